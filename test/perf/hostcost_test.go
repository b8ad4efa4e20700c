package perf

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shrooms-cage/shrooms/internal/itest"
	"github.com/shrooms-cage/shrooms/internal/tbworld"
	"github.com/shrooms-cage/shrooms/internal/testbed"
)

// burnScript burns about 200 ms of CPU in the image's busybox sh (the
// positive control: it must show up alike in both columns).
const burnScript = `i=0; while [ $i -lt 170000 ]; do i=$((i+1)); done`

// BenchmarkHostCost measures the CPU time (user+system) the host spends on
// one whole turn: the `shrooms run` process, its detached child (removing
// the old cage, the HOME reset, creating and starting the next prepared
// cage), the podman service's work, conmon, runc, the exit commands conmon
// runs and the cage's processes, against the same for a bare `podman run
// --rm` (its client included) of the same image and command, side by side
// in one testbed. Everything runs below a cpuacct or v2 cgroup of the
// benchmark's own (testbed.CPUAccount; v2 where /sys/fs/cgroup is
// cgroup2); a turn's window closes when its
// detached teardown has ended and no transient process is left, and the
// cgroup's usage (which keeps that of removed children) is read before
// and after. The burn rows are the positive control: the same turns with
// a command burning ~200 ms of CPU.
func BenchmarkHostCost(b *testing.B) {
	if b.N == 1 {
		return
	}
	acct := newCPUAcct(b)
	opts := []tbworld.Option{tbworld.WithTestbed(testbed.CPUAccount(acct.dir))}
	if d := os.Getenv("SHROOMS_PERF_DRIVER"); d != "" {
		// network.driver for this build ("podman": the same binary on a
		// podman network); unset keeps the build's default (a build
		// older than the key knows only podman networks).
		opts = append(opts, tbworld.WithNetwork(map[string]any{"driver": d}))
	}
	be := newBench(b, opts...)
	// The third column's network: a podman network like the cage network.
	podNet := podmanCageNet(b, be)
	acct.service = acct.pids("svc")
	if len(acct.service) != 1 {
		b.Fatalf("the podman service's cgroup holds %v, want one process", acct.service)
	}
	task := be.Task("cost")
	type column struct {
		name string
		turn func(script string) (float64, error) // the CLI process's own CPU ms
	}
	shrooms := func(script string) (float64, error) {
		cmd := acct.inCLI(be.Command("--json", "run", "--prepare-next", "--task", task, "--agent", "shell", "--", "-c", script))
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		if err := cmd.Run(); err != nil {
			return 0, fmt.Errorf("shrooms run: %v: %s %s", err, out.String(), errb.String())
		}
		lines := strings.Split(strings.TrimSpace(out.String()), "\n")
		var res result
		if err := json.Unmarshal([]byte(lines[len(lines)-1]), &res); err != nil || !res.Prepared {
			return 0, fmt.Errorf("shrooms run: not a prepared turn (%v): %s", err, out.String())
		}
		// The teardown's CPU must be counted: its process (a child, or
		// the lingering worker it was handed to) is in cli/.
		if !slices.Contains(acct.pids("cli"), res.TeardownPID) {
			return 0, fmt.Errorf("shrooms run: the teardown's process %d is not in cli/ %v", res.TeardownPID, acct.pids("cli"))
		}
		be.WaitIdle(task)
		return rusageMs(cmd), nil
	}
	bare := func(network string) func(string) (float64, error) {
		return func(script string) (float64, error) {
			// A private cgroup namespace, as a cage has: with the host's,
			// runc bind-mounts the container's cgroups from the host's
			// mount table, which CPUAccount's bind mount misleads.
			cmd := acct.inCLI(bareCommand(be, network, script, "--cgroupns", "private"))
			if out, err := cmd.CombinedOutput(); err != nil {
				return 0, fmt.Errorf("podman run: %v: %s", err, out)
			}
			return rusageMs(cmd), nil
		}
	}
	cols := []column{{"shrooms", shrooms}, {"podman-run", bare("podman")}, {"podman-run-cage-net", bare(podNet)}}
	// Warm-up: bootstrap, network, the first prepared cage, podman's
	// default network; not measured. The bare runs go first: podman 4.3
	// makes /run/netns a shared mount only when it makes a netns for a
	// container without a user namespace, and until then (the testbed's
	// / is private) a cage's exit command cannot see the cage's netns and
	// nobody tears its network down: the shrooms column would skip that
	// work (docs/performance.md, Round 8). leftCageLinks checks it.
	for _, c := range cols[1:] {
		if _, err := c.turn("true"); err != nil {
			b.Fatal(err)
		}
	}
	// In cli/, as every measured turn: its teardown stays as the worker
	// that takes the later turns' teardowns (cage.teardown_linger).
	if _, _, err := runCmd(acct.inCLI(be.Command("--json", "run", "--prepare-next", "--task", task, "--agent", "shell", "--", "-c", "true"))); err != nil {
		b.Fatal(err)
	}
	be.WaitIdle(task)
	if _, err := cols[0].turn("true"); err != nil {
		b.Fatal(err)
	}
	scripts := []string{"true", burnScript}
	sum := map[string]*cost{}
	for i := 0; i < b.N; i++ {
		for _, script := range scripts {
			for _, c := range cols {
				key := c.name
				if script != "true" {
					key += "+burn"
				}
				if sum[key] == nil {
					sum[key] = &cost{}
				}
				acct.settle(b)
				before := acct.read()
				cli, err := c.turn(script)
				if err != nil {
					b.Fatal(err)
				}
				acct.settle(b)
				d := acct.read().minus(before)
				d.run = cli
				sum[key].add(d)
			}
		}
	}
	// Every exited cage's network was torn down: only the prepared
	// cage's link is left on the cage network's bridge.
	if links := leftCageLinks(b, be); len(links) != 1 {
		b.Fatalf("links on the cage bridge %s after the turns: %v, want the prepared cage's alone (a cage's network was not torn down)", be.Net, links)
	}
	n := float64(b.N)
	per := func(k string) cost { return sum[k].div(n) }
	s, p, pc := per("shrooms"), per("podman-run"), per("podman-run-cage-net")
	sb, pb := per("shrooms+burn"), per("podman-run+burn")
	b.ReportMetric(s.total, "shrooms-cpu-ms")
	b.ReportMetric(p.total, "podman-run-cpu-ms")
	b.ReportMetric(pc.total, "podman-run-cage-net-cpu-ms")
	b.ReportMetric(s.total/p.total, "ratio")
	b.ReportMetric(sb.total-s.total, "burn-shrooms-ms")
	b.ReportMetric(pb.total-p.total, "burn-podman-run-ms")
	b.ReportMetric(0, "ns/op")
	b.Logf("host CPU per turn (mean of %d, ms), load %s:", b.N, loadAvg())
	b.Logf("%-22s %8s %8s %8s %8s %8s %8s %8s", "", "total", "run/cli", "child", "service", "conmon", "cage", "other")
	for _, k := range []string{"shrooms", "podman-run", "podman-run-cage-net", "shrooms+burn", "podman-run+burn", "podman-run-cage-net+burn"} {
		c := per(k)
		child := c.cli - c.run
		b.Logf("%-22s %8.1f %8.1f %8.1f %8.1f %8.1f %8.1f %8.1f", k, c.total, c.run, child, c.svc, c.conmon, c.cages(), c.other())
	}
	b.Logf("ratio shrooms / podman run --rm: %.2f× (on a dual-stack podman network: %.2f×); burn control: +%.0f ms shrooms, +%.0f ms podman run",
		s.total/p.total, s.total/pc.total, sb.total-s.total, pb.total-p.total)
}

// leftCageLinks lists the links enslaved to the cage network's bridge in
// the testbed's host namespace: one per cage whose network is set up.
func leftCageLinks(t testing.TB, be *tbworld.World) []string {
	t.Helper()
	out, err := be.TB.Exec("host", "ip", "-j", "link", "show", "master", be.Net)
	if err != nil {
		t.Fatalf("ip link show master %s: %v: %s", be.Net, err, out)
	}
	var links []struct {
		Name string `json:"ifname"`
	}
	if err := json.Unmarshal(out, &links); err != nil {
		t.Fatalf("ip -j link show master %s: %v: %s", be.Net, err, out)
	}
	var names []string
	for _, l := range links {
		names = append(names, l.Name)
	}
	return names
}

// cost is CPU time in ms: the whole cgroup, its parts, and the CLI
// process's own rusage (run).
type cost struct {
	total, svc, cli, parent, conmon, run float64
}

func (c cost) minus(o cost) cost {
	return cost{c.total - o.total, c.svc - o.svc, c.cli - o.cli, c.parent - o.parent, c.conmon - o.conmon, c.run - o.run}
}

func (c *cost) add(o cost) {
	c.total, c.svc, c.cli, c.parent, c.conmon, c.run = c.total+o.total, c.svc+o.svc, c.cli+o.cli, c.parent+o.parent, c.conmon+o.conmon, c.run+o.run
}

func (c cost) div(n float64) cost {
	return cost{c.total / n, c.svc / n, c.cli / n, c.parent / n, c.conmon / n, c.run / n}
}

// cages is the containers' own cgroups (runc init and the command).
func (c cost) cages() float64 { return c.parent - c.conmon }

// other is what ran in the cgroup outside its known parts (0 expected).
func (c cost) other() float64 { return c.total - c.svc - c.cli - c.parent }

// cpuAcct is the benchmark's accounting cgroup (v1 cpuacct, or v2): svc
// (the podman service and what it spawns), cli (the measured CLI and its
// detached child), libpod_parent (podman's cgroupfs parent: conmon/ and
// the containers).
type cpuAcct struct {
	dir     string
	v2      bool
	service []int
}

const (
	cpuacctRoot  = "/sys/fs/cgroup/cpuacct"
	cgroup2Root  = "/sys/fs/cgroup"
	cgroup2Magic = 0x63677270 // statfs's f_type of cgroup2 (CGROUP2_SUPER_MAGIC)
)

// cgroupRoot detects the host's cgroup mode: v2 unified at /sys/fs/cgroup,
// else v1 with cpuacct at /sys/fs/cgroup/cpuacct. SHROOMS_PERF_CGROUP2
// names another cgroup2 mount to account in (e.g. a hybrid host's
// /sys/fs/cgroup/unified, to run the v2 path there).
func cgroupRoot() (root string, v2 bool, err error) {
	if r := os.Getenv("SHROOMS_PERF_CGROUP2"); r != "" {
		if !isCgroup2(r) {
			return "", false, fmt.Errorf("SHROOMS_PERF_CGROUP2=%s is not a cgroup2 mount", r)
		}
		return r, true, nil
	}
	if isCgroup2(cgroup2Root) {
		return cgroup2Root, true, nil
	}
	if _, err := os.Stat(filepath.Join(cpuacctRoot, "cpuacct.usage")); err != nil {
		return "", false, fmt.Errorf("host cost needs cgroup v2 at %s or cgroup v1's cpuacct at %s: %w", cgroup2Root, cpuacctRoot, err)
	}
	return cpuacctRoot, false, nil
}

func isCgroup2(dir string) bool {
	var st syscall.Statfs_t
	return syscall.Statfs(dir, &st) == nil && st.Type == cgroup2Magic
}

// newCPUAcct makes the cgroup, removed when the test ends (after the
// testbed's teardown, which is registered later).
func newCPUAcct(t testing.TB) *cpuAcct {
	root, v2, err := cgroupRoot()
	if err != nil {
		t.Fatal(err)
	}
	return newCPUAcctIn(t, root, v2)
}

func newCPUAcctIn(t testing.TB, root string, v2 bool) *cpuAcct {
	a := &cpuAcct{dir: filepath.Join(root, itest.UniqueName("shrooms-hostcost")), v2: v2}
	for _, d := range []string{"", "cli"} {
		if err := os.Mkdir(filepath.Join(a.dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { a.remove(t) })
	return a
}

// remove removes the cgroups deepest first; the processes are gone by
// then, but a cgroup empties a moment after its last process exits.
func (a *cpuAcct) remove(t testing.TB) {
	var dirs []string
	_ = filepath.WalkDir(a.dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	for i := len(dirs) - 1; i >= 0; i-- {
		var err error
		for try := 0; try < 100; try++ {
			if err = os.Remove(dirs[i]); err == nil || errors.Is(err, os.ErrNotExist) {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Errorf("remove cgroup %s: %v (processes: %v)", dirs[i], err, a.pids(strings.TrimPrefix(dirs[i], a.dir+"/")))
		}
	}
}

// inCLI runs cmd in the cli cgroup, joined before exec.
func (a *cpuAcct) inCLI(cmd *exec.Cmd) *exec.Cmd {
	procs := filepath.Join(a.dir, "cli", "cgroup.procs")
	w := exec.Command("sh", append([]string{"-c", `echo $$ > "$0" && exec "$@"`, procs}, cmd.Args...)...)
	w.Env, w.Dir = cmd.Env, cmd.Dir
	return w
}

// usage is sub's CPU time in ms, its removed children's included: v1's
// cpuacct.usage (ns), v2's cpu.stat usage_usec (the core rstat, there
// without the cpu controller).
func (a *cpuAcct) usage(sub string) float64 {
	if !a.v2 {
		b, err := os.ReadFile(filepath.Join(a.dir, sub, "cpuacct.usage"))
		if err != nil {
			return 0 // not made yet (conmon's before the first container)
		}
		ns, _ := strconv.ParseFloat(strings.TrimSpace(string(b)), 64)
		return ns / 1e6
	}
	b, err := os.ReadFile(filepath.Join(a.dir, sub, "cpu.stat"))
	if err != nil {
		return 0
	}
	us, _ := cpuStatUsage(string(b))
	return us / 1e3
}

// cpuStatUsage is a v2 cpu.stat's usage_usec.
func cpuStatUsage(stat string) (float64, error) {
	for _, line := range strings.Split(stat, "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == "usage_usec" {
			return strconv.ParseFloat(f[1], 64)
		}
	}
	return 0, errors.New("cpu.stat has no usage_usec")
}

func (a *cpuAcct) read() cost {
	return cost{total: a.usage(""), svc: a.usage("svc"), cli: a.usage("cli"),
		parent: a.usage("libpod_parent"), conmon: a.usage("libpod_parent/conmon")}
}

func (a *cpuAcct) pids(sub string) []int {
	b, _ := os.ReadFile(filepath.Join(a.dir, sub, "cgroup.procs"))
	var out []int
	for _, f := range strings.Fields(string(b)) {
		if pid, err := strconv.Atoi(f); err == nil {
			out = append(out, pid)
		}
	}
	return out
}

// transient lists the processes that belong to a turn's work and are
// still there: any in cli (the CLI, the detached child) but an idle
// teardown worker (cage.teardown_linger: it stays, and what it spends
// in a turn's window is counted, cli's usage being cumulative), any in svc but
// the service and conmon, any in conmon/ but conmon (runc, the exit
// commands).
func (a *cpuAcct) transient() []string {
	var out []string
	note := func(sub string, pid int) {
		comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		out = append(out, fmt.Sprintf("%s:%d(%s)", sub, pid, strings.TrimSpace(string(comm))))
	}
	for _, pid := range a.pids("cli") {
		if !idleWorker(pid) {
			note("cli", pid)
		}
	}
	conmon := func(pid int) bool {
		comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		return strings.TrimSpace(string(comm)) == "conmon"
	}
	for _, pid := range a.pids("svc") {
		// conmon stays in svc where podman cannot make conmon/ (a v2
		// cgroup without controllers to enable); it lives with its cage.
		if pid != a.service[0] && !conmon(pid) {
			note("svc", pid)
		}
	}
	for _, pid := range a.pids("libpod_parent/conmon") {
		if !conmon(pid) {
			note("conmon", pid)
		}
	}
	return out
}

// idleWorker: pid is a teardown process that runs no job (it holds no
// task's teardown.log: a job holds its task's until it is over).
func idleWorker(pid int) bool {
	cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if !strings.Contains(string(cmdline), "\x00teardown-detached\x00") {
		return false
	}
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return false
	}
	for _, fd := range fds {
		if target, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name())); filepath.Base(target) == "teardown.log" {
			return false
		}
	}
	return true
}

// settle waits until no transient process is left, twice in a row.
func (a *cpuAcct) settle(t testing.TB) {
	deadline := time.Now().Add(30 * time.Second)
	for quiet := 0; quiet < 2; time.Sleep(20 * time.Millisecond) {
		if left := a.transient(); len(left) > 0 {
			quiet = 0
			if time.Now().After(deadline) {
				t.Fatalf("the turn's processes are still there after 30 s: %v", left)
			}
			continue
		}
		quiet++
	}
}

// rusageMs is the CPU time of a process that ran, with the children it
// waited for.
func rusageMs(cmd *exec.Cmd) float64 {
	return msOf(cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime())
}

// TestCgroupV2Accounting checks the v2 accounting against a real cgroup2
// mount (/sys/fs/cgroup on a v2 host, /sys/fs/cgroup/unified on a hybrid
// one): a process placed as testbed.CPUAccount places the service's (its
// mount namespace sees the cgroup as /sys/fs/cgroup) lands in
// libpod_parent/conmon, its burn is counted there and in cli alike, and the
// parent keeps the usage once the child cgroup is removed.
func TestCgroupV2Accounting(t *testing.T) {
	itest.Require(t, itest.Root)
	if _, err := cpuStatUsage("user_usec 1\nsystem_usec 2\n"); err == nil {
		t.Fatal("cpu.stat without usage_usec parsed")
	}
	root := cgroup2Root
	if !isCgroup2(root) {
		root = filepath.Join(cgroup2Root, "unified")
	}
	if !isCgroup2(root) {
		t.Fatalf("no cgroup2 mount at %s or %s/unified", cgroup2Root, cgroup2Root)
	}
	a := newCPUAcctIn(t, root, true)
	burn := func(cmd *exec.Cmd) float64 {
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%v: %v: %s", cmd.Args, err, out)
		}
		return rusageMs(cmd)
	}
	near := func(what string, got, want float64) {
		t.Logf("%s: cgroup %.1f ms, the process's rusage %.1f ms", what, got, want)
		if want < 100 || got < 0.8*want || got > want+5 {
			t.Errorf("%s: cgroup counted %.1f ms of a %.1f ms burn", what, got, want)
		}
	}
	before := a.read()
	placed := exec.Command("unshare", "--mount", "--propagation", "private", "sh", "-c",
		`mount --bind "$0" /sys/fs/cgroup && mkdir -p /sys/fs/cgroup/libpod_parent/conmon && echo $$ > /sys/fs/cgroup/libpod_parent/conmon/cgroup.procs && `+burnScript, a.dir)
	placedMs := burn(placed)
	mid := a.read()
	near("libpod_parent/conmon (placed through the bind mount)", mid.conmon, placedMs)
	near("libpod_parent", mid.parent, placedMs)
	cliMs := burn(a.inCLI(exec.Command("sh", "-c", burnScript)))
	after := a.read()
	near("cli", after.cli-mid.cli, cliMs)
	// Remove the placed child cgroups: the total keeps their usage.
	for _, d := range []string{"libpod_parent/conmon", "libpod_parent"} {
		var err error
		for try := 0; try < 100; try++ {
			if err = os.Remove(filepath.Join(a.dir, d)); err == nil {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	end := a.read()
	if end.parent != 0 {
		t.Fatalf("libpod_parent still read after removal: %.1f ms", end.parent)
	}
	near("total after removing libpod_parent", end.total-before.total-(after.cli-mid.cli), placedMs)
}

// TestCgroupV2Service runs testbed.CPUAccount's v2 placement with the real
// podman service and runc: the service's mount namespace sees a cgroup2
// cgroup as /sys/fs/cgroup, so podman runs in v2 mode, and a container's
// burn lands in that cgroup's libpod_parent and is kept there once --rm
// has removed the container's cgroup. --pids-limit -1: a hybrid host's
// unified mount has no pids, memory or cpu controller to set limits with.
func TestCgroupV2Service(t *testing.T) {
	itest.Require(t, itest.Root, itest.Podman)
	root := cgroup2Root
	if !isCgroup2(root) {
		root = filepath.Join(cgroup2Root, "unified")
	}
	if !isCgroup2(root) {
		t.Fatalf("no cgroup2 mount at %s or %s/unified", cgroup2Root, cgroup2Root)
	}
	a := newCPUAcctIn(t, root, true)
	tb := testbed.New(t, testbed.CPUAccount(a.dir))
	tb.StartPodman()
	run := func(script string) (cost, float64) {
		before := a.read()
		cmd := a.inCLI(exec.Command("podman", "--url", tb.PodmanURL, "run", "--rm", "--pids-limit", "-1", "--network", "none",
			"--cgroupns", "private", itest.TestImage, "/bin/sh", "-c", script))
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("podman run: %v: %s", err, out)
		}
		time.Sleep(time.Second) // conmon's exit command (podman container cleanup)
		return a.read().minus(before), rusageMs(cmd)
	}
	run("true") // warm-up: the image's layers, podman's first container
	idle, _ := run("true")
	burnt, _ := run(burnScript)
	t.Logf("per run, ms: idle total %.1f (cli %.1f, svc %.1f, libpod_parent %.1f); burn total %.1f (cli %.1f, svc %.1f, libpod_parent %.1f)",
		idle.total, idle.cli, idle.svc, idle.parent, burnt.total, burnt.cli, burnt.svc, burnt.parent)
	if idle.parent < 5 { // runc init and the container's sh: ~20 ms
		t.Errorf("%.1f ms in libpod_parent: the container was not placed below the accounting cgroup", idle.parent)
	}
	if d := burnt.parent - idle.parent; d < 150 {
		t.Errorf("the ~200 ms burn added %.1f ms to libpod_parent", d)
	}
	if other := burnt.total - burnt.cli - burnt.svc - burnt.parent; other < -1 || other > 1 {
		t.Errorf("%.1f ms outside cli, svc and libpod_parent", other)
	}
	left, _ := filepath.Glob(filepath.Join(a.dir, "libpod_parent", "libpod-*"))
	if len(left) > 0 {
		t.Errorf("containers' cgroups left after --rm: %v", left)
	}
}
