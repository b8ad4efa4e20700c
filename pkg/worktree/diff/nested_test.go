package diff

import (
	"os"
	"path/filepath"
	"testing"

	"gotest.tools/v3/assert"
)

// TestDiffFlagsNestedRepos: a nested .git created (directory or gitdir
// pointer file) or changed, and a bare repository layout, are listed as
// agent config under the repository's root, with why; the worktree root's
// own .git is not scanned; ordinary files are only counted.
func TestDiffFlagsNestedRepos(t *testing.T) {
	root := t.TempDir()
	write(t, root, ".git/HEAD", "ref: refs/heads/main\n")
	write(t, root, "vendor/lib/.git/config", "[core]\n")
	write(t, root, "plain/readme", "x\n")
	before := scan(t, root)

	write(t, root, "sub/.git/config", "[core]\n\tfsmonitor = touch /tmp/m\n")
	write(t, root, "sub/.git/hooks/pre-commit", "#!/bin/sh\n")
	write(t, root, "ptr/.git", "gitdir: ../payload\n")
	write(t, root, "payload/HEAD", "ref: refs/heads/main\n")
	assert.NilError(t, os.MkdirAll(filepath.Join(root, "payload", "objects"), 0o755))
	assert.NilError(t, os.MkdirAll(filepath.Join(root, "payload", "refs"), 0o755))
	write(t, root, "vendor/lib/.git/config", "[core]\n\tpager = touch /tmp/p\n")
	write(t, root, ".git/config", "[core]\n")
	write(t, root, "plain/new", "y\n")
	sum := Diff(before, scan(t, root))

	got := map[string]Change{}
	for _, c := range sum.AgentConfig {
		got[c.Path] = c
	}
	assert.Equal(t, len(got), 4, "%+v", sum.AgentConfig)
	for p, change := range map[string]string{"sub/.git": "added", "ptr/.git": "added", "payload": "added", "vendor/lib/.git": "modified"} {
		assert.Equal(t, got[p].Change, change, p)
		assert.Equal(t, got[p].Why, nestedWhy, p)
	}
}
