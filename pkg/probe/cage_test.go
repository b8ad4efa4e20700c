package probe_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"
	// The battery's names unqualified: these tests drive it from the host

	"github.com/containers/podman/v5/pkg/specgen"
	spec "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	"gotest.tools/v3/assert"
	// (probedrive), which imports it.

	"github.com/shrooms-cage/shrooms/internal/itest"
	"github.com/shrooms-cage/shrooms/internal/testcfg"
	. "github.com/shrooms-cage/shrooms/pkg/probe"
	"github.com/shrooms-cage/shrooms/pkg/probedrive"
	"github.com/shrooms-cage/shrooms/pkg/taskid"
	"github.com/shrooms-cage/shrooms/pkg/turn"
)

// shroomsBinary is the real static shrooms binary, built once per test run.
func shroomsBinary(t *testing.T) string { return itest.ShroomsBinary(t) }

func TestMain(m *testing.M) {
	code := m.Run()
	itest.RemoveShroomsBinary()
	os.Exit(code)
}

// cageProbe returns a function that probes one cage per call, in a world
// of the test's own (itest.Env); weaken, when set, mutates its spec first.
func cageProbe(t *testing.T, seccomp string) func(t *testing.T, weaken func(*specgen.SpecGenerator)) *Report {
	t.Helper()
	e, cfg, client := testcfg.Env(t, "pr", testcfg.Config{
		Cage: map[string]any{"pids": 128, "nofile": 512, "nproc": 256, "seccomp": seccomp}})
	bin := shroomsBinary(t)
	n := 0
	return func(t *testing.T, weaken func(*specgen.SpecGenerator)) *Report {
		t.Helper()
		n++
		r := turn.NewRunner(cfg, client, nil)
		r.OnSpec = weaken
		var stderr strings.Builder
		rep, res, err := probedrive.Run(context.Background(), r, probedrive.Options{
			Task: taskid.Must(fmt.Sprintf("%s-%d", e.Prefix, n)), Agent: "shell", Binary: bin,
			Params: Params{Policy: cfg.Network.Policy, StrictSeccomp: cfg.Cage.StrictSeccomp(), Nonce: e.Prefix},
			Stderr: &stderr,
		})
		assert.NilError(t, err, stderr.String())
		assert.Assert(t, res.Removed, "cage not removed: %s", res.Error)
		if t.Failed() || testing.Verbose() {
			for _, c := range rep.Checks {
				if c.Verdict != Sealed {
					t.Logf("%s %s: %s %s %v", c.ID, c.Verdict, c.Observed, c.Reason, c.Evidence)
				}
			}
		}
		return rep
	}
}

// hostOpensVsock says whether this host's kernel offers AF_VSOCK (a VM with
// a vsock transport); nothing is connected.
func hostOpensVsock() bool {
	fd, err := unix.Socket(unix.AF_VSOCK, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return false
	}
	unix.Close(fd)
	return true
}

func profilePath(t *testing.T) string {
	p, err := filepath.Abs("../seccomp/shrooms.json")
	assert.NilError(t, err)
	return p
}

func sorted(s ...string) []string {
	sort.Strings(s)
	return s
}

// TestBatteryInSealedCages: under podman's default profile and under
// shrooms' profile every check runs, nothing escapes, nothing errs, and the
// residual rows are exactly the documented ones; A3 and B4 flip between the
// two profiles, which proves the profile is loaded and applied.
//
// B11 (socket families) too: under podman's profile the unneeded families
// reach the kernel (residual), and on a host whose kernel offers AF_VSOCK
// (a VM) the cage opens one (escaped); shrooms' profile refuses them all.
func TestBatteryInSealedCages(t *testing.T) {
	podmanResidual, podmanEscaped := sorted("A3", "A4", "B4", "B10", "B11"), []string(nil)
	if hostOpensVsock() {
		podmanResidual, podmanEscaped = sorted("A3", "A4", "B4", "B10"), []string{"B11"}
	}
	for _, tc := range []struct {
		name     string
		seccomp  string
		residual []string
		escaped  []string
	}{
		{"podman default seccomp", "podman", podmanResidual, podmanEscaped},
		{"shrooms seccomp (built in)", "shrooms", sorted("A4", "B10"), nil},
		{"shrooms seccomp (as a file)", profilePath(t), sorted("A4", "B10"), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			probeCage := cageProbe(t, tc.seccomp)
			rep := probeCage(t, nil)
			assert.Assert(t, len(rep.Checks) >= 40, "%d checks", len(rep.Checks))
			assert.DeepEqual(t, rep.IDs(Escaped), tc.escaped)
			assert.DeepEqual(t, rep.IDs(Error), []string(nil))
			assert.DeepEqual(t, rep.IDs(Residual), tc.residual)
		})
	}
}

// TestNegativeControls weakens one property of the cage at a time and
// checks that exactly the rows that test it flip to escaped.
func TestNegativeControls(t *testing.T) {
	hostDir := t.TempDir()
	assert.NilError(t, os.MkdirAll(filepath.Join(hostDir, ".ssh"), 0o755))
	assert.NilError(t, os.WriteFile(filepath.Join(hostDir, ".ssh", "id_ed25519"), []byte("not a key\n"), 0o644))
	assert.NilError(t, os.Chmod(hostDir, 0o755))
	for _, tc := range []struct {
		name    string
		strict  bool
		weaken  func(*specgen.SpecGenerator)
		escaped []string
		errors  bool // rows without targets err once the cage has interfaces
	}{
		{"NET_RAW added", false, func(s *specgen.SpecGenerator) { s.CapAdd = append(s.CapAdd, "NET_RAW") }, sorted("A1", "D10", "D11", "D12"), false},
		{"core dumps on", true, func(s *specgen.SpecGenerator) {
			for i := range s.Rlimits {
				if s.Rlimits[i].Type == "core" {
					s.Rlimits[i].Soft, s.Rlimits[i].Hard = 1<<20, 1<<20
				}
			}
		}, sorted("B1"), false},
		{"seccomp unconfined", true, func(s *specgen.SpecGenerator) { s.SeccompProfilePath = "unconfined" }, sorted("A3", "B4", "B11"), false},
		{"podman socket bind-mounted", false, func(s *specgen.SpecGenerator) {
			s.Mounts = append(s.Mounts, spec.Mount{Destination: "/run/podman/podman.sock", Type: "bind", Source: itest.SocketPath(), Options: []string{"rbind", "rw"}})
		}, sorted("C1", "C3"), false},
		{"git system config read-write", false, func(s *specgen.SpecGenerator) {
			for i := range s.Mounts {
				if s.Mounts[i].Destination == "/etc/gitconfig" {
					s.Mounts[i].Options = append(slices.DeleteFunc(slices.Clone(s.Mounts[i].Options), func(o string) bool { return o == "ro" }), "rw")
				}
			}
		}, sorted("A7", "C3"), false},
		{"host directory mounted", false, func(s *specgen.SpecGenerator) {
			s.Mounts = append(s.Mounts, spec.Mount{Destination: "/mnt/host", Type: "bind", Source: hostDir, Options: []string{"rbind", "ro"}})
		}, sorted("C3", "C4"), false},
		// Observed with runc on hybrid cgroups: with the host's network
		// namespace the cgroup v1 hierarchies come up read-write (A7, C3).
		{"host network namespace", false, func(s *specgen.SpecGenerator) { s.NetNS = specgen.Namespace{NSMode: specgen.Host} }, sorted("A6", "A7", "C3", "D1"), true},
		{"root user without user namespace", false, func(s *specgen.SpecGenerator) {
			s.UserNS = specgen.Namespace{NSMode: specgen.Host}
			s.IDMappings = nil
			s.User = "0:0"
		}, sorted("A5", "A6"), false}, // A6: the user namespace is the host's
	} {
		t.Run(tc.name, func(t *testing.T) {
			seccomp, escaped := "podman", tc.escaped
			if tc.strict {
				seccomp = "shrooms"
			} else if hostOpensVsock() {
				escaped = sorted(append([]string{"B11"}, escaped...)...) // podman's profile allows AF_VSOCK
			}
			probeCage := cageProbe(t, seccomp)
			rep := probeCage(t, tc.weaken)
			assert.DeepEqual(t, rep.IDs(Escaped), escaped)
			if !tc.errors {
				assert.DeepEqual(t, rep.IDs(Error), []string(nil))
			}
		})
	}
}

// TestCageKeepsNoLog: the cage runs with podman's log driver "none" (its
// output reaches shrooms over attach only, and nothing of it is left on
// the host's disk), and the probe's report still arrives over attach.
func TestCageKeepsNoLog(t *testing.T) {
	probeCage := cageProbe(t, "shrooms")
	driver := make(chan string, 1)
	rep := probeCage(t, func(s *specgen.SpecGenerator) {
		// Watch the cage from the side while the turn runs it.
		go func(name string) {
			got := ""
			for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
				out, err := exec.Command("podman", "--url", itest.Socket(), "inspect", "--format", "{{.HostConfig.LogConfig.Type}}", name).CombinedOutput()
				if err == nil {
					got = strings.TrimSpace(string(out))
					break
				}
			}
			driver <- got
		}(s.Name)
	})
	assert.Equal(t, <-driver, "none", "the cage's log driver (seen while it ran)")
	assert.Assert(t, len(rep.Checks) >= 40, "the report arrived over attach: %d checks", len(rep.Checks))
}
