package profile

import (
	"bytes"
	"context"
	"database/sql"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
	"gotest.tools/v3/assert"
)

// TestPatchInterruptedIsFinished: an in-place rewrite interrupted after
// trusted.db's transaction committed (the mark names the file, half its
// blocks already trusted.db's) is finished by the next reset without
// updating trusted.db again — the half-rewritten file is never read as a
// turn's changes — whether the next reset rewrites in place or copies; a
// mark naming another file is stale and goes; while a mark is there the
// file is never carried as it is.
func TestPatchInterruptedIsFinished(t *testing.T) {
	ctx := context.Background()
	seedDir := t.TempDir()
	seed := filepath.Join(seedDir, "seed.db")
	newOpencodeDB(t, seed, false).Close()
	data, err := os.ReadFile(seed)
	assert.NilError(t, err)
	base, _, err := rebuildBytes(t, t.TempDir(), data)
	assert.NilError(t, err)

	state := t.TempDir()
	trusted := filepath.Join(state, trustedDB)
	assert.NilError(t, os.WriteFile(trusted, base, 0o600))
	turn := filepath.Join(t.TempDir(), "opencode.db")
	assert.NilError(t, os.WriteFile(turn, base, 0o600))
	db, err := sql.Open("sqlite", "file:"+turn)
	assert.NilError(t, err)
	mustExec(t, db, `UPDATE part SET data = '{"type":"text","text":"edited"}' WHERE id = 'prt_3'`)
	assert.NilError(t, db.Close())
	fd, err := unix.Open(turn, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	assert.NilError(t, err)
	defer unix.Close(fd)
	var st unix.Stat_t
	assert.NilError(t, unix.Fstat(fd, &st))

	_, err = refreshTrusted(ctx, fd, -1, 1<<30, state)
	assert.NilError(t, err)
	want, err := os.ReadFile(trusted)
	assert.NilError(t, err)
	assert.Assert(t, !bytes.Equal(want, base), "positive control: the update changed trusted.db")
	interrupt := func() {
		t.Helper()
		assert.NilError(t, writeSynced(state, patchMark, markText(&st)))
		f, err := os.OpenFile(turn, os.O_WRONLY, 0)
		assert.NilError(t, err)
		_, err = f.WriteAt(want[:len(want)/2], 0)
		assert.NilError(t, err)
		assert.NilError(t, f.Close())
		// Whatever the file holds now is not a turn's change: its
		// turn's changes are in trusted.db already.
		db, err := sql.Open("sqlite", "file:"+turn)
		assert.NilError(t, err)
		mustExec(t, db, `UPDATE todo SET status = 'after the mark'`)
		assert.NilError(t, db.Close())
	}

	interrupt()
	assert.Assert(t, !sameAsTrusted(fd, -1, state), "carried as it is under a mark")
	drops, done, err := updateOpencodeDBInPlace(ctx, fd, -1, 1<<30, state)
	assert.NilError(t, err)
	assert.Assert(t, done)
	assert.Equal(t, len(drops), 0)
	got, err := os.ReadFile(turn)
	assert.NilError(t, err)
	assert.Assert(t, bytes.Equal(got, want), "the rewrite was not finished")
	again, err := os.ReadFile(trusted)
	assert.NilError(t, err)
	assert.Assert(t, bytes.Equal(again, want), "trusted.db was updated from the half-rewritten file")
	_, err = os.Stat(filepath.Join(state, patchMark))
	assert.Assert(t, os.IsNotExist(err), "the mark is left")

	// Copying instead: trusted.db as it is.
	interrupt()
	var out bytes.Buffer
	_, err = updateOpencodeDB(ctx, fd, -1, 1<<30, state, &out)
	assert.NilError(t, err)
	assert.Assert(t, bytes.Equal(out.Bytes(), want))
	again, err = os.ReadFile(trusted)
	assert.NilError(t, err)
	assert.Assert(t, bytes.Equal(again, want), "trusted.db was updated from the half-rewritten file")

	// The mark now names a file that is gone: stale, removed.
	other := filepath.Join(t.TempDir(), "other.db")
	assert.NilError(t, os.WriteFile(other, want, 0o600))
	ofd, err := unix.Open(other, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	assert.NilError(t, err)
	defer unix.Close(ofd)
	mine, err := patchMarked(ofd, state)
	assert.NilError(t, err)
	assert.Assert(t, !mine)
	_, err = os.Stat(filepath.Join(state, patchMark))
	assert.Assert(t, os.IsNotExist(err), "a stale mark is left")
}
