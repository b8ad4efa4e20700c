package task

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shrooms-cage/shrooms/pkg/config"
	"github.com/shrooms-cage/shrooms/pkg/fault"
	"github.com/shrooms-cage/shrooms/pkg/taskid"
	"github.com/shrooms-cage/shrooms/pkg/taskstate"
	"github.com/shrooms-cage/shrooms/pkg/turn"
)

// maxRecord bounds one turn record (a reset report lists bounded paths).
const maxRecord = 4 << 20

// Log returns the task's turn records, oldest first; n > 0 selects turn n.
func (r *Commands) Log(task taskid.ID, n int) ([]turn.Result, error) {
	if _, err := r.knownTask(task); err != nil {
		return nil, err
	}
	out, err := r.readLog(task, n)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", fault.HostNotReady, err)
	}
	return r.noTurn(task, n, out)
}

// readLog reads the task's turn records (turn n, or all when n is 0); no
// log yet is no record.
func (r *Commands) readLog(task taskid.ID, n int) ([]turn.Result, error) {
	f, err := os.Open(filepath.Join(r.taskDir(task), turn.TurnsFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("turn log: %w", err)
	}
	defer f.Close()
	var out []turn.Result
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), maxRecord)
	for sc.Scan() {
		var rec turn.Result
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			return nil, fmt.Errorf("turn log of %s is damaged: %w", task, err)
		}
		if n == 0 || rec.Turn == n {
			out = append(out, rec)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("turn log: %w", err)
	}
	return out, nil
}

func (r *Commands) noTurn(task taskid.ID, n int, out []turn.Result) ([]turn.Result, error) {
	if n > 0 && len(out) == 0 {
		return nil, fmt.Errorf("%w: task %q has no record of turn %d", fault.Input, task, n)
	}
	if out == nil {
		out = []turn.Result{}
	}
	return out, nil
}

// CheckTask refuses a task id that is invalid or that shrooms has no state
// of (fault.Input), reading only the state directory, so commands on an
// existing task can refuse a typo before they connect to podman.
func CheckTask(cfg *config.Config, task taskid.ID) error {
	r := state(cfg)
	_, err := r.knownTask(task)
	return err
}

// knownTask parses task and checks that shrooms has state of it.
func (r *Commands) knownTask(task taskid.ID) (taskid.ID, error) {
	id := task
	ok, err := r.Store.Exists(id)
	if err != nil {
		return id, fmt.Errorf("%w: %w", fault.HostNotReady, err)
	}
	if !ok {
		return id, fmt.Errorf("%w: %w %q (no turn has run for it)", fault.Input, ErrUnknownTask, task)
	}
	return id, nil
}

// TaskStatus is one task as `tasks` and `status` show it.
type TaskStatus struct {
	Task  string `json:"task"`
	Turns int    `json:"turns"`
	// Busy is true while a shrooms process holds the task (a turn runs);
	// PID is that process.
	Busy     bool   `json:"busy"`
	PID      int    `json:"pid,omitempty"`
	Agent    string `json:"agent,omitempty"`
	Worktree string `json:"worktree,omitempty"`
	// Last is the record of the task's last recorded turn.
	Last *turn.Result `json:"last,omitempty"`
	// HomeBytes is the disk space the task HOME's filesystem image uses.
	HomeBytes int64 `json:"homeBytes"`
	// Prepared is true while a cage prepared for the task's next turn
	// waits (it holds a conmon, a loop device and the HOME mount), made
	// PreparedAt, PreparedAgeS seconds ago; it expires after
	// cage.prepared_ttl. Known only while podman answers.
	Prepared     bool    `json:"prepared"`
	PreparedAt   string  `json:"preparedAt,omitempty"`
	PreparedAgeS float64 `json:"preparedAgeS,omitempty"`
}

// Tasks lists every task in the state directory, by id.
func (r *Commands) Tasks() ([]TaskStatus, error) {
	entries, err := os.ReadDir(taskstate.Layout{Dir: r.Cfg.State.Dir}.Tasks())
	if errors.Is(err, os.ErrNotExist) {
		return []TaskStatus{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %w", fault.HostNotReady, err)
	}
	out := []TaskStatus{}
	for _, e := range entries {
		id, perr := taskid.Parse(e.Name())
		if !e.IsDir() || perr != nil {
			continue
		}
		st, err := r.Status(id)
		if err != nil {
			return nil, err
		}
		out = append(out, *st)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Task < out[j].Task })
	return out, nil
}

// Status reports one task without taking its lock (a running turn is never
// disturbed). A state directory it cannot read is the host's to fix.
func (r *Commands) Status(task taskid.ID) (_ *TaskStatus, err error) {
	defer fault.Phase(fault.HostNotReady, &err)
	id, err := r.knownTask(task)
	if err != nil {
		return nil, err
	}
	st := &TaskStatus{Task: task.String()}
	if st.Turns, err = r.Store.LastTurn(id); err != nil {
		return nil, err
	}
	if st.PID, err = r.lockHolder(task); err != nil {
		return nil, err
	}
	st.Busy = st.PID != 0
	st.Agent, _ = r.Store.Recall(id, taskstate.FactAgent)
	st.Worktree, _ = r.Store.Recall(id, taskstate.FactWorktree)
	recs, err := r.Log(task, 0)
	if err != nil {
		return nil, err
	}
	if len(recs) > 0 {
		st.Last = &recs[len(recs)-1]
		st.Last.Reset = nil // the full report is in the log
	}
	st.HomeBytes = r.Homes.Bytes(task)
	return st, nil
}

// lockHolder returns the pid of the process holding the task's lock (0 when
// none), read from /proc/locks so that looking never takes the lock.
func (r *Commands) lockHolder(task taskid.ID) (int, error) {
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Join(r.taskDir(task), "lock"), &st); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return 0, nil
		}
		return 0, fmt.Errorf("task lock: %w", err)
	}
	locks, err := os.ReadFile("/proc/locks")
	if err != nil {
		return 0, fmt.Errorf("read /proc/locks: %w", err)
	}
	pid := flockHolder(locks, unix.Major(st.Dev), unix.Minor(st.Dev), st.Ino)
	if pid != 0 {
		// A detached teardown holds the lock its turn's process took (and
		// /proc/locks still names that process): it wrote its own pid.
		if tp := r.Store.TeardownHolder(task); tp != 0 {
			return tp, nil
		}
	}
	return pid, nil
}

// flockHolder finds the pid holding a FLOCK on the inode in /proc/locks
// text (lines such as "1: FLOCK  ADVISORY  WRITE 4242 fd:01:131 0 EOF";
// waiters, marked "->", are not holders).
func flockHolder(locks []byte, major, minor uint32, ino uint64) int {
	want := fmt.Sprintf("%02x:%02x:%d", major, minor, ino)
	for _, line := range bytes.Split(locks, []byte{'\n'}) {
		f := strings.Fields(string(line))
		if len(f) < 6 || f[1] != "FLOCK" || f[5] != want {
			continue
		}
		if pid, err := strconv.Atoi(f[4]); err == nil && pid > 0 {
			return pid
		}
	}
	return 0
}

// StopResult is what Stop did.
type StopResult struct {
	Task    string `json:"task"`
	Stopped bool   `json:"stopped"` // a running turn was ended
	PID     int    `json:"pid,omitempty"`
	// Turn is the task's last turn (the one that was running).
	Turn int `json:"turn,omitempty"`
}

// Stop ends the task's running turn from another process: it sends SIGTERM
// to the shrooms process holding the task's lock, which stops and removes
// the cage, gives the worktree back, records the turn and exits 130, and
// waits until the lock is free. No turn running is not an error; what
// fails is the host's to fix.
func (r *Commands) Stop(task taskid.ID, wait time.Duration) (_ *StopResult, err error) {
	defer fault.Phase(fault.HostNotReady, &err)
	id, err := r.knownTask(task)
	if err != nil {
		return nil, err
	}
	res := &StopResult{Task: task.String()}
	pid, err := r.lockHolder(task)
	if err != nil {
		return nil, err
	}
	if pid == 0 {
		return res, nil
	}
	res.PID = pid
	// A detached teardown is not a turn: the turn already ended; wait for
	// the teardown instead of cutting it short.
	teardown := r.Store.TeardownHolder(id) == pid
	if teardown {
		res.PID = 0
	} else if err := syscall.Kill(pid, syscall.SIGTERM); err != nil && !errors.Is(err, syscall.ESRCH) {
		return nil, fmt.Errorf("signal shrooms process %d: %w", pid, err)
	}
	deadline := time.Now().Add(wait)
	for {
		holder, err := r.lockHolder(task)
		if err != nil {
			return nil, err
		}
		if holder != pid {
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("shrooms process %d still holds task %q after %s", pid, task, wait)
		}
		time.Sleep(50 * time.Millisecond)
	}
	res.Stopped = !teardown
	res.Turn, _ = r.Store.LastTurn(id)
	return res, nil
}

// StopWait is how long Stop waits for a turn to end: the agent's grace
// period plus the time to remove its cage and give the worktree back.
func (r *Commands) StopWait() time.Duration {
	return r.Cfg.Cage.StopGrace.Std() + 2*turn.CleanupTimeout
}
