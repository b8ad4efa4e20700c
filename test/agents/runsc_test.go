//go:build runsc

package agents_test

import (
	"os"
	"strings"
	"testing"

	"gotest.tools/v3/assert"

	"github.com/shrooms-cage/shrooms/internal/itest"
	"github.com/shrooms-cage/shrooms/internal/modelapi"
)

// runscOptions run the environment's cages under the static upstream runsc
// make setup builds (SHROOMS_TEST_RUNSC), with shrooms' runsc profile
// (docs/gvisor.md).
func runscOptions(t *testing.T, o envOptions) envOptions {
	t.Helper()
	runsc := os.Getenv("SHROOMS_TEST_RUNSC")
	if runsc == "" {
		t.Fatal("SHROOMS_TEST_RUNSC is unset: name a static upstream runsc (make setup builds one; docs/gvisor.md)")
	}
	o.runtime = runsc
	o.service = []string{"--runtime", runsc, "--runtime-flag", "platform=systrap", "--runtime-flag", "oci-seccomp", "--runtime-flag", "network=host"}
	return o
}

// TestRunscClaudeThroughGateway: real Claude Code (Node: io_uring, clone3)
// runs one turn under gVisor through the model gateway on the cage's
// loopback, under policy none, with a real Bash tool call; the upstream sees the real key,
// the cage only the placeholder; run --json names the runtime and its
// pinned version.
func TestRunscClaudeThroughGateway(t *testing.T) {
	itest.Require(t, itest.Root, itest.Podman, itest.Nftables, itest.Netns)
	// Policy none: a cage that reaches its model and nothing else (the
	// gateway sets the netns's lo up, which podman leaves down for runsc).
	e := newEnvWith(t, runscOptions(t, envOptions{gateway: true, policy: "none"}))
	nonce := e.Prefix
	e.API.Append(bash(`echo "$(uname -r) $(echo $ANTHROPIC_API_KEY | cut -c1-27)" > /work/.runsc`), modelapi.Text("ran "+nonce))
	code, out, errb := e.CLI("--json", "run", "--task", e.Task("claude"), "--agent", "claude", "--worktree", e.Worktree, "--no-stdin", "--",
		"-p", "--output-format", "json", "hello "+nonce)
	assert.Equal(t, code, 0, "%s %s\n%s", out, errb, e.API.Log())
	r := parseClaude(t, out)
	assert.Assert(t, !r.IsError, out)
	assert.Equal(t, r.Result, "ran "+nonce)
	b, err := os.ReadFile(e.Worktree + "/.runsc")
	assert.NilError(t, err)
	assert.Assert(t, strings.Contains(string(b), "gvisor") && strings.HasSuffix(string(b), " sk-ant-shrooms-placeholder-\n"), "%q", b)
	for _, req := range e.API.Requests() {
		assert.Equal(t, req.Header.Get("X-Api-Key"), apiKey)
	}
	var prov struct {
		Runtime        string `json:"runtime"`
		RuntimeVersion string `json:"runtime_version"`
	}
	lastJSON(t, out, &prov)
	assert.Equal(t, prov.Runtime, os.Getenv("SHROOMS_TEST_RUNSC"))
	assert.Assert(t, strings.HasPrefix(prov.RuntimeVersion, "runsc version v0.0.0-"), "%+v", prov)
}

// TestRunscOpencodeThroughGateway: real opencode (Bun) runs a turn under
// gVisor through the gateway, streaming, with a real tool call; the
// upstream sees the real key.
func TestRunscOpencodeThroughGateway(t *testing.T) {
	itest.Require(t, itest.Root, itest.Podman, itest.Nftables, itest.Netns)
	e := newEnvWith(t, runscOptions(t, envOptions{gateway: true, policy: "internet"}))
	nonce := e.Prefix
	e.API.Append(ocBash(`echo "$(uname -r) $(echo $ANTHROPIC_API_KEY | cut -c1-27)" > /work/.ocrunsc`), modelapi.Text("done "+nonce))
	code, out, errb := e.CLI("--json", "run", "--task", e.Task("opencode"), "--agent", "opencode", "--worktree", e.Worktree, "--no-stdin", "--",
		"--format", "json", "hello "+nonce)
	assert.Equal(t, code, 0, "%s %s\n%s", out, errb, e.API.Log())
	assert.Equal(t, e.API.Remaining(), 0, e.API.Log())
	b, err := os.ReadFile(e.Worktree + "/.ocrunsc")
	assert.NilError(t, err)
	assert.Assert(t, strings.Contains(string(b), "gvisor") && strings.HasSuffix(string(b), " sk-ant-shrooms-placeholder-\n"), "%q", b)
	for _, r := range e.API.Scripted() {
		assert.Equal(t, r.Header.Get("X-Api-Key"), apiKey)
	}
}
