package guard

import (
	"encoding/binary"
	"hash/crc32"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"gotest.tools/v3/assert"
)

// TestGuardCacheLeafRevalidation attacks the leaf path (a cached directory
// with no guarded root, link or subdirectory is revalidated by one fstatat,
// not opened): each change turns a recorded leaf into something else with
// its mtime put back, and the cached scan still equals the full scan and
// finds what was put there. The control in each: the leaf's record was in
// the cache the scan used (so the fstatat path was the one attacked).
func TestGuardCacheLeafRevalidation(t *testing.T) {
	cases := []struct {
		name string
		// change alters wt's leaf pkg03 (or its place); want is a guarded
		// path the scan must find after it.
		change func(t *testing.T, wt, leaf string)
		want   string
	}{
		{"a subdirectory with a guarded file, mtime put back", func(t *testing.T, wt, leaf string) {
			mt := mtimeOf(t, leaf)
			assert.NilError(t, os.MkdirAll(filepath.Join(leaf, "sub"), 0o755))
			assert.NilError(t, os.WriteFile(filepath.Join(leaf, "sub", "CLAUDE.md"), []byte("x"), 0o644))
			setMtime(t, leaf, mt)
		}, "pkg03/sub/CLAUDE.md"},
		{"a link out of the tree, mtime put back", func(t *testing.T, wt, leaf string) {
			mt := mtimeOf(t, leaf)
			assert.NilError(t, os.Symlink("/outbox", filepath.Join(leaf, "out")))
			setMtime(t, leaf, mt)
		}, "pkg03/out"},
		{"replaced by a link out of the tree, parent's mtime put back", func(t *testing.T, wt, leaf string) {
			mt := mtimeOf(t, wt)
			assert.NilError(t, os.RemoveAll(leaf))
			assert.NilError(t, os.Symlink("/outbox", leaf))
			setMtime(t, wt, mt)
		}, "pkg03"},
		{"a directory renamed over it", func(t *testing.T, wt, leaf string) {
			mt, lmt := mtimeOf(t, wt), mtimeOf(t, leaf)
			for _, e := range mustRead(t, leaf) {
				assert.NilError(t, os.Remove(filepath.Join(leaf, e)))
			}
			other := filepath.Join(wt, "other")
			assert.NilError(t, os.MkdirAll(other, 0o755))
			assert.NilError(t, os.WriteFile(filepath.Join(other, ".mcp.json"), []byte("{}"), 0o644))
			assert.NilError(t, unix.Rename(other, leaf)) // os.Rename refuses a directory over one
			setMtime(t, leaf, lmt)
			setMtime(t, wt, mt)
		}, "pkg03/.mcp.json"},
		{"removed and made again with the same inode", func(t *testing.T, wt, leaf string) {
			var st unix.Stat_t
			assert.NilError(t, unix.Lstat(leaf, &st))
			mt, lmt := mtimeOf(t, wt), mtimeOf(t, leaf)
			assert.NilError(t, os.RemoveAll(leaf))
			// ext4 hands a freed inode out again: make directories until
			// one gets the leaf's number (the control that this case is the
			// inode-reuse one).
			var made []string
			reused := false
			for i := 0; i < 2000 && !reused; i++ {
				p := filepath.Join(wt, "again"+itoa(i))
				assert.NilError(t, os.Mkdir(p, 0o755))
				var now unix.Stat_t
				assert.NilError(t, unix.Lstat(p, &now))
				if now.Ino == st.Ino {
					t.Logf("inode %d again after %d directories", st.Ino, i+1)
					assert.NilError(t, os.Rename(p, leaf))
					reused = true
				} else {
					made = append(made, p)
				}
			}
			assert.Assert(t, reused, "no directory got inode %d again", st.Ino)
			for _, p := range made {
				assert.NilError(t, os.Remove(p))
			}
			assert.NilError(t, os.WriteFile(filepath.Join(leaf, ".envrc"), []byte("x"), 0o644))
			setMtime(t, leaf, lmt)
			setMtime(t, wt, mt)
		}, "pkg03/.envrc"},
		{"a bind mount over it (a private mount namespace)", nil, "pkg03/.cursorrules"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			wt := cacheTree(t)
			leaf := filepath.Join(wt, "pkg03")
			cacheDir := t.TempDir()
			time.Sleep(racyWindow + 100*time.Millisecond)
			scanBoth(t, wt, cacheDir)
			data, err := os.ReadFile(filepath.Join(cacheDir, cacheFile))
			assert.NilError(t, err)
			d, err := decodeCache(data)
			assert.NilError(t, err)
			r, ok := d.Dirs["pkg03"]
			assert.Assert(t, ok && !r.work(), "the control: pkg03 recorded as a leaf")
			if c.change == nil {
				bindMounted(t, wt, leaf, func() {
					s := scanBoth(t, wt, cacheDir)
					_, found := s.Entries[c.want]
					assert.Assert(t, found, c.want)
					assert.Assert(t, s.DirsCached > 30, "the control: the cache was used (%d)", s.DirsCached)
				})
				return
			}
			c.change(t, wt, leaf)
			s := scanBoth(t, wt, cacheDir)
			_, found := s.Entries[c.want]
			assert.Assert(t, found, c.want)
			assert.Assert(t, s.DirsCached > 30, "the control: the cache was used (%d)", s.DirsCached)
		})
	}
}

// TestGuardCacheRacyLeaf: a leaf changed less than racyWindow before the
// scan is not recorded, so a second change in the same ctime tick (here:
// at once, mtime put back) is seen; the control: once old enough it is
// recorded.
func TestGuardCacheRacyLeaf(t *testing.T) {
	wt := cacheTree(t)
	cacheDir := t.TempDir()
	time.Sleep(racyWindow + 100*time.Millisecond)
	leaf := filepath.Join(wt, "pkg04")
	assert.NilError(t, os.WriteFile(filepath.Join(leaf, "new.go"), nil, 0o644))
	mt := mtimeOf(t, leaf)
	scanBoth(t, wt, cacheDir)
	data, err := os.ReadFile(filepath.Join(cacheDir, cacheFile))
	assert.NilError(t, err)
	d, err := decodeCache(data)
	assert.NilError(t, err)
	_, ok := d.Dirs["pkg04"]
	assert.Assert(t, !ok, "a directory changed within racyWindow is not recorded")
	_, ok = d.Dirs["pkg05"]
	assert.Assert(t, ok, "the control: an older one is")
	assert.NilError(t, os.Rename(filepath.Join(leaf, "new.go"), filepath.Join(leaf, "AGENTS.md")))
	setMtime(t, leaf, mt)
	s := scanBoth(t, wt, cacheDir)
	_, found := s.Entries["pkg04/AGENTS.md"]
	assert.Assert(t, found)
}

func mustRead(t *testing.T, dir string) []string {
	ents, err := os.ReadDir(dir)
	assert.NilError(t, err)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

func itoa(i int) string {
	b := []byte{}
	for {
		b = append([]byte{byte('0' + i%10)}, b...)
		if i /= 10; i == 0 {
			return string(b)
		}
	}
}

// bindMounted runs fn on a thread in a mount namespace of its own where a
// directory holding a guarded file is bind-mounted over leaf (the host's
// mounts untouched; the thread ends with fn).
func bindMounted(t *testing.T, wt, leaf string, fn func()) {
	src := t.TempDir()
	assert.NilError(t, os.WriteFile(filepath.Join(src, ".cursorrules"), []byte("x"), 0o644))
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread() // never unlocked: the thread goes with its namespace
		if err := unix.Unshare(unix.CLONE_NEWNS | unix.CLONE_FS); err != nil {
			t.Errorf("unshare: %v", err)
			return
		}
		if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
			t.Errorf("make private: %v", err)
			return
		}
		if err := unix.Mount(src, leaf, "", unix.MS_BIND, ""); err != nil {
			t.Errorf("bind: %v", err)
			return
		}
		fn()
	}()
	<-done
}

// TestGuardCacheDecodeForged: the decoder of a file whose checksum is
// right (written by someone who computed it) never panics and refuses
// every truncation; a file cut short without its checksum recomputed is
// refused by it. The control: the whole file decodes.
func TestGuardCacheDecodeForged(t *testing.T) {
	wt := cacheTree(t)
	cacheDir := t.TempDir()
	time.Sleep(racyWindow + 100*time.Millisecond)
	scanBoth(t, wt, cacheDir)
	data, err := os.ReadFile(filepath.Join(cacheDir, cacheFile))
	assert.NilError(t, err)
	_, err = decodeCache(data)
	assert.NilError(t, err, "the control")
	withCRC := func(body []byte) []byte {
		return binary.LittleEndian.AppendUint32(append([]byte(nil), body...), crc32.Checksum(body, cacheCRC))
	}
	body := data[:len(data)-4]
	for n := 0; n < len(body); n++ {
		_, err := decodeCache(withCRC(body[:n]))
		assert.Assert(t, err != nil, "cut at %d of %d", n, len(body))
		_, err = decodeCache(data[:n])
		assert.Assert(t, err != nil, "cut at %d, no checksum", n)
	}
	rnd := rand.New(rand.NewPCG(1, 2))
	for range 20000 {
		b := append([]byte(nil), body...)
		for range 1 + rnd.IntN(4) {
			b[len(cacheMagic)+rnd.IntN(len(b)-len(cacheMagic))] = byte(rnd.Uint32())
		}
		_, _ = decodeCache(withCRC(b)) // no panic
	}
}
