package cagelink

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/shrooms-cage/shrooms/internal/itest"
	"github.com/shrooms-cage/shrooms/pkg/config"
)

// world is one test's namespaces: a "host" (the bridge's) and any number of
// cages, each a network namespace bind-mounted on a file of the test's own
// directory. A cage's exit is the deletion of its namespace.
type world struct {
	t    testing.TB
	dir  string
	host string
	n    Net
}

func newWorld(t testing.TB, subnet4, subnet6 string) *world {
	itest.Require(t, itest.Root, itest.Nftables, itest.Netns)
	w := &world{t: t, dir: t.TempDir()}
	w.host = w.newNS("host")
	name := itest.UniqueName("cl")
	n, err := FromConfig(netConfig(name, subnet4, subnet6), w.host)
	if err != nil {
		t.Fatal(err)
	}
	w.n = n
	return w
}

// newNS makes a network namespace and returns its path; it is deleted when
// the test ends (if still there).
func (w *world) newNS(name string) string {
	w.t.Helper()
	path, err := makeNS(w.dir, name)
	if err != nil {
		w.t.Fatalf("netns %s: %v", name, err)
	}
	w.t.Cleanup(func() { _ = deleteNS(path) })
	return path
}

// makeNS unshares a network namespace on a locked thread and bind-mounts it
// on dir/name. A thread that cannot go back stays locked (discarded).
func makeNS(dir, name string) (string, error) {
	path := filepath.Join(dir, name)
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_RDONLY, 0o444)
	if err != nil {
		return "", err
	}
	f.Close()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		self, err := os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()))
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer self.Close()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("unshare: %w", err)
			return
		}
		merr := unix.Mount(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()), path, "", unix.MS_BIND, "")
		if err := unix.Setns(int(self.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("back to own netns: %w", err)
			return
		}
		runtime.UnlockOSThread()
		errc <- merr
	}()
	if err := <-errc; err != nil {
		_ = os.Remove(path)
		return "", err
	}
	return path, nil
}

// deleteNS is a cage's exit: the namespace's last reference goes, and the
// kernel tears it down (its veth with it) asynchronously.
func deleteNS(path string) error {
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return err
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

func netConfig(name, s4, s6 string) config.Network {
	return config.Network{Policy: "internet", Name: name, Bridge: name, Subnet4: s4, Subnet6: s6}
}

// in runs fn in the namespace at path.
func (w *world) in(path string, fn func() error) {
	w.t.Helper()
	if err := inNetNS(path, fn); err != nil {
		w.t.Fatal(err)
	}
}

// handle is a netlink handle in path, closed at the end of the test (so
// not for a cage that is to exit: the socket keeps its namespace alive).
func (w *world) handle(path string) *netlink.Handle {
	w.t.Helper()
	h, err := handleAt(path)
	if err != nil {
		w.t.Fatal(err)
	}
	w.t.Cleanup(h.Close)
	return h
}

// linkNames are the interface names in path.
func (w *world) linkNames(path string) []string {
	w.t.Helper()
	// A handle of its own, closed at once: an open netlink socket keeps
	// its namespace (and a cage's veth) alive.
	h, err := handleAt(path)
	if err != nil {
		w.t.Fatal(err)
	}
	defer h.Close()
	links, err := h.LinkList()
	if err != nil {
		w.t.Fatal(err)
	}
	var out []string
	for _, l := range links {
		out = append(out, l.Attrs().Name)
	}
	return out
}

// veths are the host veths of this network's bridge name.
func (w *world) veths() []string {
	w.t.Helper()
	prefix := strings.TrimSuffix(VethName(w.n.Bridge, 0), "0")
	var out []string
	for _, name := range w.linkNames(w.host) {
		if strings.HasPrefix(name, prefix) {
			out = append(out, name)
		}
	}
	return out
}

// listen opens a TCP listener in path on addr (port 0) and returns it.
func (w *world) listen(path string, addr netip.Addr) net.Listener {
	w.t.Helper()
	var ln net.Listener
	w.in(path, func() error {
		var err error
		ln, err = net.Listen("tcp", netip.AddrPortFrom(addr, 0).String())
		return err
	})
	w.t.Cleanup(func() { ln.Close() })
	return ln
}

// dial connects from the namespace at path to ln's address and returns
// the source address the listener saw (error if none arrived).
func (w *world) dial(path string, ln net.Listener, to netip.AddrPort) (netip.Addr, error) {
	w.t.Helper()
	accepted := make(chan netip.Addr, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			close(accepted)
			return
		}
		accepted <- c.RemoteAddr().(*net.TCPAddr).AddrPort().Addr().Unmap()
		c.Close()
	}()
	var derr error
	w.in(path, func() error {
		c, err := net.DialTimeout("tcp", to.String(), 2*time.Second)
		if err != nil {
			derr = err
			return nil
		}
		c.Close()
		return nil
	})
	if derr != nil {
		return netip.Addr{}, derr
	}
	select {
	case a := <-accepted:
		return a, nil
	case <-time.After(3 * time.Second):
		return netip.Addr{}, fmt.Errorf("connected but nothing accepted")
	}
}

func port(ln net.Listener) uint16 { return uint16(ln.Addr().(*net.TCPAddr).Port) }

// nft runs nft in the namespace at path.
func nft(t testing.TB, path string, args ...string) string {
	t.Helper()
	out, err := exec.Command("nsenter", append([]string{"--net=" + path, "nft"}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("nft %v: %v: %s", args, err, out)
	}
	return string(out)
}

var handleRE = regexp.MustCompile(`# handle (\d+)`)

// tableHandle is the kernel's handle of the NAT table (a new one each time
// it is made) or -1 if there is none.
func (w *world) tableHandle() int {
	w.t.Helper()
	out, err := exec.Command("nsenter", "--net="+w.host, "nft", "-a", "list", "table", "inet", NATTable(w.n.Name)).CombinedOutput()
	if err != nil {
		return -1
	}
	m := handleRE.FindStringSubmatch(string(out))
	if m == nil {
		w.t.Fatalf("no handle in %s", out)
	}
	h, _ := strconv.Atoi(m[1])
	return h
}

// waitGone polls until the host veth name is gone (the kernel deletes a
// dead namespace's veth asynchronously).
func (w *world) waitGone(name string) {
	w.t.Helper()
	h := w.handle(w.host)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := h.LinkByName(name); isNotFound(err) {
			return
		}
		if time.Now().After(deadline) {
			w.t.Fatalf("veth %s still there 10 s after its cage's namespace was deleted", name)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (w *world) ensure() {
	w.t.Helper()
	if err := EnsureBridge(context.Background(), w.n); err != nil {
		w.t.Fatal(err)
	}
}

func (w *world) attach(cage string) Link {
	w.t.Helper()
	l, err := Attach(context.Background(), w.n, cage)
	if err != nil {
		w.t.Fatal(err)
	}
	return l
}
