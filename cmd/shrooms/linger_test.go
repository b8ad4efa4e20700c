package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
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
	"github.com/shrooms-cage/shrooms/pkg/taskid"
	"github.com/shrooms-cage/shrooms/pkg/taskstate"
)

// lingerConfig writes the env's config with teardown_linger = linger;
// comment changes the file's digest and nothing else.
func lingerConfig(e *itest.Env, linger, comment string) {
	e.WriteConfig("# " + comment + "\n" + testcfg.Config{Cage: map[string]any{"prepare_next": false, "teardown_linger": linger}}.For(e).TOML())
}

// pidRun runs a prepared turn (--prepare-next) as a process of its own,
// waits for its teardown, and returns its result.
func pidRun(t *testing.T, e *itest.Env, task, script string) detachedResult {
	t.Helper()
	cmd := e.Command("--json", "run", "--prepare-next", "--task", task, "--agent", "shell", "--", "-c", script)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	assert.NilError(t, cmd.Run(), errb.String())
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	var r detachedResult
	assert.NilError(t, json.Unmarshal([]byte(lines[len(lines)-1]), &r), out.String())
	assert.Equal(t, r.Teardown, "detached")
	assert.Assert(t, r.TeardownPID > 0)
	e.WaitIdle(task)
	return r
}

func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	return err == nil && !strings.Contains(string(b), ") Z ")
}

// TestTeardownWorker: with cage.teardown_linger, the teardown of a turn
// stays and takes the next turns' teardowns: one pid serves them, the next
// cage is prepared, the old cages go. A worker started with another config
// (digest) is not used; with linger 0 (the positive control) every
// teardown is a child of its own that exits. A lingering worker exits
// after the linger and takes its socket with it.
func TestTeardownWorker(t *testing.T) {
	requireStatic(t)
	e, client := integration(t, "")
	lingerConfig(e, "1m", "a")
	task := e.Task("linger")
	layout := taskstate.Layout{Dir: e.State}

	r1 := pidRun(t, e, task, "echo one")
	worker := r1.TeardownPID
	assert.Assert(t, alive(worker), "turn 1's teardown did not linger")
	_, err := os.Lstat(layout.TeardownSocket())
	assert.NilError(t, err)
	// doctor names it, and how to stop it.
	_, stdout, _ := e.Shrooms("--json", "doctor")
	assert.Assert(t, is.Contains(stdout, fmt.Sprintf("teardown worker pid %d lingers", worker)), stdout)
	assert.Assert(t, is.Contains(stdout, fmt.Sprintf("kill %d", worker)), stdout)
	r2 := pidRun(t, e, task, "echo two")
	assert.Assert(t, r2.Prepared, "turn 2 did not get the cage turn 1's teardown prepared")
	assert.Equal(t, r2.TeardownPID, worker, "turn 2's teardown was not handed to the worker")
	r3 := pidRun(t, e, task, "echo three")
	assert.Assert(t, r3.Prepared, "turn 3 did not get the cage the worker prepared")
	assert.Equal(t, r3.TeardownPID, worker)
	states := cageIDs(t, client, task)
	for _, old := range []string{r1.Cage, r2.Cage, r3.Cage} {
		_, left := states[old]
		assert.Assert(t, !left, "cage %s is still there: %v", old, states)
	}
	assert.Equal(t, len(states), 1, "one prepared cage: %v", states)
	for _, st := range states {
		assert.Equal(t, st, "initialized")
	}
	id, err := taskid.Parse(task)
	assert.NilError(t, err)
	log, err := os.ReadFile(layout.TaskFile(id, "teardown.log"))
	assert.NilError(t, err)
	assert.Equal(t, string(log), "", "the worker's job wrote to teardown.log")

	// Another config digest: the worker is not used; the child started
	// instead finds the worker there and does not linger.
	lingerConfig(e, "1m", "b")
	r4 := pidRun(t, e, task, "echo four")
	assert.Assert(t, r4.TeardownPID != worker, "a worker of another config took the teardown")
	waitGone(t, r4.TeardownPID)
	assert.Assert(t, alive(worker))

	// Positive control: linger 0, a child per turn, each gone when done.
	lingerConfig(e, "0s", "c")
	r5 := pidRun(t, e, task, "echo five")
	r6 := pidRun(t, e, task, "echo six")
	assert.Assert(t, r5.TeardownPID != worker && r6.TeardownPID != worker && r5.TeardownPID != r6.TeardownPID,
		"pids %d %d (worker %d)", r5.TeardownPID, r6.TeardownPID, worker)
	waitGone(t, r5.TeardownPID)
	waitGone(t, r6.TeardownPID)
	assert.Assert(t, r6.Prepared)

	// The first worker ends after its minute; a new one with a linger of
	// one second ends after it.
	assert.NilError(t, syscall.Kill(worker, syscall.SIGTERM))
	waitGone(t, worker)
	lingerConfig(e, "1s", "d")
	r7 := pidRun(t, e, task, "echo seven")
	assert.Assert(t, alive(r7.TeardownPID), "a linger of 1s: gone before its job's end was seen")
	start := time.Now()
	waitGone(t, r7.TeardownPID)
	assert.Assert(t, time.Since(start) < 5*time.Second, "the worker stayed %s after a linger of 1s", time.Since(start))
	_, err = os.Lstat(layout.TeardownSocket())
	assert.Assert(t, os.IsNotExist(err), "the socket stayed: %v", err)
	// And the next turn, with no worker there, gets a child as before.
	r8 := pidRun(t, e, task, "echo eight")
	assert.Assert(t, r8.Prepared)
	assert.Assert(t, r8.TeardownPID != r7.TeardownPID)
	code, _, stderr := e.Shrooms("forget", "--task", task)
	assert.Equal(t, code, 0, stderr)
}

// TestTeardownWorkerRefusesOtherUsers: a connection from another uid is
// closed without an answer (SO_PEERCRED), while one of the worker's own
// uid with a wrong key is answered "no" (the positive control: the
// socket is served). The state directory is opened to others here, only
// to let nobody reach the socket: the check behind the permissions.
func TestTeardownWorkerRefusesOtherUsers(t *testing.T) {
	requireStatic(t)
	e, _ := integration(t, "")
	lingerConfig(e, "1m", "peer")
	task := e.Task("peer")
	r := pidRun(t, e, task, "true")
	defer func() {
		_ = syscall.Kill(r.TeardownPID, syscall.SIGTERM)
		waitGone(t, r.TeardownPID)
	}()
	assert.Assert(t, alive(r.TeardownPID))
	socket := taskstate.Layout{Dir: e.State}.TeardownSocket()
	for _, dir := range []string{filepath.Dir(e.Dir), e.Dir, e.State} {
		assert.NilError(t, os.Chmod(dir, 0o711))
	}
	assert.NilError(t, os.Chmod(socket, 0o666))

	peer := func(uid int) string {
		cmd := exec.Command(os.Args[0])
		cmd.Env = append(os.Environ(), "SHROOMS_TEST_LINGER_PEER="+socket, "SHROOMS_TEST_LINGER_PEER_UID="+strconv.Itoa(uid))
		out, err := cmd.CombinedOutput()
		assert.NilError(t, err, string(out))
		return string(out)
	}
	own := peer(0)
	assert.Assert(t, is.Contains(own, `answer: {"ok":false`), own)
	other := peer(65534)
	assert.Assert(t, is.Contains(other, "no answer"), other)
	assert.Assert(t, alive(r.TeardownPID), "the worker died of the refused peer")
	code, _, stderr := e.Shrooms("forget", "--task", task)
	assert.Equal(t, code, 0, stderr)
}

// lingerPeer is the test binary as a client of the worker socket named by
// SHROOMS_TEST_LINGER_PEER (TestTeardownWorkerRefusesOtherUsers): as the
// uid SHROOMS_TEST_LINGER_PEER_UID (set here, before it connects: the
// worker sees the credentials of the connect), it says hello with a wrong
// key and prints what comes back.
func lingerPeer(socket string) {
	uid, err := strconv.Atoi(os.Getenv("SHROOMS_TEST_LINGER_PEER_UID"))
	if err != nil {
		fmt.Println("uid:", err)
		os.Exit(1)
	}
	if uid != os.Getuid() {
		if err := syscall.Setgroups(nil); err != nil {
			fmt.Println("setgroups:", err)
			os.Exit(1)
		}
		if err := syscall.Setresgid(uid, uid, uid); err != nil {
			fmt.Println("setgid:", err)
			os.Exit(1)
		}
		if err := syscall.Setresuid(uid, uid, uid); err != nil {
			fmt.Println("setuid:", err)
			os.Exit(1)
		}
	}
	conn, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: socket, Net: "unixpacket"})
	if err != nil {
		fmt.Println("dial:", err)
		os.Exit(1)
	}
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := conn.Write([]byte(`{"key":"not the worker's"}`)); err != nil {
		fmt.Println("no answer: write:", err)
		return
	}
	b := make([]byte, 4096)
	n, err := conn.Read(b)
	if n == 0 {
		fmt.Println("no answer:", err)
		return
	}
	fmt.Printf("uid %d answer: %s\n", os.Getuid(), b[:n])
}

// TestTeardownWorkerRunsJobsSideBySide: the worker runs the teardowns of
// different tasks at once: one held at its gate does not hold back
// another task's, which ends meanwhile; both are the worker's.
func TestTeardownWorkerRunsJobsSideBySide(t *testing.T) {
	requireStatic(t)
	e, client := integration(t, "")
	lingerConfig(e, "1m", "side")
	a, b := e.Task("side-a"), e.Task("side-b")
	worker := pidRun(t, e, a, "true").TeardownPID
	defer func() {
		_ = syscall.Kill(worker, syscall.SIGTERM)
		waitGone(t, worker)
	}()
	gate := filepath.Join(e.Dir, "gate-a")
	t.Cleanup(func() { _ = os.WriteFile(gate, nil, 0o600) })
	ra := gatedRun(t, e, gate, "--prepare-next", "--task", a, "--agent", "shell", "--", "-c", "echo a")
	assert.Equal(t, ra.TeardownPID, worker)
	rb := pidRun(t, e, b, "echo b") // waits for b's teardown
	assert.Equal(t, rb.TeardownPID, worker)
	assert.Assert(t, lockHeld(t, e, a), "a's teardown ended before its gate opened")
	_, left := cageIDs(t, client, a)[ra.Cage]
	assert.Assert(t, left, "a's cage went before its gate opened")
	assert.NilError(t, os.WriteFile(gate, nil, 0o600))
	e.WaitIdle(a)
	_, left = cageIDs(t, client, a)[ra.Cage]
	assert.Assert(t, !left, "a's cage is still there")
	for _, task := range []string{a, b} {
		code, _, stderr := e.Shrooms("forget", "--task", task)
		assert.Equal(t, code, 0, stderr)
	}
}
