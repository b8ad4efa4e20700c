package main

import (
	"bufio"
	"bytes"
	"os"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"

	"github.com/shrooms-cage/shrooms/internal/itest"
)

// TestRunRidesThroughPodmanRestart: `shrooms run` whose podman service is
// killed (SIGKILL, the pid this test started) and started again mid-turn
// prints the agent's whole output and exits with the agent's own code.
func TestRunRidesThroughPodmanRestart(t *testing.T) {
	e, _ := integration(t, "")
	svc := itest.StartService(t)
	data, err := os.ReadFile(e.Config)
	assert.NilError(t, err)
	assert.NilError(t, os.WriteFile(e.Config, bytes.Replace(data, []byte(itest.Socket()), []byte(svc.URI), 1), 0o600))

	cmd := e.Command("run", "--task", e.Task("restart"), "--agent", "shell", "--no-stdin", "--", "-c", "echo before; sleep 1; echo running; sleep 4; echo after; exit 7")
	stdout, err := cmd.StdoutPipe()
	assert.NilError(t, err)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	assert.NilError(t, cmd.Start())
	r := bufio.NewReader(stdout)
	// Past its start: the second line comes from the running agent.
	for _, want := range []string{"before\n", "running\n"} {
		line, err := r.ReadString('\n')
		assert.NilError(t, err, stderr.String())
		assert.Equal(t, line, want)
	}
	svc.Kill()
	time.Sleep(time.Second)
	svc.Start()
	var rest strings.Builder
	_, _ = r.WriteTo(&rest)
	_ = cmd.Wait()
	// The detached teardown removes the cage through this service, which
	// stops with the test.
	e.WaitIdle(e.Task("restart"))
	assert.Equal(t, cmd.ProcessState.ExitCode(), 7, stderr.String())
	assert.Equal(t, rest.String(), "after\n", stderr.String())
}
