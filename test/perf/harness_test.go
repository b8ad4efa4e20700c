// Package perf measures shrooms as an orchestrator sees it: the shrooms
// binary itself, on a sealed cage network in the testbed's namespaces,
// against bare `podman run --rm` on podman's default network, side by side
// in one run (the round-2 goals in docs/performance.md; `make bench`).
// Every figure is a ratio or a distribution from paired runs; nothing here
// asserts a time.
package perf

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shrooms-cage/shrooms/internal/itest"
	"github.com/shrooms-cage/shrooms/internal/tbworld"
	"github.com/shrooms-cage/shrooms/pkg/cagenet"
	"github.com/shrooms-cage/shrooms/pkg/config"
	"github.com/shrooms-cage/shrooms/pkg/turn"
)

func TestMain(m *testing.M) {
	code := m.Run()
	itest.RemoveShroomsBinary()
	os.Exit(code)
}

// newBench is the perf world: the testbed with a podman service, a
// config for the shrooms binary (cage network policy internet, one shell
// agent "cl" with Claude Code's HOME rules) and the seal applied by the
// binary (`net apply`) in the testbed's host namespace, where its CLI runs.
func newBench(t testing.TB, opts ...tbworld.Option) *tbworld.World {
	t.Helper()
	// SHROOMS_PERF_BINARY measures another build (an older one, for the
	// figures before a change) with the same benchmarks. Prepared next
	// cages are left by design (--prepare-next).
	be := tbworld.New(t, "pf", append([]tbworld.Option{tbworld.WithCLI(os.Getenv("SHROOMS_PERF_BINARY")), tbworld.WithEnv(itest.WithPrepared()),
		// The figures are the default runtime's (runtime: nil drops the
		// suites' SHROOMS_TEST_RUNTIME).
		tbworld.WithCage(map[string]any{"memory": "256m", "pids": 128, "nofile": 512, "nproc": 256, "timeout": "120s", "stop_grace": "1s", "runtime": nil}),
		tbworld.WithExtra(func(*tbworld.World) string {
			return "[home]\nmax_session_file = \"2g\"\nmax_keep_size = \"4g\"\n[agents.cl]\ncommand = [\"/bin/sh\"]\nhome = [\"claude\", \"shell\"]\n"
		})}, opts...)...)
	if out, err := shrooms(be, "net", "apply"); err != nil {
		t.Fatalf("net apply: %v: %s", err, out)
	}
	return be
}

// inHost runs a command in the testbed's host network namespace.
func inHost(b *tbworld.World, args ...string) *exec.Cmd {
	return exec.Command("nsenter", append([]string{"--net=" + b.TB.NSPath("host"), "--"}, args...)...)
}

// shrooms runs the binary with the bench config and returns its output.
func shrooms(b *tbworld.World, args ...string) ([]byte, error) {
	return b.Command(args...).CombinedOutput()
}

// timing is one process run: its wall time and the time to its first byte
// on stdout.
type timing struct {
	wall, first time.Duration
	// cpu is the process's own user and system time (not its detached
	// child's, which it never waits for).
	cpu time.Duration
	// at is when the process was started.
	at     time.Time
	stdout bytes.Buffer
}

// firstByte records when the first byte of output arrives.
type firstByte struct {
	start time.Time
	at    time.Duration
	buf   *bytes.Buffer
	mu    sync.Mutex
}

func (f *firstByte) Write(p []byte) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.at == 0 && len(p) > 0 {
		f.at = time.Since(f.start)
	}
	return f.buf.Write(p)
}

// timed runs cmd and measures it from the call.
func timed(cmd *exec.Cmd) (*timing, error) {
	t := &timing{}
	var errb bytes.Buffer
	fb := &firstByte{buf: &t.stdout}
	cmd.Stdout, cmd.Stderr = fb, &errb
	fb.start = time.Now()
	t.at = fb.start
	err := cmd.Run()
	t.wall = time.Since(fb.start)
	t.first = fb.at
	if ps := cmd.ProcessState; ps != nil {
		t.cpu = ps.UserTime() + ps.SystemTime()
	}
	if err != nil {
		return t, fmt.Errorf("%s: %v: %s %s", strings.Join(cmd.Args, " "), err, t.stdout.String(), errb.String())
	}
	return t, nil
}

// result is the part of `run --json`'s result the benchmarks read.
type result struct {
	Status    string       `json:"status"`
	StartedAt string       `json:"started_at"`
	Prepared  bool         `json:"prepared"`
	Skipped   string       `json:"prepared_skipped"` // why a prepared cage was passed over
	Removed   bool         `json:"removed"`
	Cage      string       `json:"cage"`
	Phases    []turn.Phase `json:"phases"`
	TotalMs   float64      `json:"totalMs"`
	Error     string       `json:"error"`
	// TeardownPID is the detached teardown's process: a child, or the
	// lingering worker (cage.teardown_linger) the teardown was handed to.
	TeardownPID int `json:"teardown_pid"`
}

// run runs one turn with the shrooms binary (--json, --prepare-next).
func runTurn(b *tbworld.World, task, agent, script string) (*timing, *result, error) {
	return runCmd(b.Command("--json", "run", "--prepare-next", "--task", task, "--agent", agent, "--", "-c", script))
}

// runCmd runs one `run --json` command and reads its result.
func runCmd(cmd *exec.Cmd) (*timing, *result, error) {
	t, err := timed(cmd)
	if err != nil {
		return t, nil, err
	}
	lines := strings.Split(strings.TrimSpace(t.stdout.String()), "\n")
	var res result
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &res); err != nil {
		return t, nil, fmt.Errorf("result: %v: %s", err, t.stdout.String())
	}
	return t, &res, nil
}

// bare is `podman run --rm` of the same image and command on the named
// network, with the same limits a cage has.
func bareRun(b *tbworld.World, network, script string) (*timing, error) {
	return timed(bareCommand(b, network, script))
}

// bareCommand is bareRun's process, with podman run's flags extra added.
func bareCommand(b *tbworld.World, network, script string, extra ...string) *exec.Cmd {
	args := []string{"podman", "--url", b.TB.PodmanURL, "run", "--rm", "--network", network,
		"--read-only", "--cap-drop", "all", "--security-opt", "no-new-privileges", "--user", "1000:1000",
		"--memory", "256m", "--pids-limit", "128", "--ulimit", "nofile=512:512", "--ulimit", "nproc=256:256"}
	args = append(append(args, extra...), itest.TestImage, "/bin/sh", "-c", script)
	return inHost(b, args...)
}

func msOf(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// quantile is the nearest-rank quantile q of d.
func quantile(d []time.Duration, q float64) time.Duration {
	s := append([]time.Duration{}, d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := int(float64(len(s))*q+0.999999) - 1
	return s[min(max(i, 0), len(s)-1)]
}

func median(d []time.Duration) time.Duration { return quantile(d, 0.5) }

// phaseMedians returns each phase's median over the results, in the order
// of the first result.
func phaseMedians(rs []*result) []turn.Phase { return phaseQuantiles(rs, 0.5) }

// phaseQuantiles returns each phase's quantile q over the results, in the
// order of the first result.
func phaseQuantiles(rs []*result, q float64) []turn.Phase {
	by := map[string][]time.Duration{}
	var order []string
	for _, r := range rs {
		for _, p := range r.Phases {
			if _, ok := by[p.Name]; !ok {
				order = append(order, p.Name)
			}
			by[p.Name] = append(by[p.Name], time.Duration(p.Ms*float64(time.Millisecond)))
		}
	}
	var out []turn.Phase
	for _, n := range order {
		out = append(out, turn.Phase{Name: n, Ms: msOf(quantile(by[n], q))})
	}
	return out
}

func phaseString(ps []turn.Phase) string {
	var parts []string
	for _, p := range ps {
		parts = append(parts, fmt.Sprintf("%s %.1f", p.Name, p.Ms))
	}
	return strings.Join(parts, ", ")
}

// podmanCageNet makes (once; again is a no-op) a podman network like the
// cage network — dual-stack, no DNS server, a bridge and subnets of its
// own — for the bare `podman run` columns: under network.driver "shrooms"
// the cage network is no podman network.
func podmanCageNet(t testing.TB, be *tbworld.World) string {
	t.Helper()
	name := be.Net + "p"
	sub4, sub6 := itest.Subnets(t)
	cfg := *be.Cfg
	cfg.Network.Driver, cfg.Network.Name, cfg.Network.Bridge, cfg.Network.Subnet4, cfg.Network.Subnet6 = config.DriverPodman, name, name, sub4, sub6
	if n, err := be.Client.InspectNetwork(context.Background(), name); err == nil && n != nil {
		return name
	}
	if _, err := cagenet.EnsureNetwork(context.Background(), &cfg, be.Client); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = be.TB.Podman("network", "rm", "-f", name) })
	return name
}
