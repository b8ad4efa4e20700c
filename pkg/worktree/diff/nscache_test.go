package diff

import (
	"context"
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
)

// lazyDirs counts the namespace's directories whose listing is still in
// the cache file.
func lazyDirs(ns *Namespace) int {
	n := 0
	for _, d := range ns.dirs {
		if d.lazy != nil {
			n++
		}
	}
	return n
}

// keptCache is root's namespace cache file as a first scan of the aged
// tree writes it.
func keptCache(t *testing.T, root string) string {
	t.Helper()
	cache := filepath.Join(t.TempDir(), NamespaceCacheFile)
	aged()
	first, why := ScanNamespace(context.Background(), root, cache, nil)
	assert.Equal(t, why, "")
	must(t, first.Keep())
	first.Close()
	return cache
}

// cachedTree is a tree and its namespace cache file, written and aged.
func cachedTree(t *testing.T) (root, cache string) {
	t.Helper()
	root = tree(t)
	cache = keptCache(t, root)
	aged()
	return root, cache
}

// The revalidation before a turn reads the cache file's index, no
// listing; the snapshot after reads the listings of the directories the
// turn's events name; a full walk after reads them all (the control: the
// count moves).
func TestNamespaceReadsListingsWhenNeeded(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("fanotify's filesystem mark needs root")
	}
	ctx := context.Background()
	root, cache := cachedTree(t)
	before, why := ScanNamespace(ctx, root, cache, nil)
	assert.Equal(t, why, "")
	defer before.Close()
	ns := before.ns
	assert.Equal(t, ns.Cache, "")
	assert.Equal(t, ns.Relisted, 0)
	assert.Equal(t, lazyDirs(ns), ns.Dirs) // no listing read
	nested := ns.Nested()                  // from the index
	assert.Equal(t, nested["vendor/lib/.git"] != 0, true)
	assert.Equal(t, lazyDirs(ns), ns.Dirs)
	must(t, before.Settle())
	must(t, before.Ready())
	w, err := Watch(root)
	must(t, err)
	defer w.Close()
	write(t, root, "d3/sub/f1.txt", "changed")
	got, why := w.After(ctx, before)
	assert.Equal(t, why, "")
	s := DiffRefs(before, got, nil)
	assert.Equal(t, s.Modified, 1)
	assert.Equal(t, s.Added+s.Deleted, 0)
	assert.Assert(t, ns.Dirs-lazyDirs(ns) <= 3, "listings read: %d of %d", ns.Dirs-lazyDirs(ns), ns.Dirs)
	assert.Equal(t, ns.dirs["d0"].lazy != nil, true)
	assert.NilError(t, before.Err())
	// The control: a full walk after reads every listing.
	s = DiffRefs(before, scan(t, root), nil)
	assert.Equal(t, s.Modified, 1)
	assert.Equal(t, lazyDirs(ns), 0)
	assert.NilError(t, before.Err())
}

// A listing of the cache file that fails its checksum when first read —
// after the turn — fails closed: the snapshot after from the events is
// refused (the turn walks), Err says why, Keep removes the file (the next
// revalidation lists every directory). The control, the same turn on the
// file as written, reads it and keeps the file. A snapshot closed before
// a listing is needed fails the same way.
func TestNamespaceCacheListingFailsClosed(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("fanotify's filesystem mark needs root")
	}
	ctx := context.Background()
	for _, c := range []string{"as written", "a listing flipped", "closed"} {
		t.Run(c, func(t *testing.T) {
			root, cache := cachedTree(t)
			if c == "a listing flipped" {
				b, err := os.ReadFile(cache)
				must(t, err)
				listings := nsHeader + int(binary.LittleEndian.Uint32(b[len(nsMagic)+4:]))
				b[listings+4] ^= 0x20 // the root's first name (the root's listing is first)
				must(t, os.WriteFile(cache, b, 0o600))
			}
			before, why := ScanNamespace(ctx, root, cache, nil)
			assert.Equal(t, why, "")
			assert.Equal(t, before.ns.Cache, "") // the index is sound
			assert.Equal(t, before.ns.Relisted, 0)
			must(t, before.Settle())
			must(t, before.Ready())
			w, err := Watch(root)
			must(t, err)
			defer w.Close()
			write(t, root, "main.go", "package main // edited\n")
			if c == "closed" {
				before.Close()
			}
			got, why := w.After(ctx, before)
			defer before.Close()
			if c == "as written" {
				assert.Equal(t, why, "")
				assert.Equal(t, DiffRefs(before, got, nil).Modified, 1)
				assert.NilError(t, before.Err())
				assert.NilError(t, before.Keep())
				_, err := os.Stat(cache)
				assert.NilError(t, err)
				return
			}
			assert.Assert(t, got == nil)
			want := "corrupt"
			if c == "closed" {
				want = "closed"
			}
			assert.Assert(t, strings.Contains(why, want), why)
			assert.ErrorContains(t, before.Err(), want)
			assert.ErrorContains(t, before.Keep(), want)
			_, err = os.Stat(cache)
			assert.Assert(t, os.IsNotExist(err), "the cache file stayed: %v", err)
			next, why := ScanNamespace(ctx, root, cache, nil)
			assert.Equal(t, why, "")
			defer next.Close()
			assert.Equal(t, next.ns.Cache, "no cache yet")
			assert.Equal(t, next.ns.Relisted, next.ns.Dirs)
		})
	}
}

// TestInoFilter: the filter never rules out an inode it holds, and rules
// out most others (a false yes costs the full link pass).
func TestInoFilter(t *testing.T) {
	f := newInoFilter(100_000)
	for i := range uint64(100_000) {
		f.add(1_000_000 + i*3)
	}
	g := decodeInoFilter(f.bytes())
	assert.Assert(t, g != nil)
	for i := range uint64(100_000) {
		assert.Assert(t, g.has(1_000_000+i*3), "inode %d ruled out", 1_000_000+i*3)
	}
	yes := 0
	for i := range uint64(100_000) {
		if g.has(1_000_001 + i*3) {
			yes++
		}
	}
	assert.Assert(t, yes < 1_000, "false yes for %d of 100 000", yes)
	assert.Assert(t, decodeInoFilter(f.bytes()[:24]) == nil) // not a power of two
}
