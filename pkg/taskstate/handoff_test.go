package taskstate

import (
	"errors"
	"os"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"
	"gotest.tools/v3/assert"

	"github.com/shrooms-cage/shrooms/pkg/taskid"
)

// inherit duplicates the lock's file the way a child process inherits it.
func inherit(t *testing.T, f *os.File) *os.File {
	fd, err := unix.Dup(int(f.Fd()))
	assert.NilError(t, err)
	return os.NewFile(uintptr(fd), "inherited")
}

// TestHandOff: a lock handed off outlives the process that took it; a
// turn's lock makes a taker fail as busy, a teardown's makes it wait until
// the teardown drops it; a teardown that died holds nothing.
func TestHandOff(t *testing.T) {
	s := Store{Dir: t.TempDir()}
	turnLock, err := s.LockTask(taskid.Must("t1"))
	assert.NilError(t, err)
	_, err = s.LockTask(taskid.Must("t1"))
	assert.Assert(t, errors.Is(err, ErrBusy), "a turn's lock: %v", err)

	f, err := turnLock.HandOff()
	assert.NilError(t, err)
	child, err := AdoptLock(inherit(t, f))
	assert.NilError(t, err)
	assert.NilError(t, turnLock.Release()) // the run process exits

	var released atomic.Bool
	taken := make(chan error, 1)
	go func() {
		l, err := s.LockTask(taskid.Must("t1"))
		if err == nil {
			if !released.Load() {
				err = errors.New("took the lock while the teardown held it")
			}
			l.Release()
		}
		taken <- err
	}()
	released.Store(true)
	assert.NilError(t, child.Release())
	assert.NilError(t, <-taken)

	// A teardown killed half-way: its mark stays in the file, its lock
	// does not.
	l, err := s.LockTask(taskid.Must("t1"))
	assert.NilError(t, err)
	f, err = l.HandOff()
	assert.NilError(t, err)
	dead, err := AdoptLock(inherit(t, f))
	assert.NilError(t, err)
	assert.NilError(t, l.Release())
	assert.NilError(t, dead.f.Close()) // the kernel drops a killed process's locks
	l, err = s.LockTask(taskid.Must("t1"))
	assert.NilError(t, err, "a dead teardown's mark kept the task busy")
	b, err := os.ReadFile(s.Dir + "/tasks/t1/lock")
	assert.NilError(t, err)
	assert.Equal(t, string(b), "", "the mark is cleared by the next holder")
	// Reclaim: a hand-off whose child never started leaves a plain turn lock.
	_, err = l.HandOff()
	assert.NilError(t, err)
	assert.NilError(t, l.Reclaim())
	_, err = s.LockTask(taskid.Must("t1"))
	assert.Assert(t, errors.Is(err, ErrBusy), "%v", err)
	assert.NilError(t, l.Release())
}
