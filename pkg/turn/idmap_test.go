package turn

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"gotest.tools/v3/assert"

	"github.com/shrooms-cage/shrooms/internal/itest"
	"github.com/shrooms-cage/shrooms/pkg/podman"
	"github.com/shrooms-cage/shrooms/pkg/taskid"
	"github.com/shrooms-cage/shrooms/pkg/worktree"
)

// idmapTree is ownedTree (uid 4242, below the test's root-only temp
// directory: no other user can reach it) with a nested repository of the
// owner and a file of root.
func idmapTree(t *testing.T, e *itest.Env, runner *Runner) string {
	t.Helper()
	itest.Require(t, itest.Root)
	wt := ownedTree(t, e, runner)
	for _, d := range []string{"sub", "sub/.git", "sub/.git/objects", "sub/.git/refs"} {
		assert.NilError(t, os.Mkdir(filepath.Join(wt, d), 0o755))
	}
	for _, f := range []string{"sub/.git/HEAD", "sub/.git/config", "sub/file"} {
		assert.NilError(t, os.WriteFile(filepath.Join(wt, f), []byte("x\n"), 0o644))
	}
	for _, p := range []string{"sub", "sub/.git", "sub/.git/objects", "sub/.git/refs", "sub/.git/HEAD", "sub/.git/config", "sub/file"} {
		assert.NilError(t, os.Lchown(filepath.Join(wt, p), 4242, 4242))
	}
	assert.NilError(t, os.WriteFile(filepath.Join(wt, "rootfile"), nil, 0o644))
	return wt
}

// staged reports whether the task's staging directory has a mount (the
// worktree's files show through it).
func staged(t *testing.T, runner *Runner, task string) bool {
	t.Helper()
	_, err := os.Lstat(filepath.Join(mustHolder(t, runner, task).StagingDir(), "src"))
	return err == nil
}

func uidOf(t *testing.T, p string) uint32 {
	t.Helper()
	fi, err := os.Lstat(p)
	assert.NilError(t, err)
	return fi.Sys().(*syscall.Stat_t).Uid
}

// asUID runs argv as uid:uid and returns its combined output and error.
func asUID(uid uint32, argv ...string) (string, error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid}}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

const idmapScript = `set -e
stat -c '%u' /work/src/main.go
echo edited >> /work/src/main.go
echo y > /work/new.txt
echo s > /work/suid && chmod 4755 /work/suid
if echo x >> /work/sub/.git/config 2>/dev/null; then echo NESTED-WRITABLE; else echo nested-ro; fi
if echo x >> /work/rootfile 2>/dev/null; then echo ROOTFILE-WRITABLE; else echo rootfile-ro; fi
echo w >> /work/sub/file
mkdir -p /work/made/.git/objects /work/made/.git/refs && echo ref > /work/made/.git/HEAD
echo up
while [ ! -e /work/go ]; do sleep 0.05; done
`

// TestIdmappedWorktree: with the idmapped mount the cage's agent owns and
// writes the owner's files, what it makes lands owned by the owner, root's
// file and the owner's nested repository stay read-only (their neighbours
// writable), nothing is chowned; while the turn runs the setuid file it made
// is on the host but no other user can reach it (with the gate open they
// could: the positive control); after the turn the setuid bit is gone, the
// nested repository it made is the task's, and no staging mount is left.
func TestIdmappedWorktree(t *testing.T) {
	e, runner := newHarness(t, "")
	wt := idmapTree(t, e, runner)
	task := e.Task("idm")
	pr, pw, err := os.Pipe()
	assert.NilError(t, err)
	defer pr.Close()
	var out bytes.Buffer
	window := make(chan error, 1)
	go func() {
		defer close(window)
		buf := make([]byte, 4096)
		got := ""
		for !strings.Contains(got, "up\n") {
			n, err := pr.Read(buf)
			if err != nil {
				window <- err
				return
			}
			got += string(buf[:n])
			out.Write(buf[:n])
		}
		// The window: the setuid file is the owner's on the host now...
		fi, err := os.Stat(filepath.Join(wt, "suid"))
		if err != nil || fi.Mode()&os.ModeSetuid == 0 {
			window <- err
			t.Errorf("positive control: the cage's setuid file on the host during the turn: %v %v", fi, err)
		}
		// ...and nobody else reaches it: the gate (a root-only parent).
		o, err := asUID(5555, "/bin/ls", "-l", filepath.Join(wt, "suid"))
		if err == nil || !strings.Contains(o, "Permission denied") {
			t.Errorf("another user reached the worktree during the turn: %s %v", o, err)
		}
		// The positive control: with the gate open they would.
		gates := []string{filepath.Dir(wt), filepath.Dir(filepath.Dir(wt))}
		for _, g := range gates {
			_ = os.Chmod(g, 0o755)
		}
		o, err = asUID(5555, "/bin/ls", "-l", filepath.Join(wt, "suid"))
		for _, g := range gates {
			_ = os.Chmod(g, 0o700)
		}
		if err != nil || !strings.Contains(o, "rws") {
			t.Errorf("positive control: with the gate open another user sees the setuid file: %s %v", o, err)
		}
		_, _ = pr.Read(buf[:0])
		window <- os.WriteFile(filepath.Join(wt, "go"), nil, 0o644)
		// Drain the rest.
		for {
			n, err := pr.Read(buf)
			out.Write(buf[:n])
			if err != nil {
				return
			}
		}
	}()
	var errb bytes.Buffer
	res, err := runner.Run(context.Background(), Request{
		Task: taskid.Must(task), Agent: "shell", Worktree: wt, Args: []string{"-c", idmapScript},
		Streams: podman.Streams{Stdout: pw, Stderr: &errb},
	})
	pw.Close()
	assert.NilError(t, <-window)
	for range window {
	}
	assert.NilError(t, err, errb.String())
	assert.Equal(t, res.ExitCode, 0, out.String()+errb.String())
	assert.Equal(t, out.String(), "1000\nnested-ro\nrootfile-ro\nup\n", "in the cage the agent owns the owner's files")
	assert.Assert(t, res.Worktree != nil && res.Worktree.Idmapped, "%+v", res.Worktree)
	// The give-back looked only at what the turn's events name.
	assert.Equal(t, res.WorktreeChanges.ScanAfter, "events")
	assert.Equal(t, res.Worktree.GivenBack, 0)
	assert.Equal(t, res.Worktree.Stripped, 1)
	assert.DeepEqual(t, res.Worktree.KeptNestedRepos, []string{"made/.git"})

	for _, p := range []string{"src/main.go", "new.txt", "suid", "sub/file", "made"} {
		assert.Equal(t, uidOf(t, filepath.Join(wt, p)), uint32(4242), p)
	}
	b, err := os.ReadFile(filepath.Join(wt, "src", "main.go"))
	assert.NilError(t, err)
	assert.Equal(t, string(b), "package main\nedited\n")
	b, err = os.ReadFile(filepath.Join(wt, "sub/.git/config"))
	assert.NilError(t, err)
	assert.Equal(t, string(b), "x\n", "the owner's nested repository is unchanged")
	fi, err := os.Stat(filepath.Join(wt, "suid"))
	assert.NilError(t, err)
	assert.Equal(t, fi.Mode()&(os.ModeSetuid|os.ModeSetgid), os.FileMode(0), "no setuid bit after the turn")
	ids, err := runner.Store.TaskIDs(taskid.Must(task), runner.IDFiles, false)
	assert.NilError(t, err)
	agent := ids.UID + uint32(runner.Cfg.Cage.User)
	for _, p := range []string{"made/.git", "made/.git/HEAD", "made/.git/objects"} {
		assert.Equal(t, uidOf(t, filepath.Join(wt, p)), agent, p)
	}
	fi, err = os.Stat(filepath.Join(wt, "made/.git"))
	assert.NilError(t, err)
	assert.Equal(t, fi.Mode().Perm()&0o007, os.FileMode(0))
	assert.Assert(t, !staged(t, runner, task), "no staging mount after the turn")

	// The fallback, forced: the same worktree by the chown walks.
	runner.Cfg.Worktree.Idmap = "off"
	res, o, eo, err := sh(runner, task, wt, "stat -c %u /work/src/main.go; echo z > /work/fallback")
	assert.NilError(t, err, eo)
	assert.Equal(t, o, "1000\n")
	assert.Assert(t, !res.Worktree.Idmapped && res.Worktree.GivenBack > 0, "%+v", res.Worktree)
	assert.Equal(t, uidOf(t, filepath.Join(wt, "fallback")), uint32(4242))
}

// TestIdmapLeftoverStagingIsCleared: a turn killed after its staging mount
// was made (its give-back never ran) leaves the mount; gc's give-back
// detaches it, and so does the next turn's take.
func TestIdmapLeftoverStagingIsCleared(t *testing.T) {
	e, runner := newHarness(t, "")
	wt := idmapTree(t, e, runner)
	task := e.Task("kill")
	_, _, eo, err := sh(runner, task, wt, "true")
	assert.NilError(t, err, eo)
	ids, err := runner.Store.TaskIDs(taskid.Must(task), runner.IDFiles, false)
	assert.NilError(t, err)
	take := func() {
		lock, err := runner.Store.LockTask(taskid.Must(task))
		assert.NilError(t, err)
		defer lock.Release()
		_, err = runner.claims().TakeIdmapped(context.Background(), mustHolder(t, runner, task), wt, ids, true, nil)
		assert.NilError(t, err)
	}
	take()
	assert.Assert(t, staged(t, runner, task), "positive control: the killed turn's staging mount")
	_, err = runner.claims().GiveBackIdle()
	assert.NilError(t, err)
	assert.Assert(t, !staged(t, runner, task), "gc detached it")

	take()
	assert.Assert(t, staged(t, runner, task))
	// What the killed turn made, as its cage would have: a setuid file
	// and a nested repository, the owner's on disk.
	for _, d := range []string{"killed", "killed/.git", "killed/.git/objects", "killed/.git/refs"} {
		assert.NilError(t, os.Mkdir(filepath.Join(wt, d), 0o755))
		assert.NilError(t, os.Lchown(filepath.Join(wt, d), 4242, 4242))
	}
	assert.NilError(t, os.WriteFile(filepath.Join(wt, "killed/.git/HEAD"), nil, 0o644))
	assert.NilError(t, os.WriteFile(filepath.Join(wt, "killed/s"), nil, 0o755))
	assert.NilError(t, os.Lchown(filepath.Join(wt, "killed/s"), 4242, 4242))
	assert.NilError(t, syscall.Chmod(filepath.Join(wt, "killed/s"), 0o4755))
	res, o, eo, err := sh(runner, task, wt, "echo ok > /work/after; if { echo x >> /work/killed/.git/HEAD; } 2>/dev/null; then echo KILLED-WRITABLE; fi")
	assert.NilError(t, err, eo+o)
	assert.Equal(t, o, "")
	assert.Assert(t, res.Worktree.Idmapped)
	assert.Assert(t, !staged(t, runner, task), "the next turn detached it")
	assert.Equal(t, uidOf(t, filepath.Join(wt, "after")), uint32(4242))
	// The next turn gave the killed one back first: its repository is the
	// task's, its setuid bit gone.
	assert.Assert(t, uidOf(t, filepath.Join(wt, "killed/.git")) != 4242)
	fi, err := os.Stat(filepath.Join(wt, "killed/s"))
	assert.NilError(t, err)
	assert.Equal(t, fi.Mode()&os.ModeSetuid, os.FileMode(0))
}

// TestIdmapPreparedCage: a cage prepared ahead gets the idmapped worktree
// at its init and the staging mount goes right after; its turn writes as
// the owner. A nested repository the owner adds between the preparation
// and the turn refuses the prepared cage's turn (it would be writable).
func TestIdmapPreparedCage(t *testing.T) {
	e, runner := newHarness(t, "")
	runner.Binary = itest.ShroomsBinary(t)
	wt := idmapTree(t, e, runner)
	task := e.Task("prep")
	ctx := context.Background()
	req := func(script string, out *bytes.Buffer) Request {
		return Request{Task: taskid.Must(task), Agent: "shell", Worktree: wt, Args: []string{"-c", script}, Streams: podman.Streams{Stdout: out, Stderr: out}}
	}
	var out bytes.Buffer
	_, err := runner.Run(ctx, req("true", &out))
	assert.NilError(t, err, out.String())
	_, err = runner.PrepareNext(ctx, req("echo p > /work/prep.txt; stat -c %u /work/prep.txt", nil))
	assert.NilError(t, err)
	assert.Assert(t, !staged(t, runner, task), "the prepared cage's staging mount is detached after its init")
	out.Reset()
	res, err := runner.Run(ctx, req("echo p > /work/prep.txt; stat -c %u /work/prep.txt", &out))
	assert.NilError(t, err, out.String())
	assert.Assert(t, res.Prepared, "the prepared cage ran the turn")
	assert.Equal(t, out.String(), "1000\n")
	assert.Assert(t, res.Worktree.Idmapped)
	assert.Equal(t, uidOf(t, filepath.Join(wt, "prep.txt")), uint32(4242))

	_, err = runner.PrepareNext(ctx, req("echo x >> /work/late/.git/config && echo LATE-WRITABLE", nil))
	assert.NilError(t, err)
	for _, d := range []string{"late", "late/.git", "late/.git/objects", "late/.git/refs"} {
		assert.NilError(t, os.Mkdir(filepath.Join(wt, d), 0o755))
		assert.NilError(t, os.Lchown(filepath.Join(wt, d), 4242, 4242))
	}
	assert.NilError(t, os.WriteFile(filepath.Join(wt, "late/.git/config"), nil, 0o644))
	assert.NilError(t, os.Lchown(filepath.Join(wt, "late/.git/config"), 4242, 4242))
	out.Reset()
	_, err = runner.Run(ctx, req("echo x >> /work/late/.git/config && echo LATE-WRITABLE", &out))
	assert.ErrorContains(t, err, "nested git repositories changed since its cage was prepared")
	assert.Assert(t, !strings.Contains(out.String(), "LATE-WRITABLE"))
	b, _ := os.ReadFile(filepath.Join(wt, "late/.git/config"))
	assert.Equal(t, string(b), "")
	// The next turn gets a fresh cage, with the new nested repository read-only.
	out.Reset()
	res, err = runner.Run(ctx, req("if { echo x >> /work/late/.git/config; } 2>/dev/null; then echo LATE-WRITABLE; else echo late-ro; fi", &out))
	assert.NilError(t, err, out.String())
	assert.Assert(t, !res.Prepared)
	assert.Equal(t, out.String(), "late-ro\n")
}

// TestIdmapGitWorkTree: a git work tree of the owner, idmapped, with its
// .git the read-only bind pkg/gitseal makes: git works in the cage and the
// commit lands owned by the owner.
func TestIdmapGitWorkTree(t *testing.T) {
	e, runner := newHarness(t, "")
	wt := idmapTree(t, e, runner)
	o, err := exec.Command("git", "init", "-q", wt).CombinedOutput()
	assert.NilError(t, err, string(o))
	assert.NilError(t, filepath.WalkDir(filepath.Join(wt, ".git"), func(p string, _ os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, 4242, 4242)
	}))
	res, out, eo, err := sh(runner, e.Task("git"), wt, "git -C /work status --short | head -3; echo z > /work/z")
	assert.NilError(t, err, eo+out)
	assert.Assert(t, res.Worktree.Idmapped)
	assert.Equal(t, uidOf(t, filepath.Join(wt, "z")), uint32(4242))
}

// TestIdmapGateOpenedFallsBack: a worktree other users can reach again (its
// closed parent opened) gets the chown walks from the next turn on, also
// when a cage was prepared for it while it was closed (that cage is not
// used: its /work is the idmapped mount).
func TestIdmapGateOpenedFallsBack(t *testing.T) {
	e, runner := newHarness(t, "")
	runner.Binary = itest.ShroomsBinary(t)
	wt := idmapTree(t, e, runner)
	task := e.Task("gate")
	res, _, eo, err := sh(runner, task, wt, "true")
	assert.NilError(t, err, eo)
	assert.Assert(t, res.Worktree.Idmapped, "positive control: closed, it is idmapped")
	_, err = runner.PrepareNext(context.Background(), Request{Task: taskid.Must(task), Agent: "shell", Worktree: wt, Args: []string{"-c", "echo x > /work/opened"}})
	assert.NilError(t, err)
	gates := []string{filepath.Dir(wt), filepath.Dir(filepath.Dir(wt))}
	for _, g := range gates {
		assert.NilError(t, os.Chmod(g, 0o755))
	}
	t.Cleanup(func() {
		for _, g := range gates {
			_ = os.Chmod(g, 0o700)
		}
	})
	res, _, eo, err = sh(runner, task, wt, "echo x > /work/opened")
	assert.NilError(t, err, eo)
	assert.Assert(t, !res.Prepared, "the cage prepared on the idmapped mount is not used")
	assert.Assert(t, !res.Worktree.Idmapped && res.Worktree.GivenBack > 0, "%+v", res.Worktree)
	assert.Equal(t, uidOf(t, filepath.Join(wt, "opened")), uint32(4242))
}

// mustHolder is the worktree claims' Holder of task.
func mustHolder(t *testing.T, runner *Runner, task string) worktree.Holder {
	t.Helper()
	h, err := runner.claims().Holder(taskid.Must(task))
	assert.NilError(t, err)
	return h
}
