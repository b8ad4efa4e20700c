package worktree

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"gotest.tools/v3/assert"

	"github.com/shrooms-cage/shrooms/internal/itest"
)

func TestHandOverSkipsGitAndFollowsNoLink(t *testing.T) {
	itest.Require(t, itest.Root) // chown needs root
	dir := t.TempDir()
	wt := filepath.Join(dir, "wt")
	outside := filepath.Join(dir, "outside")
	for _, d := range []string{wt, filepath.Join(wt, ".git"), filepath.Join(wt, "src"), outside} {
		assert.NilError(t, os.Mkdir(d, 0o755))
	}
	assert.NilError(t, os.WriteFile(filepath.Join(wt, "src", "f"), nil, 0o644))
	assert.NilError(t, os.Symlink(outside, filepath.Join(wt, "out")))
	changed, err := handOver(wt, 4242, 4343)
	assert.NilError(t, err)
	assert.Assert(t, changed)
	owner := func(p string) (uint32, uint32) {
		fi, err := os.Lstat(p)
		assert.NilError(t, err)
		st := fi.Sys().(*syscall.Stat_t)
		return st.Uid, st.Gid
	}
	for _, p := range []string{wt, filepath.Join(wt, "src"), filepath.Join(wt, "src", "f"), filepath.Join(wt, "out")} {
		u, g := owner(p)
		assert.Equal(t, u, uint32(4242), p)
		assert.Equal(t, g, uint32(4343), p)
	}
	u, _ := owner(filepath.Join(wt, ".git"))
	assert.Equal(t, u, uint32(0), ".git stays root's")
	u, _ = owner(outside)
	assert.Equal(t, u, uint32(0), "the link's target was not followed")
	changed, err = handOver(wt, 4242, 4343)
	assert.NilError(t, err)
	assert.Assert(t, !changed, "an owned worktree is not walked again")
}
