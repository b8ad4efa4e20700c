//go:build runsc

package turn

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"

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

// runscHarness is a harness whose turns run under runsc on a private service.
func runscHarness(t *testing.T) *harness {
	runsc := runscPath(t)
	return runtimeHarness(t, runsc, runscFlags(runsc)...)
}

// The turn suites under gVisor: the same bodies as under the default
// runtime (turn_test.go).
func TestRuntimeRunscExitCodeAndHomeReset(t *testing.T) { exitCodeAndHomeReset(t, runscHarness(t)) }
func TestRuntimeRunscDeadline(t *testing.T)             { deadlineStopsAndRemoves(t, runscHarness(t)) }
func TestRuntimeRunscInterrupt(t *testing.T)            { interruptStopsAndRemoves(t, runscHarness(t)) }
func TestRuntimeRunscCageIsSealedFromInside(t *testing.T) {
	cageIsSealedFromInside(t, runscHarness(t), true)
}

// A turn under gVisor: the service runs runsc with the flags shrooms
// requires of it, the cage gets the task's user namespace and runs as the
// cage user, and the kernel it sees is gVisor's, not the host's.
func TestRuntimeRunscTurn(t *testing.T) {
	runsc := runscPath(t)
	h := runtimeHarness(t, runsc, "--runtime", runsc, "--runtime-flag", "platform=systrap", "--runtime-flag", "oci-seccomp")
	res, out, errOut, err := h.sh(h.Task("gv"), "", "id -u; cat /proc/self/uid_map; uname -r; dmesg 2>&1 | head -1")
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
	_, out, errOut, err := with.sh(with.Task("sc"), "", probe)
	assert.NilError(t, err, errOut)
	assert.Equal(t, out, "unshare-denied\n", errOut)

	without := runtimeHarness(t, runsc, "--runtime", runsc, "--runtime-flag", "platform=systrap")
	_, out, errOut, err = without.sh(without.Task("sc"), "", probe)
	assert.NilError(t, err, errOut)
	assert.Equal(t, out, "unshare-ok\n", errOut)
}

// Under gVisor the cage reads the Sentry's own id maps; the task's user
// namespace holds on the host side: the sandbox (the Sentry) and the gofer
// run as the task range's base uid and gid, not as root.
func TestRuntimeRunscSandboxRunsAsTheTaskRange(t *testing.T) {
	h := runscHarness(t)
	task := h.Task("ids")
	if _, _, errOut, err := h.sh(task, "", "true"); err != nil { // the task's ids exist from here on
		t.Fatal(err, errOut)
	}
	ids, err := h.runner.Store.TaskIDs(taskid.Must(task), h.runner.IDFiles, false)
	assert.NilError(t, err)
	type hostProc struct{ uid, gid string }
	seen := map[string]hostProc{}
	done := make(chan error, 1)
	go func() { _, _, _, err := h.sh(task, "", "sleep 4"); done <- err }()
	deadline := time.Now().Add(30 * time.Second)
	for len(seen) < 2 && time.Now().Before(deadline) {
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
			if uid[0] == strconv.Itoa(int(ids.UID)) || uid[0] == "0" {
				seen[name] = hostProc{uid[0], gid[0]}
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	assert.NilError(t, <-done)
	for _, name := range []string{"runsc-sandbox", "runsc-gofer"} {
		got, ok := seen[name]
		assert.Assert(t, ok, "no %s seen on the host: %v", name, seen)
		assert.Equal(t, got.uid, strconv.Itoa(int(ids.UID)), "%s runs as host uid %s", name, got.uid)
		assert.Equal(t, got.gid, strconv.Itoa(int(ids.GID)), "%s runs as host gid %s", name, got.gid)
	}
}
