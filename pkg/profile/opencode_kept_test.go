package profile

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
)

// TestOpencodeKeptFileFields: one hostile value per field of auth.json and
// mcp-auth.json that docs/kept-state.md (## opencode) lists as able to name
// a path, a URL or a command; each is dropped (and named in the drops), and
// the credential next to it is kept.
func TestOpencodeKeptFileFields(t *testing.T) {
	env := &FilterEnv{mcpURLs: map[string]string{"docs": "https://docs.example/mcp"}}
	for _, tc := range []struct {
		name, in, drop string
		filter         func(map[string]any, *FilterEnv) (map[string]any, []FieldDrop)
		keep           string // a key path still there after the filter
	}{
		{"auth wellknown name", `{"https://evil.invalid/wk":{"type":"wellknown","key":"K","token":"t"},"a":{"type":"api","key":"k"}}`, badName, filterOpencodeAuth, "a.key"},
		{"auth wellknown entry", `{"wk":{"type":"wellknown","key":"K","token":"t"},"a":{"type":"api","key":"k"}}`, "wk", filterOpencodeAuth, "a.key"},
		{"auth enterpriseUrl", `{"gl":{"type":"oauth","refresh":"r","access":"a","expires":0,"enterpriseUrl":"gitlab.evil.invalid"}}`, "gl.enterpriseUrl", filterOpencodeAuth, "gl.access"},
		{"auth URL-named key", `{"a":{"type":"api","key":"k","baseURL":"/outbox/x"}}`, "a.baseURL", filterOpencodeAuth, "a.key"},
		{"auth unknown key", `{"a":{"type":"api","key":"k","command":["sh","-c","touch /x"]}}`, "a.command", filterOpencodeAuth, "a.key"},
		{"auth URL value", `{"o":{"type":"oauth","refresh":"r","access":"a","expires":0,"accountId":"http://evil.invalid"}}`, "o.accountId", filterOpencodeAuth, "o.refresh"},
		{"mcp serverUrl not the owner's", `{"docs":{"tokens":{"accessToken":"a"},"serverUrl":"http://203.0.113.10/mcp"}}`, "docs.serverUrl", filterMcpAuth, "docs.tokens.accessToken"},
		{"mcp codeVerifier", `{"docs":{"tokens":{"accessToken":"a"},"codeVerifier":"v"}}`, "docs.codeVerifier", filterMcpAuth, "docs.tokens.accessToken"},
		{"mcp oauthState", `{"docs":{"tokens":{"accessToken":"a"},"oauthState":"s"}}`, "docs.oauthState", filterMcpAuth, "docs.tokens.accessToken"},
		{"mcp redirect URI", `{"docs":{"tokens":{"accessToken":"a"},"clientInfo":{"clientId":"c","redirectUris":["http://evil.invalid"]}}}`, "docs.clientInfo.redirectUris", filterMcpAuth, "docs.clientInfo.clientId"},
		{"mcp URL in a token field", `{"docs":{"tokens":{"accessToken":"a","scope":"https://evil.invalid"}}}`, "docs.tokens.scope", filterMcpAuth, "docs.tokens.accessToken"},
		{"mcp server name", `{"../x":{"tokens":{"accessToken":"a"}},"docs":{"tokens":{"accessToken":"b"}}}`, badName, filterMcpAuth, "docs.tokens.accessToken"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, drops := tc.filter(decode(t, tc.in), env)
			assert.Assert(t, slices.Contains(dropKeys(drops), tc.drop), "%s not dropped: %v", tc.drop, dropKeys(drops))
			var v any = out
			for _, k := range strings.Split(tc.keep, ".") {
				m, _ := v.(map[string]any)
				v = m[k]
			}
			assert.Assert(t, v != nil, "%s was not kept", tc.keep)
			b, _ := json.Marshal(out)
			for _, bad := range []string{"evil", "outbox", "203.0.113", "touch"} {
				assert.Assert(t, !strings.Contains(string(b), bad), "kept: %s", b)
			}
		})
	}
}
