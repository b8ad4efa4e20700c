package worktree

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"gotest.tools/v3/assert"

	"github.com/shrooms-cage/shrooms/internal/itest"
	"github.com/shrooms-cage/shrooms/pkg/config"
	"github.com/shrooms-cage/shrooms/pkg/fault"
	"github.com/shrooms-cage/shrooms/pkg/taskid"
	"github.com/shrooms-cage/shrooms/pkg/taskstate"
)

// TestClaimFollowsTheDirectoryNotThePath: a bind mount of a claimed
// worktree is the same worktree for the one-task rule.
func TestClaimFollowsTheDirectoryNotThePath(t *testing.T) {
	itest.Require(t, itest.Root) // bind mount
	dir := t.TempDir()
	state, a, b := filepath.Join(dir, "state"), filepath.Join(dir, "a"), filepath.Join(dir, "b")
	assert.NilError(t, os.Mkdir(a, 0o755))
	assert.NilError(t, os.Mkdir(b, 0o755))
	assert.NilError(t, syscall.Mount(a, b, "", syscall.MS_BIND, ""))
	t.Cleanup(func() { _ = syscall.Unmount(b, syscall.MNT_DETACH) })
	claims := Claims{Layout: taskstate.Layout{Dir: state}}
	assert.NilError(t, claims.write(&claim{Worktree: a, Task: "one", UID: 4242, GID: 4242}))
	assert.NilError(t, claims.Check(mustHolder(t, claims, taskid.Must("one")), a))
	assert.NilError(t, claims.Check(mustHolder(t, claims, taskid.Must("one")), b), "the same task through another path")
	assert.ErrorContains(t, claims.Check(mustHolder(t, claims, taskid.Must("two")), b), `belongs to task "one"`)
	c := filepath.Join(dir, "c")
	assert.NilError(t, os.Mkdir(c, 0o755))
	assert.NilError(t, claims.Check(mustHolder(t, claims, taskid.Must("two")), c), "positive control: another directory is free")
}

// TestClaimsThroughTheDoor: a worktree's life through Claims alone — taken
// for a turn (claimed, handed to the task's agent user, its snapshot
// taken), refused to another task, given back to its owner, given back
// again by GiveBackIdle after the task's user wrote it (a crashed turn),
// released (unclaimed) — with a positive control for each refusal.
func TestClaimsThroughTheDoor(t *testing.T) {
	itest.Require(t, itest.Root) // chown
	dir := t.TempDir()
	ids := filepath.Join(dir, "subids")
	assert.NilError(t, os.WriteFile(ids, []byte("shrooms:1879048192:1073741824\n"), 0o600))
	state := filepath.Join(dir, "state")
	c := Claims{
		Layout:  taskstate.Layout{Dir: state},
		Store:   taskstate.Store{Dir: state},
		IDFiles: taskstate.IDFiles{SubUID: ids, SubGID: ids, User: "shrooms"},
		User:    1000,
	}
	c.Cap.Uncapped = "allow" // the test's temporary directory has no project quotas
	wt := filepath.Join(dir, "wt")
	for _, d := range []string{wt, filepath.Join(wt, ".git"), filepath.Join(wt, "src")} {
		assert.NilError(t, os.Mkdir(d, 0o755))
	}
	assert.NilError(t, os.WriteFile(filepath.Join(wt, "src", "f"), nil, 0o644))
	for _, p := range []string{wt, filepath.Join(wt, "src"), filepath.Join(wt, "src", "f")} {
		assert.NilError(t, os.Chown(p, 4242, 4343))
	}
	owner := func(p string) (uint32, uint32) {
		var st syscall.Stat_t
		assert.NilError(t, syscall.Lstat(p, &st))
		return st.Uid, st.Gid
	}
	one, two := taskid.Must("one"), taskid.Must("two")
	got, err := c.Store.TaskIDs(one, c.IDFiles, true)
	assert.NilError(t, err)

	assert.NilError(t, c.Check(mustHolder(t, c, two), wt), "positive control: an unclaimed worktree is free")
	snap, err := c.Take(context.Background(), mustHolder(t, c, one), wt, got)
	assert.NilError(t, err)
	assert.Assert(t, snap != nil && snap.Entries() == 2, "the hand-over's walk is the scan")
	agent := got.UID + 1000
	u, g := owner(filepath.Join(wt, "src", "f"))
	assert.Equal(t, u, agent)
	assert.Equal(t, g, got.GID+1000)
	u, _ = owner(filepath.Join(wt, ".git"))
	assert.Equal(t, u, uint32(0), ".git stays root's")
	assert.Equal(t, len(c.Files(one)), 1)
	assert.Equal(t, len(c.Files(two)), 0)
	assert.ErrorContains(t, c.Check(mustHolder(t, c, two), wt), `belongs to task "one"`)
	assert.NilError(t, c.Check(mustHolder(t, c, one), wt))

	rep, err := c.GiveBack(mustHolder(t, c, one), wt)
	assert.NilError(t, err)
	assert.Equal(t, rep.GivenBack, 3)
	for _, p := range []string{wt, filepath.Join(wt, "src"), filepath.Join(wt, "src", "f")} {
		u, g := owner(p)
		assert.Equal(t, u, uint32(4242), p)
		assert.Equal(t, g, uint32(4343), p)
	}
	rep, err = c.GiveBack(mustHolder(t, c, two), wt)
	assert.NilError(t, err)
	assert.Assert(t, rep == nil, "another task's give-back touches nothing")

	// A crashed turn leaves a file of the task's user: the idle give-back
	// takes it back.
	assert.NilError(t, os.WriteFile(filepath.Join(wt, "src", "new"), nil, 0o644))
	assert.NilError(t, os.Chown(filepath.Join(wt, "src", "new"), int(agent), int(agent)))
	given, err := c.GiveBackIdle()
	assert.NilError(t, err)
	assert.DeepEqual(t, given, []string{wt})
	u, _ = owner(filepath.Join(wt, "src", "new"))
	assert.Equal(t, u, uint32(4242))
	lock, err := c.Store.LockTask(one)
	assert.NilError(t, err)
	assert.NilError(t, os.Chown(filepath.Join(wt, "src", "new"), int(agent), int(agent)))
	given, err = c.GiveBackIdle()
	lock.Release()
	assert.NilError(t, err)
	assert.Equal(t, len(given), 0, "a busy task's worktree is its own turn's to give back")

	assert.NilError(t, c.Release(one))
	u, _ = owner(filepath.Join(wt, "src", "new"))
	assert.Equal(t, u, uint32(4242), "released worktrees are given back first")
	assert.Equal(t, len(c.Files(one)), 0)
	assert.NilError(t, c.Check(mustHolder(t, c, two), wt), "a released worktree is free")
}

// TestTakeKinds: Take kinds once what fails in it without a kind (a damaged
// claim: the host's) and keeps the kind a step decided (another task's
// worktree: bad input; the cap refusal: the host's, said once).
func TestTakeKinds(t *testing.T) {
	dir := t.TempDir()
	c := Claims{Layout: taskstate.Layout{Dir: filepath.Join(dir, "state")}}
	wt := filepath.Join(dir, "wt")
	assert.NilError(t, os.Mkdir(wt, 0o755))
	ids := taskstate.IDs{UID: 200000, GID: 200000}
	ctx := context.Background()
	once := func(err error, prefix string) {
		t.Helper()
		assert.Assert(t, strings.HasPrefix(err.Error(), prefix), "%v", err)
		assert.Equal(t, strings.Count(err.Error(), "host not ready"), strings.Count(prefix, "host not ready"), "%v", err)
	}

	_, err := c.Take(ctx, mustHolder(t, c, taskid.Must("one")), filepath.Join(dir, "nosuch"), ids)
	assert.Equal(t, fault.Of(err), fault.Input, "%v", err)

	assert.NilError(t, c.write(&claim{Worktree: wt, Task: "one", UID: 4242, GID: 4242}))
	_, err = c.Take(ctx, mustHolder(t, c, taskid.Must("two")), wt, ids)
	assert.Equal(t, fault.Of(err), fault.Input, "%v", err)
	once(err, `bad input: worktree "`+wt+`" belongs to task "one"`)

	assert.NilError(t, os.WriteFile(c.path(wt), []byte("{"), 0o600))
	_, err = c.Take(ctx, mustHolder(t, c, taskid.Must("one")), wt, ids)
	assert.Equal(t, fault.Of(err), fault.HostNotReady, "%v", err)
	once(err, "host not ready: worktree claim ")

	// The cap refusal (the test's temporary directory has no project
	// quotas, as TestUncappedWorktreeIsRefusedByDefault checks).
	assert.NilError(t, os.Remove(c.path(wt)))
	_, err = c.Take(ctx, mustHolder(t, c, taskid.Must("one")), wt, ids)
	assert.Equal(t, fault.Of(err), fault.HostNotReady, "%v", err)
	once(err, "host not ready: worktree cap: ")
}

// mustHolder is the claims' Holder of task.
func mustHolder(t testing.TB, c Claims, task taskid.ID) Holder {
	t.Helper()
	h, err := c.Holder(task)
	assert.NilError(t, err)
	return h
}

// TestZeroHolderIsRefused: no claim is written for the zero Holder (the
// zero id has none); a real one claims the same worktree (root: the
// hand-over chowns).
func TestZeroHolderIsRefused(t *testing.T) {
	itest.Require(t, itest.Root) // the positive control's hand-over chowns
	dir := t.TempDir()
	wt := filepath.Join(dir, "wt")
	assert.NilError(t, os.Mkdir(wt, 0o755))
	c := Claims{Layout: taskstate.Layout{Dir: filepath.Join(dir, "state")}, Cap: config.Worktree{Uncapped: "allow"}}
	_, err := c.Holder(taskid.ID{})
	assert.ErrorContains(t, err, "no task id")
	_, err = c.Take(context.Background(), Holder{}, wt, taskstate.IDs{UID: 1 << 30, GID: 1 << 30})
	assert.ErrorContains(t, err, "no task id")
	_, err = os.Stat(c.Layout.Worktrees())
	assert.Assert(t, os.IsNotExist(err), "a claim was written: %v", err)
	_, err = c.Take(context.Background(), mustHolder(t, c, taskid.Must("one")), wt, taskstate.IDs{UID: 1 << 30, GID: 1 << 30})
	assert.NilError(t, err, "positive control: a real holder")
	files := c.Files(taskid.Must("one"))
	assert.Equal(t, len(files), 1, "positive control: its claim: %v", files)
}
