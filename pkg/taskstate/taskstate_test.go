package taskstate

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"gotest.tools/v3/assert"

	"github.com/shrooms-cage/shrooms/pkg/taskid"
)

func idFiles(t *testing.T, entry string) IDFiles {
	dir := t.TempDir()
	for _, f := range []string{"subuid", "subgid"} {
		assert.NilError(t, os.WriteFile(filepath.Join(dir, f), []byte("containers:100000:65536\n"+entry+"\n"), 0o644))
	}
	return IDFiles{SubUID: filepath.Join(dir, "subuid"), SubGID: filepath.Join(dir, "subgid"), User: "shrooms"}
}

func TestTaskIDsAreStableAndDisjoint(t *testing.T) {
	s := Store{Dir: t.TempDir()}
	files := idFiles(t, "shrooms:1000000:262144") // 4 slots

	peek, err := s.TaskIDs(taskid.Must("a"), files, false)
	assert.NilError(t, err)
	_, err = os.Stat(filepath.Join(s.Dir, "tasks", "a"))
	assert.Assert(t, errors.Is(err, os.ErrNotExist), "a dry look allocates nothing")

	a, err := s.TaskIDs(taskid.Must("a"), files, true)
	assert.NilError(t, err)
	assert.Equal(t, a, peek)
	assert.Equal(t, a.UID, uint32(1000000))
	b, err := s.TaskIDs(taskid.Must("b"), files, true)
	assert.NilError(t, err)
	assert.Equal(t, b.UID, uint32(1000000+65536))
	again, err := s.TaskIDs(taskid.Must("a"), files, true)
	assert.NilError(t, err)
	assert.Equal(t, again, a)

	for _, id := range []string{"c", "d"} {
		_, err := s.TaskIDs(taskid.Must(id), files, true)
		assert.NilError(t, err)
	}
	_, err = s.TaskIDs(taskid.Must("e"), files, true)
	assert.ErrorContains(t, err, "all 4 user-namespace slots")
}

func TestTaskIDsNeedARange(t *testing.T) {
	s := Store{Dir: t.TempDir()}
	_, err := s.TaskIDs(taskid.Must("a"), idFiles(t, "other:1:65536"), true)
	assert.ErrorContains(t, err, `has no range for "shrooms"`)
	_, err = s.TaskIDs(taskid.Must("a"), idFiles(t, "shrooms:1000000:1000"), true)
	assert.ErrorContains(t, err, "fewer than 65536")
}

func TestLockIsExclusiveAndReleased(t *testing.T) {
	s := Store{Dir: t.TempDir()}
	l, err := s.LockTask(taskid.Must("t1"))
	assert.NilError(t, err)
	_, err = s.LockTask(taskid.Must("t1"))
	assert.Assert(t, errors.Is(err, ErrBusy))
	other, err := s.LockTask(taskid.Must("t2"))
	assert.NilError(t, err, "other tasks are independent")
	assert.NilError(t, other.Release())
	assert.NilError(t, l.Release())
	l, err = s.LockTask(taskid.Must("t1"))
	assert.NilError(t, err)
	assert.NilError(t, l.Release())
}

func TestTurnCounter(t *testing.T) {
	s := Store{Dir: t.TempDir()}
	n, err := s.LastTurn(taskid.Must("t"))
	assert.NilError(t, err)
	assert.Equal(t, n, 0)
	for want := 1; want <= 3; want++ {
		n, err := s.NextTurn(taskid.Must("t"))
		assert.NilError(t, err)
		assert.Equal(t, n, want)
	}
	assert.NilError(t, os.WriteFile(filepath.Join(s.Dir, "tasks", "t", "turn"), []byte("x"), 0o600))
	_, err = s.NextTurn(taskid.Must("t"))
	assert.ErrorContains(t, err, "corrupt")
}

func TestBadTaskIDs(t *testing.T) {
	s := Store{Dir: t.TempDir()}
	// A bad id never parses (pkg/taskid); the zero ID fails closed and
	// creates nothing.
	_, err := s.LockTask(taskid.ID{})
	assert.ErrorContains(t, err, "no task id")
	_, err = s.TaskIDs(taskid.ID{}, idFiles(t, "shrooms:1000000:65536"), true)
	assert.Assert(t, err != nil)
	_, err = os.Stat(filepath.Join(s.Dir, "tasks"))
	assert.Assert(t, os.IsNotExist(err), "nothing created: %v", err)
}
