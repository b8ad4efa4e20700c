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

// Who holds a task's lock is kept in the kernel, not in the lock file's
// text: besides its flock, the holder holds an open-file-description
// (OFD) byte-range lock on the lock file's first byte, exclusive while a
// turn runs and shared once a detached teardown holds it. Turning one into
// the other is one fcntl (the kernel converts a lock atomically), so a
// taker that finds the flock held always sees one of the two, never a
// half-written mark; and the lock dies with its holder, so a teardown
// killed half-way leaves no stale mark. The file's text only names the
// teardown's pid for status.
const (
	holderByte = 0
	// teardownMark prefixes the pid a teardown writes into the file,
	// padded to markLen so that one write replaces the whole text.
	teardownMark = "teardown "
	markLen      = 32
)

// holder is what holds a task's lock, as its byte-range lock says.
type holder int

const (
	holderNone     holder = iota // nobody, or a holder in its first or last microseconds
	holderTurn                   // a turn (exclusive)
	holderTeardown               // a detached teardown (shared)
)

// setHolder sets (or converts) this description's byte-range lock.
func setHolder(f *os.File, typ int16) error {
	lk := unix.Flock_t{Type: typ, Whence: 0, Start: holderByte, Len: 1}
	if err := unix.FcntlFlock(f.Fd(), unix.F_OFD_SETLK, &lk); err != nil {
		return fmt.Errorf("task lock: holder mark: %w", err)
	}
	return nil
}

// holderOf reads who holds the lock file's byte-range lock (locks of f's
// own description do not count).
func holderOf(f *os.File) holder {
	lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: 0, Start: holderByte, Len: 1}
	if err := unix.FcntlFlock(f.Fd(), unix.F_OFD_GETLK, &lk); err != nil {
		return holderNone
	}
	switch lk.Type {
	case unix.F_WRLCK:
		return holderTurn
	case unix.F_RDLCK:
		return holderTeardown
	}
	return holderNone
}

// HandOff marks the held lock as passed to a detached teardown and returns
// its two files (the lock file and the task directory, both flocked), for
// the child process to inherit: a flock and an OFD lock belong to the open
// file, so the lock stays held until the child is done (or dies) however
// soon this process exits. The directory's lock goes too, so that deleting
// the lock file while the teardown runs still lets no turn start beside
// it. Takers of the lock wait for such a holder instead of failing as
// busy. Undo with Reclaim if the child never starts.
func (l *Lock) HandOff() (file, dir *os.File, err error) {
	if l == nil || l.f == nil || l.dir == nil {
		return nil, nil, errors.New("task lock: not held")
	}
	if err := setHolder(l.f, unix.F_RDLCK); err != nil {
		return nil, nil, err
	}
	if err := l.mark(teardownMark); err != nil {
		return nil, nil, err
	}
	return l.f, l.dir, nil
}

// MarkTeardown records the pid of the child a lock was handed off to, so
// that status names it before the child has written it itself.
func (l *Lock) MarkTeardown(pid int) error {
	return l.mark(teardownMark + strconv.Itoa(pid))
}

// Reclaim undoes a hand-off: this process keeps the lock as a turn.
func (l *Lock) Reclaim() error {
	if err := setHolder(l.f, unix.F_WRLCK); err != nil {
		return err
	}
	return l.mark("")
}

// mark writes the file's text in one write of markLen bytes (never a
// truncation then a write): a reader sees the old text or the new.
func (l *Lock) mark(s string) error {
	b := []byte(fmt.Sprintf("%-*s", markLen-1, s) + "\n")
	if len(b) != markLen {
		return fmt.Errorf("task lock: mark %q too long", s)
	}
	if _, err := l.f.WriteAt(b, 0); err != nil {
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
	// Shared already (HandOff); setting it again is a no-op that checks
	// this description holds it.
	if err := setHolder(f, unix.F_RDLCK); err != nil {
		return nil, err
	}
	if err := l.mark(teardownMark + strconv.Itoa(os.Getpid())); err != nil {
		return nil, err
	}
	return l, nil
}

// transitionWait bounds how long a taker retries when the flock is held
// but no holder mark is set: a holder between its flock and its mark, or
// between dropping one and the other, is there for microseconds.
const transitionWait = 200 * time.Millisecond

// takeLock flocks the task's lock file: at once, or after a detached
// teardown holding it is done (up to TeardownWait). It fails with
// EWOULDBLOCK, and what held it, when a turn holds it.
func takeLock(f *os.File) (holder, error) {
	start := time.Now()
	// How long the flock has been held with no holder mark: counted from
	// when that was first seen, not from start. A teardown's last close
	// drops its byte lock a moment before its flock (the kernel removes
	// them one after the other), and a taker that had waited for it longer
	// than transitionWait must not read that moment as another tool.
	var unmarked time.Time
	for delay := time.Millisecond; ; delay = min(delay*2, 20*time.Millisecond) {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil || !errors.Is(err, unix.EWOULDBLOCK) {
			return holderNone, err
		}
		h := holderOf(f)
		if h != holderNone {
			unmarked = time.Time{}
		} else if unmarked.IsZero() {
			unmarked = time.Now()
		}
		switch {
		case h == holderTurn:
			return h, err
		case h == holderNone && time.Since(unmarked) > transitionWait:
			// A flock without a mark for this long: an older shrooms, or
			// another tool holding the file. Not a teardown: busy.
			return h, err
		case h == holderTeardown && time.Since(start) > TeardownWait:
			return h, err
		}
		time.Sleep(delay)
	}
}

// TeardownHolder returns the pid a detached teardown wrote into the task's
// lock file, 0 when no teardown holds the lock (a teardown that died holds
// nothing, whatever its text says).
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
	if holderOf(f) != holderTeardown {
		return 0
	}
	b := make([]byte, markLen)
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

// StartingEarly is Starting for a turn whose input is not checked yet: it
// creates nothing (bad input leaves no state behind), so it is nil, nil on
// a host where no turn ever marked itself starting.
func (s Store) StartingEarly() (*Lock, error) {
	f, err := os.OpenFile(filepath.Join(s.Dir, "starting.lock"), os.O_RDWR|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("starting lock: %w", err)
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
