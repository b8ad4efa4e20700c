package worktree

import (
	"os"
	"path/filepath"
	"testing"

	"gotest.tools/v3/assert"
)

func TestCheckWorktreeAllowlist(t *testing.T) {
	dir := t.TempDir()
	repo := filepath.Join(dir, "repo")
	plain := filepath.Join(dir, "plain")
	roots := filepath.Join(dir, "roots")
	for _, d := range []string{repo, filepath.Join(repo, ".git"), plain, roots, filepath.Join(roots, "task")} {
		assert.NilError(t, os.Mkdir(d, 0o755))
	}
	got, err := checkPath(repo, nil, nil)
	assert.NilError(t, err, "a git work tree")
	assert.Equal(t, got, repo)
	_, err = checkPath(filepath.Join(roots, "task"), []string{roots}, nil)
	assert.NilError(t, err, "inside a configured root")

	_, err = checkPath(plain, nil, nil)
	assert.ErrorContains(t, err, "is not a git work tree (no .git) and not inside a [worktree] roots directory")
	_, err = checkPath(roots, []string{roots}, nil)
	assert.ErrorContains(t, err, "configured worktree root itself")
	for _, p := range []string{"/tmp", "/srv", "/opt", "/mnt", "/var/tmp", "/home/someone", "/run/user/1000"} {
		if _, err := os.Lstat(p); err != nil {
			continue // only what exists here can reach the root check
		}
		_, err := checkPath(p, []string{"/"}, nil)
		assert.ErrorContains(t, err, "", p)
		assert.Assert(t, err != nil, p)
	}
	_, err = checkPath("/tmp", nil, nil)
	assert.ErrorContains(t, err, "is a system, temporary or home root")
	_, err = checkPath("/home", nil, nil)
	assert.ErrorContains(t, err, "contains /home")
}
