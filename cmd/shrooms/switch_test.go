package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

// switchAgents has an agent with Claude's HOME profile (a shell in the test
// image: what it keeps is Claude's keep-list) beside the plain shell.
const switchAgents = "[agents.cl]\ncommand = [\"/bin/sh\"]\nhome = [\"claude\", \"shell\"]\n"

// TestAgentSwitchKeepsKeptState: a turn of another agent on a task keeps
// the kept state of every profile the task used (Claude's session and
// ~/.claude.json survive a shell turn), rebuilt as in its own agent's turn
// (a key the shell turn planted in ~/.claude.json is dropped and reported),
// and the reset report names the profiles kept for other agents.
func TestAgentSwitchKeepsKeptState(t *testing.T) {
	e, _ := integration(t, switchAgents)
	task := e.Task("switch")
	session := "0b7e8c3a-1d2f-4e5a-9b6c-7d8e9f0a1b2c"
	transcript := `{"type":"user","sessionId":"` + session + `","cwd":"/work","message":{"role":"user","content":"hi"},"uuid":"11111111-2222-4333-8444-555555555555","parentUuid":null,"timestamp":"2026-01-01T00:00:00Z"}`
	code, out, errb := e.Shrooms("--json", "run", "--task", task, "--agent", "cl", "--", "-c",
		`mkdir -p ~/.claude/projects/-work && echo '`+transcript+`' > ~/.claude/projects/-work/`+session+`.jsonl && echo '{"userID":"u1"}' > ~/.claude.json`)
	assert.Equal(t, code, 0, "%s %s", out, errb)

	type report struct {
		Profiles     []string `json:"profiles"`
		KeptProfiles []string `json:"kept_profiles"`
		Dropped      []struct {
			Path string `json:"path"`
			Item string `json:"item"`
		} `json:"dropped"`
	}
	shell := func(script string) (string, report) {
		t.Helper()
		code, out, errb := e.Shrooms("--json", "run", "--task", task, "--agent", "shell", "--", "-c", script)
		assert.Equal(t, code, 0, "%s %s", out, errb)
		lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
		var res struct {
			Reset report `json:"reset"`
		}
		assert.NilError(t, json.Unmarshal([]byte(lines[len(lines)-1]), &res), out)
		return strings.Join(lines[:len(lines)-1], "\n"), res.Reset
	}
	got, rep := shell(`ls ~/.claude/projects/-work/; cat ~/.claude.json; echo '{"userID":"u1","mcpServers":{"evil":{"command":"sh"}}}' > ~/.claude.json`)
	assert.DeepEqual(t, rep.Profiles, []string{"shell"})
	assert.DeepEqual(t, rep.KeptProfiles, []string{"claude"})
	assert.Check(t, is.Contains(got, session+".jsonl"), "the shell turn keeps Claude's session")
	assert.Check(t, is.Contains(got, `"userID": "u1"`), "and Claude's ~/.claude.json")
	assert.Check(t, !strings.Contains(got, "hasTrustDialogAccepted"), "a shell turn gets none of a Claude turn's seeds: %s", got)

	got, rep = shell(`cat ~/.claude.json`)
	assert.Check(t, !strings.Contains(got, "evil"), "what the shell turn planted in Claude's kept file survived: %s", got)
	found := false
	for _, d := range rep.Dropped {
		found = found || d.Path == ".claude.json" && d.Item == "mcpServers"
	}
	assert.Check(t, found, "the drop is reported: %+v", rep.Dropped)

	// The task's profiles are remembered; its own agent's turn still keeps.
	fact, err := os.ReadFile(filepath.Join(e.Dir, "state", "tasks", task, "fact-profiles"))
	assert.NilError(t, err)
	assert.Equal(t, string(fact), "claude,shell\n")
	code, out, errb = e.Shrooms("run", "--task", task, "--agent", "cl", "--", "-c", "ls ~/.claude/projects/-work/; cat ~/.claude.json")
	assert.Equal(t, code, 0, errb)
	assert.Check(t, is.Contains(out, session+".jsonl"))
	assert.Check(t, is.Contains(out, `"hasTrustDialogAccepted": true`), "a Claude turn's seeds: %s", out)
	assert.Check(t, is.Contains(out, `"hasCompletedOnboarding": true`))
}
