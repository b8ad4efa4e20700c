package turn

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"gotest.tools/v3/assert"

	"github.com/shrooms-cage/shrooms/internal/itest"
	"github.com/shrooms-cage/shrooms/pkg/podman"
	"github.com/shrooms-cage/shrooms/pkg/taskid"
)

// ownedTree makes a worktree owned by uid:gid 4242 inside a configured root.
func ownedTree(t *testing.T, e *itest.Env, runner *Runner) string {
	t.Helper()
	wt := filepath.Join(t.TempDir(), "wt")
	assert.NilError(t, os.MkdirAll(filepath.Join(wt, "src"), 0o755))
	assert.NilError(t, os.WriteFile(filepath.Join(wt, "src", "main.go"), []byte("package main\n"), 0o644))
	for _, p := range []string{wt, filepath.Join(wt, "src"), filepath.Join(wt, "src", "main.go")} {
		assert.NilError(t, os.Lchown(p, 4242, 4242))
	}
	runner.Cfg.Worktree.Roots = []string{filepath.Dir(wt)}
	return wt
}

// assertOwned walks the worktree and fails on any entry not owned by 4242.
func assertOwned(t *testing.T, wt string, want int) {
	t.Helper()
	n := 0
	err := filepath.WalkDir(wt, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		st := fi.Sys().(*syscall.Stat_t)
		assert.Equal(t, st.Uid, uint32(4242), p)
		assert.Equal(t, st.Gid, uint32(4242), p)
		n++
		return nil
	})
	assert.NilError(t, err)
	assert.Assert(t, n >= want, "walked %d entries, want at least %d", n, want)
}

const nested = `set -e
mkdir -p /work/a/b/c/d
echo x > /work/a/b/c/d/deep.txt
echo y > /work/new.txt
ln -s ../new.txt /work/a/link
mkfifo /work/a/fifo
echo edited >> /work/src/main.go
`

// TestWorktreeKeepsItsOwner: a worktree owned by uid 4242 is writable in the
// cage and is 4242's again, new nested files included, after a turn that
// exits, after one that hits its deadline, and after one interrupted.
func TestWorktreeKeepsItsOwner(t *testing.T) {
	e, runner := newHarness(t, "")
	wt := ownedTree(t, e, runner)
	runner.Cfg.Worktree.Idmap = "off" // the chown walks (the fallback); idmap_test.go has the idmapped mount

	res, out, errOut, err := sh(runner, e.Task("own"), wt, nested+"stat -c '%u' /work/new.txt")
	assert.NilError(t, err, errOut)
	assert.Equal(t, res.ExitCode, 0, out+errOut)
	assert.Equal(t, out, "1000\n", "positive control: in the cage the agent owns what it writes")
	// Under gVisor a FIFO made in a bind mount lives only in the Sentry
	// (measured: the host directory has no such entry), so one fewer.
	fifo := 1
	if itest.Runtime() == "runsc" {
		fifo = 0
		_, err := os.Lstat(filepath.Join(wt, "a", "fifo"))
		assert.Assert(t, os.IsNotExist(err), "under runsc the FIFO stays in the Sentry: %v", err)
	}
	assertOwned(t, wt, 10+fifo)
	assert.Assert(t, res.Worktree != nil)
	assert.Equal(t, res.Worktree.OwnerUID, uint32(4242))
	assert.Assert(t, !res.Worktree.Idmapped)
	assert.Assert(t, res.Worktree.GivenBack >= 10+fifo, "%+v", res.Worktree)
	b, err := os.ReadFile(filepath.Join(wt, "src", "main.go"))
	assert.NilError(t, err)
	assert.Equal(t, string(b), "package main\nedited\n", "the turn's work is there")

	// The deadline path: the cage is stopped, removed, and the tree given back.
	var outb, errb bytes.Buffer
	res, err = runner.Run(context.Background(), Request{
		Task: taskid.Must(e.Task("own")), Agent: "shell", Worktree: wt, Timeout: 3 * time.Second,
		Args:    []string{"-c", "mkdir -p /work/dl/x && echo z > /work/dl/x/f && echo up && sleep 600"},
		Streams: podman.Streams{Stdout: &outb, Stderr: &errb},
	})
	assert.Assert(t, errors.Is(err, ErrDeadline), "%v %s", err, errb.String())
	assert.Equal(t, res.Status, "deadline")
	assert.Equal(t, outb.String(), "up\n")
	assertOwned(t, wt, 13+fifo)

	// Interrupted (what SIGINT/SIGTERM do in the CLI: the context ends).
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pr, pw, err := os.Pipe()
	assert.NilError(t, err)
	defer pr.Close()
	go func() {
		buf := make([]byte, 3)
		_, _ = pr.Read(buf) // the files exist once the cage said "up"
		cancel()
	}()
	res, err = runner.Run(ctx, Request{
		Task: taskid.Must(e.Task("own")), Agent: "shell", Worktree: wt,
		Args:    []string{"-c", "mkdir -p /work/int/y && echo z > /work/int/y/f && echo up && sleep 600"},
		Streams: podman.Streams{Stdout: pw, Stderr: &errb},
	})
	pw.Close()
	assert.Assert(t, errors.Is(err, ErrInterrupted), "%v %s", err, errb.String())
	assert.Equal(t, res.Status, "interrupted")
	assertOwned(t, wt, 16+fifo)
}

// TestOneTaskPerWorktree: a second task on a worktree another task holds is
// refused as bad input, before anything is created; releasing the first
// task's worktrees (what forget does, pkg/task) frees it.
func TestOneTaskPerWorktree(t *testing.T) {
	e, runner := newHarness(t, "")
	wt := ownedTree(t, e, runner)
	_, _, errOut, err := sh(runner, e.Task("first"), wt, "true")
	assert.NilError(t, err, errOut)
	_, _, _, err = sh(runner, e.Task("second"), wt, "true")
	assert.Assert(t, errors.Is(err, ErrInput), "%v", err)
	assert.ErrorContains(t, err, "belongs to task \""+e.Task("first")+"\"")
	_, serr := os.Stat(filepath.Join(runner.Cfg.State.Dir, "tasks", e.Task("second")))
	assert.Assert(t, os.IsNotExist(serr), "no state for the refused task")

	assert.NilError(t, runner.claims().Release(taskid.Must(e.Task("first"))))
	res, _, errOut, err := sh(runner, e.Task("second"), wt, "touch /work/second")
	assert.NilError(t, err, errOut)
	assert.Equal(t, res.ExitCode, 0)
	assertOwned(t, wt, 4)
}

// TestWorktreeGuardIsAnAllowlist: a plain directory outside the configured
// roots is refused; the same directory as a git work tree is accepted.
func TestWorktreeGuardIsAnAllowlist(t *testing.T) {
	e, runner := newHarness(t, "")
	wt := filepath.Join(t.TempDir(), "plain")
	assert.NilError(t, os.Mkdir(wt, 0o755))
	_, _, _, err := sh(runner, e.Task("plain"), wt, "true")
	assert.Assert(t, errors.Is(err, ErrInput), "%v", err)
	assert.ErrorContains(t, err, "not a git work tree")
	for _, root := range []string{"/tmp", "/srv", "/opt", "/mnt"} {
		if _, err := os.Stat(root); err != nil {
			continue
		}
		runner.Cfg.Worktree.Roots = []string{"/"}
		_, _, _, err := sh(runner, e.Task("root"), root, "true")
		assert.Assert(t, errors.Is(err, ErrInput), "%s: %v", root, err)
	}
}
