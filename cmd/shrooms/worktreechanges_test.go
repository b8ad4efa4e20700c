package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

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

// TestIdmappedWorktreeChangesFromTheNamespace: on an idmapped worktree the
// scan before a turn revalidates the worktree's namespace cache instead of
// a full walk (scan_before "namespace"), and the changes are still the
// turn's exactly: the owner's changes between turns (a directory renamed,
// a hard link made) are not reported, the turn's write through that link
// shows at both names, a directory the turn renames is added and deleted
// whole, a rewrite in place with size and mtime restored is modified. The
// controls: the first turn and a corrupted cache file list every
// directory (cache not used).
func TestIdmappedWorktreeChangesFromTheNamespace(t *testing.T) {
	e, _ := integration(t, "")
	wt := filepath.Join(e.Dir, "repo")
	assert.NilError(t, os.Mkdir(wt, 0o755))
	git(t, wt, "init", "-q", "-b", "main")
	for _, f := range []string{"a.txt", "b.txt", "c.txt", "sub/d.txt", "deep/x/y.txt"} {
		assert.NilError(t, os.MkdirAll(filepath.Dir(filepath.Join(wt, f)), 0o755))
		assert.NilError(t, os.WriteFile(filepath.Join(wt, f), []byte(f+"\n"), 0o644))
	}
	assert.NilError(t, filepath.WalkDir(wt, func(p string, _ os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, 4242, 4242)
	}))
	task := e.Task("wtns")
	// Older than the racy window: the first turn's listings are trusted.
	time.Sleep(1100 * time.Millisecond)
	type turn struct {
		changes  []any
		before   string
		dirs     float64
		relisted float64
		statted  float64 // by the namespace itself
		shared   float64 // taken from the turn's guard scan
	}
	run := func(script string) turn {
		t.Helper()
		code, stdout, stderr := e.Shrooms("run", "--json", "--task", task, "--agent", "shell", "--worktree", wt, "--", "-c", script)
		assert.Equal(t, code, 0, stderr)
		obj := lastObject(t, stdout)
		assert.Equal(t, obj["worktree"].(map[string]any)["idmapped"], true)
		ch := obj["worktree_changes"].(map[string]any)
		assert.Equal(t, ch["scan_after"], "events")
		n := func(k string) float64 { v, _ := ch[k].(float64); return v }
		return turn{[]any{ch["added"], ch["modified"], ch["deleted"]}, ch["scan_before"].(string), n("dirs_revalidated"), n("dirs_relisted"), n("dirs_statted"), n("dirs_stat_shared")}
	}
	first := run("true")
	assert.DeepEqual(t, first.changes, []any{0.0, 0.0, 0.0})
	assert.Assert(t, strings.HasPrefix(first.before, "namespace, cache not used: "), first.before)
	assert.Equal(t, first.dirs, 4.0) // the root, sub, deep, deep/x (the root's .git left out)
	assert.Equal(t, first.relisted, first.dirs)
	// Every directory below the root has its stat from the turn's guard
	// scan, none stat-ed again.
	assert.Equal(t, first.shared, first.dirs-1)
	assert.Equal(t, first.statted, 0.0)

	// The owner, between turns: a directory renamed, a hard link made.
	assert.NilError(t, os.Rename(filepath.Join(wt, "sub"), filepath.Join(wt, "sub2")))
	assert.NilError(t, os.Link(filepath.Join(wt, "b.txt"), filepath.Join(wt, "sub2", "b-link.txt")))
	assert.NilError(t, os.WriteFile(filepath.Join(wt, "a.txt"), []byte("A.TXT\n"), 0o644))
	second := run("printf more >> /work/sub2/b-link.txt")
	assert.Equal(t, second.before, "namespace")
	assert.DeepEqual(t, second.changes, []any{0.0, 2.0, 0.0}) // b.txt and its link
	assert.Assert(t, second.relisted >= 2 && second.relisted < second.dirs, "%+v", second)
	assert.Equal(t, second.shared, second.dirs-1, "%+v", second)

	// The turn renames a directory and rewrites a file in place, size and
	// mtime put back.
	third := run(`mv /work/sub2 /work/sub3 && touch -r /work/c.txt /tmp/stamp && printf 'C.TXT\n' > /work/c.txt && touch -r /tmp/stamp /work/c.txt`)
	assert.Equal(t, third.before, "namespace")
	assert.DeepEqual(t, third.changes, []any{3.0, 1.0, 3.0})

	// Control: the cache file corrupted, every directory is listed again.
	var cache string
	assert.NilError(t, filepath.WalkDir(e.Dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.Name() == "namespace-cache" {
			cache = p
		}
		return nil
	}))
	assert.Assert(t, cache != "")
	data, err := os.ReadFile(cache)
	assert.NilError(t, err)
	data[len(data)/2] ^= 0xff
	assert.NilError(t, os.WriteFile(cache, data, 0o600))
	fourth := run("true")
	assert.Assert(t, strings.HasPrefix(fourth.before, "namespace, cache not used: corrupt"), fourth.before)
	assert.Equal(t, fourth.relisted, fourth.dirs)
	assert.DeepEqual(t, fourth.changes, []any{0.0, 0.0, 0.0})
}
