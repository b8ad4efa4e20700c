package turn

import (
	"cmp"
	"context"
	"errors"
	"github.com/shrooms-cage/shrooms/pkg/taskid"
	"path/filepath"
	"testing"

	"gotest.tools/v3/assert"

	"github.com/shrooms-cage/shrooms/internal/itest"
	"github.com/shrooms-cage/shrooms/internal/testcfg"
	"github.com/shrooms-cage/shrooms/pkg/podman"
)

// runtimeHarness is a runner whose config asks for OCI runtime rt, on the
// shared test service or, with serviceArgs, on a private one.
func runtimeHarness(t *testing.T, rt string, serviceArgs ...string) (*itest.Env, *Runner) {
	t.Helper()
	socket := ""
	if len(serviceArgs) > 0 {
		// Started first, so it stops after the env's cleanup.
		socket = itest.StartServiceWith(t, serviceArgs...).URI
	}
	e, runner := newHarness(t, "")
	cfg := testcfg.Config{Socket: socket, Dir: filepath.Dir(runner.Cfg.State.Dir), Prefix: e.Prefix,
		Cage: map[string]any{"pids": 128, "cpus": 1.0, "nofile": 512, "nproc": 256, "tmp_size": "16m", "run_size": "4m", "runtime": rt}}.Parse(t, "test.toml")
	client, err := podman.Connect(context.Background(), cfg.Podman.Socket)
	assert.NilError(t, err)
	*runner = *NewRunner(cfg, client, nil)
	return e, runner
}

// An explicit runtime path (not the "default" choice) reaches the spec, and
// the turn runs where the service's runtime is that file.
func TestRuntimeExplicitPathRuns(t *testing.T) {
	e, runner := runtimeHarness(t, "/usr/bin/runc")
	spec, err := runner.Spec(context.Background(), Request{Task: taskid.Must(e.Task("rt")), Agent: "shell", Args: []string{"-c", "true"}})
	assert.NilError(t, err)
	assert.Equal(t, spec.OCIRuntime, "/usr/bin/runc")
	res, out, _, err := sh(runner, e.Task("rt"), "", "echo ran")
	assert.NilError(t, err)
	assert.Equal(t, res.ExitCode, 0)
	assert.Equal(t, out, "ran\n")
	// The test service names its default runtime "runc" (containers.conf);
	// /usr/bin/runc is that runtime's file.
	assert.Equal(t, res.Runtime, "runc")
}

// A service started with --runtime PATH names the cage's runtime by that
// path: a cage.runtime of the same file through a symlink matches it.
func TestRuntimeOfAServiceStartedWithAPath(t *testing.T) {
	e, runner := runtimeHarness(t, "/usr/bin/runc", "--runtime", "/usr/sbin/runc")
	res, out, _, err := sh(runner, e.Task("rtp"), "", "echo ran")
	assert.NilError(t, err)
	assert.Equal(t, out, "ran\n")
	assert.Equal(t, res.Runtime, "/usr/sbin/runc")
}

// Podman 4.3 ignores the spec's runtime over its API: a cage.runtime the
// service does not run is refused before the cage starts, and no cage is
// left (the env's cleanup fails the test on one).
func TestRuntimeTheServiceDoesNotRunIsRefused(t *testing.T) {
	for _, rt := range []string{"crun", "/usr/bin/true"} {
		t.Run(rt, func(t *testing.T) {
			e, runner := runtimeHarness(t, rt)
			res, out, _, err := sh(runner, e.Task("rtx"), "", "echo ran")
			assert.Assert(t, errors.Is(err, ErrHostNotReady), "%v", err)
			// The shared service's runtime: runc, or the suites' runsc,
			// whose cages are refused first for lacking gVisor's profile.
			svc := cmp.Or(itest.CageRuntime(), "runc")
			if itest.Runtime() == "runsc" {
				assert.ErrorContains(t, err, `under runsc but cage.runtime is "`+rt+`"`)
			} else {
				assert.ErrorContains(t, err, `cage.runtime is "`+rt+`" but podman runs cage`)
				assert.ErrorContains(t, err, `with "`+svc+`"`)
			}
			assert.Equal(t, out, "", "the agent never ran")
			assert.Equal(t, res.Runtime, svc)
		})
	}
}
