package worktree

import (
	"context"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"gotest.tools/v3/assert"

	"github.com/shrooms-cage/shrooms/internal/itest"
	"github.com/shrooms-cage/shrooms/pkg/worktree/diff"
)

// TestNestedReposStayTheCages: the give-back leaves every git directory
// below the worktree root with the task's uid and without access for
// others — a .git directory, a gitdir pointer file, a .git link, a bare
// repository layout and a commondir layout — and descends into none of
// them; the directories holding them, the root's own .git and ordinary
// files go back to the owner. handOver never hands the owner's own
// nested repository to the task.
func TestNestedReposStayTheCages(t *testing.T) {
	itest.Require(t, itest.Root)
	const lo, hi, task = 200000, 265536, 201000
	wt := filepath.Join(t.TempDir(), "wt")
	mk := func(rel string) string {
		p := filepath.Join(wt, rel)
		assert.NilError(t, os.MkdirAll(p, 0o755))
		return p
	}
	write := func(rel, body string) {
		mk(filepath.Dir(rel))
		assert.NilError(t, os.WriteFile(filepath.Join(wt, rel), []byte(body), 0o644))
	}
	write(".git/config", "[core]\n") // the root's own
	write("own/.git/config", "[core]\n")
	write("own/.git/HEAD", "ref: refs/heads/main\n")
	assert.NilError(t, chownTree(wt, 4242, 4242))
	changed, err := handOver(wt, task, task)
	assert.NilError(t, err)
	assert.Assert(t, changed)
	u, _ := owner(t, filepath.Join(wt, "own", ".git", "config"))
	assert.Equal(t, u, uint32(4242), "the owner's nested repository is not handed to the task")
	u, _ = owner(t, filepath.Join(wt, "own"))
	assert.Equal(t, u, uint32(task), "positive control: the directory holding it is")

	// What a turn leaves (all of it the task's, as the cage writes it).
	write("sub/.git/config", "[core]\n\tfsmonitor = touch /tmp/x\n")
	write("sub/.git/hooks/pre-commit", "#!/bin/sh\n")
	write("sub/file.txt", "work\n")
	write("ptr/.git", "gitdir: ../payload\n")
	write("payload/HEAD", "ref: refs/heads/main\n")
	mk("payload/objects")
	mk("payload/refs")
	write("wt2/HEAD", "ref: refs/heads/x\n")
	write("wt2/commondir", "../.git\n")
	mk("lnk")
	assert.NilError(t, os.Symlink("../payload", filepath.Join(wt, "lnk", ".git")))
	write("deep/a/b/.git/config", "[alias]\n")
	write(".git/new", "") // the root's own .git: today's treatment
	assert.NilError(t, chownTreeExcept(wt, task, task, filepath.Join(wt, "own", ".git")))

	rep, err := giveBack(wt, 4242, 4242, lo, hi)
	assert.NilError(t, err)
	assert.Equal(t, rep.Kept, 6, "%+v", rep)
	assert.DeepEqual(t, slices.Sorted(slices.Values(rep.KeptPaths)), []string{"deep/a/b/.git", "lnk/.git", "payload", "ptr/.git", "sub/.git", "wt2"})
	for _, rel := range []string{"sub/.git", "ptr/.git", "payload", "wt2", "deep/a/b/.git"} {
		fi, err := os.Lstat(filepath.Join(wt, rel))
		assert.NilError(t, err)
		u, _ := owner(t, filepath.Join(wt, rel))
		assert.Equal(t, u, uint32(task), rel)
		assert.Equal(t, fi.Mode().Perm()&0o007, os.FileMode(0), "%s: no access for others", rel)
	}
	for _, rel := range []string{"sub/.git/config", "sub/.git/hooks/pre-commit", "payload/HEAD", "lnk/.git"} {
		u, _ := owner(t, filepath.Join(wt, rel))
		assert.Equal(t, u, uint32(task), "%s: not descended into", rel)
	}
	for _, rel := range []string{".", "sub", "sub/file.txt", "ptr", "lnk", "deep/a/b", ".git/new"} {
		u, _ := owner(t, filepath.Join(wt, rel))
		assert.Equal(t, u, uint32(4242), "%s: given back", rel)
	}
	u, _ = owner(t, filepath.Join(wt, "own", ".git", "config"))
	assert.Equal(t, u, uint32(4242), "the owner's own nested repository is still the owner's")

	// Every later give-back (gc, the next turn's end) leaves them so too.
	rep, err = giveBack(wt, 4242, 4242, lo, hi)
	assert.NilError(t, err)
	assert.Equal(t, rep.Changed, 0)
	assert.Equal(t, rep.Kept, 6)
}

func chownTree(root string, uid, gid int) error { return chownTreeExcept(root, uid, gid, "") }

func chownTreeExcept(root string, uid, gid int, except string) error {
	return filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == except {
			return filepath.SkipDir
		}
		return os.Lchown(p, uid, gid)
	})
}

// BenchmarkGiveBack: the give-back of a tree of 2,000 directories and
// 20,000 files in the task's range (each directory is also looked at for a
// git directory layout: one fstatat of HEAD).
func BenchmarkGiveBack(b *testing.B) {
	itest.Require(b, itest.Root)
	const lo, hi = 200000, 265536
	wt := b.TempDir()
	for d := 0; d < 2000; d++ {
		dir := filepath.Join(wt, "d"+strconv.Itoa(d/100), "e"+strconv.Itoa(d))
		assert.NilError(b, os.MkdirAll(dir, 0o755))
		for f := 0; f < 10; f++ {
			assert.NilError(b, os.WriteFile(filepath.Join(dir, "f"+strconv.Itoa(f)), nil, 0o644))
		}
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		assert.NilError(b, chownTree(wt, lo+1000, lo+1000))
		b.StartTimer()
		rep, err := giveBack(wt, 4242, 4242, lo, hi)
		assert.NilError(b, err)
		assert.Assert(b, rep.Changed > 22000)
	}
}

// TestNamespaceFindsTheNestedFindersRepositories: the owner's nested
// repositories an idmapped turn binds read-only are the same, by path and
// inode, from the namespace (diff.Namespace.Nested) as from the full
// walk's nestedFinder: a .git directory, a gitdir pointer file and a
// .git link, bare and commondir layouts, one inside another (not looked
// into), the root's own .git left out, and look-alikes that are not one.
func TestNamespaceFindsTheNestedFindersRepositories(t *testing.T) {
	wt := t.TempDir()
	mk := func(rel, data string) {
		p := filepath.Join(wt, rel)
		assert.NilError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		if data != "" {
			assert.NilError(t, os.WriteFile(p, []byte(data), 0o644))
		}
	}
	mk(".git/HEAD", "ref: refs/heads/main\n")
	mk("a/.git/HEAD", "ref\n")
	mk("a/.git/objects/x", "x")
	mk("a/inner/.git/HEAD", "ref\n") // inside a's repository's work tree: found
	mk("b/.git", "gitdir: /elsewhere\n")
	assert.NilError(t, os.Symlink("/elsewhere", filepath.Join(wt, "c.git")))
	assert.NilError(t, os.MkdirAll(filepath.Join(wt, "d"), 0o755))
	assert.NilError(t, os.Symlink("/elsewhere", filepath.Join(wt, "d/.git")))
	mk("bare/HEAD", "ref\n")
	mk("bare/objects/o", "o")
	mk("bare/refs/heads/main", "0")
	mk("bare/sub/.git/HEAD", "ref\n") // inside a bare layout: not looked into
	mk("wtgit/HEAD", "ref\n")
	mk("wtgit/commondir", "../bare\n")
	mk("notgit/HEAD", "just a file\n") // HEAD alone
	mk("notgit/objects/o", "o")
	mk("deep/e/f/.git/config", "[core]\n")
	_, want, err := scanNested(context.Background(), wt)
	assert.NilError(t, err)
	snap, why := diff.ScanNamespace(context.Background(), wt, "", nil)
	assert.Equal(t, why, "")
	got := snap.Namespace().Nested()
	assert.DeepEqual(t, got, want)
	// The control: the finder found what the layout says.
	assert.DeepEqual(t, slices.Sorted(maps.Keys(want)), []string{"a/.git", "a/inner/.git", "b/.git", "bare", "d/.git", "deep/e/f/.git", "wtgit"})

	// The same from the cache: listings kept by one scan and taken back,
	// unlisted, by the next (their index comes from the cache's decoding,
	// not a listing). Past the racy window first, or every directory is
	// listed again.
	time.Sleep(1100 * time.Millisecond)
	cache := filepath.Join(t.TempDir(), diff.NamespaceCacheFile)
	first, why := diff.ScanNamespace(context.Background(), wt, cache, nil)
	assert.Equal(t, why, "")
	assert.NilError(t, first.Keep())
	again, why := diff.ScanNamespace(context.Background(), wt, cache, nil)
	assert.Equal(t, why, "")
	assert.Equal(t, again.Namespace().Cache, "")
	assert.Equal(t, again.Namespace().Relisted, 0) // the control: nothing listed again
	assert.DeepEqual(t, again.Namespace().Nested(), want)
}
