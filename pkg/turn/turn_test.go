package turn

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containers/podman/v5/pkg/specgen"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/shrooms-cage/shrooms/internal/itest"
	"github.com/shrooms-cage/shrooms/internal/testcfg"
	"github.com/shrooms-cage/shrooms/pkg/outbox"
	"github.com/shrooms-cage/shrooms/pkg/podman"
	"github.com/shrooms-cage/shrooms/pkg/sealed"
	"github.com/shrooms-cage/shrooms/pkg/taskid"
)

// newHarness is a runner on the test podman service, in a world of its
// own (itest.Env: private state dir, unique prefix, cleanup of what the
// test's tasks left).
func newHarness(t *testing.T, extra string) (*itest.Env, *Runner) { return newHarnessTB(t, extra) }

func newHarnessTB(t testing.TB, extra string, opts ...itest.Option) (*itest.Env, *Runner) {
	t.Helper()
	e, cfg, client := testcfg.Env(t, "tt", testcfg.Config{Extra: extra,
		Cage: map[string]any{"pids": 128, "cpus": 1.0, "nofile": 512, "nproc": 256, "tmp_size": "16m", "run_size": "4m"}}, opts...)
	runner := NewRunner(cfg, client, nil)
	// The HOMEs go through the service the test ended on (a test may move
	// the runner to a service of its own).
	e.Release = func(ctx context.Context, task taskid.ID) error {
		return testcfg.Release(runner.Cfg, runner.Podman)(ctx, task)
	}
	return e, runner
}

// sh runs one turn of the shell agent and returns its stdout and stderr.
func sh(runner *Runner, task, worktree, script string) (*Result, string, string, error) {
	var out, errb bytes.Buffer
	res, err := runner.Run(context.Background(), Request{
		Task: taskid.Must(task), Agent: "shell", Worktree: worktree, Args: []string{"-c", script},
		Streams: podman.Streams{Stdout: &out, Stderr: &errb},
	})
	return res, out.String(), errb.String(), err
}

func field(t *testing.T, status, name string) string {
	t.Helper()
	m := regexp.MustCompile(`(?m)^` + name + `:\s*(.*)$`).FindStringSubmatch(status)
	assert.Assert(t, m != nil, "no %s in /proc/self/status", name)
	return strings.TrimSpace(m[1])
}

// TestCageIsSealedFromInside observes every property of the sealed spec from
// inside a real cage (with gVisor's measured differences when the suites
// run under runsc, SHROOMS_TEST_RUNTIME).
func TestCageIsSealedFromInside(t *testing.T) {
	e, runner := newHarness(t, "")
	cageIsSealedFromInside(t, e, runner, itest.Runtime() == "runsc")
}

// cageIsSealedFromInside is also run under gVisor (runtime_runsc_test.go),
// where the id maps the cage reads are the Sentry's own (the task's host
// ids are checked on the host side there).
func cageIsSealedFromInside(t *testing.T, e *itest.Env, runner *Runner, gvisor bool) {
	wt := filepath.Join(t.TempDir(), "wt")
	assert.NilError(t, os.Mkdir(wt, 0o755))
	runner.Cfg.Worktree.Roots = []string{filepath.Dir(wt)} // a plain directory, not a git work tree
	res, out, errOut, err := sh(runner, e.Task("seal"), wt, `
echo "==status"; cat /proc/self/status
echo "==uidmap"; cat /proc/self/uid_map
echo "==gidmap"; cat /proc/self/gid_map
echo "==mountinfo"; cat /proc/self/mountinfo
echo "==writes"
for d in / /etc /usr /bin /var; do if touch $d/.probe 2>/dev/null; then echo "wrote $d"; else echo "denied $d"; fi; done
if touch /work/.probe && touch /tmp/.probe && touch /home/agent/.probe; then echo "wrote work tmp home"; fi
cp /bin/busybox /tmp/bb 2>/dev/null && chmod +x /tmp/bb && if /tmp/bb true 2>/dev/null; then echo "exec tmp allowed"; else echo "exec tmp denied"; fi
echo "==id $(id -u):$(id -g) home=$HOME pwd=$(pwd) host=$(hostname)"
echo "==limits nofile=$(ulimit -n) nproc=$(ulimit -u)"
echo "==pids $(cat /sys/fs/cgroup/pids.max 2>/dev/null || cat /sys/fs/cgroup/pids/pids.max)"
echo "==mem $(cat /sys/fs/cgroup/memory.max 2>/dev/null || cat /sys/fs/cgroup/memory/memory.limit_in_bytes)"
echo "==dev $(ls /dev | tr '\n' ' ')"
echo "==sockets"; find / -type s 2>/dev/null | grep -v '^/proc/' 
echo "==ns"; ls -l /proc/1/ns/ | tail -n +2 | sed 's/.*-> //'
echo "==ps $(ls -d /proc/[0-9]* | wc -l)"
echo "==hosts"; cat /etc/hosts /etc/resolv.conf
`)
	assert.NilError(t, err, errOut)
	assert.Equal(t, res.ExitCode, 0, errOut)
	assert.Equal(t, res.Status, "exited")
	assert.Assert(t, res.Removed, "cage not removed: %s", res.Error)

	status := section(out, "status")
	for _, capName := range []string{"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"} {
		assert.Equal(t, field(t, status, capName), "0000000000000000", capName)
	}
	assert.Equal(t, field(t, status, "NoNewPrivs"), "1")
	assert.Equal(t, field(t, status, "Seccomp"), "2")

	if !gvisor {
		uidmap := strings.Fields(section(out, "uidmap"))
		assert.Equal(t, len(uidmap), 3, "one uid_map line: %v", uidmap)
		assert.Equal(t, uidmap[0], "0")
		assert.Assert(t, uidmap[1] != "0", "the cage's root is not host root: %v", uidmap)
		assert.Equal(t, uidmap[2], "65536")
		ids, err := runner.Store.TaskIDs(taskid.Must(e.Task("seal")), runner.IDFiles, false)
		assert.NilError(t, err)
		assert.Equal(t, uidmap[1], strconv.Itoa(int(ids.UID)))
		assert.DeepEqual(t, strings.Fields(section(out, "gidmap")), []string{"0", strconv.Itoa(int(ids.GID)), "65536"})
	}

	// Read-only root: every mount point that is writable is one we asked for.
	mi := section(out, "mountinfo")
	root := mountLine(t, mi, "/")
	assert.Assert(t, hasOpt(root, "ro"), "root is not read-only: %s", root)
	for _, dest := range []string{"/tmp", "/run"} {
		line := mountLine(t, mi, dest)
		assert.Assert(t, strings.Contains(line, " - tmpfs "), "%s is not tmpfs: %s", dest, line)
		// gVisor's mountinfo never shows nodev (docs/gvisor.md); its
		// tmpfs has no device nodes to open.
		assert.Assert(t, hasOpt(line, "nosuid") && (gvisor || hasOpt(line, "nodev")) && hasOpt(line, "noexec"), "%s: %s", dest, line)
	}
	assert.Assert(t, strings.Contains(mountLine(t, mi, "/tmp"), "size=16384k"), "tmp size cap")
	writes := section(out, "writes")
	for _, d := range []string{"/", "/etc", "/usr", "/bin", "/var"} {
		assert.Assert(t, is.Contains(writes, "denied "+d))
	}
	assert.Assert(t, is.Contains(writes, "wrote work tmp home"), "positive control: the sanctioned places are writable")
	assert.Assert(t, is.Contains(writes, "exec tmp denied"))

	assert.Assert(t, is.Contains(out, fmt.Sprintf("==id 1000:1000 home=/home/agent pwd=/work host=cage-%s", e.Task("seal"))))
	if gvisor {
		// RLIMIT_NPROC keeps the Sentry's host tasks under the pids limit
		// (sealed.GVisorNproc, docs/gvisor.md).
		assert.Assert(t, is.Contains(out, fmt.Sprintf("==limits nofile=512 nproc=%d", sealed.GVisorNproc(128, 256))))
	} else {
		assert.Assert(t, is.Contains(out, "==limits nofile=512 nproc=256"))
	}
	if gvisor {
		// The Sentry's cgroupfs shows no pids limit: a known gap
		// (docs/gvisor.md), asserted so that a change is noticed.
		assert.Assert(t, is.Contains(out, "==pids max"))
	} else {
		assert.Assert(t, is.Contains(out, "==pids 128"))
	}
	assert.Assert(t, is.Contains(out, "==mem 268435456"))
	devs := strings.Fields(strings.TrimPrefix(lineWith(out, "==dev"), "==dev"))
	known := []string{"console", "core", "fd", "full", "mqueue", "null", "ptmx", "pts", "random", "shm", "stderr", "stdin", "stdout", "tty", "urandom", "zero"}
	if gvisor {
		known = append(known, "char", "fuse") // the Sentry's own (docs/gvisor.md)
	}
	for _, d := range devs {
		assert.Assert(t, slices.Contains(known, d), "unexpected device /dev/%s", d)
	}
	assert.Equal(t, strings.TrimSpace(section(out, "sockets")), "", "no sockets visible in the cage")
	assert.Assert(t, is.Contains(out, "==ps "), out)
	hostsFile, err := os.ReadFile("/etc/hosts")
	assert.NilError(t, err)
	for _, l := range strings.Split(string(hostsFile), "\n") {
		if f := strings.Fields(l); len(f) > 1 && !strings.HasPrefix(f[0], "#") && f[1] != "localhost" && !strings.HasPrefix(f[1], "ip6-") {
			assert.Assert(t, !strings.Contains(section(out, "hosts"), f[1]), "the host's /etc/hosts line %q leaked into the cage", l)
		}
	}
	assert.Assert(t, !strings.Contains(section(out, "hosts"), "host.containers.internal"))

	// Namespaces: none shared with the host (compare with our own).
	for _, ns := range []string{"pid", "ipc", "uts", "mnt", "net", "user", "cgroup"} {
		mine, err := os.Readlink("/proc/self/ns/" + ns)
		assert.NilError(t, err)
		assert.Assert(t, !strings.Contains(section(out, "ns"), mine), "cage shares the host's %s namespace (%s)", ns, mine)
	}
}

func TestTwoTasksHaveDisjointIDRanges(t *testing.T) {
	e, runner := newHarness(t, "")
	var starts []int
	for _, name := range []string{"a", "b"} {
		_, out, errOut, err := sh(runner, e.Task(name), "", "cat /proc/self/uid_map")
		assert.NilError(t, err, errOut)
		f := strings.Fields(out)
		assert.Equal(t, len(f), 3, out)
		n, _ := strconv.Atoi(f[1])
		size, _ := strconv.Atoi(f[2])
		assert.Equal(t, size, 65536)
		starts = append(starts, n)
	}
	gap := starts[1] - starts[0]
	if gap < 0 {
		gap = -gap
	}
	assert.Assert(t, gap >= 65536, "ranges overlap: %v", starts)
	// The same task keeps its range on its next turn.
	_, out, _, err := sh(runner, e.Task("a"), "", "cat /proc/self/uid_map")
	assert.NilError(t, err)
	assert.Equal(t, strings.Fields(out)[1], strconv.Itoa(starts[0]))
}

// TestExitCodeAndHomeReset: the agent's exit code is the turn's, and what a
// turn leaves in HOME outside the keep-list is gone at the next turn, while
// its outbox files wait, out of the next turn's reach, to be collected.
func TestExitCodeAndHomeReset(t *testing.T) {
	e, runner := newHarness(t, "")
	exitCodeAndHomeReset(t, e, runner)
}

func exitCodeAndHomeReset(t *testing.T, e *itest.Env, runner *Runner) {
	task := e.Task("exit")
	res, _, errOut, err := sh(runner, task, "", "echo planted > /home/agent/.profile; echo report > /outbox/r.txt; exit 7")
	assert.NilError(t, err, errOut)
	assert.Equal(t, res.ExitCode, 7)
	assert.Equal(t, res.Turn, 1)
	res, out, _, err := sh(runner, task, "", "cat /home/agent/.profile 2>&1; cat /outbox/r.txt")
	assert.NilError(t, err)
	assert.Equal(t, res.Turn, 2)
	assert.Assert(t, is.Contains(out, "No such file"), out)
	assert.Assert(t, !strings.Contains(out, "report"), "the next turn read the outbox: %s", out)
	rep, err := outbox.List(context.Background(), runner.Cfg.Outbox.Root, taskid.Must(task), outbox.LimitsFrom(runner.Cfg.Outbox))
	assert.NilError(t, err)
	assert.Equal(t, len(rep.Files), 1, "the outbox file is pending")
	assert.Equal(t, rep.Files[0].Turn, 1)
	assert.Assert(t, res.Reset != nil)
	assert.Assert(t, is.Contains(res.Reset.Removed, ".profile"))
	assert.Assert(t, res.Reset.BaselineDigest != "")
}

func TestDeadlineStopsAndRemovesTheCage(t *testing.T) {
	e, runner := newHarness(t, "")
	deadlineStopsAndRemoves(t, e, runner)
}

func deadlineStopsAndRemoves(t *testing.T, e *itest.Env, runner *Runner) {
	var out bytes.Buffer
	start := time.Now()
	res, err := runner.Run(context.Background(), Request{
		Task: taskid.Must(e.Task("deadline")), Agent: "shell", Timeout: 2 * time.Second,
		Args:    []string{"-c", "echo started; sleep 600"},
		Streams: podman.Streams{Stdout: &out, Stderr: &out},
	})
	assert.ErrorIs(t, err, ErrDeadline)
	assert.Equal(t, res.Status, "deadline")
	assert.Assert(t, res.Removed)
	assert.Assert(t, time.Since(start) < 30*time.Second, "took %s", time.Since(start))
	assert.Assert(t, is.Contains(out.String(), "started"))
	assertNoCage(t, runner, e.Task("deadline"))
}

func TestInterruptStopsAndRemovesTheCage(t *testing.T) {
	e, runner := newHarness(t, "")
	interruptStopsAndRemoves(t, e, runner)
}

func interruptStopsAndRemoves(t *testing.T, e *itest.Env, runner *Runner) {
	ctx, cancel := context.WithCancel(context.Background())
	r, w, _ := os.Pipe()
	defer r.Close()
	go func() {
		// Cancel once the agent has printed: the cage is running.
		buf := make([]byte, 16)
		_, _ = r.Read(buf)
		cancel()
	}()
	res, err := runner.Run(ctx, Request{
		Task: taskid.Must(e.Task("intr")), Agent: "shell", Args: []string{"-c", "echo up; sleep 600"},
		Streams: podman.Streams{Stdout: w, Stderr: os.Stderr},
	})
	w.Close()
	assert.ErrorIs(t, err, ErrInterrupted)
	assert.Equal(t, res.Status, "interrupted")
	assert.Assert(t, res.Removed)
	assertNoCage(t, runner, e.Task("intr"))
}

func TestBusyTaskFailsAtOnce(t *testing.T) {
	e, runner := newHarness(t, "")
	task := e.Task("busy")
	lock, err := runner.Store.LockTask(taskid.Must(task))
	assert.NilError(t, err)
	_, _, _, err = sh(runner, task, "", "true")
	assert.ErrorIs(t, err, ErrBusy)
	assert.Assert(t, is.Contains(err.Error(), "has a turn running"))
	assert.NilError(t, lock.Release())
	res, _, _, err := sh(runner, task, "", "true")
	assert.NilError(t, err, "positive control: the task runs once free")
	assert.Equal(t, res.ExitCode, 0)
}

func TestSpecIsWhatRunSends(t *testing.T) {
	e, runner := newHarness(t, "")
	task := e.Task("spec")
	req := Request{Task: taskid.Must(task), Agent: "shell", Args: []string{"-c", "true"}}
	spec, err := runner.Spec(context.Background(), req)
	assert.NilError(t, err)
	want, err := SpecJSON(spec)
	assert.NilError(t, err)
	_, err = os.Stat(filepath.Join(runner.Cfg.State.Dir, "tasks", task))
	assert.Assert(t, os.IsNotExist(err), "spec wrote task state")
	exists, err := runner.Podman.VolumeExists(context.Background(), runner.Cfg.Home.VolumePrefix+task)
	assert.NilError(t, err)
	assert.Assert(t, !exists, "spec created the HOME volume")

	var sent []byte
	runner.OnSpec = func(s *specgen.SpecGenerator) { sent, _ = SpecJSON(s) }
	req.Streams = podman.Streams{Stdout: &bytes.Buffer{}, Stderr: &bytes.Buffer{}}
	_, err = runner.Run(context.Background(), req)
	assert.NilError(t, err)
	assert.Equal(t, string(sent), string(want))
}

func TestTokenReachesTheCageOnlyAsEnv(t *testing.T) {
	dir := t.TempDir()
	tok := filepath.Join(dir, "tok")
	assert.NilError(t, os.WriteFile(tok, []byte("s3cr3t-value\n"), 0o600))
	e, runner := newHarness(t, fmt.Sprintf(`
[tokens]
api = %q
[agents.tok]
command = ["/bin/sh"]
home = ["shell"]
token_env = { API_KEY = "api" }
`, tok))
	task := e.Task("tok")
	req := Request{Task: taskid.Must(task), Agent: "tok", Args: []string{"-c", `echo "key=$API_KEY"; grep -rl "s3""cr3t" /home/agent /work /tmp 2>/dev/null | wc -l`}}
	spec, err := runner.Spec(context.Background(), req)
	assert.NilError(t, err)
	js, _ := json.Marshal(spec)
	assert.Assert(t, !strings.Contains(string(js), "s3cr3t"), "the token value is in the spec")
	var out, errb bytes.Buffer
	req.Streams = podman.Streams{Stdout: &out, Stderr: &errb}
	res, err := runner.Run(context.Background(), req)
	assert.NilError(t, err, errb.String())
	assert.Equal(t, res.ExitCode, 0)
	assert.Equal(t, out.String(), "key=s3cr3t-value\n0\n")
	secrets, err := exec.Command("podman", "--url", itest.Socket(), "secret", "ls", "--format", "{{.Name}}").CombinedOutput()
	assert.NilError(t, err, string(secrets))
	assert.Assert(t, !strings.Contains(string(secrets), SecretName(taskid.Must(task), "api")), "the token's secret outlived the turn")
}

func assertNoCage(t *testing.T, runner *Runner, task string) {
	t.Helper()
	cages, err := runner.Podman.ListByLabel(context.Background(), sealed.LabelTask, task)
	assert.NilError(t, err)
	assert.Equal(t, len(cages), 0, "cages left: %+v", cages)
}

func section(out, name string) string {
	i := strings.Index(out, "=="+name+"\n")
	if i < 0 {
		return ""
	}
	rest := out[i+len(name)+3:]
	if strings.HasPrefix(rest, "==") {
		return ""
	}
	if j := strings.Index(rest, "\n=="); j >= 0 {
		return rest[:j+1]
	}
	return rest
}

func lineWith(out, prefix string) string {
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, prefix) {
			return l
		}
	}
	return ""
}

// mountLine finds the mountinfo line whose mount point is dest.
func mountLine(t *testing.T, mi, dest string) string {
	t.Helper()
	for _, l := range strings.Split(mi, "\n") {
		f := strings.Fields(l)
		if len(f) > 5 && f[4] == dest {
			return l
		}
	}
	t.Fatalf("no mount at %s in:\n%s", dest, mi)
	return ""
}

func hasOpt(line, opt string) bool {
	f := strings.Fields(line)
	if len(f) < 6 {
		return false
	}
	for _, o := range strings.Split(f[5], ",") {
		if o == opt {
			return true
		}
	}
	return false
}

func TestMain(m *testing.M) {
	code := itest.Main(m)
	itest.RemoveShroomsBinary()
	os.Exit(code)
}
