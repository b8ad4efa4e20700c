// Package taskstate keeps shrooms' host-side state of a task under the state
// directory: the lock that keeps two turns of a task from overlapping, the
// task's stable user-namespace range, and its turn counter.
//
// Locks are flock(2) locks, so the kernel releases them when a shrooms
// process dies: a crash can never leave a task stuck.
package taskstate

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/shrooms-cage/shrooms/pkg/fault"
	"github.com/shrooms-cage/shrooms/pkg/taskid"
)

// ErrBusy means another turn of the task holds its lock.
var ErrBusy error = fault.Busy

// Store is the state directory.
type Store struct {
	Dir string
}

// taskDir returns (and creates, 0700) the task's state directory.
func (s Store) taskDir(task taskid.ID) (string, error) {
	d, err := s.Task(task)
	if err != nil {
		return "", err
	}
	return d.ensure()
}

// taskPath returns the task's state directory without creating it.
func (s Store) taskPath(task taskid.ID) (string, error) {
	d, err := s.Task(task)
	return d.path, err
}

// Dir is one task's state directory, derived once from the task id
// (Store.Task): what a turn reads and writes of its task's state needs the
// directory, not the id. The zero Dir is refused as "no task id".
type Dir struct{ path string }

// Task is task's state directory (created by the calls that write).
func (s Store) Task(task taskid.ID) (Dir, error) {
	if task.IsZero() {
		return Dir{}, errors.New("no task id") // only taskid.Parse makes one
	}
	return Dir{filepath.Join(s.Dir, "tasks", task.String())}, nil
}

// Path is the directory's path.
func (d Dir) Path() string { return d.path }

// File is the path of the file name in the directory.
func (d Dir) File(name string) string { return filepath.Join(d.path, name) }

// History is the path of the task's model-request history.
func (d Dir) History() string { return d.File("history") }

// Trust is the path of the task's trust store (guard records and caches
// the cage cannot write).
func (d Dir) Trust() string { return d.File("trust") }

// Name is the directory's name, the task id's string form, for messages.
func (d Dir) Name() string { return filepath.Base(d.path) }

// check refuses the zero Dir.
func (d Dir) check() error {
	if d.path == "" {
		return errors.New("no task id")
	}
	return nil
}

// ensure returns (and creates, 0700) the directory.
func (d Dir) ensure() (string, error) {
	if err := d.check(); err != nil {
		return "", err
	}
	if err := os.MkdirAll(d.path, 0o700); err != nil {
		return "", fmt.Errorf("state directory: %w", err)
	}
	return d.path, nil
}

// Lock is a held task lock.
type Lock struct{ f, dir *os.File }

// Release drops the lock.
func (l *Lock) Release() error {
	if l == nil || l.f == nil {
		return nil
	}
	// The directory's lock goes first: a taker waiting on the lock file
	// (a teardown's) then finds the directory free.
	if l.dir != nil {
		l.dir.Close()
	}
	err := l.f.Close()
	l.f, l.dir = nil, nil
	return err
}

// LockTask takes the task's lock without waiting for a turn (ErrBusy if one
// holds it); it waits, up to TeardownWait, for a detached teardown.
func (s Store) LockTask(task taskid.ID) (*Lock, error) {
	d, err := s.Task(task)
	if err != nil {
		return nil, err
	}
	return d.Lock()
}

// Lock is Store.LockTask on the task's directory.
func (d Dir) Lock() (*Lock, error) {
	dir, err := d.ensure()
	if err != nil {
		return nil, err
	}
	task := d.Name()
	f, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_RDWR|os.O_CREATE|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("task lock: %w", err)
	}
	h, err := takeLock(f)
	if err != nil {
		f.Close()
		switch {
		case h == holderTeardown:
			return nil, fmt.Errorf("%w: task %q: the previous turn's teardown still holds it after %s (see teardown.log in its state directory)", ErrBusy, task, TeardownWait)
		case errors.Is(err, unix.EWOULDBLOCK):
			return nil, fmt.Errorf("%w: task %q has a turn running (turns of one task never overlap)", ErrBusy, task)
		}
		return nil, fmt.Errorf("task lock: %w", err)
	}
	l := &Lock{f: f}
	// This process holds it as a turn; a teardown that died left at most
	// its text, which goes too.
	if err := l.Reclaim(); err != nil {
		f.Close()
		return nil, err
	}
	// The task directory is locked too: a lock file deleted (or replaced)
	// while a turn holds it would let a second turn lock a new file and
	// run alongside. (A detached teardown inherits both.)
	dl, err := os.OpenFile(dir, os.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("task lock: %w", err)
	}
	if err := unix.Flock(int(dl.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		dl.Close()
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w: task %q has a turn running (turns of one task never overlap)", ErrBusy, task)
		}
		return nil, fmt.Errorf("task lock: %w", err)
	}
	l.dir = dl
	// A turn whose shrooms died left its record to write: write it now.
	if err := recordKilled(dir); err != nil {
		l.Release()
		return nil, err
	}
	return l, nil
}

// NextTurn increments and returns the task's turn number (1 for the first).
// Call it with the task lock held.
func (s Store) NextTurn(task taskid.ID) (int, error) {
	d, err := s.Task(task)
	if err != nil {
		return 0, err
	}
	return d.NextTurn()
}

// NextTurn is Store.NextTurn on the task's directory.
func (d Dir) NextTurn() (int, error) {
	n, err := d.LastTurn()
	if err != nil {
		return 0, err
	}
	n++
	dir, _ := d.ensure()
	if err := writeAtomic(filepath.Join(dir, "turn"), []byte(strconv.Itoa(n)+"\n")); err != nil {
		return 0, fmt.Errorf("turn counter: %w", err)
	}
	return n, nil
}

// LastTurn returns the number of the task's last turn (0 if none).
func (s Store) LastTurn(task taskid.ID) (int, error) {
	d, err := s.Task(task)
	if err != nil {
		return 0, err
	}
	return d.LastTurn()
}

// LastTurn is Store.LastTurn on the task's directory.
func (d Dir) LastTurn() (int, error) {
	if err := d.check(); err != nil {
		return 0, err
	}
	dir := d.path
	b, err := os.ReadFile(filepath.Join(dir, "turn"))
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("turn counter: %w", err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || n < 0 {
		return 0, fmt.Errorf("turn counter %s is corrupt: %q", filepath.Join(dir, "turn"), string(b))
	}
	return n, nil
}

func writeAtomic(path string, data []byte) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// SubIDRange is one /etc/subuid or /etc/subgid entry.
type SubIDRange struct {
	Start, Count uint64
}

// ReadSubIDs finds user's range in a subuid/subgid file.
func ReadSubIDs(path, user string) (SubIDRange, error) {
	f, err := os.Open(path)
	if err != nil {
		return SubIDRange{}, fmt.Errorf("%s: %w", path, err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		parts := strings.Split(strings.TrimSpace(sc.Text()), ":")
		if len(parts) != 3 || parts[0] != user {
			continue
		}
		start, err1 := strconv.ParseUint(parts[1], 10, 32)
		count, err2 := strconv.ParseUint(parts[2], 10, 32)
		if err1 != nil || err2 != nil || start == 0 || start+count > 1<<32-1 {
			return SubIDRange{}, fmt.Errorf("%s: malformed entry for %q: %q", path, user, sc.Text())
		}
		return SubIDRange{Start: start, Count: count}, nil
	}
	if err := sc.Err(); err != nil {
		return SubIDRange{}, fmt.Errorf("%s: %w", path, err)
	}
	return SubIDRange{}, fmt.Errorf("%s has no range for %q (add e.g. `%s:1879048192:268435456`)", path, user, user)
}

// Facts a task remembers between commands (for commit, collect and reset).
const (
	FactWorktree = "worktree"
	FactAgent    = "agent"
	// FactHome names the task's HOME volume once it was made: from then on
	// a missing HOME image is drift to repair or refuse, never a new start.
	FactHome = "home"
	// FactProfiles lists (comma-separated, sorted) every HOME profile the
	// task bootstrapped or used: the reset keeps their kept state whatever
	// the turn's agent.
	FactProfiles = "profiles"
)

// Remember stores a fact of the task (a single line).
func (s Store) Remember(task taskid.ID, fact, value string) error {
	d, err := s.Task(task)
	if err != nil {
		return err
	}
	return d.Remember(fact, value)
}

// Remember is Store.Remember on the task's directory.
func (d Dir) Remember(fact, value string) error {
	dir, err := d.ensure()
	if err != nil {
		return err
	}
	if strings.ContainsAny(value, "\n\x00") {
		return fmt.Errorf("task fact %s: value is not a single line", fact)
	}
	path := filepath.Join(dir, "fact-"+fact)
	// Most turns remember what the last one did: no write, no fsync.
	if old, err := os.ReadFile(path); err == nil && string(old) == value+"\n" {
		return nil
	}
	return writeAtomic(path, []byte(value+"\n"))
}

// Recall returns a remembered fact, "" if there is none.
func (s Store) Recall(task taskid.ID, fact string) (string, error) {
	d, err := s.Task(task)
	if err != nil {
		return "", err
	}
	return d.Recall(fact)
}

// Recall is Store.Recall on the task's directory.
func (d Dir) Recall(fact string) (string, error) {
	if err := d.check(); err != nil {
		return "", err
	}
	dir := d.path
	b, err := os.ReadFile(filepath.Join(dir, "fact-"+fact))
	if errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("task fact %s: %w", fact, err)
	}
	return strings.TrimSuffix(string(b), "\n"), nil
}

// Exists reports whether the task has any state (has been bootstrapped or run).
func (s Store) Exists(task taskid.ID) (bool, error) {
	dir, err := s.taskPath(task)
	if err != nil {
		return false, err
	}
	_, err = os.Stat(dir)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	return err == nil, err
}
