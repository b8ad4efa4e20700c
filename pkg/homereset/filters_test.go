package homereset

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
)

func decode(t testing.TB, s string) map[string]any {
	t.Helper()
	d := json.NewDecoder(strings.NewReader(s))
	d.UseNumber()
	var m map[string]any
	assert.NilError(t, d.Decode(&m))
	return m
}

// TestTranscriptGlobsSkipMemory: the transcript keep-list matches session
// files only; Claude's auto memory (projects/<p>/memory/**, and any
// "memory" directory) and names of the wrong shape never survive, nor do
// extra credential slots.
func TestTranscriptGlobsSkipMemory(t *testing.T) {
	task := newTask(t, "claude", "shell")
	ctx := context.Background()
	_, err := Bootstrap(ctx, task)
	assert.NilError(t, err)
	home := HomeDir(task.Root)
	p := ".claude/projects/-work/"
	keep := []string{
		p + sid + ".jsonl",
		p + sid + "/subagents/agent-a1b2c3d4e5f60718.jsonl",
		p + sid + "/tool-results/toolu_01.txt",
		p + sid + "/tool-results/toolu_02.json",
		".claude/history.jsonl",
	}
	drop := []string{
		p + "memory/MEMORY.md",
		p + "memory/subagents/agent-x.jsonl",
		p + "memory/tool-results/x.txt",
		p + "memory/" + sid + ".jsonl",
		p + sid + "/memory/agent-x.jsonl",
		p + sid + "/subagents/memory/agent-x.jsonl",
		p + sid + "/subagents/notes.md",
		p + sid + "/subagents/agent-a1b2c3d4e5f60718.meta.json",
		p + sid + "/tool-results/x.md",
		p + sid + "/CLAUDE.md",
		p + "not-a-session/subagents/agent-x.jsonl",
		p + "not-a-session.jsonl",
		p + strings.ToUpper(sid) + ".jsonl",
		".claude/file-history/" + sid + "/3f2a9c1e0b7d4a65@v2",
		".claude/file-history/x/evil@v1",
		".claude/file-history/" + sid + "/evil.sh",
	}
	for _, rel := range append(append([]string{}, keep...), drop...) {
		write(t, filepath.Join(home, rel), "{}\n")
	}
	write(t, filepath.Join(home, ".claude/.credentials.json"), `{"claudeAiOauth":{"accessToken":"at","refreshToken":"rt","expiresAt":1,"scopes":["user:inference"]},"mcpOAuth":{"s":{"serverUrl":"http://evil.invalid"}},"enterpriseGateway":{"url":"http://evil.invalid"}}`)
	rep, err := Reset(ctx, ResetInput{Task: task})
	assert.NilError(t, err)
	got := files(t, filepath.Join(home, ".claude"))
	for _, rel := range keep {
		assert.Assert(t, slices.Contains(got, strings.TrimPrefix(rel, ".claude/")), "%s was not kept: %v", rel, got)
	}
	for _, rel := range drop {
		assert.Assert(t, !slices.Contains(got, strings.TrimPrefix(rel, ".claude/")), "%s was kept", rel)
	}
	cred, err := os.ReadFile(filepath.Join(home, ".claude/.credentials.json"))
	assert.NilError(t, err)
	assert.Assert(t, !strings.Contains(string(cred), "evil") && strings.Contains(string(cred), `"accessToken": "at"`), string(cred))
	var items []string
	for _, d := range rep.Dropped {
		if d.Path == ".claude/.credentials.json" {
			items = append(items, d.Item+": "+d.Reason)
		}
	}
	slices.Sort(items)
	assert.DeepEqual(t, items, []string{"enterpriseGateway: only the claudeAiOauth sign-in is kept", "mcpOAuth: only the claudeAiOauth sign-in is kept"})
}

// TestMcpAuthKeepsOwnerServerURL: through a real reset, mcp-auth.json keeps
// a server's serverUrl only when the owner's baseline opencode config gives
// that server exactly that URL (opencode uses a token only for its bound
// URL); a planted URL goes, and the report says why.
func TestMcpAuthKeepsOwnerServerURL(t *testing.T) {
	task := newTask(t, "opencode", "shell")
	task.Config.Home.Profile("opencode").Settings = map[string]any{"mcp": map[string]any{
		"docs": map[string]any{"type": "remote", "url": "https://docs.example/mcp"}}}
	ctx := context.Background()
	_, err := Bootstrap(ctx, task)
	assert.NilError(t, err)
	home := HomeDir(task.Root)
	write(t, filepath.Join(home, ".local/share/opencode/mcp-auth.json"), `{
		"docs": {"tokens": {"accessToken": "a"}, "serverUrl": "https://docs.example/mcp"},
		"evil": {"tokens": {"accessToken": "b"}, "serverUrl": "https://evil.invalid/mcp", "codeVerifier": "v"}}`)
	rep, err := Reset(ctx, ResetInput{Task: task})
	assert.NilError(t, err)
	data, err := os.ReadFile(filepath.Join(home, ".local/share/opencode/mcp-auth.json"))
	assert.NilError(t, err)
	got := decode(t, string(data))
	assert.Equal(t, got["docs"].(map[string]any)["serverUrl"], "https://docs.example/mcp")
	assert.Assert(t, !strings.Contains(string(data), "evil.invalid"), string(data))
	var items []string
	for _, d := range rep.Dropped {
		if d.Path == ".local/share/opencode/mcp-auth.json" {
			items = append(items, d.Item)
		}
	}
	slices.Sort(items)
	assert.DeepEqual(t, items, []string{"evil.codeVerifier", "evil.serverUrl"})
}
