package homereset

import (
	"context"
	"encoding/json"
	"maps"
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

func dropKeys(d []fieldDrop) []string {
	var out []string
	for _, x := range d {
		out = append(out, x.key)
	}
	slices.Sort(out)
	return out
}

func TestFilterOpencodeAuth(t *testing.T) {
	in := decode(t, `{
		"anthropic": {"type":"api","key":"sk-1","metadata":{"baseURL":"http://evil.invalid"}},
		"github-copilot": {"type":"oauth","refresh":"r","access":"a","expires":0,"enterpriseUrl":"ghe.evil.invalid"},
		"gitlab": {"type":"oauth","refresh":"r","access":"a","expires":1,"accountId":"https://evil.invalid"},
		"openai": {"type":"oauth","refresh":"r","access":"a","expires":1,"accountId":"acc-1","endpoint":"x"},
		"https://evil.invalid": {"type":"api","key":"k"},
		"wk": {"type":"wellknown","key":"K","token":"t"},
		"broken": {"type":"oauth","refresh":"r"},
		"str": "x"
	}`)
	out, dropped := filterOpencodeAuth(in, nil)
	b, _ := json.Marshal(out)
	assert.Equal(t, string(b), `{"anthropic":{"key":"sk-1","type":"api"},"github-copilot":{"access":"a","expires":0,"refresh":"r","type":"oauth"},`+
		`"gitlab":{"access":"a","expires":1,"refresh":"r","type":"oauth"},"openai":{"access":"a","accountId":"acc-1","expires":1,"refresh":"r","type":"oauth"}}`)
	assert.DeepEqual(t, dropKeys(dropped), []string{badName, "anthropic.metadata", "broken", "github-copilot.enterpriseUrl",
		"gitlab.accountId", "openai.endpoint", "str", "wk"})
	for _, d := range dropped {
		if d.key == "github-copilot.enterpriseUrl" || d.key == "gitlab.accountId" {
			assert.Equal(t, d.reason, "URL-bearing")
		}
	}
}

func TestFilterClaudeCredentials(t *testing.T) {
	in := decode(t, `{
		"claudeAiOauth": {"accessToken":"at","refreshToken":"rt","expiresAt":17,"scopes":["user:inference","user:profile"],
			"subscriptionType":"max","rateLimitTier":null,"baseUrl":"http://evil.invalid","extra":{"x":1}},
		"mcpOAuth": {"srv": {"serverUrl":"http://evil.invalid","accessToken":"x"}},
		"enterpriseGateway": {"url":"http://evil.invalid"},
		"organizationUuid": "o"
	}`)
	out, dropped := filterClaudeCredentials(in, nil)
	b, _ := json.Marshal(out)
	assert.Equal(t, string(b), `{"claudeAiOauth":{"accessToken":"at","expiresAt":17,"rateLimitTier":null,"refreshToken":"rt","scopes":["user:inference","user:profile"],"subscriptionType":"max"}}`)
	assert.DeepEqual(t, dropKeys(dropped), []string{"claudeAiOauth.baseUrl", "claudeAiOauth.extra", "enterpriseGateway", "mcpOAuth", "organizationUuid"})

	// Wrong types drop the field; a missing access token drops the slot.
	out, dropped = filterClaudeCredentials(decode(t, `{"claudeAiOauth":{"accessToken":1,"scopes":"all"}}`), nil)
	assert.Equal(t, len(out), 0)
	assert.DeepEqual(t, dropKeys(dropped), []string{"claudeAiOauth", "claudeAiOauth.accessToken", "claudeAiOauth.scopes"})
}

func TestFilterMcpAuth(t *testing.T) {
	env := &filterEnv{mcpURLs: map[string]string{"docs": "https://docs.example/mcp"}}
	in := decode(t, `{
		"docs": {"tokens":{"accessToken":"a","refreshToken":"r","expiresAt":5,"scope":"read"},
			"clientInfo":{"clientId":"c","clientSecret":"s","redirectUri":"http://evil.invalid"},
			"serverUrl":"https://docs.example/mcp","codeVerifier":"v","oauthState":"st"},
		"other": {"tokens":{"accessToken":"a"},"serverUrl":"https://evil.invalid/mcp"},
		"bad": {"tokens":"x"}
	}`)
	out, dropped := filterMcpAuth(in, env)
	b, _ := json.Marshal(out)
	assert.Equal(t, string(b), `{"bad":{},"docs":{"clientInfo":{"clientId":"c","clientSecret":"s"},"serverUrl":"https://docs.example/mcp",`+
		`"tokens":{"accessToken":"a","expiresAt":5,"refreshToken":"r","scope":"read"}},"other":{"tokens":{"accessToken":"a"}}}`)
	assert.DeepEqual(t, dropKeys(dropped), []string{"bad.tokens", "docs.clientInfo.redirectUri", "docs.codeVerifier", "docs.oauthState", "other.serverUrl"})
}

// checkFiltered is the property every filter keeps, whatever the input: the
// output carries no URL-looking string anywhere, only keys from the
// allowlists, and filtering it again changes nothing and drops nothing.
func checkFiltered(t *testing.T, data []byte, f func(map[string]any, *filterEnv) (map[string]any, []fieldDrop), keys []string) {
	d := json.NewDecoder(strings.NewReader(string(data)))
	d.UseNumber()
	var in map[string]any
	if d.Decode(&in) != nil || in == nil {
		return
	}
	env := &filterEnv{mcpURLs: map[string]string{"srv": "https://ok.example/mcp"}}
	out, _ := f(in, env)
	b, err := json.Marshal(out)
	assert.NilError(t, err)
	var walk func(v any, top bool)
	walk = func(v any, top bool) {
		switch x := v.(type) {
		case map[string]any:
			for k, e := range x {
				assert.Assert(t, top || slices.Contains(keys, k), "key %q is not on the allowlist: %s", k, b)
				walk(e, false)
			}
		case []any:
			for _, e := range x {
				walk(e, false)
			}
		case string:
			assert.Assert(t, !strings.Contains(x, "://") || x == "https://ok.example/mcp", "URL kept: %s", b)
		}
	}
	walk(out, true)
	again, dropped := f(out, env)
	assert.Equal(t, len(dropped), 0, "a rebuilt file is not a fixed point: %v", dropped)
	b2, _ := json.Marshal(again)
	assert.Equal(t, string(b2), string(b))
}

func FuzzFilterOpencodeAuth(f *testing.F) {
	f.Add([]byte(`{"anthropic":{"type":"api","key":"sk"},"x":{"type":"oauth","refresh":"r","access":"a","expires":1,"enterpriseUrl":"h"}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		checkFiltered(t, data, filterOpencodeAuth, []string{"type", "key", "refresh", "access", "expires", "accountId"})
	})
}

func FuzzFilterClaudeCredentials(f *testing.F) {
	f.Add([]byte(`{"claudeAiOauth":{"accessToken":"a","scopes":["x"]},"mcpOAuth":{}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		checkFiltered(t, data, filterClaudeCredentials, []string{"claudeAiOauth", "accessToken", "refreshToken", "expiresAt", "scopes", "subscriptionType", "rateLimitTier"})
	})
}

func FuzzFilterMcpAuth(f *testing.F) {
	f.Add([]byte(`{"srv":{"tokens":{"accessToken":"a"},"serverUrl":"https://ok.example/mcp"},"x":{"serverUrl":"http://evil"}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		checkFiltered(t, data, filterMcpAuth, []string{"tokens", "clientInfo", "serverUrl", "accessToken", "refreshToken", "expiresAt",
			"scope", "clientId", "clientSecret", "clientIdIssuedAt", "clientSecretExpiresAt"})
	})
}

func FuzzFilterClaudeJSON(f *testing.F) {
	f.Add([]byte(`{"userID":"u","mcpServers":{"x":{}},"projects":{"/w":{"lastSessionId":"s","mcpServers":{}}}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		d := json.NewDecoder(strings.NewReader(string(data)))
		d.UseNumber()
		var in map[string]any
		if d.Decode(&in) != nil || in == nil {
			return
		}
		out, _ := filterClaudeJSON(in, nil)
		for k := range out {
			_, forced := claudeForced[k]
			assert.Assert(t, claudeKeep[k] != "" || forced || k == "projects" || strings.HasSuffix(k, "MigrationComplete"), "key %q kept", k)
		}
		if p, ok := out["projects"].(map[string]any); ok {
			for _, v := range p {
				for _, k := range slices.Collect(maps.Keys(v.(map[string]any))) {
					assert.Assert(t, strings.HasPrefix(k, "last") || k == "projectOnboardingSeenCount", "project key %q kept", k)
				}
			}
		}
	})
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
	task.Config.Home.Opencode.Settings = map[string]any{"mcp": map[string]any{
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
