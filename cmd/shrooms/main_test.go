package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/shrooms-cage/shrooms/internal/itest"
	"github.com/shrooms-cage/shrooms/internal/testcfg"
	"github.com/shrooms-cage/shrooms/pkg/config"
	"github.com/shrooms-cage/shrooms/pkg/podman"
	"github.com/shrooms-cage/shrooms/pkg/sealed"
	"github.com/shrooms-cage/shrooms/pkg/taskid"
)

// The test binary doubles as shrooms: with SHROOMS_TEST_MAIN=1 it runs main,
// so the tests can send real signals to a real shrooms process.
func TestMain(m *testing.M) {
	// Inside a prepared cage the test binary is mounted as shrooms itself.
	// `run` starts it again as its detached teardown.
	if socket := os.Getenv("SHROOMS_TEST_LINGER_PEER"); socket != "" {
		lingerPeer(socket)
		return
	}
	if os.Getenv("SHROOMS_TEST_MAIN") == "1" || (len(os.Args) > 1 && (os.Args[1] == "cage-exec" || os.Args[1] == "teardown-detached")) {
		main()
		return
	}
	code := itest.Main(m)
	itest.RemoveShroomsBinary()
	os.Exit(code)
}

// newEnv is a world on the shared podman service whose CLI is this test
// binary: in-process for Shrooms, a separate process for Command.
func newEnv(t *testing.T, extra string) *itest.Env {
	t.Helper()
	e := itest.New(t, "ct", itest.WithMain(run), itest.WithBinary(os.Args[0], "SHROOMS_TEST_MAIN=1"))
	// Prepared cages only where a test asks for them (--prepare-next).
	e.WriteConfig(testcfg.Config{Cage: map[string]any{"prepare_next": false}, Extra: extra}.For(e).TOML())
	return e
}

// integration is newEnv on podman, whose cleanup removes the tasks' HOMEs
// and outboxes.
func integration(t *testing.T, extra string) (*itest.Env, *podman.Client) {
	itest.Require(t, itest.Root, itest.Podman)
	e := newEnv(t, extra)
	client, err := podman.Connect(context.Background(), itest.Socket())
	assert.NilError(t, err)
	// The config as the test left it (a test may move it to a service of
	// its own): the HOME is unmounted in that service's namespace too,
	// if it still runs.
	e.Release = func(ctx context.Context, task taskid.ID) error {
		cfg, err := config.Load(e.Config)
		if err != nil {
			return err
		}
		c, err := podman.Connect(ctx, cfg.Podman.Socket)
		if err != nil {
			cfg.Podman.Socket, c = itest.Socket(), client
		}
		return testcfg.Release(cfg, c)(ctx, task)
	}
	return e, client
}

func cagesOf(e *itest.Env, client *podman.Client, task string) int {
	cages, err := client.ListByLabel(context.Background(), sealed.LabelTask, task)
	assert.NilError(e.T, err)
	return len(cages)
}

func TestExitCodePassesThrough(t *testing.T) {
	e, client := integration(t, "")
	for _, want := range []int{0, 1, 7, 42} {
		code, _, stderr := e.Shrooms("run", "--task", e.Task("exit"), "--agent", "shell", "--", "-c", fmt.Sprintf("exit %d", want))
		assert.Equal(t, code, want, stderr)
	}
	assert.Equal(t, cagesOf(e, client, e.Task("exit")), 0)
}

func TestRunJSONResult(t *testing.T) {
	e, client := integration(t, "")
	code, stdout, stderr := e.Shrooms("--json", "run", "--task", e.Task("json"), "--agent", "shell", "--", "-c", "echo out; exit 3")
	assert.Equal(t, code, 3, stderr)
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	assert.Equal(t, lines[0], "out")
	var res struct {
		Task     string `json:"task"`
		Turn     int    `json:"turn"`
		Cage     string `json:"cage"`
		ExitCode int    `json:"exit_code"`
		Status   string `json:"status"`
		Removed  bool   `json:"removed"`
		Teardown string `json:"teardown"`
		Phases   []struct {
			Name string  `json:"name"`
			Ms   float64 `json:"ms"`
		} `json:"phases"`
	}
	assert.NilError(t, json.Unmarshal([]byte(lines[len(lines)-1]), &res))
	assert.Equal(t, res.Task, e.Task("json"))
	assert.Equal(t, res.Turn, 1)
	assert.Equal(t, res.ExitCode, 3)
	assert.Equal(t, res.Status, "exited")
	// The result came as soon as the exit code was known; the cage went in
	// the detached teardown (e.shrooms waited for it).
	assert.Assert(t, !res.Removed)
	assert.Equal(t, res.Teardown, "detached")
	assert.Equal(t, cagesOf(e, client, e.Task("json")), 0)
	assert.Assert(t, len(res.Cage) == 64, res.Cage)
	var names []string
	for _, p := range res.Phases {
		names = append(names, p.Name)
	}
	assert.DeepEqual(t, names, []string{"check", "lock", "prepare", "create", "start", "wait"})
}

func TestDeadlineExitCode(t *testing.T) {
	e, client := integration(t, "")
	start := time.Now()
	code, _, stderr := e.Shrooms("run", "--task", e.Task("dl"), "--agent", "shell", "--timeout", "2s", "--", "-c", "sleep 600")
	assert.Equal(t, code, ExitDeadline, stderr)
	assert.Assert(t, is.Contains(stderr, "deadline"))
	assert.Assert(t, time.Since(start) < 30*time.Second)
	assert.Equal(t, cagesOf(e, client, e.Task("dl")), 0)
}

// TestSignalsStopAndRemoveTheCage sends real SIGINT and SIGTERM to a real
// shrooms process while its cage runs.
func TestSignalsStopAndRemoveTheCage(t *testing.T) {
	e, client := integration(t, "")
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM} {
		task := e.Task(strings.ToLower(sig.String()[:3]) + "sig")
		cmd := e.Command("run", "--task", task, "--agent", "shell", "--no-stdin", "--", "-c", "echo up; sleep 600")
		stdout, err := cmd.StdoutPipe()
		assert.NilError(t, err)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		assert.NilError(t, cmd.Start())
		buf := make([]byte, 3)
		_, err = stdout.Read(buf) // the cage runs once it has printed
		assert.NilError(t, err, stderr.String())
		assert.Equal(t, cagesOf(e, client, task), 1, "positive control: the cage is there while it runs")
		assert.NilError(t, cmd.Process.Signal(sig))
		err = cmd.Wait()
		assert.Equal(t, cmd.ProcessState.ExitCode(), ExitInterrupted, "%v: %s", err, stderr.String())
		assert.Equal(t, cagesOf(e, client, task), 0, "cage left after %s", sig)
	}
}

// TestKilledShroomsLeavesNothingAfterNextRun: kill -9 of shrooms mid-turn;
// the next run of the task (and gc) removes the orphaned cage.
func TestKilledShroomsLeavesNothingAfterNextRun(t *testing.T) {
	e, client := integration(t, "")
	task := e.Task("kill")
	for _, cleaner := range []string{"run", "gc"} {
		cmd := e.Command("run", "--task", task, "--agent", "shell", "--no-stdin", "--", "-c", "echo up; sleep 600")
		stdout, err := cmd.StdoutPipe()
		assert.NilError(t, err)
		assert.NilError(t, cmd.Start())
		_, err = stdout.Read(make([]byte, 3))
		assert.NilError(t, err)
		assert.NilError(t, cmd.Process.Kill())
		_ = cmd.Wait()
		assert.Equal(t, cagesOf(e, client, task), 1, "positive control: kill -9 leaves the cage running")
		if cleaner == "run" {
			code, _, stderr := e.Shrooms("run", "--task", task, "--agent", "shell", "--", "-c", "true")
			assert.Equal(t, code, 0, stderr)
		} else {
			code, stdout, stderr := e.Shrooms("gc")
			assert.Equal(t, code, 0, stderr)
			assert.Assert(t, is.Contains(stdout, "removed 1 leftover cage"))
		}
		assert.Equal(t, cagesOf(e, client, task), 0, "after %s", cleaner)
	}
}

func TestBusyTaskExitCode(t *testing.T) {
	e, client := integration(t, "")
	task := e.Task("busy")
	cmd := e.Command("run", "--task", task, "--agent", "shell", "--no-stdin", "--", "-c", "echo up; sleep 600")
	stdout, err := cmd.StdoutPipe()
	assert.NilError(t, err)
	assert.NilError(t, cmd.Start())
	_, err = stdout.Read(make([]byte, 3))
	assert.NilError(t, err)
	start := time.Now()
	code, _, stderr := e.Shrooms("run", "--task", task, "--agent", "shell", "--", "-c", "true")
	assert.Equal(t, code, ExitBusy, stderr)
	assert.Assert(t, time.Since(start) < 5*time.Second, "a busy task fails at once")
	assert.Assert(t, is.Contains(stderr, "has a turn running"))
	assert.NilError(t, cmd.Process.Signal(syscall.SIGTERM))
	_ = cmd.Wait()
	assert.Equal(t, cagesOf(e, client, task), 0)
}

func TestStdinAndStreams(t *testing.T) {
	e, _ := integration(t, "")
	var out, errb bytes.Buffer
	code := run([]string{"shrooms", "--config", e.Config, "run", "--task", e.Task("io"), "--agent", "shell", "--stdin", "--", "-c", "tr a-z A-Z; echo err >&2"},
		strings.NewReader("hello cage\n"), &out, &errb)
	assert.Equal(t, code, 0, errb.String())
	assert.Equal(t, out.String(), "HELLO CAGE\n")
	assert.Equal(t, errb.String(), "err\n")
}

// TestBadInputIsOneClearLineAndChangesNothing covers config, task ids,
// paths, tokens, images and the podman socket.
func TestBadInputIsOneClearLineAndChangesNothing(t *testing.T) {
	e, client := integration(t, "")
	link := filepath.Join(e.Dir, "link")
	realWT := filepath.Join(e.Dir, "wt")
	assert.NilError(t, os.Mkdir(realWT, 0o755))
	assert.NilError(t, os.Symlink(realWT, link))
	file := filepath.Join(e.Dir, "file")
	assert.NilError(t, os.WriteFile(file, nil, 0o644))

	badConfig := filepath.Join(e.Dir, "bad.toml")
	assert.NilError(t, os.WriteFile(badConfig, []byte("[cage]\nmemroy = \"1g\"\n"), 0o600))
	noToken := newEnv(t, "[tokens]\nk = \"/nonexistent/token\"\n[agents.t]\ncommand = [\"sh\"]\nhome = [\"shell\"]\ntoken_env = { K = \"k\" }\n")
	noImage := newEnv(t, "[agents.x]\ncommand = [\"sh\"]\nhome = [\"shell\"]\nimage = \"localhost/shrooms-no-such-image:latest\"\n")
	noSocket := newEnv(t, "")
	data, _ := os.ReadFile(noSocket.Config)
	assert.NilError(t, os.WriteFile(noSocket.Config, bytes.Replace(data, []byte(itest.Socket()), []byte("unix:///run/shrooms-test-nonexistent/podman.sock"), 1), 0o600))
	networked := newEnv(t, "")
	data, _ = os.ReadFile(networked.Config)
	assert.NilError(t, os.WriteFile(networked.Config, bytes.Replace(data, []byte(`policy = "none"`), []byte(`policy = "internet"`+"\nbridge = \"shrtest0\"\nname = \"shrtest0\""), 1), 0o600))

	cases := []struct {
		name string
		env  *itest.Env
		args []string
		code int
		want string
	}{
		{"unknown config key", e, []string{"--config", badConfig, "run", "--task", e.Task("a"), "--agent", "shell"}, ExitUsage, "bad.toml:2: cage.memroy: unknown key"},
		{"task ../x", e, []string{"run", "--task", "../x", "--agent", "shell"}, ExitUsage, `invalid task id "../x"`},
		{"empty task", e, []string{"run", "--task", "", "--agent", "shell"}, ExitUsage, "invalid task id"},
		{"200-char task", e, []string{"run", "--task", strings.Repeat("a", 200), "--agent", "shell"}, ExitUsage, "invalid task id"},
		{"unknown agent", e, []string{"run", "--task", e.Task("a"), "--agent", "nope"}, ExitUsage, `unknown agent "nope"`},
		{"missing worktree", e, []string{"run", "--task", e.Task("a"), "--agent", "shell", "--worktree", filepath.Join(e.Dir, "nope")}, ExitUsage, "no such file or directory"},
		{"symlinked worktree", e, []string{"run", "--task", e.Task("a"), "--agent", "shell", "--worktree", link}, ExitUsage, "is a symbolic link"},
		{"file worktree", e, []string{"run", "--task", e.Task("a"), "--agent", "shell", "--worktree", file}, ExitUsage, "is not a directory"},
		{"plain worktree", e, []string{"run", "--task", e.Task("a"), "--agent", "shell", "--worktree", realWT}, ExitUsage, "not a git work tree"},
		{"etc worktree", e, []string{"run", "--task", e.Task("a"), "--agent", "shell", "--worktree", "/etc"}, ExitUsage, "protected host directory /etc"},
		{"root worktree", e, []string{"run", "--task", e.Task("a"), "--agent", "shell", "--worktree", "/"}, ExitUsage, "root directory"},
		{"relative worktree", e, []string{"run", "--task", e.Task("a"), "--agent", "shell", "--worktree", "wt"}, ExitUsage, "must be an absolute path"},
		{"token missing", noToken, []string{"run", "--task", noToken.Task("a"), "--agent", "t"}, ExitUsage, `tokens.k: cannot read /nonexistent/token`},
		{"image missing", noImage, []string{"run", "--task", noImage.Task("a"), "--agent", "x"}, ExitHostNotReady, "image localhost/shrooms-no-such-image:latest is not in podman's store"},
		{"socket absent", noSocket, []string{"run", "--task", noSocket.Task("a"), "--agent", "shell"}, ExitHostNotReady, "podman API unreachable"},
		{"seal absent", networked, []string{"run", "--task", networked.Task("a"), "--agent", "shell"}, ExitHostNotReady, "network seal not verified, refusing to start a networked cage"},
		{"missing flag", e, []string{"run", "--agent", "shell"}, ExitUsage, `required flag --task not set`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := tc.env.Shrooms(tc.args...)
			assert.Equal(t, code, tc.code, "stdout=%q stderr=%q", stdout, stderr)
			assert.Assert(t, is.Contains(stderr, tc.want))
			msg := strings.TrimSpace(stderr)
			assert.Assert(t, !strings.Contains(msg, "\n"), "not one line: %q", msg)
			assert.Assert(t, strings.HasPrefix(msg, "shrooms: "), msg)
			assert.Equal(t, stdout, "", "usage and errors go to stderr")
		})
	}
	// Nothing was created: no cage, no HOME volume, no task state.
	for _, x := range []*itest.Env{e, noToken, noImage, noSocket, networked} {
		cages, err := client.ListByLabel(context.Background(), sealed.LabelManaged, "1")
		assert.NilError(t, err)
		for _, c := range cages {
			assert.Assert(t, !strings.HasPrefix(c.Labels[sealed.LabelTask], x.Prefix), "cage %s created", c.Name)
		}
		ok, err := client.VolumeExists(context.Background(), "shrooms-home-"+x.Prefix+"-"+x.Task("a"))
		assert.NilError(t, err)
		assert.Assert(t, !ok)
		_, err = os.Stat(filepath.Join(x.Dir, "state", "tasks", x.Task("a")))
		assert.Assert(t, os.IsNotExist(err), "task state written for bad input")
	}
	fi, err := os.Lstat(realWT)
	assert.NilError(t, err)
	assert.Equal(t, fi.Sys().(*syscall.Stat_t).Uid, uint32(0), "the worktree behind the symlink was not touched")
}

func TestBootstrapCommand(t *testing.T) {
	e, _ := integration(t, "")
	task := e.Task("boot")
	code, stdout, stderr := e.Shrooms("bootstrap", "--task", task)
	assert.Equal(t, code, 0, stderr)
	assert.Equal(t, stdout, "bootstrapped\n")
	code, stdout, _ = e.Shrooms("--json", "bootstrap", "--task", task)
	assert.Equal(t, code, 0)
	assert.Assert(t, is.Contains(stdout, `"result":"already-bootstrapped"`))
}

func TestSpecCommandPrintsStableJSON(t *testing.T) {
	e, client := integration(t, "")
	task := e.Task("spec")
	args := []string{"spec", "--task", task, "--agent", "shell", "--", "-c", "true"}
	code, first, stderr := e.Shrooms(args...)
	assert.Equal(t, code, 0, stderr)
	_, second, _ := e.Shrooms(args...)
	assert.Equal(t, first, second, "spec output is stable")
	var spec map[string]any
	assert.NilError(t, json.Unmarshal([]byte(first), &spec))
	assert.Equal(t, spec["name"], "shrooms-"+task+"-1")
	assert.Equal(t, cagesOf(e, client, task), 0)
}

func TestDoctor(t *testing.T) {
	e, _ := integration(t, "")
	code, stdout, stderr := e.Shrooms("doctor")
	assert.Assert(t, is.Contains(stdout, "ok   podman"), stdout+stderr)
	assert.Assert(t, is.Contains(stdout, "ok   image"), stdout)
	assert.Assert(t, is.Contains(stdout, "ok   subids"), stdout)
	assert.Assert(t, is.Contains(stdout, "ok   seal           network.policy = none"), stdout)
	for _, check := range []string{"config", "loop", "mkfs.ext4", "git", "tiocsti"} {
		assert.Check(t, is.Regexp("(?m)^ok +"+regexp.QuoteMeta(check)+" ", stdout))
	}
	// This host (kernel 6.x, ext4) makes idmapped mounts; forced off, the
	// chown walks.
	assert.Check(t, is.Regexp(`(?m)^ok +worktree mode +idmapped mounts \(no chown walks\)`, stdout))
	assert.Equal(t, code, 0, stdout+stderr)
	off := newEnv(t, "[worktree]\nidmap = \"off\"\n")
	_, offOut, _ := off.Shrooms("doctor")
	assert.Check(t, is.Regexp(`(?m)^ok +worktree mode +chown walks before and after every turn \(worktree.idmap = "off"\)`, offOut))

	// The gateway's upstream: DNS and TCP, against loopback only.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	assert.NilError(t, err)
	defer ln.Close()
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	assert.NilError(t, err)
	closedAddr := closed.Addr().String()
	closed.Close()
	token := filepath.Join(t.TempDir(), "key")
	assert.NilError(t, os.WriteFile(token, []byte("sk-test\n"), 0o600))
	gw := newEnv(t, fmt.Sprintf("[tokens]\nk = %q\n[gateway.up]\nupstream = \"http://%s\"\ntoken = \"k\"\n[gateway.down]\nupstream = \"http://%s\"\ntoken = \"k\"\n", token, ln.Addr(), closedAddr))
	code, stdout, _ = gw.Shrooms("doctor")
	assert.Check(t, is.Equal(code, ExitHostNotReady), stdout)
	assert.Check(t, is.Regexp(`(?m)^ok +gateway +gateway up: http://127\.0\.0\.1:\d+ resolves \(127\.0\.0\.1\) and accepts TCP`, stdout))
	assert.Check(t, is.Regexp(`(?m)^fail gateway +gateway down: gateway upstream http://127\.0\.0\.1:\d+ is unreachable`, stdout))

	// A token file others can read fails; a missing one only warns.
	loose := filepath.Join(t.TempDir(), "loose")
	assert.NilError(t, os.WriteFile(loose, []byte("sk-test\n"), 0o644))
	bad := newEnv(t, fmt.Sprintf("[tokens]\nk = \"/nonexistent/token\"\nl = %q\n", loose))
	data, _ := os.ReadFile(bad.Config)
	assert.NilError(t, os.WriteFile(bad.Config, bytes.Replace(data, []byte(itest.Socket()), []byte("unix:///run/shrooms-test-nonexistent/podman.sock"), 1), 0o600))
	code, stdout, _ = bad.Shrooms("--json", "doctor")
	assert.Equal(t, code, ExitHostNotReady)
	var rep struct {
		OK       bool `json:"ok"`
		Findings []struct{ Check, Status, Fix string }
	}
	assert.NilError(t, json.Unmarshal([]byte(stdout), &rep))
	assert.Assert(t, !rep.OK)
	failed := map[string]bool{}
	for _, f := range rep.Findings {
		if f.Status == "fail" {
			failed[f.Check] = true
			assert.Assert(t, f.Fix != "", "finding %s has no fix", f.Check)
		}
	}
	assert.Assert(t, failed["podman"] && failed["tokens"], "%+v", rep.Findings)
	var tokens []string
	for _, f := range rep.Findings {
		if f.Check == "tokens" {
			tokens = append(tokens, f.Status)
		}
	}
	assert.Check(t, is.DeepEqual(tokens, []string{"warn", "fail"}), "%+v", rep.Findings)
}

func TestVersionAndHelp(t *testing.T) {
	e := newEnv(t, "")
	code, stdout, _ := e.Shrooms("version")
	assert.Equal(t, code, 0)
	assert.Assert(t, strings.HasPrefix(stdout, "shrooms "))
	// --version and -v say the same as the command.
	for _, flag := range []string{"--version", "-v"} {
		c, out, _ := e.Shrooms(flag)
		assert.Equal(t, c, 0)
		assert.Equal(t, out, stdout, flag)
	}
	_, jv, _ := e.Shrooms("--json", "version")
	_, jf, _ := e.Shrooms("--json", "--version")
	assert.Equal(t, jf, jv)
	code, stdout, _ = e.Shrooms("--help")
	assert.Equal(t, code, 0)
	for _, cmd := range []string{"run", "spec", "bootstrap", "doctor", "gc", "tasks", "status", "log", "stop", "version"} {
		assert.Assert(t, is.Contains(stdout, "   "+cmd), "help lacks %s", cmd)
	}
	assert.Assert(t, is.Contains(stdout, "123 task busy"))
}
