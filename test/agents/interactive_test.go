package agents_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"gotest.tools/v3/assert"

	"github.com/shrooms-cage/shrooms/internal/itest"
	"github.com/shrooms-cage/shrooms/internal/modelapi"
)

// dialogs are texts of the dialogs an interactive Claude Code opens on a
// first start or a fresh HOME: the onboarding (theme), the first-run
// connectivity check, the workspace trust, the custom API key approval and
// the bypass-permissions warning.
var dialogs = []string{
	"Choose the text style", "Let's get started", "Unable to connect", "EAI_AGAIN",
	"trust this folder", "Do you trust", "Detected a custom API key", "Do you want to use this API key",
	"Bypass Permissions mode", "WARNING: Claude Code running in Bypass",
}

// screens records every screen a tmux pane showed while watched.
type screens struct {
	mu   sync.Mutex
	seen []string
}

func (s *screens) watch(tm *itest.Tmux, stop <-chan struct{}) {
	for {
		scr := tm.Screen()
		s.mu.Lock()
		if len(s.seen) == 0 || s.seen[len(s.seen)-1] != scr {
			s.seen = append(s.seen, scr)
		}
		s.mu.Unlock()
		select {
		case <-stop:
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// dialog returns the first dialog text any recorded screen showed.
func (s *screens) dialog() (string, string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, scr := range s.seen {
		for _, d := range dialogs {
			if strings.Contains(scr, d) {
				return d, scr
			}
		}
	}
	return "", ""
}

// TestInteractiveClaudeAsksNothing drives the real claude, interactive,
// under `shrooms run --tty` in a tmux server of the test's own, on a fresh
// task under policy none (the model only through the gateway, no DNS): no
// dialog ever shows (shrooms seeded the onboarding, the trust of /work and
// the approval of the gateway placeholder in ~/.claude.json; the managed
// settings accept the bypass warning), a typed prompt is answered through
// the gateway, and a second turn does the same. The positive control: the
// same claude in a bare `podman run -t` of the image with the same kind of
// key and no shrooms opens its first-start dialogs.
func TestInteractiveClaudeAsksNothing(t *testing.T) {
	e := newEnvWith(t, envOptions{gateway: true, policy: "none"})
	nonce := e.Prefix
	task := e.Task("claude")
	for turn := 1; turn <= 2; turn++ {
		tm := itest.NewTmux(t)
		answer := "interactive answer " + nonce + " " + string(rune('0'+turn))
		e.API.Append(modelapi.Text(answer))
		result := filepath.Join(e.Dir, "result.json")
		tm.Start(120, 40, nil, "nsenter", "--net="+e.TB.NSPath("host"), "--", e.Binary, "--config", e.Config,
			"run", "--tty", "--task", task, "--agent", "claude", "--worktree", e.Worktree, "--result-file", result)
		var sc screens
		stop := make(chan struct{})
		go sc.watch(tm, stop)
		// The prompt box is ready once its footer shows the mode.
		tm.WaitFor("bypass permissions on", 120*time.Second)
		tm.Type(true, "say the word "+nonce)
		time.Sleep(300 * time.Millisecond)
		tm.Type(false, "Enter")
		tm.WaitFor(answer, 90*time.Second)
		tm.Type(true, "/exit")
		time.Sleep(300 * time.Millisecond)
		tm.Type(false, "Enter")
		deadline := time.Now().Add(60 * time.Second)
		var res struct {
			Status   string `json:"status"`
			ExitCode int    `json:"exit_code"`
		}
		for {
			b, err := os.ReadFile(result)
			if err == nil && json.Unmarshal(b, &res) == nil && res.Status != "" && res.Status != "running" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("turn %d did not end after /exit; the screen:\n%s", turn, tm.Screen())
			}
			time.Sleep(200 * time.Millisecond)
		}
		close(stop)
		assert.Equal(t, res.Status, "exited", "turn %d", turn)
		assert.Equal(t, res.ExitCode, 0, "turn %d", turn)
		if d, scr := sc.dialog(); d != "" {
			t.Fatalf("turn %d: interactive Claude showed a dialog (%q):\n%s", turn, d, scr)
		}
		os.Remove(result)
	}
	// Every model request went through the gateway with the placeholder
	// swapped for the key.
	for _, r := range e.API.Requests() {
		assert.Equal(t, r.Header.Get("X-Api-Key"), apiKey)
	}

	// Positive control: the same binary, a fresh HOME, no shrooms.
	tm := itest.NewTmux(t)
	home := filepath.Join(e.Dir, "control-home")
	assert.NilError(t, os.MkdirAll(home, 0o755))
	assert.NilError(t, os.Chown(home, 1000, 1000))
	tm.Start(120, 40, nil, "podman", "--url", e.TB.PodmanURL, "run", "--rm", "-it", "--network", "host", "--user", "1000:1000",
		"--label", e.TB.Label(), "-v", home+":/home/agent", "-e", "HOME=/home/agent", "-w", "/tmp",
		"-e", "ANTHROPIC_BASE_URL="+e.APIURL, "-e", "ANTHROPIC_API_KEY=sk-ant-shrooms-placeholder-0123456789abcdef0123456789abcdef",
		agentImage, "claude", "--dangerously-skip-permissions")
	var sc screens
	stop := make(chan struct{})
	go sc.watch(tm, stop)
	deadline := time.Now().Add(120 * time.Second)
	for {
		if d, _ := sc.dialog(); d != "" {
			t.Logf("positive control: a bare run shows %q", d)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("positive control: no dialog in a bare run; the screen:\n%s", tm.Screen())
		}
		time.Sleep(200 * time.Millisecond)
	}
	close(stop)
}
