package gateway

import (
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/shrooms-cage/shrooms/internal/modelapi"
)

func geminiGateway(c *Config) { c.API = "gemini" }

func postGemini(t *testing.T, u, header, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, u, strings.NewReader(body))
	assert.NilError(t, err)
	req.Header.Set("Content-Type", "application/json")
	if header != "" {
		req.Header.Set("X-Goog-Api-Key", header)
	}
	resp, err := http.DefaultClient.Do(req)
	assert.NilError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

const geminiBody = `{"contents":[{"role":"user","parts":[{"text":"hi"}]}],"tools":[{"functionDeclarations":[{"name":"run_shell_command","parameters":{}}]}]}`

// TestGeminiForwardsWithTheRealKeyAndCountsUsage: generateContent, both
// streams and countTokens reach the upstream with the real key in
// x-goog-api-key (the placeholder, in the header or key=, never); usage
// comes from usageMetadata.
func TestGeminiForwardsWithTheRealKeyAndCountsUsage(t *testing.T) {
	s, up := scripted(t, modelapi.ToolCall("run_shell_command", map[string]string{"command": "ls"}), modelapi.Text("done"), modelapi.Text("three"))
	g, gw, ph := start(t, up, geminiGateway)

	code, body := postGemini(t, gw+"/v1beta/models/gemini-test:streamGenerateContent?alt=sse", ph, geminiBody)
	assert.Equal(t, code, 200, body)
	assert.Check(t, is.Contains(body, `"functionCall"`))
	assert.Check(t, is.Contains(body, "data: "))
	code, body = postGemini(t, gw+"/v1beta/models/gemini-test:streamGenerateContent?key="+url.QueryEscape(ph), "", geminiBody)
	assert.Equal(t, code, 200, body)
	assert.Check(t, strings.HasPrefix(body, "["), body)
	code, body = postGemini(t, gw+"/v1beta/models/gemini-test:generateContent", ph, geminiBody)
	assert.Equal(t, code, 200, body)
	code, body = postGemini(t, gw+"/v1beta/models/gemini-test:countTokens", ph, `{"contents":[]}`)
	assert.Equal(t, code, 200, body)

	reqs := s.Requests()
	assert.Equal(t, len(reqs), 4, s.Log())
	for _, r := range reqs {
		assert.Check(t, is.Equal(r.Header.Get("X-Goog-Api-Key"), realKey))
		assert.Check(t, is.Equal(r.Header.Get("Authorization"), ""))
		for _, vs := range r.Header {
			for _, v := range vs {
				assert.Check(t, !strings.Contains(v, ph), "the placeholder reached the upstream")
			}
		}
	}
	u := g.Usage()
	assert.Check(t, is.Equal(u.Requests, int64(4)))
	assert.Check(t, is.Equal(u.InputTokens, int64(30)))
	assert.Check(t, is.Equal(u.OutputTokens, int64(15)))
	assert.Check(t, is.DeepEqual(u.Models, []string{"gemini-test"}))
}

// TestGeminiRefuses: a wrong or missing placeholder is 401; an unlisted
// path and server-side tools (Google Search, URL context, code execution,
// an unknown kind) are 403 unless allowed; nothing reaches the upstream.
func TestGeminiRefuses(t *testing.T) {
	s, up := scripted(t)
	_, gw, ph := start(t, up, geminiGateway)
	code, _ := postGemini(t, gw+"/v1beta/models/m:generateContent", "old-placeholder-0123456789abcdef0123456789", geminiBody)
	assert.Check(t, is.Equal(code, 401))
	code, _ = postGemini(t, gw+"/v1beta/models/m:generateContent", "", geminiBody)
	assert.Check(t, is.Equal(code, 401))
	for _, p := range []string{"/v1beta/files", "/upload/v1beta/files", "/v1beta/cachedContents", "/v1beta/models/m:batchGenerateContent", "/v1beta/tunedModels/x:generateContent", "/v1beta/models/m/x:generateContent"} {
		code, body := postGemini(t, gw+p, ph, geminiBody)
		assert.Check(t, is.Equal(code, 403), "%s: %s", p, body)
	}
	for _, tool := range []string{`{"googleSearch":{}}`, `{"urlContext":{}}`, `{"codeExecution":{}}`, `{"googleSearchRetrieval":{}}`, `{"futureTool":{}}`} {
		code, body := postGemini(t, gw+"/v1beta/models/m:generateContent", ph, `{"contents":[],"tools":[`+tool+`]}`)
		assert.Check(t, is.Equal(code, 403), "%s: %s", tool, body)
	}
	code, _ = postGemini(t, gw+"/v1beta/models/m:generateContent", ph, `{"contents":[{"parts":[{"fileData":{"fileUri":"https://x"}}]}]}`)
	assert.Check(t, is.Equal(code, 403))
	assert.Check(t, is.Len(s.Requests(), 0), s.Log())
}
