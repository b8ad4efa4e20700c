package gateway

import (
	"bytes"
	"compress/flate"
	"compress/gzip"
	"compress/zlib"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

// compressingUpstream answers every request with a Messages answer of
// outTokens output tokens, compressed with enc whatever the request's
// Accept-Encoding says (honor: only when the request accepts it). It
// records the Accept-Encoding and body of each request.
type compressingUpstream struct {
	enc       string
	honor     bool
	outTokens int
	mu        sync.Mutex
	accept    []string
	bodies    [][]byte
}

func (u *compressingUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	u.mu.Lock()
	u.accept = append(u.accept, r.Header.Get("Accept-Encoding"))
	u.bodies = append(u.bodies, body)
	u.mu.Unlock()
	stream := bytes.Contains(body, []byte(`"stream":true`))
	var plain string
	if stream {
		w.Header().Set("Content-Type", "text/event-stream")
		plain = fmt.Sprintf("event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"model\":\"m\",\"usage\":{\"input_tokens\":7,\"output_tokens\":1}}}\n\n"+
			"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"%s\"}}\n\n"+
			"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":%d}}\n\n"+
			"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n", strings.Repeat("word ", u.outTokens), u.outTokens)
	} else {
		w.Header().Set("Content-Type", "application/json")
		plain = fmt.Sprintf(`{"type":"message","model":"m","content":[{"type":"text","text":"%s"}],"usage":{"input_tokens":7,"output_tokens":%d}}`, strings.Repeat("word ", u.outTokens), u.outTokens)
	}
	enc := u.enc
	if u.honor && !strings.Contains(r.Header.Get("Accept-Encoding"), enc) {
		enc = ""
	}
	var out bytes.Buffer
	var zw io.WriteCloser
	switch enc {
	case "gzip":
		zw = gzip.NewWriter(&out)
	case "deflate":
		zw = zlib.NewWriter(&out)
	case "deflate-raw":
		zw, _ = flate.NewWriter(&out, flate.DefaultCompression)
		enc = "deflate"
	case "":
		out.WriteString(plain)
	default: // br, zstd: bytes the gateway cannot read
		out.WriteString("\x1b\x00\xf8\xff not really " + enc)
	}
	if zw != nil {
		_, _ = zw.Write([]byte(plain))
		_ = zw.Close()
	}
	if enc != "" {
		w.Header().Set("Content-Encoding", enc)
	}
	_, _ = w.Write(out.Bytes())
}

// clientPost is a request as Claude Code sends it: it accepts every
// encoding it can decode.
func clientPost(t *testing.T, url, key, body string, hdr map[string]string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url+"/v1/messages", strings.NewReader(body))
	assert.NilError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Api-Key", key)
	req.Header.Set("Accept-Encoding", "gzip, deflate, br, zstd")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	// A transport that leaves the body as sent: the test sees what the
	// agent would have to decode.
	resp, err := (&http.Transport{DisableCompression: true}).RoundTrip(req)
	assert.NilError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	assert.NilError(t, err)
	return resp, b
}

func upstreamServer(t *testing.T, h http.Handler) string {
	t.Helper()
	s := httptest.NewServer(h)
	t.Cleanup(s.Close)
	return s.URL
}

// TestCompressedAnswersAreCounted: the client accepts gzip, deflate, br and
// zstd; the upstream compresses whatever it is asked. The gateway asks for
// identity and decodes what still comes compressed, so a 5000-token answer
// counts 5000 and max_output_tokens = 100 refuses the next request.
func TestCompressedAnswersAreCounted(t *testing.T) {
	for _, enc := range []string{"gzip", "deflate", "deflate-raw"} {
		for _, stream := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/stream=%t", enc, stream), func(t *testing.T) {
				up := &compressingUpstream{enc: enc, outTokens: 5000}
				upURL := upstreamServer(t, up)
				body := fmt.Sprintf(`{"model":"m","max_tokens":10,"stream":%t,"messages":[{"role":"user","content":"hi"}]}`, stream)

				// Positive control: asked directly, the upstream answers compressed.
				resp, raw := clientPost(t, upURL, realKey, body, nil)
				assert.Equal(t, resp.StatusCode, 200)
				assert.Assert(t, resp.Header.Get("Content-Encoding") != "", "the upstream compresses")
				assert.Assert(t, !bytes.Contains(raw, []byte(`"output_tokens"`)), "the compressed answer hides its usage")

				g, gw, ph := start(t, upURL, func(c *Config) { c.MaxOutputTokens = 100 })
				resp, b := clientPost(t, gw, ph, body, nil)
				assert.Equal(t, resp.StatusCode, 200, string(b))
				assert.Equal(t, resp.Header.Get("Content-Encoding"), "", "the agent gets the answer decoded")
				assert.Assert(t, is.Contains(string(b), `"output_tokens":5000`))
				assert.Equal(t, g.Usage().OutputTokens, int64(5000))

				resp, b = clientPost(t, gw, ph, body, nil)
				assert.Equal(t, resp.StatusCode, http.StatusTooManyRequests, string(b))
				assert.Assert(t, is.Contains(string(b), "limit of 100 output tokens"))
				u := g.Usage()
				assert.Equal(t, u.OutputTokens, int64(5000))
				assert.Equal(t, u.Requests, int64(1))
				assert.Equal(t, u.Limit != "", true)
				up.mu.Lock()
				defer up.mu.Unlock()
				assert.DeepEqual(t, up.accept[1:], []string{"identity"}) // [0] is the control's
			})
		}
	}
}

// TestHonestUpstreamGetsIdentity: an upstream that compresses only when
// asked answers the gateway plain.
func TestHonestUpstreamGetsIdentity(t *testing.T) {
	up := &compressingUpstream{enc: "gzip", honor: true, outTokens: 5000}
	upURL := upstreamServer(t, up)
	body := `{"model":"m","max_tokens":10,"stream":true,"messages":[]}`
	resp, _ := clientPost(t, upURL, realKey, body, nil)
	assert.Equal(t, resp.Header.Get("Content-Encoding"), "gzip", "positive control: asked for gzip, it compresses")
	g, gw, ph := start(t, upURL, nil)
	resp, b := clientPost(t, gw, ph, body, nil)
	assert.Equal(t, resp.StatusCode, 200, string(b))
	assert.Equal(t, resp.Header.Get("Content-Encoding"), "")
	assert.Equal(t, g.Usage().OutputTokens, int64(5000))
}

// TestUnreadableEncodingFailsClosed: an answer in an encoding the gateway
// cannot decode (br, zstd, a chain) is not passed on uncounted.
func TestUnreadableEncodingFailsClosed(t *testing.T) {
	for _, enc := range []string{"br", "zstd", "gzip, gzip", "compress"} {
		up := &compressingUpstream{enc: enc, outTokens: 5000}
		g, gw, ph := start(t, upstreamServer(t, up), nil)
		resp, b := clientPost(t, gw, ph, `{"model":"m","max_tokens":10,"messages":[]}`, nil)
		assert.Equal(t, resp.StatusCode, http.StatusBadGateway, "%s: %s", enc, b)
		assert.Assert(t, is.Contains(string(b), "cannot read to count usage"), enc)
		assert.Assert(t, !strings.Contains(string(b), "not really"), "%s: the undecodable bytes reached the agent", enc)
		assert.Equal(t, g.Usage().Requests, int64(1))
	}
}

// serverSide are requests that make the provider act on the network on its
// side, with the allowlist entry that lets each through.
var serverSide = []struct {
	name, body, beta, allowTool, allowBeta string
}{
	{name: "mcp_servers", body: `{"model":"m","max_tokens":10,"messages":[],"mcp_servers":[{"type":"url","url":"https://attacker.example/mcp","name":"x"}]}`, allowTool: "mcp_servers"},
	{name: "web_fetch", body: `{"model":"m","max_tokens":10,"messages":[],"tools":[{"name":"Bash","input_schema":{}},{"type":"web_fetch_20250910","name":"web_fetch"}]}`, allowTool: "web_fetch"},
	{name: "web_search", body: `{"model":"m","max_tokens":10,"messages":[],"tools":[{"type":"web_search_20250305","name":"web_search","max_uses":5}]}`, allowTool: "web_search_20250305"},
	{name: "code_execution", body: `{"model":"m","max_tokens":10,"messages":[],"tools":[{"type":"code_execution_20250825","name":"code_execution"}]}`, allowTool: "code_execution"},
	{name: "container", body: `{"model":"m","max_tokens":10,"messages":[],"container":"container_011CPR5CNjB747bTd36fQLFk"}`, allowTool: "container"},
	{name: "unknown beta", body: `{"model":"m","max_tokens":10,"messages":[]}`, beta: "claude-code-20250219, mcp-client-2025-04-04", allowBeta: "mcp-client-2025-04-04"},
	{name: "image by url", body: `{"model":"m","max_tokens":10,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"url","url":"https://attacker.example/?secret=1"}}]}]}`, allowTool: "url_sources"},
	{name: "document by url in a tool result", body: `{"model":"m","max_tokens":10,"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":[{"type":"document","source":{"url":"https://attacker.example/x.pdf","type":"url"}}]}]}]}`, allowTool: "url_sources"},
	{name: "escaped source key", body: `{"model":"m","max_tokens":10,"messages":[{"role":"user","content":[{"type":"image","sour\u0063e":{"type":"\u0075rl","url":"https://attacker.example/"}}]}]}`, allowTool: "url_sources"},
	{name: "all escaped", body: `{"model":"m","max_tokens":10,"messages":[{"role":"user","content":[{"type":"text","text":"\u001b[0m"},{"type":"image","\u0073\u006F\u0075\u0072\u0063\u0065":{"type":"url","url":"https://attacker.example/"}}]}]}`, allowTool: "url_sources"},
	{name: "file in system", body: `{"model":"m","max_tokens":10,"system":[{"type":"document","source":{"type":"file","file_id":"file_011"}}],"messages":[]}`, allowTool: "file_sources"},
	{name: "mcp with its beta", body: `{"model":"m","max_tokens":10,"messages":[],"mcp_servers":[]}`, beta: "mcp-client-2025-04-04", allowTool: "mcp_servers", allowBeta: "mcp-client-2025-04-04"},
}

// TestRefusesServerSideCapabilities: each request is refused with 403 in
// the API's error shape, counted as refused, and nothing reaches the
// upstream; with the allowlist entry set, the same request passes whole.
func TestRefusesServerSideCapabilities(t *testing.T) {
	for _, c := range serverSide {
		t.Run(c.name, func(t *testing.T) {
			up := &compressingUpstream{outTokens: 1}
			upURL := upstreamServer(t, up)
			hdr := map[string]string{}
			if c.beta != "" {
				hdr["Anthropic-Beta"] = c.beta
			}
			g, gw, ph := start(t, upURL, nil)
			resp, b := clientPost(t, gw, ph, c.body, hdr)
			assert.Equal(t, resp.StatusCode, http.StatusForbidden, string(b))
			var e struct {
				Type  string `json:"type"`
				Error struct{ Type, Message string }
			}
			assert.NilError(t, json.Unmarshal(b, &e))
			assert.Equal(t, e.Type, "error")
			assert.Equal(t, e.Error.Type, "permission_error")
			assert.Assert(t, is.Contains(e.Error.Message, "shrooms gateway: "))
			assert.Equal(t, g.Usage().Refused, int64(1))
			assert.Equal(t, g.Usage().Requests, int64(0))
			assert.Equal(t, len(up.bodies), 0, "a refused request reached the upstream")

			// Positive control: allowed, the same request goes through as sent.
			g, gw, ph = start(t, upURL, func(cfg *Config) {
				if c.allowTool != "" {
					cfg.Policy.AllowServerTools = []string{c.allowTool}
				}
				if c.allowBeta != "" {
					cfg.Policy.AllowBetas = []string{c.allowBeta}
				}
			})
			resp, b = clientPost(t, gw, ph, c.body, hdr)
			assert.Equal(t, resp.StatusCode, 200, string(b))
			assert.Equal(t, g.Usage().Refused, int64(0))
			assert.Equal(t, len(up.bodies), 1)
			assert.Equal(t, string(up.bodies[0]), c.body)
		})
	}
}

// TestRequestsTheAgentsSendPass: bodies shaped as Claude Code and opencode
// send them (custom tools without a type or with type "custom", their
// betas) are forwarded; an allowance of one tool family allows no other.
func TestRequestsTheAgentsSendPass(t *testing.T) {
	up := &compressingUpstream{outTokens: 1}
	g, gw, ph := start(t, upstreamServer(t, up), func(c *Config) { c.Policy.AllowServerTools = []string{"web_search"} })
	for _, c := range []struct{ body, beta string }{
		{`{"model":"m","max_tokens":10,"stream":true,"messages":[{"role":"user","content":[{"type":"text","text":"\"mcp_servers\":[] {\"type\":\"web_fetch_20250910\"}"}]}],"tools":[{"name":"Bash","description":"d","input_schema":{"type":"object","properties":{"type":{"type":"string"}}}}],"metadata":{"user_id":"u"},"thinking":{"type":"enabled","budget_tokens":1024},"context_management":{"edits":[]},"output_config":{"effort":"high"},"system":[{"type":"text","text":"s"}]}`,
			"claude-code-20250219,interleaved-thinking-2025-05-14,context-management-2025-06-27,per-turn-control-2026-07-01,mid-conversation-tool-changes-2026-07-01,thinking-token-count-2026-05-13,advanced-tool-use-2025-11-20,effort-2025-11-24"},
		{`{"model":"m","max_tokens":10,"messages":[]}`, "claude-code-20250219,oauth-2025-04-20,interleaved-thinking-2025-05-14,extended-cache-ttl-2025-04-11"},
		{`{"model":"m","max_tokens":10,"messages":[],"tools":[{"type":"custom","name":"bash","input_schema":{}}],"tool_choice":{"type":"auto"}}`,
			"structured-outputs-2025-11-13,interleaved-thinking-2025-05-14,fine-grained-tool-streaming-2025-05-14"},
		{`{"model":"m","max_tokens":10,"messages":[],"tools":[{"type":"web_search_20250305","name":"web_search"}]}`, ""},
		{`{"model":"m","max_tokens":10,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"iVBO"}},{"type":"text","text":"\u001b[31m \"source\""}]},{"role":"assistant","content":[{"type":"tool_use","id":"t","name":"f","input":{"source":{"type":"url"}}}]}]}`, ""},
	} {
		resp, b := clientPost(t, gw, ph, c.body, map[string]string{"Anthropic-Beta": c.beta})
		assert.Equal(t, resp.StatusCode, 200, "%s: %s", c.body, b)
	}
	resp, b := clientPost(t, gw, ph, `{"model":"m","max_tokens":10,"messages":[],"tools":[{"type":"web_search_tool_20250305","name":"x"}]}`, nil)
	assert.Equal(t, resp.StatusCode, http.StatusForbidden, string(b))
	assert.Equal(t, g.Usage().Requests, int64(5))
}

// TestRefusesBodiesItCannotRead: what the gateway cannot read as one JSON
// object with each key once is not forwarded: the provider could read a
// member the check did not see.
func TestRefusesBodiesItCannotRead(t *testing.T) {
	up := &compressingUpstream{outTokens: 1}
	g, gw, ph := start(t, upstreamServer(t, up), nil)
	for _, body := range []string{
		`not json`,
		`[]`,
		`{"model":"m"} {"mcp_servers":[]}`,
		`{"model":"m","tools":[{"name":"a"}],"tools":[{"type":"web_fetch_20250910","name":"f"}]}`,
		`{"model":"m","tools":[{"type":"web_fetch_20250910","name":"f"}],"Tools":[]}`,
		`{"model":"m","tools":[{"type":"custom","TYPE":"web_fetch_20250910","name":"f"}]}`,
		`{"model":"m","tools":[{"type":"custom","type":"web_fetch_20250910","name":"f"}]}`,
		`{"model":"m","tools":[{"type":null,"name":"f"}]}`,
		`{"model":"m","tools":{"type":"web_fetch_20250910"}}`,
		`{"model":"m","mcp_servers":null}`,
		`{"model":"m","mcp\u005fservers":[{"type":"url","url":"https://x"}]}`,
		`{"model":"m","messages":[`,
	} {
		resp, b := clientPost(t, gw, ph, body, nil)
		assert.Equal(t, resp.StatusCode, http.StatusForbidden, "%s: %s", body, b)
	}
	// A compressed request body is not read either.
	resp, b := clientPost(t, gw, ph, `{"model":"m"}`, map[string]string{"Content-Encoding": "gzip"})
	assert.Equal(t, resp.StatusCode, http.StatusForbidden, string(b))
	assert.Equal(t, len(up.bodies), 0)
	assert.Equal(t, g.Usage().Requests, int64(0))
}

// TestMaySpellSource: every way to write the key "source" takes the walk;
// a request whose only escapes are terminal colours does not.
func TestMaySpellSource(t *testing.T) {
	for _, raw := range []string{`{"source":1}`, `{"\u0073ource":1}`, `{"s\u006Furce":1}`, `{"so\u0075rce":1}`, `{"sou\u0072ce":1}`, `{"sour\u0063e":1}`, `{"sourc\u0065":1}`, `{"\u0073\u006f\u0075\u0072\u0063\u0065":1}`} {
		assert.Assert(t, maySpellSource([]byte(raw)), raw)
		var m map[string]int
		assert.NilError(t, json.Unmarshal([]byte(raw), &m))
		assert.Equal(t, m["source"], 1, raw)
	}
	for _, raw := range []string{`{"text":"\u001b[31mred\u001b[0m \"source\" here"}`, `{"sources":1}`, `{"Source":"\u00e9"}`} {
		assert.Assert(t, !maySpellSource([]byte(raw)), raw)
	}
}
