package profile

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
	"gotest.tools/v3/assert"
)

// rebuildBytes runs the opencode database rebuild on data (as the kept
// file's inode) and returns the rebuilt database.
func rebuildBytes(t testing.TB, dir string, data []byte) ([]byte, []RowDrop, error) {
	p := filepath.Join(dir, "opencode.db")
	_ = os.Remove(p)
	assert.NilError(t, os.WriteFile(p, data, 0o600))
	fd, err := unix.Open(p, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	assert.NilError(t, err)
	defer unix.Close(fd)
	var out bytes.Buffer
	drops, err := rebuildOpencodeDB(context.Background(), fd, -1, 1<<20, &out)
	return out.Bytes(), drops, err
}

// FuzzRebuildOpencodeDB feeds arbitrary bytes (mutations of a real
// database) to the rebuild of the kept opencode database: it never panics
// or hangs, and what it writes is a database that rebuilds again without
// dropping anything (only allowlisted rows and columns are left).
func FuzzRebuildOpencodeDB(f *testing.F) {
	seedDir := f.TempDir()
	seed := filepath.Join(seedDir, "seed.db")
	newOpencodeDB(f, seed, false).Close()
	data, err := os.ReadFile(seed)
	assert.NilError(f, err)
	f.Add(data)
	f.Add([]byte("SQLite format 3\x00"))
	f.Add([]byte{})
	dir := f.TempDir()
	// Positive control: the real database takes the path that is checked.
	_, _, err = rebuildBytes(f, dir, data)
	assert.NilError(f, err)
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > 1<<20 {
			return
		}
		out, _, err := rebuildBytes(t, dir, data)
		if err != nil {
			return
		}
		again, drops, err := rebuildBytes(t, dir, out)
		assert.NilError(t, err, "a rebuilt database does not rebuild")
		assert.Equal(t, len(drops), 0, "a rebuilt database still has something to drop: %v", drops)
		assert.Assert(t, len(again) > 0)
	})
}
