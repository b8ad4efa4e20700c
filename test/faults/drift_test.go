package faults_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"gotest.tools/v3/assert"

	"github.com/shrooms-cage/shrooms/internal/itest"
)

// TestVolumeRemovedBetweenTurns: `podman volume rm` of an idle task's HOME
// volume removes only an empty directory (HOME is not mounted between
// turns); the next turn makes a new volume around the surviving image and
// every kept credential and session is there.
func TestVolumeRemovedBetweenTurns(t *testing.T) {
	e := newEnv(t, itest.Socket(), "")
	task := e.Task("volrm")
	s := plant(e, task)
	assert.Equal(t, attachedAfter(e), 0, "HOME is released after the turn")
	out, err := e.Podman("volume", "rm", "-f", e.Volume(task))
	assert.NilError(t, err, out)
	// Positive control: the volume is really gone.
	_, err = e.Podman("volume", "exists", e.Volume(task))
	assert.Assert(t, err != nil, "the volume still exists")
	kept(e, task, s)
	assert.Equal(t, attachedAfter(e), 0)
}

// TestVolumeRemovedWhileMounted is issue 17's report: `podman volume rm -f`
// while the image is mounted. podman itself empties HOME and fails to
// remove the mount point; the task runs again (with a freshly bootstrapped
// HOME: there is nothing left to keep), and forget then leaves no mount,
// loop device, image, volume or state. A forget that cannot unmount (a
// process sits in HOME) exits non-zero naming the mount, and succeeds once
// it can.
func TestVolumeRemovedWhileMounted(t *testing.T) {
	e := newEnv(t, itest.Socket(), "")
	task := e.Task("volrm-mounted")
	plant(e, task)
	mp := mountHome(e, task)
	out, err := e.Podman("volume", "rm", "-f", e.Volume(task))
	// Positive control of the fault: podman cannot remove the mount point.
	assert.Assert(t, err != nil && strings.Contains(out, "busy"), "podman volume rm: %v %s", err, out)
	_, err = e.Podman("volume", "exists", e.Volume(task))
	assert.Assert(t, err != nil, "podman kept the volume")
	assert.Equal(t, len(attachments(e)), 1, "the image stays mounted at %s", mp)

	code, out, stderr := keepTurn(e, task, "echo runs-again")
	assert.Equal(t, code, 0, "%s %s", out, stderr)
	assert.Assert(t, strings.Contains(out, "runs-again"))
	assert.Equal(t, attachedAfter(e), 0)

	// A process in HOME keeps it mounted: forget says so and fails.
	mp = mountHome(e, task)
	sleeper := exec.Command("sleep", "300")
	sleeper.Dir = mp
	assert.NilError(t, sleeper.Start())
	defer func() { _ = sleeper.Process.Kill(); _ = sleeper.Wait() }()
	code, out, stderr = e.CLI("forget", "--task", task)
	assert.Equal(t, code, 122, "forget with HOME busy: %s %s", out, stderr)
	oneLine(t, stderr, "umount "+mp)
	assert.Assert(t, !strings.Contains(out, "forgot"), out)
	_ = sleeper.Process.Kill()
	_ = sleeper.Wait()

	code, out, stderr = e.CLI("forget", "--task", task)
	assert.Equal(t, code, 0, "%s %s", out, stderr)
	assert.Equal(t, attachedAfter(e), 0)
	_, err = os.Stat(image(e, task))
	assert.Assert(t, os.IsNotExist(err), "image left: %v", err)
	_, err = os.Stat(filepath.Join(e.State, "tasks", task))
	assert.Assert(t, os.IsNotExist(err), "state left: %v", err)
	_, err = e.Podman("volume", "exists", e.Volume(task))
	assert.Assert(t, err != nil, "volume left")
}

// TestImageDeletedWhileMounted: the HOME image file is deleted while it is
// loop-mounted; its blocks live only in the loop device. The next turn
// copies them back into a new image before releasing the device, and the
// kept state is all there.
func TestImageDeletedWhileMounted(t *testing.T) {
	e := newEnv(t, itest.Socket(), "")
	task := e.Task("imgdel")
	s := plant(e, task)
	mountHome(e, task)
	assert.NilError(t, os.Remove(image(e, task)))
	// Positive control: the image is gone from the file system and lives
	// on in a loop device only.
	atts := attachments(e)
	assert.Equal(t, len(atts), 1)
	assert.Assert(t, atts[0].Deleted, "%v", atts[0])
	_, err := os.Stat(image(e, task))
	assert.Assert(t, os.IsNotExist(err))

	kept(e, task, s)
	_, err = os.Stat(image(e, task))
	assert.NilError(t, err, "the image was copied back")
	assert.Equal(t, attachedAfter(e), 0)
}

// TestImageGone: the image deleted (and nothing holds it): the turn refuses
// with one line naming `shrooms forget`, which then removes everything,
// and the task starts over.
func TestImageGone(t *testing.T) {
	e := newEnv(t, itest.Socket(), "")
	task := e.Task("imggone")
	plant(e, task)
	// Nothing holds it (else the turn copies it back from the loop device).
	assert.Equal(t, attachedAfter(e), 0)
	assert.NilError(t, os.Remove(image(e, task)))
	code, out, stderr := keepTurn(e, task, "echo should-not-run")
	assert.Equal(t, code, 122, "%s %s", out, stderr)
	assert.Assert(t, !strings.Contains(out, "should-not-run"))
	oneLine(t, stderr, "shrooms forget --task "+task)
	code, out, stderr = e.CLI("forget", "--task", task)
	assert.Equal(t, code, 0, "%s %s", out, stderr)
	s := plant(e, task)
	kept(e, task, s)
}

// TestNoLoopDeviceBetweenTurns: N turns of N tasks leave no loop device
// attached; during a turn its HOME's one is (positive control). A HOME
// left mounted by a killed shrooms is released by gc.
func TestNoLoopDeviceBetweenTurns(t *testing.T) {
	e := newEnv(t, itest.Socket(), "")
	const n = 3
	for turn := 0; turn < n; turn++ {
		for i := 0; i < n; i++ {
			task := e.Task(string(rune('a' + i)))
			code, out, stderr := keepTurn(e, task, "touch ~/x")
			assert.Equal(t, code, 0, "%s %s", out, stderr)
			assert.Equal(t, attachedAfter(e), 0, "after turn %d of task %d: %v", turn+1, i, attachments(e))
		}
	}
	// Positive control: while a turn runs, its HOME is attached.
	task := e.Task("a")
	c := e.Command("run", "--task", task, "--agent", "keep", "--no-stdin", "--", "-c", "sleep 60")
	assert.NilError(t, c.Start())
	deadline := time.Now().Add(60 * time.Second)
	for len(attachments(e)) == 0 && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	assert.Equal(t, len(attachments(e)), 1, "no loop device while a turn runs")
	// shrooms killed: its HOME stays mounted until gc (or the next turn).
	time.Sleep(time.Second)
	assert.NilError(t, c.Process.Kill())
	_ = c.Wait()
	assert.Equal(t, len(attachments(e)), 1)
	assert.Assert(t, secret(e, task), "positive control: the killed turn left its token secret")
	// A process sitting in the HOME: gc cannot release it, says so, fails.
	mp := volumePath(e, task)
	sleeper := exec.Command("sleep", "300")
	sleeper.Dir = mp
	assert.NilError(t, sleeper.Start())
	defer func() { _ = sleeper.Process.Kill(); _ = sleeper.Wait() }()
	code, out, stderr := e.CLI("gc")
	assert.Equal(t, code, 122, "gc with a busy HOME: %s %s", out, stderr)
	oneLine(t, stderr, "umount "+mp)
	_ = sleeper.Process.Kill()
	_ = sleeper.Wait()
	code, out, stderr = e.CLI("gc")
	assert.Equal(t, code, 0, "%s %s", out, stderr)
	assert.Assert(t, strings.Contains(out, "released HOME"), out)
	assert.Equal(t, attachedAfter(e), 0)
	assert.Assert(t, !secret(e, task), "gc left the token secret")
}

// TestStateDirLost: a task whose state dir was deleted keeps running on
// its HOME (kept state intact, new turn counter); and when its volume is
// gone too, `forget` still finds and removes its image.
func TestStateDirLost(t *testing.T) {
	e := newEnv(t, itest.Socket(), "")
	task := e.Task("stateless")
	s := plant(e, task)
	assert.NilError(t, os.RemoveAll(filepath.Join(e.State, "tasks", task)))
	kept(e, task, s)

	assert.NilError(t, os.RemoveAll(filepath.Join(e.State, "tasks", task)))
	out, err := e.Podman("volume", "rm", "-f", e.Volume(task))
	assert.NilError(t, err, out)
	// Positive control: nothing of the task but its image is left.
	code, _, stderr := e.CLI("status", "--task", task)
	assert.Assert(t, code != 0, "status knows the task")
	_, err = os.Stat(image(e, task))
	assert.NilError(t, err)
	code, out, stderr = e.CLI("forget", "--task", task)
	assert.Equal(t, code, 0, "%s %s", out, stderr)
	_, err = os.Stat(image(e, task))
	assert.Assert(t, os.IsNotExist(err), "image left")
	code, out, _ = e.CLI("--json", "forget", "--task", task)
	assert.Equal(t, code, 0, "forgetting a task of which nothing is left is done already")
	assert.Assert(t, strings.Contains(out, `"forgotten":false`), out)
}

// TestPreparedCageDrift: a prepared cage keeps its HOME mounted while it
// waits (gc leaves both), and runs prepared. A prepared cage whose HOME was
// unmounted behind shrooms' back is not used: the turn runs in a fresh
// cage on the remounted HOME, with every kept credential and session, and
// nothing is left attached.
func TestPreparedCageDrift(t *testing.T) {
	e := newEnv(t, itest.Socket(), "")
	task := e.Task("prep")
	s := plant(e, task)
	prepare := func() {
		t.Helper()
		code, out, stderr := e.CLI("prepare", "--task", task, "--agent", "keep", "--no-stdin")
		assert.Equal(t, code, 0, "%s %s", out, stderr)
		e.WaitIdle(task)
	}
	prepared := func(script string) (bool, string) {
		t.Helper()
		code, out, stderr := e.CLI("--json", "run", "--task", task, "--agent", "keep", "--no-stdin", "--", "-c", script)
		assert.Equal(t, code, 0, "%s %s", out, stderr)
		e.WaitIdle(task)
		return strings.Contains(out, `"prepared":true`), out
	}

	prepare()
	assert.Equal(t, len(attachments(e)), 1, "a waiting prepared cage holds its HOME")
	code, out, stderr := e.CLI("gc")
	assert.Equal(t, code, 0, "%s %s", out, stderr)
	assert.Equal(t, len(attachments(e)), 1, "gc released the HOME of a waiting prepared cage")
	ok, out := prepared("cat ~/.claude/.credentials.json")
	assert.Assert(t, ok, "positive control: the prepared cage runs: %s", out)
	assert.Assert(t, strings.Contains(out, s.claude), out)
	assert.Equal(t, attachedAfter(e), 0)

	prepare()
	mp := volumePath(e, task)
	assert.NilError(t, unix.Unmount(mp, 0))
	ok, out = prepared("cat ~/.claude/.credentials.json ~/" + sessionPath)
	assert.Assert(t, !ok, "a prepared cage ran on a HOME unmounted under it: %s", out)
	assert.Assert(t, strings.Contains(out, s.claude) && strings.Contains(out, s.session), out)
	assert.Equal(t, attachedAfter(e), 0)
	out, _ = e.Podman("ps", "-a", "--filter", "label=io.shrooms.task="+task, "--format", "{{.Names}}")
	assert.Equal(t, strings.TrimSpace(out), "", "cages left")
}

// TestWorktreeClaimLost: shrooms killed mid-turn leaves the worktree with
// the task's user; its claim (the record of the owner) deleted, the next
// turn refuses with one line saying to chown it back (it cannot know to
// whom), and once that is done the task runs again.
func TestWorktreeClaimLost(t *testing.T) {
	e := newEnv(t, itest.Socket(), "")
	task := e.Task("claim")
	wt := filepath.Join(e.Dir, "work", "wt")
	assert.NilError(t, os.MkdirAll(wt, 0o755))
	assert.NilError(t, os.WriteFile(filepath.Join(wt, "file"), []byte("x"), 0o644))
	c := e.Command("run", "--task", task, "--agent", "keep", "--no-stdin", "--worktree", wt, "--", "-c", "sleep 100")
	assert.NilError(t, c.Start())
	waitCage(e, task)
	assert.NilError(t, c.Process.Kill())
	_ = c.Wait()
	var st unix.Stat_t
	assert.NilError(t, unix.Stat(wt, &st))
	assert.Assert(t, st.Uid != 0, "positive control: the killed turn left the worktree with the task's user")
	claims, err := filepath.Glob(filepath.Join(e.State, "worktrees", "*.json"))
	assert.NilError(t, err)
	assert.Equal(t, len(claims), 1)
	assert.NilError(t, os.Remove(claims[0]))

	code, out, stderr := e.CLI("run", "--task", task, "--agent", "keep", "--no-stdin", "--worktree", wt, "--", "-c", "echo should-not-run")
	assert.Assert(t, code != 0, "%s %s", out, stderr)
	assert.Assert(t, !strings.Contains(out, "should-not-run"))
	oneLine(t, stderr, "chown -R")
	out2, err := exec.Command("chown", "-R", "0:0", wt).CombinedOutput()
	assert.NilError(t, err, string(out2))
	code, out, stderr = e.CLI("run", "--task", task, "--agent", "keep", "--no-stdin", "--worktree", wt, "--", "-c", "cat /work/file")
	assert.Equal(t, code, 0, "%s %s", out, stderr)
	e.WaitIdle(task)
	assert.NilError(t, unix.Stat(wt, &st))
	assert.Equal(t, st.Uid, uint32(0), "the worktree was given back")
}
