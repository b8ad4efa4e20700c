package main

import (
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/shrooms-cage/shrooms/internal/itest"
)

// withRuntime sets cage.runtime in the env's config file.
func withRuntime(t *testing.T, e *itest.Env, rt string) {
	t.Helper()
	data, err := os.ReadFile(e.Config)
	assert.NilError(t, err)
	assert.Assert(t, strings.Contains(string(data), "[cage]\n"))
	data = []byte(strings.Replace(string(data), "[cage]\n", "[cage]\nruntime = \""+rt+"\"\n", 1))
	assert.NilError(t, os.WriteFile(e.Config, data, 0o600))
}

// cage.runtime as an explicit path: doctor finds it is the service's, and
// run --json names the runtime the cage ran with.
func TestRuntimeDoctorAndRunJSON(t *testing.T) {
	e, _ := integration(t, "")
	withRuntime(t, e, "/usr/bin/runc")
	_, stdout, stderr := e.Shrooms("doctor")
	assert.Check(t, is.Regexp(`(?m)^ok +oci-runtime +runc at /usr/\w+/runc \(runc version`, stdout), stdout+stderr)

	code, stdout, stderr := e.Shrooms("--json", "run", "--task", e.Task("rt"), "--agent", "shell", "--", "-c", "echo out")
	assert.Equal(t, code, 0, stderr)
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	var res struct {
		Runtime string `json:"runtime"`
	}
	assert.NilError(t, json.Unmarshal([]byte(lines[len(lines)-1]), &res))
	assert.Equal(t, res.Runtime, "runc")
}

// A runtime the service does not run fails doctor; a bad value is refused
// at config load with one line, before podman is asked anything.
func TestRuntimeRefusals(t *testing.T) {
	e, _ := integration(t, "")
	withRuntime(t, e, "crun")
	code, stdout, _ := e.Shrooms("doctor")
	assert.Check(t, is.Equal(code, ExitHostNotReady), stdout)
	assert.Check(t, is.Regexp(`(?m)^fail oci-runtime +cage.runtime is "crun" but the podman service runs runc`, stdout))

	bad := newEnv(t, "")
	withRuntime(t, bad, "/etc/passwd")
	code, stdout, stderr := bad.Shrooms("run", "--task", bad.Task("rt"), "--agent", "shell", "--", "-c", "true")
	assert.Equal(t, code, ExitUsage, stdout+stderr)
	assert.Check(t, is.Regexp(regexp.QuoteMeta(`cage.runtime: "/etc/passwd" (/etc/passwd) is not executable`), stderr))
	assert.Equal(t, strings.Count(strings.TrimSpace(stderr), "\n"), 0, stderr)
}
