package diff

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
	"gotest.tools/v3/assert"
)

// TestNamespaceHostileTurns: turns that try to leave a change the events'
// region misses — a link made, written through and removed; a directory
// moved away, changed there and moved back; two directories exchanged
// and back; a file moved away, rewritten and moved back — report what
// full walks at Ts and after report (nsTurn asserts it), and each names
// the change (the positive control that there was one).
func TestNamespaceHostileTurns(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("fanotify's filesystem mark needs root")
	}
	p := func(root, rel string) string { return filepath.Join(root, rel) }
	appendTo := func(t *testing.T, path, s string) {
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
		must(t, err)
		_, err = f.WriteString(s)
		must(t, err)
		must(t, f.Close())
	}
	cases := []struct {
		name  string
		turn  func(t *testing.T, root string)
		check func(t *testing.T, s Summary)
	}{
		{name: "a transient hard link, written through and removed", turn: func(t *testing.T, root string) {
			must(t, os.Link(p(root, "d0/top.txt"), p(root, "d3/tmp")))
			appendTo(t, p(root, "d3/tmp"), "evil")
			must(t, os.Remove(p(root, "d3/tmp")))
		}, check: func(t *testing.T, s Summary) { assert.Equal(t, s.Modified, 1) }},
		{name: "a transient hard link in a transient directory", turn: func(t *testing.T, root string) {
			must(t, os.Mkdir(p(root, "x"), 0o755))
			must(t, os.Link(p(root, "d0/sub/f1.txt"), p(root, "x/l")))
			appendTo(t, p(root, "x/l"), "evil")
			must(t, os.RemoveAll(p(root, "x")))
		}, check: func(t *testing.T, s Summary) { assert.Equal(t, s.Modified, 1) }},
		{name: "a directory moved away, changed there, moved back", turn: func(t *testing.T, root string) {
			must(t, os.Rename(p(root, "d1"), p(root, "x")))
			appendTo(t, p(root, "x/sub/f2.txt"), "evil")
			write(t, root, "x/sub/new.txt", "new")
			must(t, os.Rename(p(root, "x"), p(root, "d1")))
		}, check: func(t *testing.T, s Summary) {
			assert.Equal(t, s.Modified, 1)
			assert.Equal(t, s.Added, 1)
		}},
		{name: "a directory moved out of the tree's view and back under another parent", turn: func(t *testing.T, root string) {
			must(t, os.Rename(p(root, "d2/sub"), p(root, "d3/sub2")))
			appendTo(t, p(root, "d3/sub2/f0.txt"), "evil")
			must(t, os.Rename(p(root, "d3/sub2"), p(root, "d2/sub")))
		}, check: func(t *testing.T, s Summary) { assert.Equal(t, s.Modified, 1) }},
		{name: "two directories exchanged, one changed, exchanged back", turn: func(t *testing.T, root string) {
			must(t, unix.Renameat2(unix.AT_FDCWD, p(root, "d0"), unix.AT_FDCWD, p(root, "d4"), unix.RENAME_EXCHANGE))
			appendTo(t, p(root, "d4/sub/f3.txt"), "evil")
			must(t, unix.Renameat2(unix.AT_FDCWD, p(root, "d0"), unix.AT_FDCWD, p(root, "d4"), unix.RENAME_EXCHANGE))
		}, check: func(t *testing.T, s Summary) { assert.Equal(t, s.Modified, 1) }},
		{name: "a file moved away, rewritten, moved back", turn: func(t *testing.T, root string) {
			must(t, os.Rename(p(root, "main.go"), p(root, "d3/m")))
			appendTo(t, p(root, "d3/m"), "// evil\n")
			must(t, os.Rename(p(root, "d3/m"), p(root, "main.go")))
		}, check: func(t *testing.T, s Summary) { assert.Equal(t, s.Modified, 1) }},
		{name: "setuid set through a transient hard link", turn: func(t *testing.T, root string) {
			must(t, os.Link(p(root, "d2/top.txt"), p(root, "d4/tmp")))
			must(t, os.Chmod(p(root, "d4/tmp"), 0o4755))
			must(t, os.Remove(p(root, "d4/tmp")))
		}, check: func(t *testing.T, s Summary) { assert.Equal(t, s.Modified, 1) }},
		{name: "truncated through a transient hard link", turn: func(t *testing.T, root string) {
			must(t, os.Link(p(root, "d2/sub/f4.txt"), p(root, "tmp")))
			must(t, os.Truncate(p(root, "tmp"), 0))
			must(t, os.Remove(p(root, "tmp")))
		}, check: func(t *testing.T, s Summary) { assert.Equal(t, s.Modified, 1) }},
		{name: "two directories swapped by three renames", turn: func(t *testing.T, root string) {
			must(t, os.Rename(p(root, "d0"), p(root, "x")))
			must(t, os.Rename(p(root, "d1"), p(root, "d0")))
			must(t, os.Rename(p(root, "x"), p(root, "d1")))
		}, check: func(t *testing.T, s Summary) { assert.Assert(t, s.Modified > 0) }},
		{name: "two files swapped by three renames", turn: func(t *testing.T, root string) {
			must(t, os.Rename(p(root, "d0/sub/f0.txt"), p(root, "x")))
			must(t, os.Rename(p(root, "d0/sub/f1.txt"), p(root, "d0/sub/f0.txt")))
			must(t, os.Rename(p(root, "x"), p(root, "d0/sub/f1.txt")))
		}, check: func(t *testing.T, s Summary) { assert.Equal(t, s.Modified, 2) }},
		{name: "a directory replaced by a symbolic link to another in the tree", turn: func(t *testing.T, root string) {
			must(t, os.RemoveAll(p(root, "d3")))
			must(t, os.Symlink("d4", p(root, "d3")))
			appendTo(t, p(root, "d3/top.txt"), "evil") // d4/top.txt
		}, check: func(t *testing.T, s Summary) {
			assert.Equal(t, s.Modified, 2) // d3, now a link, and d4/top.txt
			assert.Assert(t, s.Deleted > 0)
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			root := tree(t)
			cache := filepath.Join(t.TempDir(), NamespaceCacheFile)
			aged()
			nsTurn(t, root, cache, nil, func() {}) // writes the cache
			aged()
			s, ns := nsTurn(t, root, cache, nil, func() { c.turn(t, root) })
			assert.Equal(t, ns.Cache, "")
			assert.Equal(t, ns.Relisted, 0) // all from the cache
			c.check(t, s)
		})
	}
}
