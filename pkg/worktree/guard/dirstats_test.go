package guard

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"gotest.tools/v3/assert"
)

// TestScanDirStats: a cached scan puts the stat of every directory it
// walked in the table (the root's as "", .git and a guarded directory
// left out: not walked), each the directory's own; a second scan from the
// cache (leaves revalidated by fstatat) gives the same; a failed scan
// leaves the table as it was; Take empties it.
func TestScanDirStats(t *testing.T) {
	ctx := context.Background()
	wt := t.TempDir()
	for _, d := range []string{"a/b/c", "d", ".git/objects", ".claude/commands"} {
		assert.NilError(t, os.MkdirAll(filepath.Join(wt, d), 0o755))
	}
	assert.NilError(t, os.WriteFile(filepath.Join(wt, "a/b/f"), nil, 0o644))
	cacheDir := t.TempDir()
	want := []string{"", "a", "a/b", "a/b/c", "d"}
	check := func(stats *DirStats) {
		t.Helper()
		m := stats.Take()
		assert.Equal(t, len(m), len(want), "%v", m)
		for _, rel := range want {
			st, ok := m[rel]
			assert.Assert(t, ok, rel)
			var fresh unix.Stat_t
			assert.NilError(t, unix.Lstat(filepath.Join(wt, rel), &fresh))
			assert.Equal(t, st.Ino, fresh.Ino, rel)
			assert.Equal(t, st.Ctim, fresh.Ctim, rel)
		}
		assert.Equal(t, stats.Len(), 0, "taken")
	}
	time.Sleep(racyWindow) // old enough to be recorded
	// The first scan reads every directory, the second uses the cache.
	for i := range 2 {
		stats := &DirStats{}
		snap, err := scanCached(ctx, wt, nil, nil, nil, cacheDir, stats)
		assert.NilError(t, err)
		if i == 1 {
			assert.Equal(t, snap.DirsRead, 0, "positive control: every directory from the cache")
		}
		check(stats)
	}
	// Without a cache the scan takes no directory stat: no table.
	stats := &DirStats{}
	_, err := scanCached(ctx, wt, nil, nil, nil, "", stats)
	assert.NilError(t, err)
	assert.Equal(t, stats.Len(), 0)

	// A scan that fails (a tree nested past the walk's depth) leaves the
	// table as it was.
	deep := filepath.Join(wt, "d", strings.Repeat("x/", maxWalkDepth+1))
	assert.NilError(t, os.MkdirAll(deep, 0o755))
	stats = &DirStats{}
	_, err = scanCached(ctx, wt, nil, nil, nil, cacheDir, stats)
	assert.ErrorContains(t, err, "nested more than")
	assert.Equal(t, stats.Len(), 0)
}
