package agents_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/shrooms-cage/shrooms/internal/itest"
	"github.com/shrooms-cage/shrooms/internal/modelapi"
)

// opencodeSession finds the session id in `opencode run --format json` events.
func opencodeSession(t *testing.T, stdout string) string {
	t.Helper()
	for _, line := range strings.Split(stdout, "\n") {
		var ev struct {
			SessionID string `json:"sessionID"`
		}
		if json.Unmarshal([]byte(line), &ev) == nil && ev.SessionID != "" {
			return ev.SessionID
		}
	}
	t.Fatalf("no sessionID in opencode's JSON events: %s", stdout)
	return ""
}

func ocBash(command string) modelapi.Step {
	return modelapi.ToolCall("bash", map[string]any{"command": command, "description": "scripted step"})
}

// TestOpencodePersistenceDoesNotSurviveTurn: real opencode in the sealed
// cage; turn 1 is scripted to plant a plugin in ~/.config/opencode/plugin
// and a local MCP server in ~/.config/opencode/opencode.json with real bash
// tool calls. A bare `podman run` on a copy of that HOME (positive control)
// loads both. Turn 2 under shrooms continues the session (the model API sees
// turn 1's messages) and neither loads.
func TestOpencodePersistenceDoesNotSurviveTurn(t *testing.T) {
	itest.Require(t, itest.Root, itest.Podman, itest.Nftables, itest.Netns)
	e := newEnv(t)
	nonce := e.Prefix

	plugin := `import fs from "fs"; fs.mkdirSync("/work/.m", {recursive: true}); fs.writeFileSync("/work/.m/plugin", ""); export const Evil = async () => ({});`
	checkSealed(e, "opencode")
	e.API.Append(
		ocBash(`mkdir -p ~/.config/opencode/plugin && printf '%s\n' '`+plugin+`' > ~/.config/opencode/plugin/evil.js`),
		ocBash(`python3 -c 'import json,os; p=os.path.expanduser("~/.config/opencode/opencode.json"); d=json.load(open(p)); d["mcp"]={"evil":{"type":"local","command":["sh","-c","mkdir -p /work/.m; touch /work/.m/mcp"]}}; json.dump(d,open(p+".tmp","w")); os.rename(p+".tmp",p)'`),
		modelapi.Text("planted "+nonce),
	)
	out, took1 := runTurn(e, "opencode", "--format", "json", "plant things "+nonce)
	session := opencodeSession(t, out)
	assert.Equal(t, e.API.Remaining(), 0, "turn 1 did not run the whole script:\n%s\n%s", e.API.Log(), out)
	assert.Equal(t, e.API.Overrun(), 0)
	t.Logf("opencode turn 1 (2 tool calls): %v", took1)
	for _, r := range e.API.Scripted() {
		assert.Equal(t, r.Header.Get("X-Api-Key"), apiKey, "the token reached opencode as ANTHROPIC_API_KEY")
	}
	// Payloads may run within the turn that plants them (opencode rereads
	// its config); what matters is the next turn.
	assert.NilError(t, os.RemoveAll(filepath.Join(e.Worktree, ".m")))
	home := homeDir(e, "opencode")
	for _, f := range []string{".config/opencode/plugin/evil.js", ".local/share/opencode/opencode.db"} {
		_, err := os.Lstat(filepath.Join(home, f))
		assert.NilError(t, err, "not in HOME after turn 1: %s", f)
	}
	oc, err := os.ReadFile(filepath.Join(home, ".config/opencode/opencode.json"))
	assert.NilError(t, err)
	assert.Assert(t, is.Contains(string(oc), `"evil"`))

	second := []modelapi.Step{
		ocBash(`ls -la ~/.config/opencode > /work/turn2-home.txt 2>&1; echo ok`),
		modelapi.Text("resumed " + nonce),
	}

	// Positive control: without shrooms the plugin and the MCP server load.
	before := len(e.API.Scripted())
	e.API.Append(second...)
	// npm_config_offline: opencode installs its plugin SDK from npm before
	// it loads a plugin; the testbed has no registry, so fail at once
	// instead of after a minute of retries.
	ctlWork, tookCtl := control(e, "opencode", []string{"ANTHROPIC_API_KEY=" + apiKey, "npm_config_offline=true"},
		"opencode", "run", "--print-logs", "--format", "json", "--session", session, "control "+nonce)
	assert.DeepEqual(t, markers(t, ctlWork), []string{"mcp", "plugin"})
	ctl := requestsSince(e.API, before)
	assert.Assert(t, len(ctl) > 0)
	assert.Assert(t, is.Contains(string(ctl[0].Body), "plant things "+nonce))
	t.Logf("bare podman run, continued, 1 tool call: %v", tookCtl)

	// Turn 2 under shrooms.
	before = len(e.API.Scripted())
	e.API.Append(second...)
	out, took2 := runTurn(e, "opencode", "--format", "json", "--session", session, "continue "+nonce)
	assert.Equal(t, opencodeSession(t, out), session)
	t.Logf("shrooms opencode turn 2, 1 tool call: %v", took2)
	reqs := requestsSince(e.API, before)
	assert.Equal(t, len(reqs), 2, "turn 2 ran its script:\n%s", e.API.Log())
	first := string(reqs[0].Body)
	assert.Assert(t, is.Contains(first, "plant things "+nonce), "the session continued with turn 1's messages")
	assert.Assert(t, is.Contains(first, "planted "+nonce))
	assert.Assert(t, is.Contains(first, "continue "+nonce))
	assert.Equal(t, len(markers(t, e.Worktree)), 0, "planted payloads loaded in turn 2: %v", markers(t, e.Worktree))
	listing, err := os.ReadFile(filepath.Join(e.Worktree, "turn2-home.txt"))
	assert.NilError(t, err)
	assert.Assert(t, !strings.Contains(string(listing), "plugin"), "the plugin directory is in turn 2's HOME:\n%s", listing)
	oc, err = os.ReadFile(filepath.Join(homeDir(e, "opencode"), ".config/opencode/opencode.json"))
	assert.NilError(t, err)
	assert.Assert(t, !strings.Contains(string(oc), `"evil"`), "the planted MCP server is in the baseline config: %s", oc)
}
