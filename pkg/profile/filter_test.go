package profile

import (
	"encoding/json"
	"maps"
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

func dropKeys(d []FieldDrop) []string {
	var out []string
	for _, x := range d {
		out = append(out, x.Key)
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
		if d.Key == "github-copilot.enterpriseUrl" || d.Key == "gitlab.accountId" {
			assert.Equal(t, d.Reason, "URL-bearing")
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
	env := &FilterEnv{mcpURLs: map[string]string{"docs": "https://docs.example/mcp"}}
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
func checkFiltered(t *testing.T, data []byte, f func(map[string]any, *FilterEnv) (map[string]any, []FieldDrop), keys []string) {
	d := json.NewDecoder(strings.NewReader(string(data)))
	d.UseNumber()
	var in map[string]any
	if d.Decode(&in) != nil || in == nil {
		return
	}
	env := &FilterEnv{mcpURLs: map[string]string{"srv": "https://ok.example/mcp"}}
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
