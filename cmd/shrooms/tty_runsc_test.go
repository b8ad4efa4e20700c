//go:build runsc

package main

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/shrooms-cage/shrooms/internal/itest"
)

// TestRunscTTYTurn is TestTTYTurn's turn under gVisor: `run --tty` gives
// the cage a terminal of the person's window size, what they type reaches
// the agent, and TIOCSTI is denied (shrooms' profile, enforced in the
// Sentry by --oci-seccomp).
func TestRunscTTYTurn(t *testing.T) {
	runsc := os.Getenv("SHROOMS_TEST_RUNSC")
	if runsc == "" {
		t.Fatal("SHROOMS_TEST_RUNSC is unset: name a static upstream runsc (make setup builds one; docs/gvisor.md)")
	}
	// Started first, so it stops after the environment's cleanup.
	svc := itest.StartServiceWith(t, "--runtime", runsc, "--runtime-flag", "platform=systrap", "--runtime-flag", "oci-seccomp", "--runtime-flag", "network=host")
	e, client := integration(t, "")
	cfg, err := os.ReadFile(e.Config)
	assert.NilError(t, err)
	cfg = bytes.Replace(cfg, []byte(itest.TestImage), []byte(agentImage), 1)
	cfg = bytes.Replace(cfg, []byte(itest.Socket()), []byte(svc.URI), 1)
	cfg = bytes.Replace(cfg, []byte(`memory = "256m"`), []byte("memory = \"256m\"\nruntime = \""+runsc+"\""), 1)
	assert.NilError(t, os.WriteFile(e.Config, cfg, 0o600))

	master, slave := itest.OpenPTY(t, 40, 100)
	task := e.Task("rtty")
	cmd := e.Command("run", "--tty", "--json", "--task", task, "--agent", "shell", "--", "-c",
		`tty; stty size; uname -r; `+tiocsti+`; printf 'name? '; read name; echo "got:$name"; exit 3`)
	onTerminal(cmd, slave)
	var sc screen
	go sc.read(master)
	assert.NilError(t, cmd.Start())
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	sc.waitFor(t, "name? ", done)
	_, err = master.Write([]byte("hello\r"))
	assert.NilError(t, err)
	select {
	case err = <-done:
	case <-time.After(90 * time.Second):
		_ = cmd.Process.Signal(syscall.SIGTERM)
		t.Fatalf("the turn did not end: %q", sc.String())
	}
	var ee *exec.ExitError
	assert.Assert(t, err != nil && errors.As(err, &ee) && ee.ExitCode() == 3, "exit: %v; screen %q", err, sc.String())
	sc.waitFor(t, `"status":"exited"`, nil)
	out := strings.ReplaceAll(sc.String(), "\r", "")
	t.Logf("the terminal showed: %q", out)
	assert.Check(t, is.Contains(out, "-gvisor\n"), "the turn ran under gVisor")
	// The terminal is the host pty the Sentry was handed (its fd reads as
	// host:[N]), so tty(1) finds no /dev/pts name for it (docs/gvisor.md);
	// it is a terminal all the same: stty reads its size below.
	assert.Check(t, is.Contains(out, "not a tty\n"), "measured under gVisor: no /dev/pts name")
	assert.Check(t, is.Contains(out, "\n40 100\n"), "of the person's window size")
	assert.Check(t, is.Contains(out, "PermissionError: [Errno 1] Operation not permitted"), "TIOCSTI is denied in the cage")
	assert.Check(t, !strings.Contains(out, "TIOCSTI injected"))
	assert.Check(t, is.Contains(out, "got:hello\n"), "what the person typed reached the agent")
	assert.Check(t, is.Contains(out, `"exit_code":3`))
	assert.Check(t, is.Contains(out, `"runtime_version":"runsc version v0.0.0-`), "run --json names the pinned runsc")
	e.WaitIdle(task)
	assert.Equal(t, cagesOf(e, client, task), 0)
}
