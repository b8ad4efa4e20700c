package itest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The integration suites run their cages under the podman service's own
// runtime (runc), or, with SHROOMS_TEST_RUNTIME=runsc, under gVisor: the
// pinned runsc named by SHROOMS_TEST_RUNSC with shrooms' runsc profile
// (docs/gvisor.md). Main starts, once per test binary, a private podman
// service with that profile and points SHROOMS_TEST_PODMAN_SOCKET at it;
// the harnesses then set cage.runtime (CageRuntime) and start their own
// services with ServiceArgs.
const (
	RuntimeEnv = "SHROOMS_TEST_RUNTIME"
	RunscEnv   = "SHROOMS_TEST_RUNSC"
)

// Runtime is "" (the service's default) or "runsc".
func Runtime() string { return os.Getenv(RuntimeEnv) }

// RunscFlags are the podman global flags of a service that runs runsc with
// the profile shrooms requires of it (docs/gvisor.md).
func RunscFlags(runsc string) []string {
	return []string{"--runtime", runsc, "--runtime-flag", "platform=systrap", "--runtime-flag", "oci-seccomp", "--runtime-flag", "network=host"}
}

// CageRuntime is the cage.runtime the suites' configs ask for: "" (the
// config's default) or the runsc path.
func CageRuntime() string {
	if Runtime() == "runsc" {
		return os.Getenv(RunscEnv)
	}
	return ""
}

// ServiceArgs are the podman global flags of a service that runs the
// suites' runtime (none for the default one).
func ServiceArgs() []string {
	if Runtime() == "runsc" {
		return RunscFlags(os.Getenv(RunscEnv))
	}
	return nil
}

// Main runs the package's tests (call it from TestMain: os.Exit(itest.Main(m))).
// Under SHROOMS_TEST_RUNTIME=runsc it first starts a private podman service
// with the runsc profile, on the host's storage, and makes it the shared
// test service (Socket) of this process and what it starts; it stops it
// afterwards. An unknown runtime or a missing runsc fails the binary.
func Main(m *testing.M) int {
	switch Runtime() {
	case "":
		return m.Run()
	case "runsc":
	default:
		fmt.Fprintf(os.Stderr, "%s=%q: only \"runsc\" (or unset) is known\n", RuntimeEnv, Runtime())
		return 2
	}
	runsc := os.Getenv(RunscEnv)
	if fi, err := os.Stat(runsc); runsc == "" || err != nil || fi.Mode()&0o111 == 0 {
		fmt.Fprintf(os.Stderr, "%s=runsc needs %s naming the pinned runsc (make setup builds it; docs/gvisor.md): %q\n", RuntimeEnv, RunscEnv, runsc)
		return 2
	}
	stop, uri, err := startMainService(RunscFlags(runsc))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer stop()
	if err := os.Setenv("SHROOMS_TEST_PODMAN_SOCKET", uri); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	return m.Run()
}

// startMainService starts `podman ARGS system service` on a socket of its
// own (as StartServiceWith, without a test) and returns how to stop it.
func startMainService(args []string) (stop func(), uri string, err error) {
	dir, err := os.MkdirTemp("", "shrooms-rtsvc")
	if err != nil {
		return nil, "", err
	}
	uri = "unix://" + filepath.Join(dir, "podman.sock")
	log, err := os.Create(filepath.Join(dir, "service.log"))
	if err != nil {
		os.RemoveAll(dir)
		return nil, "", err
	}
	defer log.Close()
	cmd := exec.Command("podman", append(append([]string{}, args...), "system", "service", "--time=0", uri)...)
	cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root", "LANG=C.UTF-8"}
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, "", fmt.Errorf("start the %s podman service: %w", Runtime(), err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	stop = func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		os.RemoveAll(dir)
	}
	deadline := time.Now().Add(30 * time.Second)
	for ping(uri) != nil {
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(filepath.Join(dir, "service.log"))
			stop()
			return nil, "", fmt.Errorf("the %s podman service on %s did not answer in 30s: %s", Runtime(), uri, b)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return stop, uri, nil
}

// runtimeSkip is why the test named (the top-level test) cannot pass under
// runtime rt, measured; docs/gvisor.md has the same table. Require skips
// such a test under that runtime only, never under the default one.
func runtimeSkip(rt, name string) (string, bool) {
	if rt != "runsc" {
		return "", false
	}
	reason, ok := runscSkips()[name]
	return reason, ok
}

// idmapUnderRunsc is why the idmapped worktree's tests cannot pass under runsc.
const idmapUnderRunsc = "gVisor cages keep the chown walks (no idmapped worktree: res.Worktree.Idmapped is false, " +
	"and the take hands every file to the task, root's too); TestWorktreeKeepsItsOwner is their runsc test"

// runscSkips are the tests that cannot pass under runsc, by name, with
// the measured reason.
func runscSkips() map[string]string {
	return map[string]string{
		// pkg/turn
		"TestTwoTasksHaveDisjointIDRanges": "the cage reads the Sentry's own uid_map (0 0 4294967295), not the task's range; " +
			"TestRuntimeRunscSandboxRunsAsTheTaskRange checks the range on the host side",
		"TestRuntimeExplicitPathRuns": "it asks for /usr/bin/runc on the shared service, which runs runsc here " +
			"(refused: exit 122, as TestRuntimeTheServiceDoesNotRunIsRefused asserts)",
		// Each asserts the idmapped worktree, which gVisor cages do not get
		// (worktree.Claims.IdmapReason): they keep the chown walks, TestWorktreeKeepsItsOwner's.
		"TestIdmappedWorktree":                   idmapUnderRunsc,
		"TestIdmapScanBeforeTakesTheGuardsStats": idmapUnderRunsc,
		"TestIdmapLeftoverStagingIsCleared":      idmapUnderRunsc,
		"TestIdmapPreparedCage":                  idmapUnderRunsc,
		"TestIdmapGitWorkTree":                   idmapUnderRunsc,
		"TestIdmapGateOpenedFallsBack":           idmapUnderRunsc,
		"TestIdmapUnseenWorktreeIsRefused":       idmapUnderRunsc,
		"TestIdmapWorktreeSeenInTestbed":         idmapUnderRunsc,
		// cmd/shrooms
		"TestRuntimeDoctorAndRunJSON": "it sets cage.runtime itself and asserts doctor's runc line; the config it builds then names cage.runtime twice",
		"TestRuntimeRefusals":         "it sets cage.runtime itself (crun, /etc/passwd) against a runc service; the config it builds then names cage.runtime twice",
		"TestProbeWithoutTargetsInTestbed": "it wants no row escaped; under runsc A3 (seccomp) reads escaped by design, the gVisor profile allowing clone3 " +
			"(TestBatteryInTestbedRunsc asserts the runsc verdicts, docs/gvisor.md's probe table)",
		"TestTTYTurn": "tty(1) says \"not a tty\" (the host pty handed to the Sentry), and its positive control (bare podman run -t) cannot inject: " +
			"TIOCSTI gets ENOTTY in gVisor; TestRunscTTYTurn is the runsc version",
	}
}

// skipForRuntime skips t when its test cannot pass under the suites'
// runtime (runtimeSkip).
func skipForRuntime(t testing.TB) {
	t.Helper()
	name, _, _ := strings.Cut(t.Name(), "/")
	if reason, ok := runtimeSkip(Runtime(), name); ok {
		t.Skipf("not under %s=%s: %s (docs/gvisor.md)", RuntimeEnv, Runtime(), reason)
	}
}
