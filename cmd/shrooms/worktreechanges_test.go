package main

import (
	"os"
	"path/filepath"
	"testing"

	"gotest.tools/v3/assert"
)

// TestWorktreeChangesAreTheTurnsOnly: a turn reports what it changed, not
// what the owner changed on the host between turns (added, deleted, a
// file rewritten in place at the same size, a directory swapped for a
// link); a file the turn rewrites in place with its size and mtime
// restored is reported (ctime), and so is a file it swaps for a link.
func TestWorktreeChangesAreTheTurnsOnly(t *testing.T) {
	e, _ := integration(t, "")
	wt := filepath.Join(e.Dir, "repo")
	assert.NilError(t, os.Mkdir(wt, 0o755))
	git(t, wt, "init", "-q", "-b", "main")
	for _, f := range []string{"a.txt", "b.txt", "c.txt", "sub/d.txt"} {
		assert.NilError(t, os.MkdirAll(filepath.Dir(filepath.Join(wt, f)), 0o755))
		assert.NilError(t, os.WriteFile(filepath.Join(wt, f), []byte(f+"\n"), 0o644))
	}
	task := e.Task("wtch")
	changes := func(script string) []any {
		t.Helper()
		code, stdout, stderr := e.Shrooms("run", "--json", "--task", task, "--agent", "shell", "--worktree", wt, "--", "-c", script)
		assert.Equal(t, code, 0, stderr)
		ch := lastObject(t, stdout)["worktree_changes"].(map[string]any)
		// The scan after read the turn's events, not the whole tree.
		assert.Equal(t, ch["scan_after"], "events")
		return []any{ch["added"], ch["modified"], ch["deleted"]}
	}
	assert.DeepEqual(t, changes("true"), []any{0.0, 0.0, 0.0})

	// The owner, between turns.
	assert.NilError(t, os.WriteFile(filepath.Join(wt, "a.txt"), []byte("A.TXT\n"), 0o644))
	assert.NilError(t, os.WriteFile(filepath.Join(wt, "host.txt"), []byte("mine\n"), 0o644))
	assert.NilError(t, os.Remove(filepath.Join(wt, "c.txt")))
	assert.NilError(t, os.Rename(filepath.Join(wt, "sub"), filepath.Join(wt, "sub2")))
	assert.NilError(t, os.Symlink("sub2", filepath.Join(wt, "sub")))
	before, err := os.Lstat(filepath.Join(wt, "b.txt"))
	assert.NilError(t, err)

	// The turn rewrites b.txt in place, same size, mtime put back.
	got := changes(`touch -r /work/b.txt /tmp/stamp && printf 'B.TXT\n' > /work/b.txt && touch -r /tmp/stamp /work/b.txt`)
	after, err := os.Lstat(filepath.Join(wt, "b.txt"))
	assert.NilError(t, err)
	// The control: size and mtime say nothing changed, the content did.
	assert.Equal(t, after.Size(), before.Size())
	assert.Equal(t, after.ModTime(), before.ModTime())
	b, err := os.ReadFile(filepath.Join(wt, "b.txt"))
	assert.NilError(t, err)
	assert.Equal(t, string(b), "B.TXT\n")
	assert.DeepEqual(t, got, []any{0.0, 1.0, 0.0})

	// A file swapped for a link to another.
	assert.DeepEqual(t, changes(`rm /work/a.txt && ln -s host.txt /work/a.txt`), []any{0.0, 1.0, 0.0})
	fi, err := os.Lstat(filepath.Join(wt, "a.txt"))
	assert.NilError(t, err)
	assert.Equal(t, fi.Mode()&os.ModeSymlink, os.ModeSymlink)
}
