// Package faults_test breaks the host under shrooms on real podman — state
// drifted behind its back (HOME volume removed, image deleted while
// mounted), the podman service stopped, the cage or conmon killed, the
// host disk full, HOME full during the reset, the task lock file deleted,
// a reboot — and checks that no kept credential or session is lost (by
// content) and that the next turn works or refuses with the command that
// fixes it. It drives the shrooms binary, as a user would.
package faults_test

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"

	"github.com/shrooms-cage/shrooms/internal/itest"
	"github.com/shrooms-cage/shrooms/pkg/homestore"
	"github.com/shrooms-cage/shrooms/pkg/taskid"
)

func TestMain(m *testing.M) {
	code := itest.Main(m)
	itest.RemoveShroomsBinary()
	os.Exit(code)
}

// newEnv writes a config on the given podman socket (itest.Socket() for
// the shared service). The agent "keep" is a shell with the claude and
// opencode keep-lists, so its turns keep credentials and sessions. When
// the test ends it forgets every task: forget must leave no cage and no
// HOME loop device.
func newEnv(t *testing.T, socket, stateDir string) *itest.Env {
	t.Helper()
	itest.Require(t, itest.Root, itest.Podman)
	opts := []itest.Option{itest.WithSocket(socket), itest.WithForget()}
	if stateDir != "" {
		opts = append(opts, itest.WithStateDir(stateDir))
	}
	e := itest.New(t, "fl", opts...)
	token := filepath.Join(e.Dir, "token")
	e.WriteConfig(fmt.Sprintf(`
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
`, e.Socket, e.State, itest.TestImage, cmp.Or(itest.CageRuntime(), "default"), e.Prefix, e.Outbox, filepath.Join(e.Dir, "work"), token))
	assert.NilError(t, os.WriteFile(token, []byte("token-"+e.Prefix+"\n"), 0o600))
	e.Release = func(_ context.Context, task taskid.ID) error {
		if code, _, stderr := e.CLI("forget", "--task", task.String()); code != 0 {
			return fmt.Errorf("forget: exit %d: %s", code, stderr)
		}
		return nil
	}
	e.Finally(func() {
		if n := attachedAfter(e); n != 0 {
			t.Errorf("cleanup: %d loop device(s) of this test's HOMEs are left: %v", n, attachments(e))
		}
	})
	return e
}

func image(e *itest.Env, task string) string {
	return homestore.ImagePath(e.State, e.Volume(task))
}

// keepTurn runs one turn of the keep agent with a shell script, and waits for
// its detached teardown.
func keepTurn(e *itest.Env, task, script string) (int, string, string) {
	return e.Shrooms("run", "--task", task, "--agent", "keep", "--no-stdin", "--", "-c", script)
}

// secrets are a task's kept state, unique per task: a Claude Code sign-in,
// an opencode API key and a Claude session transcript.
type secrets struct{ claude, opencode, session string }

const sessionPath = ".claude/projects/-work/0b8e3e2a-1f7c-4c5e-9d7a-5b0c1d2e3f40.jsonl"

func plant(e *itest.Env, task string) secrets {
	e.T.Helper()
	s := secrets{claude: "cl-" + task, opencode: "oc-" + task, session: "session-of-" + task}
	code, out, stderr := keepTurn(e, task, fmt.Sprintf(`set -e
mkdir -p ~/.claude/projects/-work ~/.local/share/opencode
printf '{"claudeAiOauth":{"accessToken":"%s"}}' > ~/.claude/.credentials.json
printf '{"anthropic":{"type":"api","key":"%s"}}' > ~/.local/share/opencode/auth.json
printf '{"message":{"content":"%s","role":"user"},"type":"user","uuid":"u1"}\n' > ~/%s
echo planted`, s.claude, s.opencode, s.session, sessionPath))
	assert.Equal(e.T, code, 0, "plant: %s %s", out, stderr)
	assert.Assert(e.T, strings.Contains(out, "planted"), out)
	return s
}

// kept runs a turn that prints the kept state and asserts every piece of
// it by content.
func kept(e *itest.Env, task string, s secrets) {
	e.T.Helper()
	code, out, stderr := keepTurn(e, task, "cat ~/.claude/.credentials.json ~/.local/share/opencode/auth.json ~/"+sessionPath)
	assert.Equal(e.T, code, 0, "kept-state turn: %s %s", out, stderr)
	for _, want := range []string{s.claude, s.opencode, s.session} {
		assert.Assert(e.T, strings.Contains(out, want), "kept state %q lost: %s", want, out)
	}
}

// attachments are the loop devices backed by this env's HOME images.
func attachments(e *itest.Env) []homestore.Attachment {
	e.T.Helper()
	atts, err := homestore.Attachments(filepath.Join(e.State, "homes"))
	assert.NilError(e.T, err)
	return atts
}

// attachedAfter returns the number of this env's HOME loop devices once it
// stops falling (within 10 s): a mount namespace another process is making
// at that moment (a container runtime before its pivot_root) holds a copy
// of a HOME mount for a moment, and the device until it drops it.
func attachedAfter(e *itest.Env) int {
	e.T.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		n := len(attachments(e))
		if n == 0 || time.Now().After(deadline) {
			return n
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// volumePath is the host directory of a task's HOME volume.
func volumePath(e *itest.Env, task string) string {
	e.T.Helper()
	out, err := e.Podman("volume", "inspect", "--format", "{{.Mountpoint}}", e.Volume(task))
	assert.NilError(e.T, err, out)
	return strings.TrimSpace(out)
}

// podman runs the podman CLI against the env's service.
func podman(e *itest.Env, args ...string) (string, error) {
	out, err := exec.Command("podman", append([]string{"--url", e.Socket}, args...)...).CombinedOutput()
	return string(out), err
}

// mountHome mounts a task's HOME image on its volume as a turn does (for a
// fault that needs it mounted between turns).
func mountHome(e *itest.Env, task string) string {
	e.T.Helper()
	mp := volumePath(e, task)
	_, err := homestore.Ensure(context.Background(), image(e, task), mp, homestore.Limits{Size: 64 << 20, Inodes: 4096})
	assert.NilError(e.T, err)
	return mp
}

// oneLine asserts a refusal is one line naming the command that fixes it.
func oneLine(t *testing.T, stderr, command string) {
	t.Helper()
	s := strings.TrimSpace(stderr)
	assert.Assert(t, !strings.Contains(s, "\n"), "refusal is not one line: %q", s)
	assert.Assert(t, strings.Contains(s, command), "refusal does not name %q: %q", command, s)
}

// secret reports whether the task's token secret exists.
func secret(e *itest.Env, task string) bool {
	_, err := e.Podman("secret", "inspect", "shrooms-"+task+"-tok")
	return err == nil
}
