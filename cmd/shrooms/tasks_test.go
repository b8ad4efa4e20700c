package main

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

// TestTaskCommands: log across turns, tasks, status, and stop from another
// process (the running turn's shrooms exits 130, its cage is gone, and the
// turn is recorded as interrupted).
func TestTaskCommands(t *testing.T) {
	e, client := integration(t, "")
	task := e.Task("tc")
	code, _, stderr := e.Shrooms("run", "--task", task, "--agent", "shell", "--", "-c", "echo one")
	assert.Equal(t, code, 0, stderr)
	code, _, stderr = e.Shrooms("run", "--task", task, "--agent", "shell", "--", "-c", "exit 3")
	assert.Equal(t, code, 3, stderr)

	code, stdout, stderr := e.Shrooms("log", "--task", task, "--json")
	assert.Equal(t, code, 0, stderr)
	var log struct {
		Turns []map[string]any `json:"turns"`
	}
	assert.NilError(t, json.Unmarshal([]byte(stdout), &log))
	assert.Equal(t, len(log.Turns), 2)
	assert.Equal(t, log.Turns[0]["turn"], float64(1))
	assert.Equal(t, log.Turns[1]["exit_code"], float64(3))
	assert.Assert(t, log.Turns[1]["reset"] != nil, "the record carries the reset report")
	assert.Assert(t, log.Turns[1]["total_ms"].(float64) > 0)

	code, stdout, _ = e.Shrooms("log", "--task", task, "--turn", "2")
	assert.Equal(t, code, 0)
	assert.Assert(t, is.Contains(stdout, "turn 2  shell  exited  exit 3"), stdout)
	code, _, stderr = e.Shrooms("log", "--task", task, "--turn", "9")
	assert.Equal(t, code, ExitUsage, stderr)
	code, _, stderr = e.Shrooms("log", "--task", e.Task("never"))
	assert.Equal(t, code, ExitUsage, stderr)
	assert.Assert(t, is.Contains(stderr, "unknown task"))

	code, stdout, stderr = e.Shrooms("tasks", "--json")
	assert.Equal(t, code, 0, stderr)
	var ts struct {
		Tasks []map[string]any `json:"tasks"`
	}
	assert.NilError(t, json.Unmarshal([]byte(stdout), &ts))
	assert.Equal(t, len(ts.Tasks), 1)
	assert.Equal(t, ts.Tasks[0]["task"], task)
	assert.Equal(t, ts.Tasks[0]["turns"], float64(2))
	assert.Equal(t, ts.Tasks[0]["busy"], false)
	assert.Equal(t, ts.Tasks[0]["last"].(map[string]any)["exit_code"], float64(3))
	assert.Assert(t, ts.Tasks[0]["home_bytes"].(float64) > 0)

	code, stdout, _ = e.Shrooms("stop", "--task", task, "--json")
	assert.Equal(t, code, 0)
	assert.Assert(t, is.Contains(stdout, `"stopped":false`), "nothing running: %s", stdout)

	// A turn running in another process.
	cmd := e.Command("run", "--task", task, "--agent", "shell", "--", "-c", "echo up; sleep 600")
	out, err := cmd.StdoutPipe()
	assert.NilError(t, err)
	var errb bytes.Buffer
	cmd.Stderr = &errb
	assert.NilError(t, cmd.Start())
	_, err = out.Read(make([]byte, 3))
	assert.NilError(t, err, errb.String())

	code, stdout, _ = e.Shrooms("status", "--task", task)
	assert.Equal(t, code, 0)
	assert.Assert(t, is.Contains(stdout, "busy      yes (shrooms process "+strconv.Itoa(cmd.Process.Pid)+")"), stdout)
	assert.Equal(t, cagesOf(e, client, task), 1, "positive control: the cage runs")

	start := time.Now()
	code, stdout, stderr = e.Shrooms("stop", "--task", task, "--json")
	assert.Equal(t, code, 0, stderr)
	assert.Assert(t, is.Contains(stdout, `"stopped":true`), stdout)
	assert.Assert(t, is.Contains(stdout, `"turn":3`), stdout)
	_ = cmd.Wait()
	assert.Equal(t, cmd.ProcessState.ExitCode(), ExitInterrupted, errb.String())
	assert.Assert(t, time.Since(start) < 60*time.Second)
	assert.Equal(t, cagesOf(e, client, task), 0, "the stopped turn's cage was removed")

	code, stdout, _ = e.Shrooms("log", "--task", task, "--turn", "3", "--json")
	assert.Equal(t, code, 0)
	assert.Assert(t, is.Contains(stdout, `"status":"interrupted"`), stdout)
	code, stdout, _ = e.Shrooms("status", "--task", task)
	assert.Equal(t, code, 0)
	assert.Assert(t, is.Contains(stdout, "busy      no"), stdout)

	// forget removes the records with the task.
	code, _, stderr = e.Shrooms("forget", "--task", task)
	assert.Equal(t, code, 0, stderr)
	code, stdout, _ = e.Shrooms("tasks")
	assert.Equal(t, code, 0)
	assert.Assert(t, !strings.Contains(stdout, task), stdout)
}
