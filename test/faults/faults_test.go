package faults_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"gotest.tools/v3/assert"

	"github.com/shrooms-cage/shrooms/internal/itest"
)

// TestPodmanServiceStopped: with its podman service stopped, a turn exits
// 122 at once with one line naming the service; started again, the next
// turn has every kept credential and session.
func TestPodmanServiceStopped(t *testing.T) {
	svc := itest.StartServiceWith(t)
	e := newEnv(t, svc.URI, "")
	task := e.Task("svc")
	s := plant(e, task)
	svc.Stop()
	start := time.Now()
	code, out, stderr := keepTurn(e, task, "echo should-not-run")
	assert.Equal(t, code, 122, "%s %s", out, stderr)
	assert.Assert(t, time.Since(start) < 30*time.Second, "took %v", time.Since(start))
	assert.Assert(t, !strings.Contains(out, "should-not-run"))
	oneLine(t, stderr, strings.TrimPrefix(svc.URI, "unix://"))
	assert.Equal(t, attachedAfter(e), 0)
	svc.Start()
	kept(e, task, s)
}

// waitCage waits for the task's running cage and returns the pid of its
// conmon and of its first process.
func waitCage(e *itest.Env, task string) (conmon, pid int) {
	e.T.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		out, err := e.Podman("ps", "--filter", "label=io.shrooms.task="+task, "--format", "{{.ID}}")
		if id := strings.TrimSpace(out); err == nil && id != "" {
			out, err = e.Podman("inspect", "--format", "{{.State.ConmonPid}} {{.State.Pid}}", strings.Fields(id)[0])
			f := strings.Fields(out)
			if err == nil && len(f) == 2 && f[1] != "0" {
				c, _ := strconv.Atoi(f[0])
				p, _ := strconv.Atoi(f[1])
				return c, p
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	e.T.Fatalf("no running cage of %s", task)
	return 0, 0
}

// TestCageOrConmonKilled: the cage's process killed in the middle of a
// turn ends the turn at once; its conmon killed, by the turn's deadline
// (non-zero either way, its cage removed); the next turn has every kept
// credential and session.
func TestCageOrConmonKilled(t *testing.T) {
	e := newEnv(t, itest.Socket(), "")
	for _, victim := range []string{"cage", "conmon"} {
		t.Run(victim, func(t *testing.T) {
			task := e.Task("kill-" + victim)
			s := plant(e, task)
			// A deadline of its own: with its conmon gone podman cannot
			// report the cage's exit, and the turn waits for it (riding
			// through what looks like a podman outage) until its deadline.
			c := e.Command("run", "--task", task, "--agent", "keep", "--no-stdin", "--timeout", "20s", "--", "-c", "echo started; sleep 100")
			var cout strings.Builder
			c.Stdout, c.Stderr = &cout, &cout
			start := time.Now()
			assert.NilError(t, c.Start())
			conmon, pid := waitCage(e, task)
			target := pid
			if victim == "conmon" {
				target = conmon
			}
			assert.NilError(t, unix.Kill(target, unix.SIGKILL))
			done := make(chan error, 1)
			go func() { done <- c.Wait() }()
			select {
			case err := <-done:
				t.Logf("%s killed: the turn ended after %v: %v: %s", victim, time.Since(start).Round(time.Second), err, strings.TrimSpace(cout.String()))
				assert.Assert(t, err != nil, "the turn reported success after its %s was killed", victim)
				if victim == "cage" {
					assert.Assert(t, time.Since(start) < 15*time.Second, "the turn outlived its cage")
				}
			case <-time.After(90 * time.Second):
				_ = c.Process.Kill()
				t.Fatalf("the turn did not end after its %s was killed", victim)
			}
			e.WaitIdle(task)
			out, _ := e.Podman("ps", "-a", "--filter", "label=io.shrooms.task="+task, "--format", "{{.Names}}")
			if strings.TrimSpace(out) != "" {
				// A cage whose conmon died may outlive the turn; the next
				// turn (or gc) removes it.
				t.Logf("left after the kill: %s", out)
			}
			kept(e, task, s)
			out, _ = e.Podman("ps", "-a", "--filter", "label=io.shrooms.task="+task, "--format", "{{.Names}}")
			assert.Equal(t, strings.TrimSpace(out), "", "cages left after the next turn")
		})
	}
}

// TestLockFileDeleted: the task's lock file deleted while a turn runs does
// not let a second turn in (exit 123); the positive control shows a fresh
// lock file at the same path is free to lock. The next turn works.
func TestLockFileDeleted(t *testing.T) {
	e := newEnv(t, itest.Socket(), "")
	task := e.Task("lock")
	s := plant(e, task)
	c := e.Command("run", "--task", task, "--agent", "keep", "--no-stdin", "--", "-c", "sleep 5")
	assert.NilError(t, c.Start())
	waitCage(e, task)
	lock := filepath.Join(e.State, "tasks", task, "lock")
	assert.NilError(t, os.Remove(lock))
	// Positive control: a lock file made anew is not locked by anyone.
	f, err := os.OpenFile(lock, os.O_RDWR|os.O_CREATE, 0o600)
	assert.NilError(t, err)
	assert.NilError(t, unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB), "positive control: the new lock file is free")
	assert.NilError(t, unix.Flock(int(f.Fd()), unix.LOCK_UN))
	f.Close()
	code, out, stderr := keepTurn(e, task, "echo overlapped")
	assert.Equal(t, code, 123, "a second turn ran alongside: %s %s", out, stderr)
	assert.Assert(t, !strings.Contains(out, "overlapped"))
	assert.NilError(t, c.Wait())
	// The first turn's detached teardown holds the task directory's lock
	// (and the deleted lock file) until it is done; the next turn would be
	// refused as busy until then, so wait for it.
	dir, err := os.Open(filepath.Join(e.State, "tasks", task))
	assert.NilError(t, err)
	defer dir.Close()
	deadline := time.Now().Add(2 * time.Minute)
	for unix.Flock(int(dir.Fd()), unix.LOCK_EX|unix.LOCK_NB) != nil {
		assert.Assert(t, time.Now().Before(deadline), "the teardown never released the task directory")
		time.Sleep(50 * time.Millisecond)
	}
	assert.NilError(t, unix.Flock(int(dir.Fd()), unix.LOCK_UN))
	kept(e, task, s)
}

// TestRebootSimulated: shrooms killed mid-turn, then a "reboot": the cage
// is gone, HOME unmounted, the outbox tmpfs dropped, the state dir kept.
// The next turn works and has every kept credential and session.
func TestRebootSimulated(t *testing.T) {
	e := newEnv(t, itest.Socket(), "")
	task := e.Task("reboot")
	s := plant(e, task)
	c := e.Command("run", "--task", task, "--agent", "keep", "--no-stdin", "--", "-c", "sleep 100")
	assert.NilError(t, c.Start())
	waitCage(e, task)
	assert.NilError(t, c.Process.Kill())
	_ = c.Wait()
	// The reboot: every process and mount goes; the state dir stays.
	out, err := e.Podman("ps", "-aq", "--filter", "label=io.shrooms.task="+task)
	assert.NilError(t, err, out)
	for _, id := range strings.Fields(out) {
		out, err := e.RemoveCage(id)
		assert.NilError(t, err, out)
	}
	atts := attachments(e)
	assert.Equal(t, len(atts), 1, "positive control: the killed turn left HOME mounted")
	for _, m := range atts[0].Mounts {
		if m.NS == "" {
			assert.NilError(t, unix.Unmount(m.Point, 0))
		}
	}
	outbox := filepath.Join(e.Dir, "outbox", task)
	if _, err := os.Stat(outbox); err == nil {
		_ = unix.Unmount(outbox, unix.MNT_DETACH)
		assert.NilError(t, os.RemoveAll(outbox))
	}
	kept(e, task, s)
	assert.Equal(t, attachedAfter(e), 0)
}

// TestHostDiskFull: the state dir (and with it the HOME images) on a small
// filesystem the test makes, filled to the last block: before the reset
// and during the turn. No kept credential or session is lost, and once
// there is room again the next turn works.
func TestHostDiskFull(t *testing.T) {
	itest.Require(t, itest.Root)
	fs := t.TempDir()
	assert.NilError(t, unix.Mount("tmpfs", fs, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "size=24m,mode=0700"))
	t.Cleanup(func() { _ = unix.Unmount(fs, unix.MNT_DETACH) })
	e := newEnv(t, itest.Socket(), filepath.Join(fs, "state"))
	task := e.Task("full")
	s := plant(e, task)
	filler := filepath.Join(fs, "filler")
	fill := func() {
		t.Helper()
		f, err := os.OpenFile(filler, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
		assert.NilError(t, err)
		defer f.Close()
		buf := make([]byte, 64<<10)
		for {
			if _, err := f.Write(buf); err != nil {
				assert.Assert(t, strings.Contains(err.Error(), "no space"), "%v", err)
				return
			}
		}
	}

	// Full before the reset.
	fill()
	code, out, stderr := keepTurn(e, task, "echo ran; cat ~/.claude/.credentials.json")
	t.Logf("turn on a full disk: exit %d: %s %s", code, out, stderr)
	if code != 0 {
		assert.Equal(t, code, 122)
		// The reset's ENOSPC names the filesystem to free; mounting HOME on
		// a full disk fails earlier, with an I/O error.
		if strings.Contains(stderr, "no space left") {
			oneLine(t, stderr, "free space on the filesystem of "+filepath.Join(e.State, "homes"))
		}
		assert.Assert(t, !strings.Contains(strings.TrimSpace(stderr), "\n"), stderr)
	}
	assert.NilError(t, os.Remove(filler))
	kept(e, task, s)

	// Full during the turn: the turn writes into HOME while the host
	// filesystem under the image has no room.
	c := e.Command("run", "--task", task, "--agent", "keep", "--no-stdin", "--", "-c", "sleep 3; dd if=/dev/urandom of=$HOME/big bs=64k count=512 2>&1; sync; echo dd=$?")
	var tout strings.Builder
	c.Stdout, c.Stderr = &tout, &tout
	assert.NilError(t, c.Start())
	waitCage(e, task)
	fill()
	err := c.Wait()
	e.WaitIdle(task)
	t.Logf("turn while the disk is full: %v: %s", err, tout.String())
	assert.NilError(t, os.Remove(filler))
	code, out, stderr = keepTurn(e, task, "cat ~/.claude/.credentials.json ~/.local/share/opencode/auth.json")
	t.Logf("turn after the disk had room again: exit %d: %s %s", code, out, stderr)
	kept(e, task, s)
}

// TestHomeFullDuringReset: HOME filled to its last block and inode by root
// (the cage's user cannot touch root's reserve) before the reset: the reset
// fails with ENOSPC or carries on; either way no kept state is lost and a
// later turn works.
func TestHomeFullDuringReset(t *testing.T) {
	e := newEnv(t, itest.Socket(), "")
	task := e.Task("homefull")
	s := plant(e, task)
	mp := mountHome(e, task)
	junk := filepath.Join(mp, "home", "junk")
	assert.NilError(t, os.Mkdir(junk, 0o755))
	buf := make([]byte, 1<<20)
	f, err := os.Create(filepath.Join(junk, "big"))
	assert.NilError(t, err)
	for {
		if _, err := f.Write(buf); err != nil {
			break
		}
	}
	f.Close()
	for i := 0; ; i++ {
		if err := os.WriteFile(filepath.Join(junk, "f"+strconv.Itoa(i)), nil, 0o644); err != nil {
			break
		}
	}
	// Positive control: HOME is full for root too.
	err = os.WriteFile(filepath.Join(mp, "home", "one-more"), []byte("x"), 0o644)
	assert.Assert(t, err != nil, "HOME is not full")
	code, out, stderr := keepTurn(e, task, "echo ran")
	t.Logf("turn on a full HOME: exit %d: %s %s", code, out, stderr)
	if code != 0 {
		assert.Equal(t, code, 122)
		assert.Assert(t, !strings.Contains(strings.TrimSpace(stderr), "\n"), stderr)
	}
	kept(e, task, s)
}

// TestVolumesDiskFull: podman's own store (its volumes directory with it)
// on a small filesystem the test makes, through a podman service of the
// test's own, filled to the last block. A turn refuses (122, one line)
// and a new task's first turn leaves nothing behind; with room again the
// next turn has every kept credential and session.
func TestVolumesDiskFull(t *testing.T) {
	itest.Require(t, itest.Root, itest.Podman)
	fs := t.TempDir()
	assert.NilError(t, unix.Mount("tmpfs", fs, "tmpfs", unix.MS_NODEV, "size=48m,mode=0700"))
	t.Cleanup(func() { _ = unix.Unmount(fs, unix.MNT_DETACH) })
	run := t.TempDir()
	svc := itest.StartServiceWith(t, "--root", filepath.Join(fs, "storage"), "--runroot", run)
	// The test image, copied into the new store.
	tar := filepath.Join(t.TempDir(), "image.tar")
	out, err := exec.Command("podman", "--url", itest.Socket(), "save", "-o", tar, itest.TestImage).CombinedOutput()
	assert.NilError(t, err, string(out))
	out, err = exec.Command("podman", "--url", svc.URI, "load", "-i", tar).CombinedOutput()
	assert.NilError(t, err, string(out))
	t.Cleanup(func() { _ = exec.Command("podman", "--url", svc.URI, "rmi", "-f", itest.TestImage).Run() })

	e := newEnv(t, svc.URI, "")
	task := e.Task("volfull")
	s := plant(e, task)
	filler := filepath.Join(fs, "filler")
	f, err := os.Create(filler)
	assert.NilError(t, err)
	buf := make([]byte, 64<<10)
	for {
		if _, err := f.Write(buf); err != nil {
			break
		}
	}
	f.Close()
	// Positive control: the store's filesystem is full.
	assert.Assert(t, os.WriteFile(filepath.Join(fs, "one-more"), buf, 0o600) != nil, "not full")

	code, out2, stderr := keepTurn(e, task, "echo ran")
	t.Logf("turn with podman's store full: exit %d: %s %s", code, out2, stderr)
	assert.Equal(t, code, 122, "%s %s", out2, stderr)
	assert.Assert(t, !strings.Contains(strings.TrimSpace(stderr), "\n"), stderr)
	newTask := e.Task("volfull-new")
	code, out2, stderr = keepTurn(e, newTask, "echo ran")
	t.Logf("first turn of a new task with podman's store full: exit %d: %s %s", code, out2, stderr)
	assert.Equal(t, code, 122, "%s %s", out2, stderr)
	assert.Equal(t, attachedAfter(e), 0, "%v", attachments(e))

	assert.NilError(t, os.Remove(filler))
	kept(e, task, s)
	code, out2, stderr = keepTurn(e, newTask, "echo ran")
	assert.Equal(t, code, 0, "%s %s", out2, stderr)
}
