package worktree

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"gotest.tools/v3/assert"

	"github.com/shrooms-cage/shrooms/internal/itest"
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
	assert.NilError(t, claims.Check(taskid.Must("one"), a))
	assert.NilError(t, claims.Check(taskid.Must("one"), b), "the same task through another path")
	assert.ErrorContains(t, claims.Check(taskid.Must("two"), b), `belongs to task "one"`)
	c := filepath.Join(dir, "c")
	assert.NilError(t, os.Mkdir(c, 0o755))
	assert.NilError(t, claims.Check(taskid.Must("two"), c), "positive control: another directory is free")
}
