// Package faults_test breaks the host under shrooms on real podman — state
// drifted behind its back (HOME volume removed, image deleted while
// mounted), the podman service stopped, the cage or conmon killed, the
// host disk full, HOME full during the reset, the task lock file deleted,
// a reboot — and checks that no kept credential or session is lost (by
// content) and that the next turn works or refuses with the command that
// fixes it. It drives the shrooms binary, as a user would.
package faults_test

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"gotest.tools/v3/assert"

	"github.com/shrooms-cage/shrooms/internal/itest"
	"github.com/shrooms-cage/shrooms/pkg/homestore"
)

func TestMain(m *testing.M) {
	code := itest.Main(m)
	itest.RemoveShroomsBinary()
	os.Exit(code)
}

// env is a private state dir and config on a podman service.
type env struct {
	t      *testing.T
	dir    string
	state  string
	config string
	prefix string
	socket string
	bin    string
}

// newEnv writes a config on the given podman socket (itest.Socket() for
// the shared service). The agent "keep" is a shell with the claude and
// opencode keep-lists, so its turns keep credentials and sessions.
func newEnv(t *testing.T, socket, stateDir string) *env {
	t.Helper()
	itest.Require(t, itest.Root, itest.Podman)
	dir := t.TempDir()
	if stateDir == "" {
		stateDir = filepath.Join(dir, "state")
	}
	e := &env{t: t, dir: dir, state: stateDir, prefix: itest.UniqueName("fl"), socket: socket, bin: itest.ShroomsBinary(t)}
	e.config = filepath.Join(dir, "config.toml")
	assert.NilError(t, os.WriteFile(e.config, []byte(fmt.Sprintf(`
[podman]
socket = %q
[state]
dir = %q
[cage]
image = %q
memory = "256m"
pids = 128
nofile = 512
nproc = 256
tmp_size = "16m"
run_size = "4m"
timeout = "120s"
stop_grace = "2s"
runtime = %q
# Off: a prepared next cage holds its HOME mounted by design, and these
# tests count what a turn leaves (TestPreparedCageDrift prepares its own).
prepare_next = false
[network]
policy = "none"
[home]
volume_prefix = "shrooms-home-%s-"
size = "64m"
inodes = 4096
[outbox]
root = %q
[worktree]
roots = [%q]
uncapped = "allow"
[tokens]
tok = %q
[agents.keep]
command = ["/bin/sh"]
home = ["claude", "opencode", "shell"]
token_env = { FAULTS_TOKEN = "tok" }
`, socket, stateDir, itest.TestImage, cmp.Or(itest.CageRuntime(), "default"), e.prefix, filepath.Join(dir, "outbox"), filepath.Join(dir, "work"), filepath.Join(dir, "token"))), 0o600))
	assert.NilError(t, os.WriteFile(filepath.Join(dir, "token"), []byte("token-"+e.prefix+"\n"), 0o600))
	t.Cleanup(e.cleanup)
	return e
}

func (e *env) task(name string) string { return e.prefix + "-" + name }

func (e *env) volume(task string) string { return "shrooms-home-" + e.prefix + "-" + task }

func (e *env) image(task string) string {
	return homestore.ImagePath(e.state, e.volume(task))
}

// cleanup forgets every task of the test; forget must leave nothing.
func (e *env) cleanup() {
	entries, _ := os.ReadDir(filepath.Join(e.state, "tasks"))
	for _, d := range entries {
		if code, _, stderr := e.shrooms("forget", "--task", d.Name()); code != 0 {
			e.t.Errorf("cleanup: forget %s: exit %d: %s", d.Name(), code, stderr)
		}
	}
	if n := e.attachedAfter(); n != 0 {
		e.t.Errorf("cleanup: %d loop device(s) of this test's HOMEs are left: %v", n, e.attachments())
	}
}

// cmd returns the shrooms CLI with the env's config.
func (e *env) cmd(args ...string) *exec.Cmd {
	c := exec.Command(e.bin, append([]string{"--config", e.config}, args...)...)
	c.Env = append(os.Environ(), "SHROOMS_CONFIG=")
	return c
}

// shrooms runs the CLI and returns its exit code and output.
func (e *env) shrooms(args ...string) (int, string, string) {
	var out, errb bytes.Buffer
	c := e.cmd(args...)
	c.Stdout, c.Stderr = &out, &errb
	err := c.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		e.t.Fatalf("run shrooms: %v", err)
	}
	return code, out.String(), errb.String()
}

// turn runs one turn of the keep agent with a shell script, and waits for
// its detached teardown.
func (e *env) turn(task, script string) (int, string, string) {
	code, out, errb := e.shrooms("run", "--task", task, "--agent", "keep", "--no-stdin", "--", "-c", script)
	e.settle(task)
	return code, out, errb
}

// settle waits (up to 30 s) until no process holds the task: a turn's
// cage is removed, and its HOME released, by a detached teardown after
// `run` has returned.
func (e *env) settle(task string) {
	e.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		code, out, _ := e.shrooms("--json", "status", "--task", task)
		if code != 0 || strings.Contains(out, `"busy":false`) {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// secrets are a task's kept state, unique per task: a Claude Code sign-in,
// an opencode API key and a Claude session transcript.
type secrets struct{ claude, opencode, session string }

const sessionPath = ".claude/projects/-work/0b8e3e2a-1f7c-4c5e-9d7a-5b0c1d2e3f40.jsonl"

func (e *env) plant(task string) secrets {
	e.t.Helper()
	s := secrets{claude: "cl-" + task, opencode: "oc-" + task, session: "session-of-" + task}
	code, out, stderr := e.turn(task, fmt.Sprintf(`set -e
mkdir -p ~/.claude/projects/-work ~/.local/share/opencode
printf '{"claudeAiOauth":{"accessToken":"%s"}}' > ~/.claude/.credentials.json
printf '{"anthropic":{"type":"api","key":"%s"}}' > ~/.local/share/opencode/auth.json
printf '{"message":{"content":"%s","role":"user"},"type":"user","uuid":"u1"}\n' > ~/%s
echo planted`, s.claude, s.opencode, s.session, sessionPath))
	assert.Equal(e.t, code, 0, "plant: %s %s", out, stderr)
	assert.Assert(e.t, strings.Contains(out, "planted"), out)
	return s
}

// kept runs a turn that prints the kept state and asserts every piece of
// it by content.
func (e *env) kept(task string, s secrets) {
	e.t.Helper()
	code, out, stderr := e.turn(task, "cat ~/.claude/.credentials.json ~/.local/share/opencode/auth.json ~/"+sessionPath)
	assert.Equal(e.t, code, 0, "kept-state turn: %s %s", out, stderr)
	for _, want := range []string{s.claude, s.opencode, s.session} {
		assert.Assert(e.t, strings.Contains(out, want), "kept state %q lost: %s", want, out)
	}
}

// attachments are the loop devices backed by this env's HOME images.
func (e *env) attachments() []homestore.Attachment {
	e.t.Helper()
	atts, err := homestore.Attachments(filepath.Join(e.state, "homes"))
	assert.NilError(e.t, err)
	return atts
}

// attachedAfter returns the number of this env's HOME loop devices once it
// stops falling (within 10 s): a mount namespace another process is making
// at that moment (a container runtime before its pivot_root) holds a copy
// of a HOME mount for a moment, and the device until it drops it.
func (e *env) attachedAfter() int {
	e.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		n := len(e.attachments())
		if n == 0 || time.Now().After(deadline) {
			return n
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// volumePath is the host directory of a task's HOME volume.
func (e *env) volumePath(task string) string {
	e.t.Helper()
	out, err := e.podman("volume", "inspect", "--format", "{{.Mountpoint}}", e.volume(task))
	assert.NilError(e.t, err, out)
	return strings.TrimSpace(out)
}

// podman runs the podman CLI against the env's service.
func (e *env) podman(args ...string) (string, error) {
	out, err := exec.Command("podman", append([]string{"--url", e.socket}, args...)...).CombinedOutput()
	return string(out), err
}

// mountHome mounts a task's HOME image on its volume as a turn does (for a
// fault that needs it mounted between turns).
func (e *env) mountHome(task string) string {
	e.t.Helper()
	mp := e.volumePath(task)
	_, err := homestore.Ensure(context.Background(), e.image(task), mp, homestore.Limits{Size: 64 << 20, Inodes: 4096})
	assert.NilError(e.t, err)
	return mp
}

// oneLine asserts a refusal is one line naming the command that fixes it.
func oneLine(t *testing.T, stderr, command string) {
	t.Helper()
	s := strings.TrimSpace(stderr)
	assert.Assert(t, !strings.Contains(s, "\n"), "refusal is not one line: %q", s)
	assert.Assert(t, strings.Contains(s, command), "refusal does not name %q: %q", command, s)
}

// service is a podman API service of the test's own, on its own socket, so
// stopping it disturbs no other test.
type service struct {
	t      *testing.T
	socket string
	// storage are podman's global options for a store of its own
	// (--root, --runroot), none for the host's.
	storage []string
	cmd     *exec.Cmd
}

func startService(t *testing.T, storage ...string) *service {
	t.Helper()
	itest.Require(t, itest.Root, itest.Podman)
	dir, err := os.MkdirTemp("/run", "shrooms-faults-")
	assert.NilError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	s := &service{t: t, socket: "unix://" + filepath.Join(dir, "podman.sock"), storage: storage}
	s.start()
	t.Cleanup(s.stop)
	return s
}

func (s *service) start() {
	s.t.Helper()
	path := strings.TrimPrefix(s.socket, "unix://")
	_ = os.Remove(path)
	// As scripts/podman-service.sh starts the shared one: a clean
	// environment, its own session.
	// The suites' runtime (SHROOMS_TEST_RUNTIME), as the shared service.
	c := exec.Command("podman", append(append(itest.ServiceArgs(), s.storage...), "system", "service", "--time=0", s.socket)...)
	c.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root", "LANG=C.UTF-8"}
	c.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	assert.NilError(s.t, c.Start())
	s.cmd = c
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if ping(path) == nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	s.t.Fatalf("own podman service on %s did not answer", s.socket)
}

func (s *service) stop() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = s.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = s.cmd.Process.Kill()
		<-done
	}
	s.cmd = nil
}

func ping(path string) error {
	c := http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", path)
		},
	}}
	resp, err := c.Get("http://d/_ping")
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s", resp.Status)
	}
	return nil
}

// secret reports whether the task's token secret exists.
func (e *env) secret(task string) bool {
	_, err := e.podman("secret", "inspect", "shrooms-"+task+"-tok")
	return err == nil
}
