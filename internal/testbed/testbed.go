// Package testbed builds the test network topology (nix/tests/topology.json) for integration
// tests out of network namespaces the test itself creates: an "internet"
// namespace (TEST-NET addresses, HTTP/UDP/DNS/ICMP canaries), a LAN "router"
// (admin canary, fake metadata service on 169.254.169.254 and fd00:ec2::254,
// a fake Azure WireServer, sample private/CGNAT addresses, a LAN on public
// IPv4 and global IPv6 addresses and a VPN-style routed public prefix), and
// a "host" namespace that runs a private podman service (cages live there)
// with canaries on every host address. The host's default route leads to
// the router and the "internet" behind it; the LANs and the VPN prefixes
// are routed apart from it, as on a real host.
// Canaries log each hit with the probe's nonce, so verdicts come from the
// receiving side. The testbed has no route to the machine's real network
// (New proves it before returning) and tears itself down in t.Cleanup.
package testbed

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shrooms-cage/shrooms/internal/itest"
)

// Testbed addresses. The "internet" uses documentation prefixes, which the
// seal does not block; everything else is LAN, metadata or private space.
var (
	InternetAddr4  = netip.MustParseAddr("203.0.113.10")
	InternetAddr6  = netip.MustParseAddr("2001:db8:203::10")
	Internet2Addr4 = netip.MustParseAddr("203.0.113.20") // second internet canary (not allowlisted)
	Internet2Addr6 = netip.MustParseAddr("2001:db8:203::20")
	RouterAddr4    = netip.MustParseAddr("192.168.1.1")
	RouterAddr6    = netip.MustParseAddr("fd00:1::1")
	HostAddr4      = netip.MustParseAddr("192.168.1.2")
	HostAddr6      = netip.MustParseAddr("fd00:1::2")
	Metadata4      = netip.MustParseAddr("169.254.169.254")
	Metadata6      = netip.MustParseAddr("fd00:ec2::254")
	// WireServer is Azure's VM agent endpoint (a public address, reached
	// through the default route); the router serves it, also on
	// WireServerPort.
	WireServer     = netip.MustParseAddr("168.63.129.16")
	WireServerPort = 32526
	// A LAN on public addresses (IPv4 and global IPv6) attached to the host
	// directly (lan1), and public prefixes routed over a VPN-style link
	// (vpn0): the router answers on all of them, none is behind the
	// default route, and none is in a private range.
	PublicLAN4     = netip.MustParseAddr("198.51.100.1")
	PublicLAN6     = netip.MustParseAddr("2001:db8:1::1")
	HostPublicLAN4 = netip.MustParseAddr("198.51.100.2")
	VPN4           = netip.MustParseAddr("192.0.2.10")
	VPN6           = netip.MustParseAddr("2001:db8:2::10")
	// Private are sample private-range addresses served by the router.
	Private = []netip.Addr{
		netip.MustParseAddr("10.123.45.67"), netip.MustParseAddr("172.16.5.5"),
		netip.MustParseAddr("100.64.1.1"), netip.MustParseAddr("198.18.0.1"),
		netip.MustParseAddr("fd12:3456::1"),
	}
)

// Canary ports: every namespace listens on these TCP and UDP ports (the
// internet also on 53 with a DNS canary).
var (
	TCPPorts = []int{22, 80, 2375, 8080}
	UDPPorts = []int{123, 1900, 5000}
	// LoopbackPort is a host service bound to 127.0.0.1 and ::1 only.
	LoopbackPort = 9999
)

// Testbed is one running topology.
type Testbed struct {
	ID string
	// NS maps a role (host, router, internet) to its namespace name.
	NS map[string]string
	// PodmanURL is the private podman service running in the host namespace.
	PodmanURL string
	// Dir holds the service socket, its resolv.conf and logs.
	Dir string

	t testing.TB
	// v4Internet: the internet has no IPv6 (IPv4OnlyInternet).
	v4Internet bool
	log        log
	canaries   []*canaries
	svc        *exec.Cmd
	svcArgs    []string
	holder     *exec.Cmd // holds the service's mount namespace
	cpuacct    string    // CPUAccount's cgroup, or ""
}

// NSPath is the bind-mount path of role's namespace (for nsenter, setns).
func (tb *Testbed) NSPath(role string) string { return "/run/netns/" + tb.NS[role] }

// Option changes the topology New builds.
type Option func(*Testbed)

// IPv4OnlyInternet gives the "internet" no IPv6 at all: no addresses on
// its link to the router, no IPv6 routes there, no IPv6 default route on
// the host (the LANs keep theirs), as behind an IPv4-only provider.
func IPv4OnlyInternet() Option { return func(tb *Testbed) { tb.v4Internet = true } }

// PodmanFlags are podman's global flags for the testbed's service (e.g.
// --runtime for the gVisor suites).
func PodmanFlags(args ...string) Option { return func(tb *Testbed) { tb.svcArgs = args } }

// CPUAccount charges the service's CPU time to dir, a cgroup the caller
// made and removes: a cpuacct (cgroup v1) cgroup, or a cgroup v2 one. The
// service runs in dir/svc, and its mount namespace sees dir as the
// cpuacct root (v1) or as the whole /sys/fs/cgroup (v2, so podman and
// runc see a unified host rooted there), so podman's cgroupfs parent
// (/libpod_parent: conmon, the exit commands conmon runs, the containers)
// lands in dir/libpod_parent. A parent keeps the usage of its removed
// children (v1's cpuacct.usage, v2's cpu.stat usage_usec), so dir's usage
// is all the service's work.
func CPUAccount(dir string) Option { return func(tb *Testbed) { tb.cpuacct = dir } }

// cgroup2Magic is statfs's f_type of a cgroup v2 mount (CGROUP2_SUPER_MAGIC).
const cgroup2Magic = 0x63677270

// cpuAccountMount is where CPUAccount's dir is bind-mounted in the
// service's mount namespace: over the cpuacct root for a v1 cgroup, over
// /sys/fs/cgroup for a v2 one.
func cpuAccountMount(dir string) (string, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return "", fmt.Errorf("CPUAccount's cgroup: %w", err)
	}
	if st.Type == cgroup2Magic {
		return "/sys/fs/cgroup", nil
	}
	return "/sys/fs/cgroup/cpuacct", nil
}

// New builds a testbed, or fails t. Everything is removed in t.Cleanup.
func New(t testing.TB, opts ...Option) *Testbed {
	t.Helper()
	itest.Require(t, itest.Root, itest.Netns, itest.Nftables)
	id := itest.UniqueName("")
	tb := &Testbed{ID: id, t: t, NS: map[string]string{
		"host": "stb-h-" + id, "router": "stb-r-" + id, "internet": "stb-i-" + id,
	}}
	for _, o := range opts {
		o(tb)
	}
	tb.Dir = filepath.Join("/run", "shrooms-tb-"+id)
	t.Cleanup(tb.teardown)
	if err := os.MkdirAll(tb.Dir, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, role := range []string{"host", "router", "internet"} {
		tb.ip("netns", "add", tb.NS[role])
		tb.in(role, "ip", "link", "set", "lo", "up")
	}
	h, r, i := tb.NS["host"], tb.NS["router"], tb.NS["internet"]
	// host <-> router: the LAN, a public LAN and a VPN-style link.
	tb.ip("link", "add", "lan0", "netns", h, "type", "veth", "peer", "name", "lan0", "netns", r)
	tb.ip("link", "add", "lan1", "netns", h, "type", "veth", "peer", "name", "lan1", "netns", r)
	tb.ip("link", "add", "vpn0", "netns", h, "type", "veth", "peer", "name", "vpn0", "netns", r)
	// router <-> internet.
	tb.ip("link", "add", "wan0", "netns", r, "type", "veth", "peer", "name", "wan0", "netns", i)
	tb.in("host", "ip", "addr", "add", "192.168.1.2/24", "dev", "lan0")
	tb.in("host", "ip", "addr", "add", "fd00:1::2/64", "dev", "lan0", "nodad")
	tb.in("router", "ip", "addr", "add", "192.168.1.1/24", "dev", "lan0")
	tb.in("router", "ip", "addr", "add", "fd00:1::1/64", "dev", "lan0", "nodad")
	tb.in("router", "ip", "addr", "add", "203.0.113.1/24", "dev", "wan0")
	if !tb.v4Internet {
		tb.in("router", "ip", "addr", "add", "2001:db8:203::1/64", "dev", "wan0", "nodad")
	}
	tb.in("host", "ip", "addr", "add", "198.51.100.2/24", "dev", "lan1")
	tb.in("host", "ip", "addr", "add", "2001:db8:1::2/64", "dev", "lan1", "nodad")
	tb.in("router", "ip", "addr", "add", "198.51.100.1/24", "dev", "lan1")
	tb.in("router", "ip", "addr", "add", "2001:db8:1::1/64", "dev", "lan1", "nodad")
	tb.in("host", "ip", "addr", "add", "10.200.0.2/30", "dev", "vpn0")
	tb.in("host", "ip", "addr", "add", "fd00:200::2/64", "dev", "vpn0", "nodad")
	tb.in("router", "ip", "addr", "add", "10.200.0.1/30", "dev", "vpn0")
	tb.in("router", "ip", "addr", "add", "fd00:200::1/64", "dev", "vpn0", "nodad")
	tb.in("internet", "ip", "addr", "add", "203.0.113.10/24", "dev", "wan0")
	tb.in("internet", "ip", "addr", "add", "203.0.113.20/24", "dev", "wan0")
	if !tb.v4Internet {
		tb.in("internet", "ip", "addr", "add", "2001:db8:203::10/64", "dev", "wan0", "nodad")
	}
	// Deprecated (preferred_lft 0): it still receives, but is never picked
	// as the source of a reply, so a canary on the wildcard address answers
	// a datagram to ::10 from ::10, as a connected client expects.
	if !tb.v4Internet {
		tb.in("internet", "ip", "addr", "add", "2001:db8:203::20/64", "dev", "wan0", "nodad", "preferred_lft", "0")
	}
	for _, a := range append([]netip.Addr{Metadata4, Metadata6, WireServer, VPN4, VPN6}, Private...) {
		tb.in("router", "ip", "addr", "add", netip.PrefixFrom(a, a.BitLen()).String(), "dev", "lo")
	}
	for _, role := range []string{"host", "router", "internet"} {
		for _, l := range []string{"lan0", "lan1", "vpn0", "wan0"} {
			if role == "router" || (role == "host" && l != "wan0") || (role == "internet" && l == "wan0") {
				tb.in(role, "ip", "link", "set", l, "up")
			}
		}
	}
	tb.in("router", "sysctl", "-qw", "net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1")
	tb.in("host", "sysctl", "-qw", "net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1")
	// Routes: the host's default route leads to the router (the
	// "internet" and WireServer are behind it); the router has specific
	// prefixes only, no default route, so an address outside the testbed
	// is unreachable from every namespace. The VPN-style prefixes are
	// routed over vpn0, not by the default route.
	tb.in("host", "ip", "route", "add", "default", "via", "192.168.1.1", "dev", "lan0")
	if !tb.v4Internet {
		tb.in("host", "ip", "-6", "route", "add", "default", "via", "fd00:1::1", "dev", "lan0")
	}
	tb.in("host", "ip", "route", "add", "192.0.2.0/24", "via", "10.200.0.1", "dev", "vpn0")
	tb.in("host", "ip", "-6", "route", "add", "2001:db8:2::/48", "via", "fd00:200::1", "dev", "vpn0")
	for _, a := range append([]netip.Addr{Metadata4, Metadata6}, Private...) {
		via := "192.168.1.1"
		if a.Is6() {
			via = "fd00:1::1"
		}
		tb.in("host", "ip", "route", "add", netip.PrefixFrom(a, a.BitLen()).String(), "via", via)
	}
	tb.in("internet", "ip", "route", "add", "192.168.1.0/24", "via", "203.0.113.1")
	if !tb.v4Internet {
		tb.in("internet", "ip", "-6", "route", "add", "fd00:1::/64", "via", "2001:db8:203::1")
	}
	// Return routes for host traffic routed out over the public LAN.
	tb.in("internet", "ip", "route", "add", "198.51.100.0/24", "via", "203.0.113.1")
	if !tb.v4Internet {
		tb.in("internet", "ip", "-6", "route", "add", "2001:db8:1::/64", "via", "2001:db8:203::1")
	}

	if err := tb.CheckIsolated(); err != nil {
		t.Fatalf("testbed is not isolated, refusing to probe: %v", err)
	}
	var err error
	for _, c := range []struct {
		role string
		bind string
		tcp  []int
		udp  []int
		icmp bool
		dns  bool
	}{
		{"internet", "", append([]int{53}, TCPPorts...), append([]int{53}, UDPPorts...), true, true},
		{"router", "", TCPPorts, append([]int{53}, UDPPorts...), true, false},
		{"host", "", TCPPorts, UDPPorts, true, false},
		{"host", "127.0.0.1", []int{LoopbackPort}, []int{LoopbackPort}, false, false},
		{"host", "::1", []int{LoopbackPort}, []int{LoopbackPort}, false, false},
		{"router", WireServer.String(), []int{WireServerPort}, nil, false, false},
	} {
		cn, cerr := startCanaries(tb.NSPath(c.role), c.role, &tb.log, c.bind, c.tcp, c.udp, c.icmp, c.dns)
		if cerr != nil {
			err = cerr
			break
		}
		tb.canaries = append(tb.canaries, cn)
	}
	if err != nil {
		t.Fatalf("testbed canaries: %v", err)
	}
	return tb
}

func (tb *Testbed) ip(args ...string) {
	tb.t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		tb.t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// in runs a command inside role's namespace (nsenter, so mounts stay).
func (tb *Testbed) in(role string, args ...string) {
	tb.t.Helper()
	if out, err := tb.Exec(role, args...); err != nil {
		tb.t.Fatalf("%s: %s: %v: %s", role, strings.Join(args, " "), err, out)
	}
}

// Exec runs a command in role's namespace and returns its combined output.
func (tb *Testbed) Exec(role string, args ...string) ([]byte, error) {
	return exec.Command("nsenter", append([]string{"--net=" + tb.NSPath(role), "--"}, args...)...).CombinedOutput()
}

// testbedPrefixes are the only destinations a testbed route may cover.
var testbedPrefixes = []netip.Prefix{
	netip.MustParsePrefix("192.168.1.0/24"), netip.MustParsePrefix("203.0.113.0/24"),
	netip.MustParsePrefix("fd00:1::/64"), netip.MustParsePrefix("2001:db8:203::/64"),
	netip.MustParsePrefix("169.254.169.254/32"), netip.MustParsePrefix("fd00:ec2::254/128"),
	netip.MustParsePrefix("fe80::/64"), netip.MustParsePrefix("fd12:3456::1/128"),
	netip.MustParsePrefix("10.123.45.67/32"), netip.MustParsePrefix("172.16.5.5/32"),
	netip.MustParsePrefix("100.64.1.1/32"), netip.MustParsePrefix("198.18.0.1/32"),
	netip.MustParsePrefix("168.63.129.16/32"), netip.MustParsePrefix("198.51.100.0/24"),
	netip.MustParsePrefix("2001:db8:1::/64"), netip.MustParsePrefix("10.200.0.0/30"),
	netip.MustParsePrefix("fd00:200::/64"), netip.MustParsePrefix("192.0.2.0/24"),
	netip.MustParsePrefix("2001:db8:2::/48"),
}

// hostDefault is the host namespace's default route, IPv4 and IPv6: into
// the router namespace, which has none of its own.
var hostDefault = map[string]bool{"default via 192.168.1.1 dev lan0": true, "default via fd00:1::1 dev lan0": true}

// CheckIsolated proves the testbed cannot reach the machine's network:
// every route in every namespace is a testbed prefix (cage networks podman
// adds to the host are allowed via extra) or the host's default route into
// the router, and the kernel answers "network unreachable" for the
// machine's own addresses, gateway and resolvers and for public resolvers
// in the router and the internet (the host sends them to the router) —
// `ip route get` sends nothing.
func (tb *Testbed) CheckIsolated(extra ...netip.Prefix) error {
	allowed := append(append([]netip.Prefix(nil), testbedPrefixes...), extra...)
	for role := range tb.NS {
		for _, fam := range []string{"-4", "-6"} {
			out, err := tb.Exec(role, "ip", fam, "route", "show", "table", "all")
			if err != nil {
				return fmt.Errorf("%s: ip route: %v: %s", role, err, out)
			}
			sc := bufio.NewScanner(strings.NewReader(string(out)))
			for sc.Scan() {
				f := strings.Fields(sc.Text())
				if len(f) == 0 {
					continue
				}
				dst := f[0]
				if dst == "local" || dst == "broadcast" || dst == "multicast" || dst == "anycast" {
					if len(f) < 2 {
						continue
					}
					dst = f[1]
				}
				if dst == "default" {
					if role == "host" && hostDefault[strings.Join(f[:min(5, len(f))], " ")] {
						continue
					}
					return fmt.Errorf("%s has a default route other than into the router: %s", role, sc.Text())
				}
				p, err := netip.ParsePrefix(dst)
				if err != nil {
					a, aerr := netip.ParseAddr(dst)
					if aerr != nil {
						return fmt.Errorf("%s: unparsable route %q", role, sc.Text())
					}
					p = netip.PrefixFrom(a, a.BitLen())
				}
				if p.Addr().IsLoopback() || p.Addr().IsMulticast() || p.Addr().IsLinkLocalUnicast() && p.Bits() >= 64 {
					continue
				}
				if !within(p, allowed) {
					return fmt.Errorf("%s routes %s, which is not a testbed prefix", role, sc.Text())
				}
			}
		}
		for _, a := range realAddrs() {
			out, err := tb.Exec(role, "ip", "route", "get", a.String())
			if role == "host" && err == nil && (strings.Contains(string(out), "via 192.168.1.1 dev lan0") || strings.Contains(string(out), "via fd00:1::1 dev lan0")) {
				continue // into the router, which must say unreachable
			}
			if err == nil || !strings.Contains(string(out), "unreachable") {
				return fmt.Errorf("%s: %s is not unreachable (ip route get: %s)", role, a, strings.TrimSpace(string(out)))
			}
		}
	}
	return nil
}

func within(p netip.Prefix, list []netip.Prefix) bool {
	for _, l := range list {
		if l.Bits() <= p.Bits() && l.Contains(p.Addr()) {
			return true
		}
	}
	return false
}

// realAddrs are addresses of the machine's real network (its own addresses
// and their subnets' first hosts, its resolvers) plus public resolvers.
func realAddrs() []netip.Addr {
	out := []netip.Addr{netip.MustParseAddr("8.8.8.8"), netip.MustParseAddr("1.1.1.1"), netip.MustParseAddr("2001:4860:4860::8888")}
	ifs, _ := net.InterfaceAddrs()
	for _, a := range ifs {
		if ipn, ok := a.(*net.IPNet); ok {
			addr, _ := netip.AddrFromSlice(ipn.IP)
			addr = addr.Unmap()
			if addr.IsLoopback() || addr.IsLinkLocalUnicast() {
				continue
			}
			ones, _ := ipn.Mask.Size()
			out = append(out, addr, netip.PrefixFrom(addr, ones).Masked().Addr().Next())
		}
	}
	if b, err := os.ReadFile("/etc/resolv.conf"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			f := strings.Fields(l)
			if len(f) == 2 && f[0] == "nameserver" {
				if a, err := netip.ParseAddr(f[1]); err == nil && !a.IsLoopback() {
					out = append(out, a)
				}
			}
		}
	}
	var keep []netip.Addr
	for _, a := range out {
		if !within(netip.PrefixFrom(a, a.BitLen()), testbedPrefixes) {
			keep = append(keep, a)
		}
	}
	return keep
}

// StartPodman starts the private podman service in the host namespace. It
// runs in its own mount namespace where /run/containers/networks (netavark's
// state and aardvark-dns) is private, so it never signals the machine's
// aardvark, and /etc/resolv.conf names the internet DNS canary, so
// aardvark forwards there. Storage is the machine's.
func (tb *Testbed) StartPodman() { tb.t.Helper(); tb.StartPodmanWith() }

// StartPodmanWith is StartPodman with podman's global flags args (e.g.
// --runtime for the gVisor suites); a restart keeps them.
func (tb *Testbed) StartPodmanWith(args ...string) {
	tb.t.Helper()
	if len(args) > 0 {
		tb.svcArgs = args
	} else if tb.svcArgs == nil {
		// The suites' runtime (SHROOMS_TEST_RUNTIME), none by default.
		tb.svcArgs = itest.ServiceArgs()
	}
	itest.Require(tb.t, itest.Podman)
	resolv := filepath.Join(tb.Dir, "resolv.conf")
	if err := os.WriteFile(resolv, []byte("nameserver 203.0.113.10\n"), 0o644); err != nil {
		tb.t.Fatal(err)
	}
	if err := os.MkdirAll("/run/containers/networks", 0o755); err != nil {
		tb.t.Fatal(err)
	}
	sock := filepath.Join(tb.Dir, "podman.sock")
	// Appended to, so a restart keeps the earlier service's log.
	logf, err := os.OpenFile(filepath.Join(tb.Dir, "podman.log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		tb.t.Fatal(err)
	}
	if tb.holder == nil {
		// The mount namespace must outlive service restarts: the cages'
		// netns bind mounts live in it. A bounded sleep holds it, longer
		// than any cage lives (cages are --rm and end on their own).
		ready := filepath.Join(tb.Dir, "ready")
		script := fmt.Sprintf("mount -t tmpfs tmpfs /run/containers/networks && mount --bind %s /etc/resolv.conf && touch %s && exec sleep 1800", resolv, ready)
		if tb.cpuacct != "" {
			target, err := cpuAccountMount(tb.cpuacct)
			if err != nil {
				tb.t.Fatal(err)
			}
			script = fmt.Sprintf("mount --bind %s %s && %s", tb.cpuacct, target, script)
		}
		h := exec.Command("nsenter", "--net="+tb.NSPath("host"), "--", "unshare", "--mount", "--propagation", "private", "sh", "-c", script)
		h.Stdout, h.Stderr = logf, logf
		if err := h.Start(); err != nil {
			tb.t.Fatalf("start testbed mount namespace: %v", err)
		}
		tb.holder = h
		for i := 0; ; i++ {
			if _, err := os.Stat(ready); err == nil {
				break
			}
			if i > 100 {
				tb.t.Fatal("testbed mount namespace not ready")
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	podman := append([]string{"podman"}, tb.svcArgs...)
	if tb.cpuacct != "" {
		podman = append(podman, "--cgroup-manager", "cgroupfs") // what the bind mount above steers
	}
	nsenter := append([]string{"nsenter", "-t", fmt.Sprint(tb.holder.Process.Pid), "-m", "-n", "--"}, podman...)
	nsenter = append(nsenter, "system", "service", "--time=0", "unix://"+sock)
	cmd := exec.Command(nsenter[0], nsenter[1:]...)
	if tb.cpuacct != "" {
		// Joined before exec, so none of the service's work escapes.
		procs := filepath.Join(tb.cpuacct, "svc", "cgroup.procs")
		if err := os.MkdirAll(filepath.Dir(procs), 0o755); err != nil {
			tb.t.Fatal(err)
		}
		cmd = exec.Command("sh", append([]string{"-c", `echo $$ > "$0" && exec "$@"`, procs}, nsenter...)...)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		tb.t.Fatalf("start podman service: %v", err)
	}
	tb.svc = cmd
	tb.PodmanURL = "unix://" + sock
	c := http.Client{Timeout: time.Second, Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}}
	for i := 0; i < 100; i++ {
		if resp, err := c.Get("http://d/_ping"); err == nil {
			resp.Body.Close()
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	b, _ := os.ReadFile(logf.Name())
	tb.t.Fatalf("podman service in the testbed did not come up: %s", b)
}

// Podman runs the podman CLI against the testbed's service.
func (tb *Testbed) Podman(args ...string) (string, error) {
	out, err := exec.Command("podman", append([]string{"--url", tb.PodmanURL}, args...)...).CombinedOutput()
	return string(out), err
}

// MustPodman is Podman that fails the test on error.
func (tb *Testbed) MustPodman(args ...string) string {
	tb.t.Helper()
	out, err := tb.Podman(args...)
	if err != nil {
		tb.t.Fatalf("podman %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return out
}

// Label marks every container and network a test creates in the testbed,
// so teardown removes exactly those.
func (tb *Testbed) Label() string { return "shrooms-tb=" + tb.ID }

// RestartPodman stops and restarts the private podman service.
func (tb *Testbed) RestartPodman() {
	tb.t.Helper()
	tb.stopService()
	tb.StartPodman()
}

func (tb *Testbed) stopService() {
	if tb.svc == nil || tb.svc.Process == nil {
		return
	}
	tb.svc.Process.Signal(os.Interrupt)
	done := make(chan struct{})
	go func() { tb.svc.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		tb.svc.Process.Kill()
		<-done
	}
	tb.svc = nil
}

func (tb *Testbed) teardown() {
	if tb.t.Failed() {
		// The service log dies with the testbed: keep its tail for the report.
		if b, err := os.ReadFile(filepath.Join(tb.Dir, "podman.log")); err == nil {
			if len(b) > 8192 {
				b = b[len(b)-8192:]
			}
			tb.t.Logf("testbed podman service log (tail):\n%s", b)
		}
	}
	if tb.svc != nil {
		if out, err := tb.Podman("ps", "-aq", "--filter", "label="+tb.Label()); err == nil {
			for _, id := range strings.Fields(out) {
				tb.Podman("rm", "-f", "-t", "0", id)
			}
		}
		if out, err := tb.Podman("network", "ls", "-q", "--filter", "label="+tb.Label()); err == nil {
			for _, n := range strings.Fields(out) {
				tb.Podman("network", "rm", "-f", n)
			}
		}
	}
	tb.stopService()
	if tb.holder != nil {
		tb.holder.Process.Kill()
		tb.holder.Wait()
	}
	for _, c := range tb.canaries {
		c.close()
	}
	for _, ns := range tb.NS {
		exec.Command("ip", "netns", "del", ns).Run()
	}
	os.RemoveAll(tb.Dir)
}

// BuildProbe compiles tbprobe (static) into the testbed dir and returns its
// path, for bind-mounting into cages.
func (tb *Testbed) BuildProbe() string {
	tb.t.Helper()
	out := filepath.Join(tb.Dir, "tbprobe")
	cmd := exec.Command("go", "build", "-o", out, "github.com/shrooms-cage/shrooms/internal/testbed/tbprobe")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		tb.t.Fatalf("build tbprobe: %v: %s", err, b)
	}
	return out
}

// Route adds a return route for a cage subnet to the router and the
// internet namespaces (used when NAT does not cover it).
func (tb *Testbed) Route(p netip.Prefix) {
	tb.t.Helper()
	if p.Addr().Is4() {
		tb.in("router", "ip", "route", "replace", p.String(), "via", HostAddr4.String())
		tb.in("internet", "ip", "route", "replace", p.String(), "via", "203.0.113.1")
	} else {
		tb.in("router", "ip", "-6", "route", "replace", p.String(), "via", HostAddr6.String())
		if !tb.v4Internet {
			tb.in("internet", "ip", "-6", "route", "replace", p.String(), "via", "2001:db8:203::1")
		}
	}
}

// PodmanLocal runs the local podman CLI inside the service's network and
// mount namespaces, for commands the remote client lacks (network reload).
func (tb *Testbed) PodmanLocal(args ...string) (string, error) {
	if tb.svc == nil || tb.svc.Process == nil {
		return "", fmt.Errorf("podman service not running")
	}
	out, err := exec.Command("nsenter", append([]string{"-t", fmt.Sprint(tb.holder.Process.Pid), "-m", "-n", "--", "podman"}, args...)...).CombinedOutput()
	return string(out), err
}
