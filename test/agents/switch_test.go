package agents_test

import (
	"encoding/json"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/shrooms-cage/shrooms/internal/modelapi"
)

// TestAgentSwitchKeepsClaudeState: a shell turn on a Claude task keeps
// Claude's kept state (the task bootstrapped and used the claude profile),
// rebuilt and validated exactly as in a Claude turn: what the shell turn
// plants in ~/.claude.json is gone at the next reset, whatever that turn's
// agent, while Claude's session survives two shell turns and resumes (the
// real claude --resume, the model API sees the first turn's conversation).
func TestAgentSwitchKeepsClaudeState(t *testing.T) {
	e := newEnv(t)
	nonce := e.Prefix
	task := e.Task("claude")

	e.API.Append(modelapi.Text("first " + nonce))
	out, _ := runTurn(e, "claude", "-p", "--output-format", "json", "remember "+nonce)
	r1 := parseClaude(t, out)
	assert.Assert(t, !r1.IsError, out)

	shell := func(script string) (string, resetReport) {
		t.Helper()
		code, out, errb := e.CLI("--json", "run", "--task", task, "--agent", "sh", "--worktree", e.Worktree, "--no-stdin", "--", "-c", script)
		assert.Equal(t, code, 0, "shell turn: %s %s", out, errb)
		lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
		var res struct {
			Reset struct {
				resetReport
				Profiles     []string `json:"profiles"`
				KeptProfiles []string `json:"kept_profiles"`
			} `json:"reset"`
		}
		assert.NilError(t, json.Unmarshal([]byte(lines[len(lines)-1]), &res), out)
		assert.DeepEqual(t, res.Reset.Profiles, []string{"shell"})
		assert.DeepEqual(t, res.Reset.KeptProfiles, []string{"claude"})
		return strings.Join(lines[:len(lines)-1], "\n"), res.Reset.resetReport
	}
	// Shell turn 1: Claude's session is there; plant an MCP server (a
	// command Claude would run) in Claude's kept ~/.claude.json.
	got, _ := shell(`ls ~/.claude/projects/-work/; python3 -c 'import json,os; p=os.path.expanduser("~/.claude.json"); d=json.load(open(p)); d["mcpServers"]={"evil":{"command":"sh"}}; json.dump(d,open(p,"w"))' && grep -c evil ~/.claude.json`)
	assert.Check(t, is.Contains(got, r1.SessionID+".jsonl"), "the shell turn sees Claude's session")
	assert.Check(t, is.Contains(got, "\n1"), "positive control: the plant landed in ~/.claude.json: %s", got)
	// Shell turn 2: its reset rebuilt Claude's file (the plant dropped and
	// reported) and kept the session.
	got, rep := shell(`ls ~/.claude/projects/-work/; cat ~/.claude.json`)
	assert.Check(t, is.Contains(got, r1.SessionID+".jsonl"))
	assert.Check(t, !strings.Contains(got, "evil"), "the plant survived a shell turn's reset: %s", got)
	assert.Check(t, is.Contains(got, `"userID"`), "Claude's sign-in state is kept: %s", got)
	assert.Check(t, rep.has(".claude.json", "mcpServers", 0), "%+v", rep.Dropped)

	// Claude resumes the session.
	before := len(e.API.Scripted())
	e.API.Append(modelapi.Text("second " + nonce))
	out, _ = runTurn(e, "claude", "-p", "--output-format", "json", "--resume", r1.SessionID, "again "+nonce)
	r2 := parseClaude(t, out)
	assert.Assert(t, !r2.IsError, out)
	assert.Equal(t, r2.Result, "second "+nonce)
	reqs := requestsSince(e.API, before)
	assert.Assert(t, len(reqs) >= 1)
	body := string(reqs[len(reqs)-1].Body)
	assert.Check(t, is.Contains(body, "remember "+nonce), "the resumed request carries turn 1's prompt")
	assert.Check(t, is.Contains(body, "first "+nonce), "and turn 1's answer")
}
