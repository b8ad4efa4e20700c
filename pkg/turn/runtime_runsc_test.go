//go:build runsc

package turn

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containers/podman/v5/pkg/specgen"
	"gotest.tools/v3/assert"

	"github.com/shrooms-cage/shrooms/internal/itest"
	"github.com/shrooms-cage/shrooms/pkg/podman"
	"github.com/shrooms-cage/shrooms/pkg/sealed"
	"github.com/shrooms-cage/shrooms/pkg/seccomp"
	"github.com/shrooms-cage/shrooms/pkg/taskid"
)

// runscPath is a static upstream runsc (docs/gvisor.md says how to build
// it), named by SHROOMS_TEST_RUNSC: these tests are built only with the
// runsc tag (`make runsc-test`), and then a missing runsc is a failure.
func runscPath(t *testing.T) string {
	p := os.Getenv("SHROOMS_TEST_RUNSC")
	if p == "" {
		t.Fatal("SHROOMS_TEST_RUNSC is unset: name a static upstream runsc (docs/gvisor.md)")
	}
	return p
}

// runscFlags are the podman flags of a service that runs runsc with the
// profile shrooms requires of it (docs/gvisor.md).
func runscFlags(runsc string) []string {
	return []string{"--runtime", runsc, "--runtime-flag", "platform=systrap", "--runtime-flag", "oci-seccomp", "--runtime-flag", "network=host"}
}

// runscHarness is a runner whose turns run under runsc on a private service.
func runscHarness(t *testing.T) (*itest.Env, *Runner) {
	runsc := runscPath(t)
	return runtimeHarness(t, runsc, runscFlags(runsc)...)
}

// The turn suites themselves (TestExitCodeAndHomeReset, the deadline,
// the interrupt, TestCageIsSealedFromInside, ...) run under gVisor in
// `make runsc-suites` (SHROOMS_TEST_RUNTIME=runsc); the tests here are
// those only gVisor has.

// A turn under gVisor: the service runs runsc with the flags shrooms
// requires of it, the cage gets the task's user namespace and runs as the
// cage user, and the kernel it sees is gVisor's, not the host's.
func TestRuntimeRunscTurn(t *testing.T) {
	runsc := runscPath(t)
	e, runner := runtimeHarness(t, runsc, "--runtime", runsc, "--runtime-flag", "platform=systrap", "--runtime-flag", "oci-seccomp")
	res, out, errOut, err := sh(runner, e.Task("gv"), "", "id -u; cat /proc/self/uid_map; uname -r; dmesg 2>&1 | head -1")
	assert.NilError(t, err, errOut)
	assert.Equal(t, res.ExitCode, 0, errOut)
	assert.Equal(t, res.Runtime, runsc)
	t.Logf("under runsc:\n%s", out)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	assert.Equal(t, lines[0], "1000")
	assert.Assert(t, strings.Contains(out, "-gvisor") || strings.Contains(out, "gVisor"), out)
}

// --oci-seccomp is what makes gVisor enforce shrooms' seccomp profile: with
// it a new user namespace (denied by the profile) is refused in the cage.
// Without it the turn refuses the cage before anything of the agent runs
// (exit 122, one line): the sandbox's own command line lacks the flag. The
// positive control, that the refusal matters: the same service runs the
// same profile through podman itself, and there the call succeeds in the
// Sentry (runsc ignored the profile).
func TestRuntimeRunscEnforcesSeccompOnlyWithOCISeccomp(t *testing.T) {
	runsc := runscPath(t)
	probe := "unshare -U true && echo unshare-ok || echo unshare-denied"
	withEnv, with := runtimeHarness(t, runsc, "--runtime", runsc, "--runtime-flag", "platform=systrap", "--runtime-flag", "oci-seccomp")
	_, out, errOut, err := sh(with, withEnv.Task("sc"), "", probe)
	assert.NilError(t, err, errOut)
	assert.Equal(t, out, "unshare-denied\n", errOut)

	svc := itest.StartServiceWith(t, "--runtime", runsc, "--runtime-flag", "platform=systrap")
	withoutEnv, without := runtimeHarness(t, runsc)
	without.Cfg.Podman.Socket = svc.URI
	client, err := podman.Connect(context.Background(), svc.URI)
	assert.NilError(t, err)
	*without = *NewRunner(without.Cfg, client, nil)
	res, out, errOut, err := sh(without, withoutEnv.Task("sc"), "", probe)
	assert.Assert(t, errors.Is(err, ErrHostNotReady), "%v", err)
	assert.ErrorContains(t, err, "runsc runs without --oci-seccomp")
	assert.Assert(t, !strings.Contains(err.Error(), "\n"), "one line: %q", err)
	assert.Equal(t, out+errOut, "", "the agent never ran")
	assert.Assert(t, res.Removed, "cage left: %s", res.Error)

	prof := filepath.Join(t.TempDir(), "gvisor.json")
	assert.NilError(t, os.WriteFile(prof, seccomp.ProfileFor(true), 0o600))
	name := itest.UniqueName("sc-ctl")
	b, err := exec.Command("podman", "--remote", "--url", svc.URI, "run", "--rm", "--name", name, "--network", "none",
		"--user", "1000:1000", "--cap-drop", "ALL", "--security-opt", "seccomp="+prof,
		itest.TestImage, "sh", "-c", probe).CombinedOutput()
	assert.NilError(t, err, string(b))
	assert.Equal(t, string(b), "unshare-ok\n", "without --oci-seccomp runsc ignores the profile")
}

// TestRuntimeRunscUnderDefaultIsRefused: a podman service whose own
// runtime is runsc, with cage.runtime "default", makes gVisor cages
// without gVisor's seccomp profile and process cap (chosen from
// cage.runtime): the cage is refused before the agent runs, with or
// without --oci-seccomp; the same service with cage.runtime naming runsc
// runs the turn (the positive control).
func TestRuntimeRunscUnderDefaultIsRefused(t *testing.T) {
	runsc := runscPath(t)
	for _, flags := range [][]string{
		{"--runtime", runsc, "--runtime-flag", "platform=systrap"},
		{"--runtime", runsc, "--runtime-flag", "platform=systrap", "--runtime-flag", "oci-seccomp"},
	} {
		e, runner := runtimeHarness(t, "default", flags...)
		res, out, errOut, err := sh(runner, e.Task("dr"), "", "echo ran")
		assert.Assert(t, errors.Is(err, ErrHostNotReady), "%v (out %q)", err, out)
		assert.ErrorContains(t, err, "under runsc but cage.runtime is \"default\"")
		assert.Equal(t, out+errOut, "", "the agent never ran")
		assert.Assert(t, res.Removed, "cage left: %s", res.Error)
	}

	withEnv, with := runtimeHarness(t, runsc, "--runtime", runsc, "--runtime-flag", "platform=systrap", "--runtime-flag", "oci-seccomp")
	res, out, errOut, err := sh(with, withEnv.Task("dr"), "", "echo ran")
	assert.NilError(t, err, errOut)
	assert.Equal(t, res.ExitCode, 0, errOut)
	assert.Equal(t, out, "ran\n")
	assert.Equal(t, res.Runtime, runsc)
}

// Under gVisor the cage reads the Sentry's own id maps; the task's user
// namespace holds on the host side: the sandbox (the Sentry) and the gofer
// run as the task range's base uid and gid, not as root.
func TestRuntimeRunscSandboxRunsAsTheTaskRange(t *testing.T) {
	e, runner := runscHarness(t)
	task := e.Task("ids")
	if _, _, errOut, err := sh(runner, task, "", "true"); err != nil { // the task's ids exist from here on
		t.Fatal(err, errOut)
	}
	ids, err := runner.Store.TaskIDs(taskid.Must(task), runner.IDFiles, false)
	assert.NilError(t, err)
	// Every runsc process of the host is recorded (other cages' too: other
	// suites run runsc cages, some as root); the cage's are picked by its
	// id in their command line once the turn has named it.
	type hostProc struct{ name, cmd, uid, gid string }
	seen := map[string]hostProc{}
	done := make(chan *Result, 1)
	go func() {
		res, _, errOut, err := sh(runner, task, "", "sleep 4")
		assert.Check(t, err, errOut)
		done <- res
	}()
	var res *Result
	for res == nil {
		procs, _ := filepath.Glob("/proc/[0-9]*/status")
		for _, p := range procs {
			b, err := os.ReadFile(p)
			if err != nil {
				continue
			}
			st := string(b)
			// runsc re-executes itself (comm "exe") with argv[0] naming the part.
			cmd, err := os.ReadFile(filepath.Join(filepath.Dir(p), "cmdline"))
			if err != nil {
				continue
			}
			name, _, _ := strings.Cut(string(cmd), "\x00")
			if name != "runsc-sandbox" && name != "runsc-gofer" {
				continue
			}
			uid, gid := strings.Fields(field(t, st, "Uid")), strings.Fields(field(t, st, "Gid"))
			seen[p] = hostProc{name, string(cmd), uid[0], gid[0]}
		}
		select {
		case res = <-done:
		case <-time.After(100 * time.Millisecond):
		}
	}
	assert.Assert(t, res != nil && res.Cage != "")
	ours := map[string]hostProc{}
	for _, p := range seen {
		if strings.Contains(p.cmd, res.Cage) {
			ours[p.name] = p
		}
	}
	for _, name := range []string{"runsc-sandbox", "runsc-gofer"} {
		got, ok := ours[name]
		assert.Assert(t, ok, "no %s of cage %.12s seen on the host (%d runsc processes seen)", name, res.Cage, len(seen))
		assert.Equal(t, got.uid, strconv.Itoa(int(ids.UID)), "%s runs as host uid %s", name, got.uid)
		assert.Equal(t, got.gid, strconv.Itoa(int(ids.GID)), "%s runs as host gid %s", name, got.gid)
	}
}

// A process flood under gVisor: the Sentry needs about two host tasks a
// process, and a fork that meets the cage's host pids limit panics it (the
// whole cage dies: exit 2, no output). With shrooms' RLIMIT_NPROC for
// gVisor cages (sealed.GVisorNproc) the flood's fork fails with EAGAIN
// inside and the turn goes on. The positive control: the same turn with
// the configured nproc (256, over what pids 128 carries) loses the cage.
func TestRuntimeRunscProcessFloodFailsInside(t *testing.T) {
	flood := `(for i in $(seq 300); do sleep 30 & done); echo "the cage survived"`
	e, runner := runscHarness(t)
	res, out, errOut, err := sh(runner, e.Task("flood"), "", flood)
	assert.NilError(t, err, errOut)
	t.Logf("with nproc %d: exit %d, %q %q", sealed.GVisorNproc(128, 256), res.ExitCode, out, errOut)
	assert.Equal(t, res.ExitCode, 0, errOut)
	assert.Equal(t, out, "the cage survived\n")
	assert.Assert(t, strings.Contains(errOut, "can't fork: Resource temporarily unavailable"), errOut)

	weakEnv, weak := runscHarness(t)
	weak.OnSpec = func(s *specgen.SpecGenerator) {
		for i := range s.Rlimits {
			if s.Rlimits[i].Type == "nproc" {
				s.Rlimits[i].Soft, s.Rlimits[i].Hard = 256, 256
			}
		}
	}
	res, out, errOut, err = sh(weak, weakEnv.Task("flood"), "", flood)
	assert.NilError(t, err, errOut)
	t.Logf("with nproc 256: exit %d, %q %q", res.ExitCode, out, errOut)
	assert.Assert(t, res.ExitCode != 0, "the Sentry died: %q", out)
	assert.Equal(t, out, "", "nothing after the flood ran")
}
