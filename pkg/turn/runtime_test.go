package turn

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gotest.tools/v3/assert"

	"github.com/shrooms-cage/shrooms/internal/itest"
	"github.com/shrooms-cage/shrooms/internal/testcfg"
	"github.com/shrooms-cage/shrooms/pkg/podman"
)

// runtimeHarness is a harness whose config asks for OCI runtime rt, on the
// shared test service or, with serviceArgs, on a private one.
func runtimeHarness(t *testing.T, rt string, serviceArgs ...string) *harness {
	t.Helper()
	socket := ""
	if len(serviceArgs) > 0 {
		// Started first, so it stops after the harness's cleanup.
		socket = itest.StartServiceWith(t, serviceArgs...).URI
	}
	h := newHarness(t, "")
	cfg := testcfg.Config{Socket: socket, Dir: filepath.Dir(h.cfg.State.Dir), Prefix: h.prefix,
		Cage: map[string]any{"pids": 128, "cpus": 1.0, "nofile": 512, "nproc": 256, "tmp_size": "16m", "run_size": "4m", "runtime": rt}}.Parse(t, "test.toml")
	client, err := podman.Connect(context.Background(), cfg.Podman.Socket)
	assert.NilError(t, err)
	h.cfg, h.client, h.runner = cfg, client, NewRunner(cfg, client, nil)
	return h
}

// An explicit runtime path (not the "default" choice) reaches the spec, and
// the turn runs where the service's runtime is that file.
func TestRuntimeExplicitPathRuns(t *testing.T) {
	h := runtimeHarness(t, "/usr/bin/runc")
	spec, err := h.runner.Spec(context.Background(), Request{Task: h.task("rt"), Agent: "shell", Args: []string{"-c", "true"}})
	assert.NilError(t, err)
	assert.Equal(t, spec.OCIRuntime, "/usr/bin/runc")
	res, out, _, err := h.sh(h.task("rt"), "", "echo ran")
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
	h := runtimeHarness(t, "/usr/bin/runc", "--runtime", "/usr/sbin/runc")
	res, out, _, err := h.sh(h.task("rtp"), "", "echo ran")
	assert.NilError(t, err)
	assert.Equal(t, out, "ran\n")
	assert.Equal(t, res.Runtime, "/usr/sbin/runc")
}

// Podman 4.3 ignores the spec's runtime over its API: a cage.runtime the
// service does not run is refused before the cage starts, and no cage is
// left (the harness's cleanup fails the test on one).
func TestRuntimeTheServiceDoesNotRunIsRefused(t *testing.T) {
	for _, rt := range []string{"crun", "/usr/bin/true"} {
		t.Run(rt, func(t *testing.T) {
			h := runtimeHarness(t, rt)
			res, out, _, err := h.sh(h.task("rtx"), "", "echo ran")
			assert.Assert(t, errors.Is(err, ErrHostNotReady), "%v", err)
			assert.ErrorContains(t, err, `cage.runtime is "`+rt+`" but podman runs cage`)
			assert.ErrorContains(t, err, `with "runc"`)
			assert.Equal(t, out, "", "the agent never ran")
			assert.Equal(t, res.Runtime, "runc")
		})
	}
}

// runscPath is a static upstream runsc (docs/gvisor.md says how to build
// it); "" when SHROOMS_TEST_RUNSC is unset.
func runscPath(t *testing.T) string {
	p := os.Getenv("SHROOMS_TEST_RUNSC")
	if p == "" {
		t.Skip("SHROOMS_TEST_RUNSC is unset: no upstream runsc to run cages under (docs/gvisor.md)")
	}
	return p
}

// A turn under gVisor: the service runs runsc with the flags shrooms
// requires of it, the cage gets the task's user namespace and runs as the
// cage user, and the kernel it sees is gVisor's, not the host's.
func TestRuntimeRunscTurn(t *testing.T) {
	runsc := runscPath(t)
	h := runtimeHarness(t, runsc, "--runtime", runsc, "--runtime-flag", "platform=systrap", "--runtime-flag", "oci-seccomp")
	res, out, errOut, err := h.sh(h.task("gv"), "", "id -u; cat /proc/self/uid_map; uname -r; dmesg 2>&1 | head -1")
	assert.NilError(t, err, errOut)
	assert.Equal(t, res.ExitCode, 0, errOut)
	assert.Equal(t, res.Runtime, runsc)
	t.Logf("under runsc:\n%s", out)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	assert.Equal(t, lines[0], "1000")
	assert.Assert(t, strings.Contains(out, "-gvisor") || strings.Contains(out, "gVisor"), out)
}

// --oci-seccomp is what makes gVisor enforce shrooms' seccomp profile: with
// it a new user namespace (denied by the profile) is refused in the cage;
// without it (the positive control) the same call succeeds in the Sentry.
func TestRuntimeRunscEnforcesSeccompOnlyWithOCISeccomp(t *testing.T) {
	runsc := runscPath(t)
	probe := "unshare -U true && echo unshare-ok || echo unshare-denied"
	with := runtimeHarness(t, runsc, "--runtime", runsc, "--runtime-flag", "platform=systrap", "--runtime-flag", "oci-seccomp")
	_, out, errOut, err := with.sh(with.task("sc"), "", probe)
	assert.NilError(t, err, errOut)
	assert.Equal(t, out, "unshare-denied\n", errOut)

	without := runtimeHarness(t, runsc, "--runtime", runsc, "--runtime-flag", "platform=systrap")
	_, out, errOut, err = without.sh(without.task("sc"), "", probe)
	assert.NilError(t, err, errOut)
	assert.Equal(t, out, "unshare-ok\n", errOut)
}
