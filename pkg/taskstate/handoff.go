package taskstate

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shrooms-cage/shrooms/pkg/taskid"
)

// TeardownWait bounds how long taking a task's lock waits for a detached
// teardown (the cage's removal and the next cage's preparation after a
// turn's result was given) before it reports the task busy.
const TeardownWait = 2 * time.Minute

// teardownMark is what the lock file says while a detached teardown holds it.
const teardownMark = "teardown "

// HandOff marks the held lock as passed to a detached teardown and returns
// its two files (the lock file and the task directory, both flocked), for
// the child process to inherit: a flock belongs to the open file, so the
// lock stays held until the child is done (or dies) however soon this
// process exits. The directory's lock goes too, so that deleting the lock
// file while the teardown runs still lets no turn start beside it. Takers of the lock wait for such a holder
// instead of failing as busy. Undo with Reclaim if the child never starts.
func (l *Lock) HandOff() (file, dir *os.File, err error) {
	if l == nil || l.f == nil || l.dir == nil {
		return nil, nil, errors.New("task lock: not held")
	}
	if err := l.mark(teardownMark + "\n"); err != nil {
		return nil, nil, err
	}
	return l.f, l.dir, nil
}

// MarkTeardown records the pid of the child a lock was handed off to, so
// that status names it before the child has written it itself.
func (l *Lock) MarkTeardown(pid int) error {
	return l.mark(teardownMark + strconv.Itoa(pid) + "\n")
}

// Reclaim clears a hand-off's mark: this process keeps the lock.
func (l *Lock) Reclaim() error { return l.mark("") }

func (l *Lock) mark(s string) error {
	if err := l.f.Truncate(0); err != nil {
		return fmt.Errorf("task lock: %w", err)
	}
	if _, err := l.f.WriteAt([]byte(s), 0); err != nil {
		return fmt.Errorf("task lock: %w", err)
	}
	return nil
}

// AdoptLock takes over a lock handed off to this process (the inherited
// lock file and task directory): it checks that it holds both flocks, and
// records this process as the holder.
func AdoptLock(f, dir *os.File) (*Lock, error) {
	for _, x := range []*os.File{f, dir} {
		if err := unix.Flock(int(x.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			return nil, fmt.Errorf("task lock handed off: %w", err)
		}
	}
	l := &Lock{f: f, dir: dir}
	if err := l.mark(teardownMark + strconv.Itoa(os.Getpid()) + "\n"); err != nil {
		return nil, err
	}
	return l, nil
}

// heldByTeardown reports whether the lock file says a detached teardown
// holds it.
func heldByTeardown(f *os.File) bool {
	b := make([]byte, 32)
	n, _ := f.ReadAt(b, 0)
	return strings.HasPrefix(string(b[:n]), teardownMark)
}

// waitTeardown waits, up to TeardownWait, for a detached teardown to drop
// the lock and takes it.
func waitTeardown(f *os.File) error {
	deadline := time.Now().Add(TeardownWait)
	for delay := time.Millisecond; ; delay = min(delay*2, 20*time.Millisecond) {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil || !errors.Is(err, unix.EWOULDBLOCK) || time.Now().After(deadline) {
			return err
		}
		time.Sleep(delay)
	}
}

// TeardownHolder returns the pid a detached teardown wrote into the task's
// lock file (0 when the file carries no such mark). Only meaningful while
// the lock is held: a teardown that died leaves its mark behind.
func (s Store) TeardownHolder(task taskid.ID) int {
	dir, err := s.taskPath(task)
	if err != nil {
		return 0
	}
	f, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0
	}
	defer f.Close()
	b := make([]byte, 32)
	n, _ := f.ReadAt(b, 0)
	rest, ok := strings.CutPrefix(string(b[:n]), teardownMark)
	if !ok {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(rest))
	return pid
}

// Starting marks this process as starting a turn (a shared lock on the
// host's starting.lock) until the returned lock is released, once its cage
// runs. Detached teardowns wait for a moment with no turn starting
// (WaitStarts), so a burst of turns starts before the removals and
// preparations their predecessors left.
func (s Store) Starting() (*Lock, error) {
	f, err := s.openStarting()
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_SH); err != nil {
		f.Close()
		return nil, fmt.Errorf("starting lock: %w", err)
	}
	return &Lock{f: f}, nil
}

// WaitStarts waits until no turn is starting on the host, for at most max:
// a steady stream of starts delays a teardown, never stops it.
func (s Store) WaitStarts(ctx context.Context, max time.Duration) {
	f, err := s.openStarting()
	if err != nil {
		return
	}
	defer f.Close()
	deadline := time.Now().Add(max)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) == nil {
			return // released by Close
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (s Store) openStarting() (*os.File, error) {
	if err := os.MkdirAll(s.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("starting lock: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(s.Dir, "starting.lock"), os.O_RDWR|os.O_CREATE|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("starting lock: %w", err)
	}
	return f, nil
}
