package taskstate

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shrooms-cage/shrooms/pkg/taskid"
)

// TurnsFile holds one JSON line per turn of a task (its record), kept with
// the task until forget.
const TurnsFile = "turns.jsonl"

// runningFile holds the record of the turn that runs now, as it is to be
// written if its shrooms never gets to write its own (status "killed").
const runningFile = "running.json"

// maxRunning bounds the running turn's record (it has no reset report yet).
const maxRunning = 1 << 20

// TimeFormat is how records and results give times: RFC 3339, UTC.
const TimeFormat = "2006-01-02T15:04:05.000Z07:00"

// Now is the current time as records give it.
func Now() string { return time.Now().UTC().Format(TimeFormat) }

// MarkRunning keeps rec (a JSON object: the turn's record so far, status
// "killed") as the task's running turn. Call it with the task lock held. If
// the turn's shrooms dies before AppendRecord, the next LockTask appends
// it, with endedAt set to when the loss was found.
func (s Store) MarkRunning(task taskid.ID, rec []byte) error {
	d, err := s.Task(task)
	if err != nil {
		return err
	}
	return d.MarkRunning(rec)
}

// MarkRunning is Store.MarkRunning on the task's directory.
func (d Dir) MarkRunning(rec []byte) error {
	if err := d.check(); err != nil {
		return err
	}
	dir := d.path
	path := filepath.Join(dir, runningFile)
	tmp := path + ".tmp"
	// No fsync: a power loss loses at most this mark (the turn's record is
	// then missing, as before it was kept).
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("running turn mark: %w", err)
	}
	if _, err := f.Write(rec); err != nil {
		f.Close()
		return fmt.Errorf("running turn mark: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("running turn mark: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("running turn mark: %w", err)
	}
	return nil
}

// AppendRecord appends one turn record (a JSON object on one line) to the
// task's log and drops the running turn's mark: the turn has its record.
// Call it with the task lock held.
func (s Store) AppendRecord(task taskid.ID, rec []byte) error {
	dir, err := s.taskPath(task)
	if err != nil {
		return err
	}
	if err := appendLine(filepath.Join(dir, TurnsFile), rec); err != nil {
		return err
	}
	if err := os.Remove(filepath.Join(dir, runningFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("running turn mark: %w", err)
	}
	return nil
}

func appendLine(path string, rec []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("turn record: %w", err)
	}
	defer f.Close()
	if _, err := f.Write(append(append([]byte{}, rec...), '\n')); err != nil {
		return fmt.Errorf("turn record: %w", err)
	}
	return nil
}

// recordKilled writes the record of a turn whose shrooms died (kill -9,
// power loss) before it wrote its own: called by LockTask, so by the next
// command that takes the task lock. A damaged mark is recorded as what is
// known of it (nothing but the loss) rather than dropped silently.
func recordKilled(dir string) error {
	path := filepath.Join(dir, runningFile)
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("running turn mark: %w", err)
	}
	fi, err := f.Stat()
	var b []byte
	if err == nil && fi.Mode().IsRegular() {
		b, err = io.ReadAll(io.LimitReader(f, maxRunning))
	}
	f.Close()
	if err != nil {
		return fmt.Errorf("running turn mark: %w", err)
	}
	rec := map[string]json.RawMessage{}
	if json.Unmarshal(b, &rec) != nil {
		rec = map[string]json.RawMessage{}
	}
	set := func(k string, v any) {
		if raw, err := json.Marshal(v); err == nil {
			rec[k] = raw
		}
	}
	set("status", "killed")
	set("exitCode", -1)
	set("endedAt", Now())
	set("error", "shrooms was killed before the turn ended (kill -9, power loss); this record was written by the next command that took the task lock")
	out, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("running turn mark: %w", err)
	}
	if err := appendLine(filepath.Join(dir, TurnsFile), out); err != nil {
		return err
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("running turn mark: %w", err)
	}
	return nil
}

// LockTaskWait is LockTask that waits up to wait for a running turn of the
// task to end (run --wait); wait 0 does not wait.
func (s Store) LockTaskWait(task taskid.ID, wait time.Duration) (*Lock, error) {
	d, err := s.Task(task)
	if err != nil {
		return nil, err
	}
	return d.LockWait(wait)
}

// LockWait is Store.LockTaskWait on the task's directory.
func (d Dir) LockWait(wait time.Duration) (*Lock, error) {
	deadline := time.Now().Add(wait)
	for {
		l, err := d.Lock()
		if err == nil || !errors.Is(err, ErrBusy) || !time.Now().Before(deadline) {
			if err != nil && wait > 0 && errors.Is(err, ErrBusy) {
				err = fmt.Errorf("%w (waited %s)", err, wait)
			}
			return l, err
		}
		time.Sleep(min(100*time.Millisecond, time.Until(deadline)))
	}
}
