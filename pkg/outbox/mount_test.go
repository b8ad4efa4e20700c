package outbox

import (
	"context"
	"fmt"
	"github.com/shrooms-cage/shrooms/pkg/taskid"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/shrooms-cage/shrooms/internal/itest"
	"github.com/shrooms-cage/shrooms/pkg/homestore"
)

func TestMountSizeCappedOutbox(t *testing.T) {
	itest.Require(t, itest.Root)
	root := filepath.Join(t.TempDir(), "outbox")
	lim := DefaultLimits()
	lim.Size, lim.Inodes = 2<<20, 32
	dev, err := Mount(root, taskid.Must("t1"), 101000, 101000, lim, "")
	assert.NilError(t, err)
	t.Cleanup(func() { assert.NilError(t, Release(root, taskid.Must("t1"))) })
	dir := filepath.Join(root, "t1")

	var fs unix.Statfs_t
	assert.NilError(t, unix.Statfs(dir, &fs))
	assert.Equal(t, fs.Type, int64(unix.TMPFS_MAGIC))
	assert.Equal(t, int64(fs.Blocks)*fs.Bsize, int64(2<<20))
	assert.Assert(t, fs.Flags&unix.ST_NOSUID != 0 && fs.Flags&unix.ST_NODEV != 0 && fs.Flags&unix.ST_NOEXEC != 0, "flags %x", fs.Flags)
	var st unix.Stat_t
	assert.NilError(t, unix.Stat(dir, &st))
	assert.Equal(t, st.Uid, uint32(101000))
	assert.Equal(t, st.Gid, uint32(101000))
	assert.Equal(t, st.Mode&0o7777, uint32(0o700))
	assert.Equal(t, st.Dev, dev)
	assert.NilError(t, Ready(root, taskid.Must("t1"), 101000, 101000, lim, "", dev))

	// Writing past the cap fails on the host too (no space).
	err = os.WriteFile(filepath.Join(dir, "big"), make([]byte, 4<<20), 0o644)
	assert.ErrorContains(t, err, "no space left on device")
	assert.NilError(t, os.Remove(filepath.Join(dir, "big")))
	write(t, filepath.Join(dir, "keep"), "k", 0o644)
	assert.ErrorContains(t, Ready(root, taskid.Must("t1"), 101000, 101000, lim, "", dev), "not empty")

	// The next turn never gets it: Mount refuses until it is settled, then
	// mounts an empty one.
	_, err = Mount(root, taskid.Must("t1"), 101000, 101000, lim, "")
	assert.ErrorContains(t, err, "still mounted with an earlier turn's files")
	m, err := Settle(context.Background(), root, taskid.Must("t1"), 4, testLimits())
	assert.NilError(t, err)
	assert.Equal(t, m.Files[0].Name, "keep")
	assert.ErrorContains(t, Ready(root, taskid.Must("t1"), 101000, 101000, lim, "", dev), "not a size-capped tmpfs")
	dev2, err := Mount(root, taskid.Must("t1"), 101000, 101000, lim, "")
	assert.NilError(t, err)
	ents, err := os.ReadDir(dir)
	assert.NilError(t, err)
	assert.Equal(t, len(ents), 0, "the new turn's outbox is not empty")
	assert.ErrorContains(t, Ready(root, taskid.Must("t1"), 101000, 101000, lim, "", dev2+1), "another tmpfs")
	// Moved once: settling the same turn again moves nothing more.
	write(t, filepath.Join(dir, "late"), "l", 0o644)
	m, err = Settle(context.Background(), root, taskid.Must("t1"), 4, testLimits())
	assert.NilError(t, err)
	assert.Equal(t, len(m.Files), 0)
	_, err = os.Stat(filepath.Join(Pending(root, taskid.Must("t1")), "4", FilesDir, "late"))
	assert.Assert(t, os.IsNotExist(err))

	// A symlink planted at root/<task> is refused and its target untouched.
	victim := t.TempDir()
	assert.NilError(t, os.Symlink(victim, filepath.Join(root, "t2")))
	_, err = Mount(root, taskid.Must("t2"), 101000, 101000, lim, "")
	assert.ErrorContains(t, err, "symbolic link")
	_, err = Settle(context.Background(), root, taskid.Must("t2"), 1, testLimits())
	assert.ErrorContains(t, err, "symbolic link")
	assert.NilError(t, unix.Statfs(victim, &fs))
	assert.Assert(t, fs.Type != unix.TMPFS_MAGIC || victim == "/tmp", "victim got mounted over")
	assert.NilError(t, unix.Stat(victim, &st))
	assert.Equal(t, st.Uid, uint32(0), "victim chowned")

	_, err = Mount(root, taskid.ID{}, 1, 1, lim, "")
	assert.ErrorContains(t, err, "no task id")
	// An outbox root reached through a symbolic link is refused.
	linked := filepath.Join(t.TempDir(), "l")
	assert.NilError(t, os.Symlink(victim, linked))
	_, err = Mount(linked, taskid.Must("t3"), 1, 1, lim, "")
	assert.ErrorContains(t, err, "symbolic link")
	_, err = os.Stat(filepath.Join(victim, "t3"))
	assert.Assert(t, os.IsNotExist(err))
}

func podman(ctx context.Context, url string, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, "podman", append([]string{"--url", url}, args...)...)
}

// fillScript writes within the cap, past the size cap and past the inode
// cap of a 4 MiB, 64-inode outbox.
const fillScript = `set -u
echo "FSTYPE=$(stat -f -c %T /outbox)"
dd if=/dev/urandom of=/outbox/small bs=1024 count=1024 2>/dev/null || { echo SMALL-FAILED; exit 10; }
echo SMALL-OK
dd if=/dev/zero of=/outbox/fill bs=1M count=8 2>&1; echo "FILL-EXIT=$?"
echo "FILLED=$(wc -c < /outbox/fill)"
rm -f /outbox/fill
i=0; while [ $i -lt 200 ]; do touch /outbox/f$i 2>/dev/null || break; i=$((i+1)); done; echo "INODES=$i"
rm -f /outbox/f*
`

// cageFill runs fillScript in a cage (own user namespace, agent uid 1000)
// through the podman service at url, with dir at /outbox.
func cageFill(t *testing.T, url string, base int, dir string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	name := itest.UniqueName("shrooms-outbox-")
	t.Cleanup(func() { _ = podman(context.Background(), url, "rm", "-f", "-i", name).Run() })
	out, err := podman(ctx, url, "run", "--rm", "--name", name, "--network", "none",
		"--uidmap", fmt.Sprintf("0:%d:65536", base), "--gidmap", fmt.Sprintf("0:%d:65536", base),
		"--user", "1000:1000", "--cap-drop", "all", "--security-opt", "no-new-privileges",
		"-v", dir+":/outbox:rw,nosuid,nodev,noexec", itest.TestImage, "sh", "-c", fillScript).CombinedOutput()
	t.Logf("cage output:\n%s", out)
	assert.NilError(t, err)
	return string(out)
}

func scanInt(s, key string) int {
	var n int
	if i := strings.Index(s, key); i >= 0 {
		fmt.Sscanf(s[i+len(key):], "%d", &n)
	}
	return n
}

// assertCapped checks fillScript's output for a capped outbox.
func assertCapped(t *testing.T, s string) {
	t.Helper()
	assert.Assert(t, is.Contains(s, "FSTYPE=tmpfs"))
	assert.Assert(t, is.Contains(s, "SMALL-OK"), "positive control: a write within the limit succeeds")
	assert.Assert(t, is.Contains(s, "No space left on device"))
	assert.Assert(t, !strings.Contains(s, "FILL-EXIT=0"), "the fill must fail")
	n := scanInt(s, "INODES=")
	assert.Assert(t, n > 10 && n < 64, "inode cap: created %d files", n)
	filled := scanInt(s, "FILLED=")
	assert.Assert(t, filled > 1<<20 && filled <= 3<<20, "the fill stopped at the cap: %d bytes", filled)
}

// TestTurnPastOutboxLimitFails runs a real cage through the test podman
// service with the mounted outbox at /outbox: a write within the limit
// succeeds and is moved at the turn's end; a write past it fails with
// ENOSPC, as does a file past the inode cap, and the host's disk does not
// lose more than the limit.
func TestTurnPastOutboxLimitFails(t *testing.T) {
	itest.Require(t, itest.Root, itest.Podman)
	base := 1879048192 + 65536*(1+os.Getpid()%2000)
	root := filepath.Join(t.TempDir(), "outbox")
	lim := DefaultLimits()
	lim.Size, lim.Inodes = 4<<20, 64
	_, err := Mount(root, taskid.Must("t1"), base+1000, base+1000, lim, "")
	assert.NilError(t, err)
	t.Cleanup(func() { _ = Release(root, taskid.Must("t1")) })

	var before unix.Statfs_t
	assert.NilError(t, unix.Statfs(filepath.Dir(root), &before))
	assertCapped(t, cageFill(t, itest.Socket(), base, filepath.Join(root, "t1")))
	var after unix.Statfs_t
	assert.NilError(t, unix.Statfs(filepath.Dir(root), &after))
	lost := (int64(before.Bavail) - int64(after.Bavail)) * before.Bsize
	t.Logf("host disk free space change during the turn: %d bytes", lost)
	assert.Assert(t, lost < 32<<20, "host disk lost %d bytes", lost)

	m, err := Settle(context.Background(), root, taskid.Must("t1"), 1, lim)
	assert.NilError(t, err)
	assert.Equal(t, len(m.Files), 1)
	assert.Equal(t, m.Files[0].Name, "small")
	assert.Equal(t, m.Files[0].Size, int64(1<<20))
}

// privateService starts a podman API service in a mount namespace of its
// own with private propagation (as a podman.service with PrivateMounts, or
// the testbed's): mounts made in the test's namespace do not reach it. It
// returns the service's URL and mount namespace.
func privateService(t *testing.T) (string, string) {
	t.Helper()
	dir, err := os.MkdirTemp("", "shrooms-obsvc")
	assert.NilError(t, err)
	sock := filepath.Join(dir, "podman.sock")
	logf, err := os.Create(filepath.Join(dir, "service.log"))
	assert.NilError(t, err)
	defer logf.Close()
	cmd := exec.Command("unshare", "--mount", "--propagation", "private", "podman", "system", "service", "--time=0", "unix://"+sock)
	cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root", "LANG=C.UTF-8"}
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	assert.NilError(t, cmd.Start())
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		_ = os.RemoveAll(dir)
	})
	c := http.Client{Timeout: time.Second, Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}}
	for i := 0; ; i++ {
		if resp, err := c.Get("http://d/_ping"); err == nil {
			resp.Body.Close()
			break
		}
		if i > 200 {
			b, _ := os.ReadFile(filepath.Join(dir, "service.log"))
			t.Fatalf("private podman service did not come up: %s", b)
		}
		time.Sleep(100 * time.Millisecond)
	}
	ns, err := homestore.ServiceNamespace(sock)
	assert.NilError(t, err)
	self, _ := os.Readlink("/proc/self/ns/mnt")
	peer, _ := os.Readlink(ns)
	assert.Assert(t, self != peer, "the service shares our mount namespace")
	return "unix://" + sock, ns
}

// TestOutboxCapHoldsInServiceNamespace: with the podman service in another
// mount namespace, the outbox is mounted where the service sees it, so the
// cage's /outbox is the capped tmpfs (ENOSPC past the cap), and what the
// turn wrote is moved to the pending deliveries, visible to List. Control:
// mounted in shrooms' own namespace only (as before), the cage gets the bare
// directory — uncapped, and its files hidden from shrooms under its tmpfs.
func TestOutboxCapHoldsInServiceNamespace(t *testing.T) {
	itest.Require(t, itest.Root, itest.Podman)
	url, ns := privateService(t)
	base := 1879048192 + 65536*(1+os.Getpid()%2000)
	uid := base + 1000
	root := filepath.Join(t.TempDir(), "outbox")
	lim := DefaultLimits()
	lim.Size, lim.Inodes = 4<<20, 64

	// Control: the old way, mounted in our namespace only.
	_, err := Mount(root, taskid.Must("ctl"), uid, uid, lim, "")
	assert.NilError(t, err)
	t.Cleanup(func() { _ = Release(root, taskid.Must("ctl"), ns) })
	// The bare directory under it, as the service sees it, made writable
	// for the cage so the missing cap shows.
	assert.NilError(t, homestore.InNamespace(ns, func() error { return os.Chown(filepath.Join(root, "ctl"), uid, uid) }))
	s := cageFill(t, url, base, filepath.Join(root, "ctl"))
	assert.Assert(t, !strings.Contains(s, "FSTYPE=tmpfs"), "control: the cage got the tmpfs without it being mounted in the service's namespace")
	assert.Assert(t, is.Contains(s, "FILL-EXIT=0"), "control: the fill past the cap succeeds on the bare directory")
	assert.Equal(t, scanInt(s, "FILLED="), 8<<20)
	ents, err := os.ReadDir(filepath.Join(root, "ctl"))
	assert.NilError(t, err)
	assert.Equal(t, len(ents), 0, "control: shrooms' own view holds none of the cage's files")

	// The fix: mounted in the service's namespace.
	_, err = Mount(root, taskid.Must("t1"), uid, uid, lim, ns)
	assert.NilError(t, err)
	t.Cleanup(func() { _ = Release(root, taskid.Must("t1"), ns) })
	assert.NilError(t, Ready(root, taskid.Must("t1"), uid, uid, lim, ns, 0))
	assertCapped(t, cageFill(t, url, base, filepath.Join(root, "t1")))
	m, err := Settle(context.Background(), root, taskid.Must("t1"), 1, testLimits(), ns)
	assert.NilError(t, err)
	assert.Equal(t, len(m.Files), 1)
	rep, err := List(context.Background(), root, taskid.Must("t1"), testLimits())
	assert.NilError(t, err)
	assert.Equal(t, len(rep.Files), 1)
	assert.Equal(t, rep.Files[0].Name, "small")
	// Gone from the service's namespace: the next cage would get nothing of it.
	assert.NilError(t, homestore.InNamespace(ns, func() error {
		var fs unix.Statfs_t
		if err := unix.Statfs(filepath.Join(root, "t1"), &fs); err != nil {
			return err
		}
		if fs.Type == unix.TMPFS_MAGIC {
			return fmt.Errorf("the outbox is still mounted in the service's namespace")
		}
		return nil
	}))
}

// TestMountRefusedOverPendingCap: a turn's outbox is not mounted while the
// task's pending deliveries hold more than MaxPending bytes, so turn after
// turn cannot fill the host's disk; once they are released it mounts again.
func TestMountRefusedOverPendingCap(t *testing.T) {
	itest.Require(t, itest.Root)
	root := filepath.Join(t.TempDir(), "outbox")
	lim := DefaultLimits()
	lim.Size, lim.Inodes, lim.MaxPending = 2<<20, 32, 3<<20
	fill := func(turn int) {
		t.Helper()
		_, err := Mount(root, taskid.Must("t1"), 101000, 101000, lim, "")
		assert.NilError(t, err)
		write(t, filepath.Join(root, "t1", "blob"), strings.Repeat("x", 1800<<10), 0o644)
		m, err := Settle(context.Background(), root, taskid.Must("t1"), turn, testLimits())
		assert.NilError(t, err)
		assert.Equal(t, len(m.Files), 1)
	}
	t.Cleanup(func() { _ = Release(root, taskid.Must("t1")) })
	fill(1) // 1.8 MiB pending: under the cap, the next outbox mounts
	fill(2) // 3.6 MiB pending: over it
	_, err := Mount(root, taskid.Must("t1"), 101000, 101000, lim, "")
	assert.ErrorContains(t, err, "over outbox.max_pending (3145728): collect them (`shrooms outbox collect --task t1`)")
	var fs unix.Statfs_t
	assert.NilError(t, unix.Statfs(filepath.Join(root, "t1"), &fs))
	assert.Assert(t, fs.Type != unix.TMPFS_MAGIC, "a refused outbox was mounted")
	assert.NilError(t, Release(root, taskid.Must("t1")))
	_, err = Mount(root, taskid.Must("t1"), 101000, 101000, lim, "")
	assert.NilError(t, err, "released: the outbox mounts again")
}
