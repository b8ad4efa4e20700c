package turn

import (
	"context"
	"github.com/shrooms-cage/shrooms/internal/itest"
	"github.com/shrooms-cage/shrooms/pkg/taskid"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
	"gotest.tools/v3/assert"

	"github.com/shrooms-cage/shrooms/pkg/homestore"
)

// capHarness is newHarness with a 64 MiB, 4096-inode HOME.
func capHarness(t *testing.T) (*itest.Env, *Runner) {
	e, runner := newHarness(t, "")
	runner.Cfg.Home.Size = 64 << 20
	runner.Cfg.Home.Inodes = 4096
	return e, runner
}

func availBytes(t *testing.T, path string) int64 {
	t.Helper()
	var fs unix.Statfs_t
	assert.NilError(t, unix.Statfs(path, &fs))
	return int64(fs.Bavail) * fs.Bsize
}

// homeKiB runs a turn that prints the size of the filesystem the cage's
// HOME is on and whether junk is there, and returns the first.
func homeKiB(t *testing.T, e *itest.Env, runner *Runner, task string) (int64, string) {
	t.Helper()
	res, out, errOut, err := sh(runner, task, "", `set -e; df -k /home/agent | tail -n 1; if [ -e /home/agent/junk ]; then echo junk-survived; fi; echo ok`)
	assert.NilError(t, err, errOut)
	assert.Equal(t, res.ExitCode, 0, "out %q err %q", out, errOut)
	f := strings.Fields(strings.Split(out, "\n")[0])
	assert.Assert(t, len(f) > 2, out)
	kib, err := strconv.ParseInt(f[1], 10, 64)
	assert.NilError(t, err, out)
	return kib, out
}

// TestHomeCapEnospcInTurnHostUnaffectedAndNextTurnStarts: a turn writing
// past the HOME cap gets "No space left on device" and fails; the host
// loses at most the cap; the next turn starts from a reset HOME; the cap
// survives an unmount (a reboot): the next turn mounts it again.
func TestHomeCapEnospcInTurnHostUnaffectedAndNextTurnStarts(t *testing.T) {
	e, runner := capHarness(t)
	task := e.Task("cap")
	ctx := context.Background()

	// Turn 1 (positive control): HOME is the 64 MiB filesystem.
	kib, _ := homeKiB(t, e, runner, task)
	assert.Check(t, kib > 50<<10 && kib <= 64<<10, "HOME filesystem is %d KiB", kib)
	v, err := runner.Podman.InspectVolume(ctx, runner.homes().Name(taskid.Must(task)))
	assert.NilError(t, err)
	image := homestore.ImagePath(runner.Cfg.State.Dir, runner.homes().Name(taskid.Must(task)))

	// Turn 2 tries to write 1 GiB into HOME, then many files.
	before := availBytes(t, runner.Cfg.State.Dir)
	res, out, errOut, err := sh(runner, task, "", `dd if=/dev/zero of=/home/agent/junk bs=1M count=1024; echo "dd=$?"; exit 7`)
	assert.NilError(t, err, errOut)
	assert.Equal(t, res.ExitCode, 7)
	assert.Check(t, strings.Contains(errOut, "No space left on device"), "stderr: %q", errOut)
	assert.Check(t, strings.Contains(out, "dd=1"), "stdout: %q", out)
	drop := before - availBytes(t, runner.Cfg.State.Dir)
	var st unix.Stat_t
	assert.NilError(t, unix.Stat(image, &st))
	t.Logf("host free space dropped by %d bytes; the image holds %d of %d", drop, st.Blocks*512, st.Size)
	assert.Check(t, st.Blocks*512 <= int64(runner.Cfg.Home.Size), "the image allocates %d bytes", st.Blocks*512)
	// 1 GiB was attempted; other work on the machine may move the figure,
	// not by half a gibibyte.
	assert.Check(t, drop < 512<<20, "host lost %d bytes", drop)

	// Turn 3: HOME is full, the reset still works and the turn starts clean.
	kib, out = homeKiB(t, e, runner, task)
	assert.Check(t, !strings.Contains(out, "junk-survived"), out)
	assert.Check(t, kib <= 64<<10)

	// Simulated reboot: unmount; the volume directory alone is empty.
	assert.NilError(t, homestore.Unmount(image, v.Mountpoint))
	names, err := os.ReadDir(v.Mountpoint)
	assert.NilError(t, err)
	assert.Check(t, len(names) == 0, "the bare volume directory holds %v", names)
	kib, out = homeKiB(t, e, runner, task)
	assert.Check(t, kib > 50<<10 && kib <= 64<<10, "after the unmount HOME is %d KiB: %s", kib, out)
}

// TestHomeCapStaleOrHostileImage: an image planted at the task's image path
// before its volume exists is not used (a new HOME starts empty); a symlink
// planted there for an existing HOME stops the turn with a clear error and
// nothing mounted.
func TestHomeCapStaleOrHostileImage(t *testing.T) {
	e, runner := capHarness(t)
	task := e.Task("hostile")
	ctx := context.Background()
	image := homestore.ImagePath(runner.Cfg.State.Dir, runner.homes().Name(taskid.Must(task)))
	assert.NilError(t, os.MkdirAll(filepath.Dir(image), 0o700))
	assert.NilError(t, os.WriteFile(image, []byte("not ext4"), 0o600))
	homeKiB(t, e, runner, task) // the stale file was replaced by a new filesystem

	v, err := runner.Podman.InspectVolume(ctx, runner.homes().Name(taskid.Must(task)))
	assert.NilError(t, err)
	assert.NilError(t, homestore.Unmount(image, v.Mountpoint))
	assert.NilError(t, os.Rename(image, image+".real"))
	assert.NilError(t, os.Symlink(image+".real", image))
	_, _, errOut, err := sh(runner, task, "", "echo should-not-run")
	assert.ErrorContains(t, err, "is a symbolic link (refused, not followed)")
	assert.ErrorIs(t, err, ErrHostNotReady)
	assert.Check(t, !strings.Contains(errOut, "should-not-run"))
	names, err := os.ReadDir(v.Mountpoint)
	assert.NilError(t, err)
	assert.Check(t, len(names) == 0, "nothing mounted or written: %v", names)

	// Put back, the HOME mounts again.
	assert.NilError(t, os.Remove(image))
	assert.NilError(t, os.Rename(image+".real", image))
	homeKiB(t, e, runner, task)
}

// TestHomeInodeExhaustion: a turn that uses up every inode of its HOME does
// not stop the task: the next reset works from root's inode reserve, the
// next turn starts on a clean HOME, and so does the one after (the reserve
// is taken again once the old tree is deleted).
func TestHomeInodeExhaustion(t *testing.T) {
	e, runner := capHarness(t)
	task := e.Task("inodes")
	res, out, errOut, err := sh(runner, task, "", `mkdir -p ~/junk && cd ~/junk && seq 1 5000 | xargs touch 2>/dev/null; echo "files=$(ls | wc -l)"; df -i ~ | tail -1`)
	assert.NilError(t, err, errOut)
	assert.Equal(t, res.ExitCode, 0)
	assert.Check(t, strings.Contains(out, "files="), out)
	assert.Check(t, !strings.Contains(out, "files=5000"), "positive control: the inode cap must stop the turn short of 5000 files: %s", out)
	t.Logf("turn 1: %s", strings.TrimSpace(out))
	for turn := 2; turn <= 3; turn++ {
		res, out, errOut, err := sh(runner, task, "", `ls ~/junk >/dev/null 2>&1 && echo junk-survived; touch ~/ok && echo fresh`)
		assert.NilError(t, err, "turn %d: %s", turn, errOut)
		assert.Equal(t, res.ExitCode, 0, errOut)
		assert.Check(t, !strings.Contains(out, "junk-survived"), "turn %d: %s", turn, out)
		assert.Check(t, strings.Contains(out, "fresh"), "turn %d: HOME is writable again: %s", turn, out)
	}
}
