package outbox

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/shrooms-cage/shrooms/internal/itest"
)

func TestPrepareMountsSizeCappedOutbox(t *testing.T) {
	itest.Require(t, itest.Root)
	root := filepath.Join(t.TempDir(), "outbox")
	lim := DefaultLimits()
	lim.Size, lim.Inodes = 2<<20, 32
	dir, err := Prepare(root, "t1", 101000, 101000, lim)
	assert.NilError(t, err)
	t.Cleanup(func() { assert.NilError(t, Release(root, "t1")) })
	assert.Equal(t, dir, filepath.Join(root, "t1"))

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

	// Again (next turn): contents kept, limits re-applied.
	write(t, filepath.Join(dir, "keep"), "k", 0o644)
	lim.Size = 3 << 20
	_, err = Prepare(root, "t1", 101000, 101000, lim)
	assert.NilError(t, err)
	assert.NilError(t, unix.Statfs(dir, &fs))
	assert.Equal(t, int64(fs.Blocks)*fs.Bsize, int64(3<<20))
	_, err = os.Stat(filepath.Join(dir, "keep"))
	assert.NilError(t, err)

	// Writing past the cap fails on the host too (no space), as does an
	// inode past the inode cap.
	err = os.WriteFile(filepath.Join(dir, "big"), make([]byte, 4<<20), 0o644)
	assert.ErrorContains(t, err, "no space left on device")

	// A symlink planted at root/<task> is refused and its target untouched.
	victim := t.TempDir()
	assert.NilError(t, os.Symlink(victim, filepath.Join(root, "t2")))
	_, err = Prepare(root, "t2", 101000, 101000, lim)
	assert.ErrorContains(t, err, "symbolic link")
	assert.NilError(t, unix.Statfs(victim, &fs))
	assert.Assert(t, fs.Type != unix.TMPFS_MAGIC || victim == "/tmp", "victim got mounted over")
	assert.NilError(t, unix.Stat(victim, &st))
	assert.Equal(t, st.Uid, uint32(0), "victim chowned")

	_, err = Prepare(root, "../x", 1, 1, lim)
	assert.ErrorContains(t, err, "invalid task id")
	// An outbox root reached through a symbolic link is refused.
	linked := filepath.Join(t.TempDir(), "l")
	assert.NilError(t, os.Symlink(victim, linked))
	_, err = Prepare(linked, "t3", 1, 1, lim)
	assert.ErrorContains(t, err, "symbolic link")
	_, err = os.Stat(filepath.Join(victim, "t3"))
	assert.Assert(t, os.IsNotExist(err))
}

func podman(ctx context.Context, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, "podman", append([]string{"--url", itest.Socket()}, args...)...)
}

// TestTurnPastOutboxLimitFails runs a real cage (own user namespace, agent
// uid 1000) with the prepared outbox at /outbox: a write within the limit
// succeeds and is collected; a write past it fails with ENOSPC, as does a
// file past the inode cap, and the host's disk does not lose more than the
// limit.
func TestTurnPastOutboxLimitFails(t *testing.T) {
	itest.Require(t, itest.Root, itest.Podman)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	base := 1879048192 + 65536*(1+os.Getpid()%2000)
	root := filepath.Join(t.TempDir(), "outbox")
	lim := DefaultLimits()
	lim.Size, lim.Inodes = 4<<20, 64
	dir, err := Prepare(root, "t1", base+1000, base+1000, lim)
	assert.NilError(t, err)
	t.Cleanup(func() { _ = Release(root, "t1") })

	var before unix.Statfs_t
	assert.NilError(t, unix.Statfs(filepath.Dir(root), &before))
	name := itest.UniqueName("shrooms-outbox-")
	t.Cleanup(func() { _ = podman(context.Background(), "rm", "-f", "-i", name).Run() })
	script := `set -u
dd if=/dev/urandom of=/outbox/small bs=1024 count=1024 2>/dev/null || { echo SMALL-FAILED; exit 10; }
echo SMALL-OK
dd if=/dev/zero of=/outbox/fill bs=1M count=64 2>&1; echo "FILL-EXIT=$?"
echo "FILLED=$(wc -c < /outbox/fill)"
rm -f /outbox/fill
i=0; while [ $i -lt 200 ]; do touch /outbox/f$i 2>/dev/null || break; i=$((i+1)); done; echo "INODES=$i"
rm -f /outbox/f*
`
	out, err := podman(ctx, "run", "--rm", "--name", name, "--network", "none",
		"--uidmap", fmt.Sprintf("0:%d:65536", base), "--gidmap", fmt.Sprintf("0:%d:65536", base),
		"--user", "1000:1000", "--cap-drop", "all", "--security-opt", "no-new-privileges",
		"-v", dir+":/outbox:rw,nosuid,nodev,noexec", itest.TestImage, "sh", "-c", script).CombinedOutput()
	t.Logf("cage output:\n%s", out)
	assert.NilError(t, err)
	s := string(out)
	assert.Assert(t, is.Contains(s, "SMALL-OK"), "positive control: a write within the limit succeeds")
	assert.Assert(t, is.Contains(s, "No space left on device"))
	assert.Assert(t, !strings.Contains(s, "FILL-EXIT=0"), "the fill must fail")
	assert.Assert(t, is.Contains(s, "INODES="))
	var n, filled int
	fmt.Sscanf(s[strings.Index(s, "INODES=")+7:], "%d", &n)
	assert.Assert(t, n > 10 && n < 64, "inode cap: created %d files", n)
	fmt.Sscanf(s[strings.Index(s, "FILLED=")+7:], "%d", &filled)
	assert.Assert(t, filled > 1<<20 && filled <= 3<<20, "the fill stopped at the cap: %d bytes", filled)

	var after unix.Statfs_t
	assert.NilError(t, unix.Statfs(filepath.Dir(root), &after))
	lost := (int64(before.Bavail) - int64(after.Bavail)) * before.Bsize
	t.Logf("host disk free space change during the turn: %d bytes", lost)
	// The cage tried to write 64 MiB; allow for other activity on the
	// machine but not for the attempted fill.
	assert.Assert(t, lost < 32<<20, "host disk lost %d bytes", lost)

	rep, err := Collect(ctx, Request{Root: root, Task: "t1", To: filepath.Join(t.TempDir(), "d"), Limits: lim})
	assert.NilError(t, err)
	assert.Equal(t, len(rep.Files), 1)
	assert.Equal(t, rep.Files[0].Name, "small")
	assert.Equal(t, rep.Files[0].Size, int64(1<<20))
}
