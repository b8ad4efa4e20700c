package diff

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"
	"time"

	"gotest.tools/v3/assert"

	"github.com/shrooms-cage/shrooms/pkg/worktree/guard"
)

// sharedTree is tree with a guarded directory (.claude, which the guard
// hashes but does not walk): the directories only the namespace stats are
// vendor/lib/.git (a nested repository's metadata) and .claude,
// .claude/commands.
func sharedTree(t *testing.T) string {
	t.Helper()
	root := tree(t)
	write(t, root, ".claude/commands/x.md", "hi\n")
	return root
}

// onlyNamespace are sharedTree's directories the guard's scan does not
// stat: the namespace stats them itself.
const onlyNamespace = 3

// guardStats runs the guard of a task on root as a turn does (the trusted
// record, then Store.Guard) and returns its directory stats.
func guardStats(t *testing.T, store guard.Store, root string) *guard.DirStats {
	t.Helper()
	ctx := context.Background()
	m, err := store.Load()
	must(t, err)
	if m == nil {
		_, err := store.Trust(ctx, root, nil)
		must(t, err)
		m, err = store.Load()
		must(t, err)
	}
	c, err := store.Guard(ctx, root, m)
	must(t, err)
	assert.Equal(t, len(c.Changes), 0)
	return c.DirStats()
}

// The scan before takes the guard's stat of every directory the guard
// walked and stats only the others (a nested repository's .git, a guarded
// directory); the namespace is the one it is without the table, and a
// turn's report from it is the full walk's. The table is taken once.
func TestNamespaceTakesTheGuardsDirStats(t *testing.T) {
	ctx := context.Background()
	root := sharedTree(t)
	cache := keptCache(t, root)
	store := guard.Store{Dir: filepath.Join(t.TempDir(), "trust")}

	stats := guardStats(t, store, root)
	walked := stats.Len() // the root and the directories the guard walked
	with, why := ScanNamespace(ctx, root, cache, stats)
	assert.Equal(t, why, "")
	assert.Equal(t, stats.Len(), 0, "the table is taken")
	without, why := ScanNamespace(ctx, root, cache, nil)
	assert.Equal(t, why, "")
	ns, plain := with.ns, without.ns
	assert.Equal(t, ns.Dirs, walked+onlyNamespace, "every directory but the root .git")
	assert.Equal(t, ns.Shared, walked-1)
	assert.Equal(t, ns.Statted, onlyNamespace)
	statted, shared := with.DirsStatted()
	assert.Equal(t, statted, onlyNamespace)
	assert.Equal(t, shared, walked-1)
	// Control: without the table every directory below the root is
	// stat-ed here.
	assert.Equal(t, plain.Shared, 0)
	assert.Equal(t, plain.Statted, plain.Dirs-1)
	assert.Equal(t, ns.Relisted, 0)
	assert.Equal(t, plain.Relisted, 0)
	assert.Equal(t, len(ns.dirs), len(plain.dirs))
	for rel, d := range ns.dirs {
		p := plain.dirs[rel]
		assert.Assert(t, p != nil, rel)
		assert.Equal(t, [5]int64{int64(d.ino), int64(d.mode), d.mtime, d.ctime, d.listed}, [5]int64{int64(p.ino), int64(p.mode), p.mtime, p.ctime, p.listed}, rel)
		assert.Assert(t, reflect.DeepEqual(d.list(), p.list()), "the listing of %q differs with the guard's stats", rel)
		assert.Assert(t, reflect.DeepEqual(d.subs, p.subs), rel)
	}
	assert.Equal(t, len(ns.dirs["d0"].list()), 2) // sub, top.txt: the listings were read
	must(t, with.Err())
	must(t, without.Err())
	assert.DeepEqual(t, ns.Nested(), plain.Nested())
	// The same table again (taken): every directory stat-ed here.
	again, why := ScanNamespace(ctx, root, cache, stats)
	assert.Equal(t, why, "")
	assert.Equal(t, again.ns.Shared, 0)
	assert.Equal(t, again.ns.Statted, again.ns.Dirs-1)

	// A turn from a fresh table: its report is the full walk's (nsTurn
	// asserts it) and counts the turn's changes.
	sum, tns := nsTurnWith(t, root, cache, guardStats(t, store, root), nil, func() {
		write(t, root, "d0/sub/new.txt", "new")
		write(t, root, "d1/top.txt", "changed")
		must(t, os.Remove(filepath.Join(root, "d2/sub/f0.txt")))
		write(t, root, "d3/made/x.txt", "x")
		write(t, root, "vendor/lib/.git/config", "[core]\n")
	})
	assert.Equal(t, tns.Shared, walked-1)
	assert.Equal(t, tns.Statted, onlyNamespace)
	assert.Equal(t, [3]int{sum.Added, sum.Modified, sum.Deleted}, [3]int{4, 1, 1}) // new.txt, made, made/x.txt, .git/config
}

// A directory the host changes after the guard's stat and before the
// namespace's revalidation: the namespace, with the guard's older stat,
// keeps the directory's cached listing this turn. The report from the
// turn's events does not count the host's entry (it is the full walk's
// at Ts); a walk after (taken when the events cannot vouch) counts it as
// added, exactly as it counts one the host makes right after today's own
// stat (the control, without the table): the window is wider by the
// guard's lead, not new. The directory's ctime is not the recorded one,
// so the next revalidation lists it again; and a host change before the
// guard's scan is listed in the same turn (the other control).
func TestNamespaceHostChangeAfterTheGuard(t *testing.T) {
	for _, withTable := range []bool{true, false} {
		ctx := context.Background()
		root := sharedTree(t)
		cache := keptCache(t, root)
		store := guard.Store{Dir: filepath.Join(t.TempDir(), "trust")}
		var stats *guard.DirStats
		if withTable {
			stats = guardStats(t, store, root)
			write(t, root, "d0/host.txt", "the owner's") // after the guard's stat
		}
		before, why := ScanNamespace(ctx, root, cache, stats)
		assert.Equal(t, why, "")
		if !withTable {
			write(t, root, "d0/host.txt", "the owner's") // after the namespace's own stat
		}
		ns := before.ns
		assert.Equal(t, ns.Relisted, 0, "table %t: the stat predates the host's change", withTable)
		_, listed := ns.lookup("d0/host.txt")
		assert.Assert(t, !listed)
		must(t, before.Settle())
		must(t, before.Ready())
		ref := scan(t, root) // the full walk at Ts
		w, err := Watch(root)
		must(t, err)
		write(t, root, "d1/top.txt", "the turn's")
		got, why := w.After(ctx, before)
		assert.Equal(t, why, "")
		full := scan(t, root)
		w.Close()
		want := norm(DiffRefs(ref, full, nil))
		assert.Equal(t, [3]int{want.Added, want.Modified, want.Deleted}, [3]int{0, 1, 0}) // d1/top.txt only
		assert.DeepEqual(t, norm(DiffRefs(before, got, nil)), want)
		walked := norm(DiffRefs(before, full, nil))
		assert.Equal(t, [3]int{walked.Added, walked.Modified, walked.Deleted}, [3]int{1, 1, 0}, "table %t", withTable)
		must(t, before.Keep())
		before.Close()

		next, why := ScanNamespace(ctx, root, cache, nil)
		assert.Equal(t, why, "")
		assert.Equal(t, next.ns.Relisted, 1, "d0 listed again")
		_, listed = next.ns.lookup("d0/host.txt")
		assert.Assert(t, listed)
		must(t, next.Keep())
		if !withTable {
			continue
		}
		aged()
		// Control: the host's change before the guard's scan.
		write(t, root, "d2/host.txt", "the owner's")
		sum, ns := nsTurnWith(t, root, cache, guardStats(t, store, root), nil, func() {
			write(t, root, "d1/top.txt", "the turn's again")
		})
		assert.Assert(t, ns.Relisted >= 1, "d2 listed in the same turn")
		assert.Assert(t, ns.Shared > 0)
		_, listed = ns.lookup("d2/host.txt")
		assert.Assert(t, listed)
		assert.Equal(t, [3]int{sum.Added, sum.Modified, sum.Deleted}, [3]int{0, 1, 0})
	}
}

// A table of another directory's scan is not used: every directory is
// stat-ed here, and the namespace is the worktree's.
func TestNamespaceIgnoresAnotherRootsDirStats(t *testing.T) {
	ctx := context.Background()
	root, other := sharedTree(t), sharedTree(t)
	store := guard.Store{Dir: filepath.Join(t.TempDir(), "trust")}
	stats := guardStats(t, store, other)
	assert.Assert(t, stats.Len() > 1)
	s, why := ScanNamespace(ctx, root, "", stats)
	assert.Equal(t, why, "")
	assert.Equal(t, s.ns.Shared, 0)
	assert.Equal(t, s.ns.Statted, s.ns.Dirs-1)
}

// BenchmarkGuardThenNamespace100k: a turn's guard scan (cached) and then
// its namespace revalidation of BenchmarkNamespace100k's worktree (1 000
// directories of 100 entries, none changed), with each directory stat-ed
// by both (shared=false, as before) and with the guard's stats taken by
// the namespace (shared=true), alternating in one run; medians.
func BenchmarkGuardThenNamespace100k(b *testing.B) {
	root := tree100k(b)
	ctx := context.Background()
	cache := filepath.Join(b.TempDir(), NamespaceCacheFile)
	store := guard.Store{Dir: filepath.Join(b.TempDir(), "trust")}
	aged()
	if _, err := store.Trust(ctx, root, nil); err != nil {
		b.Fatal(err)
	}
	m, err := store.Load()
	if err != nil {
		b.Fatal(err)
	}
	s, why := ScanNamespace(ctx, root, cache, nil)
	if s == nil {
		b.Fatal(why)
	}
	if err := s.Keep(); err != nil {
		b.Fatal(err)
	}
	pass := func(shared bool) time.Duration {
		start := time.Now()
		c, err := store.Guard(ctx, root, m)
		if err != nil {
			b.Fatal(err)
		}
		var stats *guard.DirStats
		if shared {
			stats = c.DirStats()
		}
		before, why := ScanNamespace(ctx, root, cache, stats)
		took := time.Since(start)
		if before == nil || before.ns.Relisted != 0 || (shared && before.ns.Statted != 0) || (!shared && before.ns.Shared != 0) {
			b.Fatalf("shared %t: %s %+v", shared, why, before)
		}
		return took
	}
	pass(true) // the guard's cache written
	var plain, shared []time.Duration
	b.ResetTimer()
	for range b.N {
		plain = append(plain, pass(false))
		shared = append(shared, pass(true))
	}
	med := func(d []time.Duration) float64 {
		slices.Sort(d)
		return float64(d[len(d)/2].Microseconds()) / 1000
	}
	b.ReportMetric(med(plain), "plain-ms")
	b.ReportMetric(med(shared), "shared-ms")
	b.ReportMetric(0, "ns/op")
}

// A directory the host replaced after the guard's stat (another inode at
// its name): the guard's stat is not the one the parent's listing names,
// and the scan before refuses (the full walk), as for a directory replaced
// while read. The control: the same tree without the table is read.
func TestNamespaceSharedStatOfAReplacedDirectoryRefuses(t *testing.T) {
	ctx := context.Background()
	root := sharedTree(t)
	cache := keptCache(t, root)
	store := guard.Store{Dir: filepath.Join(t.TempDir(), "trust")}
	stats := guardStats(t, store, root)
	must(t, os.Rename(filepath.Join(root, "d0"), filepath.Join(root, "d0-old")))
	must(t, os.Mkdir(filepath.Join(root, "d0"), 0o755))
	s, why := ScanNamespace(ctx, root, cache, stats)
	assert.Assert(t, s == nil)
	assert.Equal(t, why, "d0 changed while the worktree was read")
	s, why = ScanNamespace(ctx, root, cache, nil)
	assert.Equal(t, why, "")
	assert.Assert(t, s != nil)
}
