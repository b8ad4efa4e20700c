package taskstate

import (
	"context"
	"errors"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

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

	f, dir, err := turnLock.HandOff()
	assert.NilError(t, err)
	child, err := AdoptLock(inherit(t, f), inherit(t, dir))
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
	f, dir, err = l.HandOff()
	assert.NilError(t, err)
	dead, err := AdoptLock(inherit(t, f), inherit(t, dir))
	assert.NilError(t, err)
	assert.NilError(t, l.Release())
	assert.NilError(t, dead.Release()) // the kernel drops a killed process's locks
	l, err = s.LockTask(taskid.Must("t1"))
	assert.NilError(t, err, "a dead teardown's mark kept the task busy")
	assert.Equal(t, s.TeardownHolder(taskid.Must("t1")), 0, "a turn holds it, not the dead teardown")
	b, err := os.ReadFile(s.Dir + "/tasks/t1/lock")
	assert.NilError(t, err)
	assert.Equal(t, strings.TrimSpace(string(b)), "", "the mark is cleared by the next holder")
	// Reclaim: a hand-off whose child never started leaves a plain turn lock.
	_, _, err = l.HandOff()
	assert.NilError(t, err)
	assert.NilError(t, l.Reclaim())
	_, err = s.LockTask(taskid.Must("t1"))
	assert.Assert(t, errors.Is(err, ErrBusy), "%v", err)
	assert.NilError(t, l.Release())
}

// TestHandOffKeepsTheDirectoryLock: deleting the lock file while a
// detached teardown holds the task lets no turn start beside it; with the
// directory lock left behind (the bug this guards), a new lock file would
// have been enough.
func TestHandOffKeepsTheDirectoryLock(t *testing.T) {
	s := Store{Dir: t.TempDir()}
	l, err := s.LockTask(taskid.Must("t2"))
	assert.NilError(t, err)
	f, dir, err := l.HandOff()
	assert.NilError(t, err)
	child, err := AdoptLock(inherit(t, f), inherit(t, dir))
	assert.NilError(t, err)
	assert.NilError(t, l.Release()) // the run process exits
	assert.NilError(t, os.Remove(s.Dir+"/tasks/t2/lock"))
	_, err = s.LockTask(taskid.Must("t2"))
	assert.Assert(t, errors.Is(err, ErrBusy), "a turn started beside the teardown: %v", err)
	assert.NilError(t, child.Release())
	// Positive control: once the teardown is done the task locks again.
	again, err := s.LockTask(taskid.Must("t2"))
	assert.NilError(t, err)
	assert.NilError(t, again.Release())
}

// TestWaitStarts: a teardown waits while a turn is starting, and goes once
// the turn's cage runs; turns starting together never wait for each other.
func TestWaitStarts(t *testing.T) {
	s := Store{Dir: t.TempDir()}
	s.WaitStarts(context.Background(), time.Minute) // none starting: returns

	a, err := s.Starting()
	assert.NilError(t, err)
	b, err := s.Starting() // shared: a second turn starts beside the first
	assert.NilError(t, err)
	var released atomic.Bool
	done := make(chan bool, 1)
	go func() {
		s.WaitStarts(context.Background(), time.Minute)
		done <- released.Load()
	}()
	assert.NilError(t, a.Release())
	released.Store(true)
	assert.NilError(t, b.Release())
	assert.Assert(t, <-done, "the teardown went while a turn was starting")

	// Bounded: a turn that never finishes starting delays it, no more.
	c, err := s.Starting()
	assert.NilError(t, err)
	defer c.Release()
	s.WaitStarts(context.Background(), 50*time.Millisecond)
}

// TestHandOffNeverLooksBusy: a taker arriving while a turn hands its lock
// to a teardown (the moment the next turn of an orchestrator's loop
// starts) waits for the teardown; it never sees a lock held by nobody in
// particular and reports a running turn. Before the holder was a byte-range
// lock, the mark was emptied then written, and 1 in ~60 such turns failed
// as busy.
func TestHandOffNeverLooksBusy(t *testing.T) {
	s := Store{Dir: t.TempDir()}
	id := taskid.Must("race")
	const rounds = 2000
	busy := 0
	for i := 0; i < rounds; i++ {
		l, err := s.LockTask(id)
		assert.NilError(t, err, "round %d", i)
		// The turn hands off (before its result is printed), then the
		// next turn starts while the turn names the child, the child
		// adopts and writes its own pid, the turn's process exits, the
		// child works and exits: every step the taker may land on.
		f, dir, err := l.HandOff()
		assert.NilError(t, err)
		taken := make(chan error, 1)
		go func() {
			next, err := s.LockTask(id)
			if err == nil {
				err = next.Release()
			}
			taken <- err
		}()
		child, err := AdoptLock(inherit(t, f), inherit(t, dir))
		assert.NilError(t, err)
		assert.NilError(t, l.MarkTeardown(os.Getpid()))
		assert.NilError(t, l.Release())
		if i%2 == 0 {
			time.Sleep(50 * time.Microsecond)
		}
		assert.NilError(t, child.Release())
		if err := <-taken; err != nil {
			assert.Assert(t, errors.Is(err, ErrBusy), "round %d: %v", i, err)
			busy++
		}
	}
	assert.Equal(t, busy, 0, "spurious busy in %d of %d hand-offs", busy, rounds)

	// Positive control: a turn that keeps its lock is busy at once.
	l, err := s.LockTask(id)
	assert.NilError(t, err)
	start := time.Now()
	_, err = s.LockTask(id)
	assert.Assert(t, errors.Is(err, ErrBusy), "%v", err)
	assert.Assert(t, time.Since(start) < time.Second, "busy took %s", time.Since(start))
	// A teardown's hold is seen for what it is.
	_, _, err = l.HandOff()
	assert.NilError(t, err)
	assert.NilError(t, l.MarkTeardown(4242))
	assert.Equal(t, s.TeardownHolder(id), 4242)
	assert.NilError(t, l.Reclaim())
	assert.Equal(t, s.TeardownHolder(id), 0)
	assert.NilError(t, l.Release())
}

// TestTeardownEndNeverLooksBusy: a teardown's last close drops its byte
// lock a moment before its flock. A taker that has already waited for the
// teardown longer than transitionWait must wait that moment out, not
// report a running turn (seen in back-to-back turns: a spurious 123). The
// moment is stretched here to 50 ms; a flock held with no mark for longer
// than transitionWait is still busy (the control).
func TestTeardownEndNeverLooksBusy(t *testing.T) {
	s := Store{Dir: t.TempDir()}
	task := taskid.Must("t4")
	l, err := s.LockTask(task)
	assert.NilError(t, err)
	f, dir, err := l.HandOff()
	assert.NilError(t, err)
	child, err := AdoptLock(inherit(t, f), inherit(t, dir))
	assert.NilError(t, err)
	assert.NilError(t, l.Release()) // the run process exits

	end := func(unmarkedFor time.Duration, done chan<- struct{}) {
		defer close(done)
		time.Sleep(transitionWait + 100*time.Millisecond) // the taker waits for the teardown
		// The byte lock goes first, then (after the moment) the flock.
		lk := unix.Flock_t{Type: unix.F_UNLCK, Whence: 0, Start: holderByte, Len: 1}
		assert.NilError(t, unix.FcntlFlock(child.f.Fd(), unix.F_OFD_SETLK, &lk))
		time.Sleep(unmarkedFor)
		assert.NilError(t, child.Release())
	}
	ended := make(chan struct{})
	go end(50*time.Millisecond, ended)
	got, err := s.LockTask(task)
	<-ended
	assert.NilError(t, err, "the end of a teardown looked like a running turn")
	assert.NilError(t, got.Release())

	// The control: a flock with no mark for longer than transitionWait is
	// another tool's (or an older shrooms'), and busy.
	l, err = s.LockTask(task)
	assert.NilError(t, err)
	f, dir, err = l.HandOff()
	assert.NilError(t, err)
	child, err = AdoptLock(inherit(t, f), inherit(t, dir))
	assert.NilError(t, err)
	assert.NilError(t, l.Release())
	ended = make(chan struct{})
	go end(2*transitionWait, ended)
	_, err = s.LockTask(task)
	<-ended
	assert.Assert(t, errors.Is(err, ErrBusy), "a flock held with no mark for %v: %v", 2*transitionWait, err)
}
