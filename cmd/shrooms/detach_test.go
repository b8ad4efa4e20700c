package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/shrooms-cage/shrooms/internal/itest"
	"github.com/shrooms-cage/shrooms/internal/testcfg"
	"github.com/shrooms-cage/shrooms/pkg/podman"
	"github.com/shrooms-cage/shrooms/pkg/sealed"
)

type detachedResult struct {
	Turn        int    `json:"turn"`
	Cage        string `json:"cage"`
	Status      string `json:"status"`
	Prepared    bool   `json:"prepared"`
	Removed     bool   `json:"removed"`
	Teardown    string `json:"teardown"`
	TeardownPID int    `json:"teardown_pid"`
}

// gatedRun runs a turn as its own process with the detached teardown held at
// the gate file until the test creates it, and returns the result.
func gatedRun(t *testing.T, e *itest.Env, gate string, args ...string) detachedResult {
	t.Helper()
	cmd := e.Command(append([]string{"--json", "run"}, args...)...)
	cmd.Env = append(cmd.Env, "SHROOMS_TEARDOWN_GATE="+gate)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	assert.NilError(t, cmd.Run(), errb.String())
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	var r detachedResult
	assert.NilError(t, json.Unmarshal([]byte(lines[len(lines)-1]), &r), out.String())
	return r
}

func lockHeld(t *testing.T, e *itest.Env, task string) bool {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(e.Dir, "state", "tasks", task, "lock"), os.O_RDWR|syscall.O_CLOEXEC, 0)
	assert.NilError(t, err)
	defer f.Close()
	err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
	return err == syscall.EWOULDBLOCK
}

func cageIDs(t *testing.T, client *podman.Client, task string) map[string]string {
	t.Helper()
	cages, err := client.ListByLabel(context.Background(), sealed.LabelTask, task)
	assert.NilError(t, err)
	m := map[string]string{}
	for _, c := range cages {
		m[c.ID] = c.State
	}
	return m
}

// waitGone waits for a killed process (re-parented away from the test) to
// be reaped.
func waitGone(t *testing.T, pid int) {
	t.Helper()
	for i := 0; i < 1000; i++ {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil || strings.Contains(string(b), ") Z ") {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("process %d still there after SIGKILL", pid)
}

// TestDetachedTeardown: `run` exits once the agent's exit code is known,
// with the cage still there; a detached child holding the task lock removes
// it; the task's next turn waits for that child and succeeds; a child killed
// with SIGKILL half-way leaves nothing that gc or the next turn does not
// clean.
func TestDetachedTeardown(t *testing.T) {
	requireStatic(t)
	// Both paths: a child per turn, and a worker that lingers and takes
	// the later turns' teardowns (killed below as a child is).
	for _, linger := range []string{"0s", "1m"} {
		t.Run("linger="+linger, func(t *testing.T) { detachedTeardown(t, linger) })
	}
}

func detachedTeardown(t *testing.T, linger string) {
	e, client := integration(t, "")
	e.WriteConfig(testcfg.Config{Cage: map[string]any{"prepare_next": false, "teardown_linger": linger}}.For(e).TOML())
	task := e.Task("detach")
	gate := filepath.Join(e.Dir, "gate1")
	// Before the env's cleanup, which waits for the teardown.
	t.Cleanup(func() { _ = os.WriteFile(gate, nil, 0o600) })

	r := gatedRun(t, e, gate, "--task", task, "--agent", "shell", "--", "-c", "echo one")
	assert.Equal(t, r.Status, "exited")
	assert.Equal(t, r.Teardown, "detached")
	assert.Assert(t, !r.Removed)
	assert.Assert(t, r.TeardownPID > 0)
	// The run process has exited; its cage has not gone yet, and the
	// child holds the task.
	st := cageIDs(t, client, task)[r.Cage]
	assert.Assert(t, st == "exited" || st == "stopped", "the cage is not there after run exited: %q", st)
	assert.Assert(t, lockHeld(t, e, task))
	// status names the teardown, not the run process that took the lock;
	// stop does not cut it short (the turn already ended).
	code, stdout, stderr := e.Shrooms("--json", "status", "--task", task)
	assert.Equal(t, code, 0, stderr)
	var status struct {
		Busy bool `json:"busy"`
		PID  int  `json:"pid"`
	}
	assert.NilError(t, json.Unmarshal([]byte(strings.TrimSpace(stdout)), &status), stdout)
	assert.Assert(t, status.Busy)
	assert.Equal(t, status.PID, r.TeardownPID)

	// The next turn waits for the child instead of failing as busy.
	type outcome struct {
		code           int
		stdout, stderr string
	}
	next := make(chan outcome, 1)
	go func() {
		code, stdout, stderr := e.Shrooms("--json", "run", "--task", task, "--agent", "shell", "--", "-c", "echo two")
		next <- outcome{code, stdout, stderr}
	}()
	time.Sleep(300 * time.Millisecond) // room for the next turn to reach the lock (not an assertion on time)
	select {
	case o := <-next:
		t.Fatalf("the next turn ran while the teardown held the task: %d %s %s", o.code, o.stdout, o.stderr)
	default:
	}
	assert.NilError(t, os.WriteFile(gate, nil, 0o600))
	o := <-next
	assert.Equal(t, o.code, 0, o.stderr)
	assert.Assert(t, is.Contains(o.stdout, "two"))
	assert.Equal(t, lastJSON(t, o.stdout).Turn, 2)
	_, left := cageIDs(t, client, task)[r.Cage]
	assert.Assert(t, !left, "turn 1's cage is still there")
	assert.Equal(t, len(cageIDs(t, client, task)), 0)

	// SIGKILL of the child, then gc: nothing is left.
	first := r.TeardownPID
	r = gatedRun(t, e, filepath.Join(e.Dir, "gate-never"), "--task", task, "--agent", "shell", "--", "-c", "echo three")
	assert.Equal(t, r.Teardown, "detached")
	// With a linger, turn 1's teardown took turn 3's (turn 2 ran in this
	// process, whose environment differs: a child of its own); without,
	// each is a child.
	assert.Equal(t, r.TeardownPID == first, linger != "0s", "turn 1's teardown pid %d, turn 3's %d", first, r.TeardownPID)
	st = cageIDs(t, client, task)[r.Cage]
	assert.Assert(t, st == "exited" || st == "stopped", st)
	assert.NilError(t, syscall.Kill(r.TeardownPID, syscall.SIGKILL))
	waitGone(t, r.TeardownPID)
	// The last of its threads may still be exiting: the lock goes with it.
	for i := 0; i < 500 && lockHeld(t, e, task); i++ {
		time.Sleep(10 * time.Millisecond)
	}
	assert.Assert(t, !lockHeld(t, e, task), "a killed teardown still holds the task")
	code, stdout, stderr = e.Shrooms("gc")
	assert.Equal(t, code, 0, stderr)
	assert.Assert(t, is.Contains(stdout, "removed 1"), stdout)
	assert.Equal(t, len(cageIDs(t, client, task)), 0)

	// SIGKILL of the child, then the next turn (which prepares the one
	// after it, detached): it runs, and what the killed child left is gone.
	r = gatedRun(t, e, filepath.Join(e.Dir, "gate-never"), "--task", task, "--agent", "shell", "--prepare-next", "--", "-c", "echo four > ~/junk")
	assert.NilError(t, syscall.Kill(r.TeardownPID, syscall.SIGKILL))
	waitGone(t, r.TeardownPID)
	code, stdout, stderr = e.Shrooms("--json", "run", "--task", task, "--agent", "shell", "--prepare-next", "--", "-c", "cat ~/junk 2>&1; echo five")
	assert.Equal(t, code, 0, stderr)
	assert.Assert(t, is.Contains(stdout, "No such file"), "turn 4's HOME survived: %s", stdout)
	assert.Assert(t, !lastJSON(t, stdout).Prepared, "no cage was prepared by the killed child")
	states := cageIDs(t, client, task)
	_, left = states[r.Cage]
	assert.Assert(t, !left, "turn 4's cage is still there")
	assert.Equal(t, len(states), 1, "one prepared cage for turn 6: %v", states)
	for _, st := range states {
		assert.Equal(t, st, "initialized")
	}
	code, _, stderr = e.Shrooms("forget", "--task", task)
	assert.Equal(t, code, 0, stderr)
}
