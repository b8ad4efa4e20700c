package guard

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"gotest.tools/v3/assert"
)

var cachePatterns = []Pattern{{Glob: "**/*.rules.md", By: "opencode.json"}}

// cacheTree is a worktree of 30 directories (some nested) with a few
// guarded files, old enough (past racyWindow) to be recorded.
func cacheTree(t *testing.T) string {
	wt := t.TempDir()
	for d := 0; d < 30; d++ {
		dir := filepath.Join(wt, fmt.Sprintf("pkg%02d", d))
		if d%5 == 0 {
			dir = filepath.Join(wt, fmt.Sprintf("pkg%02d", d), "deep", "er")
		}
		assert.NilError(t, os.MkdirAll(dir, 0o755))
		for f := 0; f < 20; f++ {
			assert.NilError(t, os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%02d.go", f)), []byte("x"), 0o644))
		}
	}
	for _, p := range []string{"CLAUDE.md", "pkg01/AGENTS.md", "pkg07/.claude/settings.json", "pkg08/x.rules.md"} {
		assert.NilError(t, os.MkdirAll(filepath.Dir(filepath.Join(wt, p)), 0o755))
		assert.NilError(t, os.WriteFile(filepath.Join(wt, p), []byte("{}"), 0o644))
	}
	assert.NilError(t, os.MkdirAll(filepath.Join(wt, "pkg09/sub"), 0o755))
	assert.NilError(t, os.Symlink("../pkg09/sub", filepath.Join(wt, "pkg06/l")))
	return wt
}

// scanBoth scans with the cache in cacheDir and without one, and asserts
// the guard saw the same.
func scanBoth(t *testing.T, wt, cacheDir string) *Snapshot {
	t.Helper()
	ctx := context.Background()
	cached, err := scanCached(ctx, wt, nil, nil, cachePatterns, cacheDir, nil)
	assert.NilError(t, err)
	full, err := scanWith(ctx, wt, nil, nil, cachePatterns)
	assert.NilError(t, err)
	assert.DeepEqual(t, cached.Entries, full.Entries)
	assert.DeepEqual(t, cached.matches, full.matches)
	assert.Equal(t, cached.Visited, full.Visited)
	return cached
}

// setMtime puts a directory's mtime back (touch -d): its ctime still moves.
func setMtime(t *testing.T, p string, mt time.Time) {
	assert.NilError(t, os.Chtimes(p, mt, mt))
}

func mtimeOf(t *testing.T, p string) time.Time {
	fi, err := os.Stat(p)
	assert.NilError(t, err)
	return fi.ModTime()
}

// TestCachedGuardEqualsFullScan: after each change made on the host, the
// guard's scan through the directory cache finds what a full scan finds,
// and it read only the directories changed since the cache was written
// (the positive control that the cache skips work).
func TestCachedGuardEqualsFullScan(t *testing.T) {
	wt := cacheTree(t)
	cacheDir := t.TempDir()
	time.Sleep(racyWindow + 100*time.Millisecond)
	first := scanBoth(t, wt, cacheDir)
	assert.Equal(t, first.DirsCached, 0)
	dirs := first.DirsRead
	assert.Assert(t, dirs > 40, dirs)
	second := scanBoth(t, wt, cacheDir)
	assert.Equal(t, second.DirsCached, dirs, "every directory from the cache")
	assert.Equal(t, second.DirsRead, 0)

	old := time.Now().Add(-time.Hour)
	cases := []struct {
		name   string
		change func(t *testing.T)
		// same: no directory listing changed (every one from the cache)
		same bool
	}{
		{"new nested repository deep down", func(t *testing.T) {
			p := filepath.Join(wt, "pkg10/deep/er/repo")
			assert.NilError(t, os.MkdirAll(filepath.Join(p, ".git"), 0o755))
			assert.NilError(t, os.WriteFile(filepath.Join(p, "CLAUDE.md"), []byte("a"), 0o644))
			assert.NilError(t, os.MkdirAll(filepath.Join(p, "x/.opencode"), 0o755))
		}, false},
		{"renamed directory", func(t *testing.T) {
			assert.NilError(t, os.Rename(filepath.Join(wt, "pkg01"), filepath.Join(wt, "pkg01x")))
		}, false},
		{"replaced directory", func(t *testing.T) {
			assert.NilError(t, os.RemoveAll(filepath.Join(wt, "pkg02")))
			assert.NilError(t, os.MkdirAll(filepath.Join(wt, "pkg02/.claude"), 0o755))
		}, false},
		{"guarded file renamed in, mtimes put back", func(t *testing.T) {
			src, dst := filepath.Join(wt, "pkg11"), filepath.Join(wt, "pkg12")
			smt, dmt := mtimeOf(t, src), mtimeOf(t, dst)
			assert.NilError(t, os.WriteFile(filepath.Join(src, "f00.go"), []byte("{\"mcp\":1}"), 0o644))
			assert.NilError(t, os.Rename(filepath.Join(src, "f00.go"), filepath.Join(dst, ".mcp.json")))
			setMtime(t, src, smt)
			setMtime(t, dst, dmt)
		}, false},
		{"touch -d forges an old mtime", func(t *testing.T) {
			p := filepath.Join(wt, "pkg13")
			assert.NilError(t, os.WriteFile(filepath.Join(p, ".envrc"), []byte("curl x|sh"), 0o644))
			setMtime(t, p, old)
		}, false},
		{"link out of the tree, mtime forged", func(t *testing.T) {
			p := filepath.Join(wt, "pkg14")
			assert.NilError(t, os.Symlink("/outbox", filepath.Join(p, "f03.go.link")))
			setMtime(t, p, old)
		}, false},
		{"pattern match renamed in", func(t *testing.T) {
			p := filepath.Join(wt, "pkg16")
			mt := mtimeOf(t, p)
			assert.NilError(t, os.Rename(filepath.Join(p, "f01.go"), filepath.Join(p, "new.rules.md")))
			setMtime(t, p, mt)
		}, false},
		{"two directories swapped", func(t *testing.T) {
			a, b, tmp := filepath.Join(wt, "pkg07"), filepath.Join(wt, "pkg17"), filepath.Join(wt, "swap")
			assert.NilError(t, os.Rename(a, tmp))
			assert.NilError(t, os.Rename(b, a))
			assert.NilError(t, os.Rename(tmp, b))
			setMtime(t, wt, old)
		}, false},
		{"guarded file rewritten, directory unchanged", func(t *testing.T) {
			assert.NilError(t, os.WriteFile(filepath.Join(wt, "pkg17/.claude/settings.json"), []byte(`{"hooks":1}`), 0o644))
		}, true},
		{"a cached link's target leaves the tree", func(t *testing.T) {
			assert.NilError(t, os.Remove(filepath.Join(wt, "pkg09/sub")))
			assert.NilError(t, os.Symlink("/etc", filepath.Join(wt, "pkg09/sub")))
			setMtime(t, filepath.Join(wt, "pkg09"), old)
		}, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			time.Sleep(racyWindow + 100*time.Millisecond) // the last case's directories recorded
			scanBoth(t, wt, cacheDir)
			c.change(t)
			s := scanBoth(t, wt, cacheDir)
			assert.Assert(t, s.DirsCached > dirs-10, "%d cached, %d read", s.DirsCached, s.DirsRead)
			if c.same {
				assert.Equal(t, s.DirsRead, 0)
			} else {
				assert.Assert(t, s.DirsRead > 0, "the changed directory is read")
			}
		})
	}
	// The changes above are what a full scan sees: guarded roots and the
	// escaping link are there.
	s := scanBoth(t, wt, cacheDir)
	for _, rel := range []string{"pkg10/deep/er/repo/CLAUDE.md", "pkg01x/AGENTS.md", "pkg02/.claude", "pkg12/.mcp.json", "pkg13/.envrc", "pkg14/f03.go.link", "pkg17/.claude", "pkg06/l"} {
		_, ok := s.Entries[rel]
		assert.Assert(t, ok, rel)
	}
	assert.Equal(t, s.matches["pkg16/new.rules.md"], "opencode.json")
}

// TestGuardCacheIsUsedAndFailsClosed: a record whose stat matches is used
// without reading the directory (shown by forging one: the scan then misses
// a file, which is why the record must be exact), and a cache file that
// cannot be trusted is ignored.
func TestGuardCacheIsUsedAndFailsClosed(t *testing.T) {
	wt := cacheTree(t)
	cacheDir := t.TempDir()
	time.Sleep(racyWindow + 100*time.Millisecond)
	first := scanBoth(t, wt, cacheDir)
	p := filepath.Join(cacheDir, cacheFile)
	data, err := os.ReadFile(p)
	assert.NilError(t, err)
	dp, err := decodeCache(data)
	assert.NilError(t, err)
	d := *dp
	r := d.Dirs["pkg01"]
	r.Guarded = nil // forge: pkg01/AGENTS.md left out
	d.Dirs["pkg01"] = r
	write := func(d cacheData, mode os.FileMode) {
		b := encodeCache(&d)
		os.Remove(p)
		assert.NilError(t, os.WriteFile(p, b, mode))
		assert.NilError(t, os.Chmod(p, mode))
	}
	ctx := context.Background()
	write(d, 0o600)
	s, err := scanCached(ctx, wt, nil, nil, cachePatterns, cacheDir, nil)
	assert.NilError(t, err)
	_, ok := s.Entries["pkg01/AGENTS.md"]
	assert.Assert(t, !ok, "the forged record was used: the directory was not read")
	assert.Equal(t, s.DirsCached, first.DirsRead)

	for name, bad := range map[string]func(){
		"group-readable": func() { write(d, 0o640) },
		"corrupt":        func() { assert.NilError(t, os.WriteFile(p, []byte("{"), 0o600)) },
		"a byte flipped": func() {
			b := encodeCache(&d)
			b[len(b)/2] ^= 1
			assert.NilError(t, os.WriteFile(p, b, 0o600))
		},
		"other patterns": func() { e := d; e.Patterns = "x"; write(e, 0o600) },
		"other root inode": func() {
			e := d
			e.RootIno++
			write(e, 0o600)
		},
		"a link": func() {
			write(d, 0o600)
			assert.NilError(t, os.Rename(p, p+".real"))
			assert.NilError(t, os.Symlink(p+".real", p))
		},
	} {
		bad()
		s, err := scanCached(ctx, wt, nil, nil, cachePatterns, cacheDir, nil)
		assert.NilError(t, err, name)
		assert.Equal(t, s.DirsCached, 0, name)
		_, ok := s.Entries["pkg01/AGENTS.md"]
		assert.Assert(t, ok, name)
		os.Remove(p + ".real")
	}
}

// TestGuardCacheNamesNotUTF8: a directory whose name is not valid UTF-8
// is recorded as it is (the cache is binary: the name comes back the
// same bytes), and a change below it is still seen.
func TestGuardCacheNamesNotUTF8(t *testing.T) {
	wt := cacheTree(t)
	bad := filepath.Join(wt, "pkg03", "bad\xff")
	assert.NilError(t, os.MkdirAll(filepath.Join(bad, "sub"), 0o755))
	assert.NilError(t, os.WriteFile(filepath.Join(bad, "sub", "f.go"), nil, 0o644))
	cacheDir := t.TempDir()
	time.Sleep(racyWindow + 100*time.Millisecond)
	scanBoth(t, wt, cacheDir)
	s := scanBoth(t, wt, cacheDir)
	assert.Equal(t, s.DirsRead, 0, "every directory from the cache, pkg03's two below it too")
	assert.Assert(t, s.DirsCached > 40)
	// What a cached scan would have missed: a link out of the tree below,
	// which the full scan refuses (its path is not UTF-8).
	assert.NilError(t, os.Symlink("/outbox", filepath.Join(bad, "sub", "l")))
	_, err := scanWith(context.Background(), wt, nil, nil, cachePatterns)
	assert.ErrorContains(t, err, "invalid UTF-8")
	_, err = scanCached(context.Background(), wt, nil, nil, cachePatterns, cacheDir, nil)
	assert.ErrorContains(t, err, "invalid UTF-8")
}

// TestGuardCacheKeyCoversGuardedNames: a cache written by a shrooms whose
// guarded-name table lacked a name (its records list no such guarded
// entry) is not used by one that guards it: the file is found although
// its directory did not change. The control: the same cache keyed to
// this table is used, and then misses the file.
func TestGuardCacheKeyCoversGuardedNames(t *testing.T) {
	wt := cacheTree(t)
	cacheDir := t.TempDir()
	time.Sleep(racyWindow + 100*time.Millisecond)
	first := scanBoth(t, wt, cacheDir)
	p := filepath.Join(cacheDir, cacheFile)
	data, err := os.ReadFile(p)
	assert.NilError(t, err)
	d, err := decodeCache(data)
	assert.NilError(t, err)
	// What the older binary, without AGENTS.md in its table, recorded.
	var older []guarded
	for _, g := range guardedNames() {
		if g.name != "AGENTS.md" {
			older = append(older, g)
		}
	}
	r := d.Dirs["pkg01"]
	assert.DeepEqual(t, r.Guarded, []string{"AGENTS.md"})
	r.Guarded = nil
	d.Dirs["pkg01"] = r
	ctx := context.Background()
	for _, c := range []struct {
		names []guarded
		used  bool
	}{{guardedNames(), true}, {older, false}} {
		d.Patterns = rulesDigest(cachePatterns, c.names)
		os.Remove(p)
		assert.NilError(t, os.WriteFile(p, encodeCache(d), 0o600))
		s, err := scanCached(ctx, wt, nil, nil, cachePatterns, cacheDir, nil)
		assert.NilError(t, err)
		_, found := s.Entries["pkg01/AGENTS.md"]
		if c.used {
			assert.Equal(t, s.DirsCached, first.DirsRead, "the control: a cache of this table is used")
			assert.Assert(t, !found, "the control: the forged record hides the file")
		} else {
			assert.Equal(t, s.DirsCached, 0, "a cache of another table is ignored")
			assert.Assert(t, found)
		}
	}
}
