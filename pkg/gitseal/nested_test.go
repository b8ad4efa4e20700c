package gitseal

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"gotest.tools/v3/assert"
)

// plantBare lays out a bare repository at wt/rel whose alias "hi" touches
// marker.
func plantBare(t *testing.T, wt, rel, marker string) {
	t.Helper()
	d := filepath.Join(wt, rel)
	for _, sub := range []string{"objects", "refs/heads"} {
		assert.NilError(t, os.MkdirAll(filepath.Join(d, sub), 0o755))
	}
	assert.NilError(t, os.WriteFile(filepath.Join(d, "HEAD"), []byte("ref: refs/heads/main\n"), 0o644))
	assert.NilError(t, os.WriteFile(filepath.Join(d, "config"), []byte("[core]\n\tbare = true\n[alias]\n\thi = !touch "+marker+"\n"), 0o644))
}

// TestCommitRefusesPlantedRepositories: a nested .git and a bare repository
// layout the index does not track are refused, each named; a bare fixture
// the owner tracks is committed as files. Positive control: git discovers
// the planted layout as a repository and runs its config.
func TestCommitRefusesPlantedRepositories(t *testing.T) {
	wt := newRepo(t)
	plantBare(t, wt, "testdata/fixture.git", filepath.Join(t.TempDir(), "fixture"))
	hostGit(t, wt, "add", "testdata")
	hostGit(t, wt, "commit", "-q", "-m", "fixture")

	marker := filepath.Join(t.TempDir(), "fired")
	plantBare(t, wt, "payload", marker)
	assert.NilError(t, os.MkdirAll(filepath.Join(wt, "sub", ".git"), 0o755))
	_, err := Commit(context.Background(), wt, "turn", author)
	assert.ErrorContains(t, err, "nested repositories the index does not know (payload, sub/.git)")

	// Positive control: in that directory git takes the layout for a
	// repository and runs what its config names.
	cmd := exec.Command("git", "-c", "safe.directory=*", "hi")
	cmd.Dir = filepath.Join(wt, "payload")
	cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=/nonexistent", "GIT_CONFIG_NOSYSTEM=1"}
	out, err := cmd.CombinedOutput()
	assert.NilError(t, err, "%s", out)
	_, err = os.Stat(marker)
	assert.NilError(t, err, "positive control: the planted bare repository's alias did not run")

	// Without the planted ones, the tracked fixture is ordinary content.
	assert.NilError(t, os.RemoveAll(filepath.Join(wt, "payload")))
	assert.NilError(t, os.RemoveAll(filepath.Join(wt, "sub")))
	assert.NilError(t, os.WriteFile(filepath.Join(wt, "work.txt"), []byte("done\n"), 0o644))
	id, err := Commit(context.Background(), wt, "turn", author)
	assert.NilError(t, err)
	files := treeFiles(t, wt, id)
	assert.Equal(t, files["work.txt"], "done\n")
	_, ok := files["testdata/fixture.git/HEAD"]
	assert.Assert(t, ok, "%v", files)
}
