package gateway

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/shrooms-cage/shrooms/internal/modelapi"
)

func openaiGateway(c *Config) { c.API = "openai" }

func postOpenAI(t *testing.T, url, bearer, body string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	assert.NilError(t, err)
	req.Header.Set("Content-Type", "application/json")
	if bearer != "" {
		req.Header.Set("Authorization", "Bearer "+bearer)
	}
	resp, err := http.DefaultClient.Do(req)
	assert.NilError(t, err)
	return resp
}

const responsesBody = `{"model":"gpt-test","stream":%t,"input":[{"type":"message","role":"user","content":[{"type":"input_text","text":"hi"}]}],"tools":[{"type":"function","name":"exec_command","parameters":{}}]}`

// TestOpenAIForwardsWithTheRealKeyAndCountsUsage: Responses (streamed and
// not) and Chat Completions reach the upstream with the real key as the
// bearer token, never the placeholder, and their usage is counted.
func TestOpenAIForwardsWithTheRealKeyAndCountsUsage(t *testing.T) {
	s, up := scripted(t, modelapi.ToolCall("exec_command", map[string]string{"cmd": "ls"}), modelapi.Text("done"), modelapi.Text("chat"), modelapi.Text("chat2"))
	g, gw, ph := start(t, up, openaiGateway)

	resp := postOpenAI(t, gw+"/v1/responses", ph, fmt.Sprintf(responsesBody, true))
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, resp.StatusCode, 200, string(body))
	assert.Check(t, is.Contains(string(body), "event: response.completed"))
	assert.Check(t, is.Contains(string(body), `"name":"exec_command"`))

	resp = postOpenAI(t, gw+"/v1/responses", ph, fmt.Sprintf(responsesBody, false))
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, resp.StatusCode, 200, string(body))

	chat := `{"model":"gpt-test","stream":%t,"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"f","parameters":{}}}]}`
	for _, stream := range []bool{false, true} {
		resp = postOpenAI(t, gw+"/v1/chat/completions", ph, fmt.Sprintf(chat, stream))
		body, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		assert.Equal(t, resp.StatusCode, 200, string(body))
	}

	reqs := s.Requests()
	assert.Equal(t, len(reqs), 4, s.Log())
	for _, r := range reqs {
		assert.Check(t, is.Equal(r.Header.Get("Authorization"), "Bearer "+realKey))
		assert.Check(t, is.Equal(r.Header.Get("X-Api-Key"), ""))
		for _, vs := range r.Header {
			for _, v := range vs {
				assert.Check(t, !strings.Contains(v, ph), "the placeholder reached the upstream")
			}
		}
	}
	u := g.Usage()
	assert.Check(t, is.Equal(u.Requests, int64(4)))
	assert.Check(t, is.Equal(u.InputTokens, int64(40)))
	assert.Check(t, is.Equal(u.OutputTokens, int64(20)))
	assert.Check(t, is.DeepEqual(u.Models, []string{"gpt-test"}))
}

// TestOpenAIRefusals: the wrong credential is 401; a path or method outside
// the API (the Files API, a Responses WebSocket upgrade) is 403, in the
// OpenAI error shape; nothing of them reaches the upstream.
func TestOpenAIRefusals(t *testing.T) {
	s, up := scripted(t)
	g, gw, ph := start(t, up, openaiGateway)
	old, _ := NewPlaceholder()

	resp := postOpenAI(t, gw+"/v1/responses", old, fmt.Sprintf(responsesBody, false))
	resp.Body.Close()
	assert.Check(t, is.Equal(resp.StatusCode, 401))
	resp = postOpenAI(t, gw+"/v1/responses", "", fmt.Sprintf(responsesBody, false))
	resp.Body.Close()
	assert.Check(t, is.Equal(resp.StatusCode, 401))

	for _, c := range []struct{ method, path string }{
		{"POST", "/v1/files"}, {"GET", "/v1/files"}, {"POST", "/v1/messages"}, {"GET", "/v1/responses"},
		{"POST", "/v1/vector_stores"}, {"POST", "/v1/responses/resp_1/cancel"}, {"GET", "/v1/models/a/b"},
		{"POST", "/v1/realtime/sessions"}, {"DELETE", "/v1/responses"},
	} {
		req, _ := http.NewRequest(c.method, gw+c.path, nil)
		req.Header.Set("Authorization", "Bearer "+ph)
		if c.path == "/v1/responses" && c.method == "GET" {
			req.Header.Set("Connection", "Upgrade")
			req.Header.Set("Upgrade", "websocket")
		}
		resp, err := http.DefaultClient.Do(req)
		assert.NilError(t, err)
		var e struct {
			Error struct{ Message string } `json:"error"`
		}
		assert.Check(t, json.NewDecoder(resp.Body).Decode(&e))
		resp.Body.Close()
		assert.Check(t, is.Equal(resp.StatusCode, 403), "%s %s", c.method, c.path)
		assert.Check(t, is.Contains(e.Error.Message, "not an API path"))
	}
	assert.Check(t, is.Len(s.Requests(), 0))
	assert.Check(t, is.Equal(g.Usage().Refused, int64(11)))
}

// TestOpenAIServerToolsRefused: tools the provider runs (web search, file
// search, code interpreter, remote MCP, unknown types), wherever Codex puts
// them (tools, a namespace's tools, an additional_tools input item), and
// inputs the provider fetches, are refused unless allowed.
func TestOpenAIServerToolsRefused(t *testing.T) {
	_, up := scripted(t, modelapi.Text("a"), modelapi.Text("b"), modelapi.Text("c"))
	_, gw, ph := start(t, up, openaiGateway)
	refusedBodies := map[string]string{
		"web_search":         `{"model":"m","input":"x","tools":[{"type":"web_search"}]}`,
		"web_search_preview": `{"model":"m","input":"x","tools":[{"type":"function","name":"f"},{"type":"web_search_preview"}]}`,
		"file_search":        `{"model":"m","input":"x","tools":[{"type":"file_search","vector_store_ids":["vs_1"]}]}`,
		"code_interpreter":   `{"model":"m","input":"x","tools":[{"type":"code_interpreter","container":{"type":"auto"}}]}`,
		"mcp":                `{"model":"m","input":"x","tools":[{"type":"mcp","server_url":"https://evil.example/mcp","server_label":"e"}]}`,
		"unknown":            `{"model":"m","input":"x","tools":[{"type":"teleport"}]}`,
		"namespace":          `{"model":"m","input":"x","tools":[{"type":"namespace","name":"n","tools":[{"type":"function","name":"f"},{"type":"web_search"}]}]}`,
		"additional_tools":   `{"model":"m","input":[{"type":"additional_tools","role":"developer","tools":[{"type":"namespace","name":"n","tools":[{"type":"mcp","server_url":"https://e"}]}]}]}`,
		"image by url":       `{"model":"m","input":[{"role":"user","content":[{"type":"input_image","image_url":"https://evil.example/x.png"}]}]}`,
		"file by id":         `{"model":"m","input":[{"role":"user","content":[{"type":"input_file","file_id":"file_1"}]}]}`,
		"chat image by url":  `{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"http://evil.example/x.png"}}]}]}`,
		"chat web search":    `{"model":"m","messages":[],"web_search_options":{}}`,
		"background":         `{"model":"m","input":"x","background":true}`,
		"stored prompt":      `{"model":"m","input":"x","prompt":{"id":"pmpt_1"}}`,
		"duplicate key":      `{"model":"m","input":"x","tools":[],"Tools":[{"type":"web_search"}]}`,
		"escaped key":        `{"model":"m","input":"x","t\u006fols":[{"type":"web_search"}]}`,
		"trailing data":      `{"model":"m","input":"x"}{"tools":[{"type":"web_search"}]}`,
	}
	for name, body := range refusedBodies {
		resp := postOpenAI(t, gw+"/v1/responses", ph, body)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		assert.Check(t, is.Equal(resp.StatusCode, 403), "%s: %s", name, b)
	}
	// Positive controls: client tools and inline data pass.
	for name, body := range map[string]string{
		"client tools": `{"model":"m","input":"x","tools":[{"type":"function","name":"f"},{"type":"custom","name":"exec"},{"type":"namespace","name":"n","tools":[{"type":"function","name":"g"}]}]}`,
		"data image":   `{"model":"m","input":[{"role":"user","content":[{"type":"input_image","image_url":"data:image/png;base64,iVBOR"}]}],"tools":[{"type":"function","name":"f"}]}`,
		"plain":        `{"model":"m","input":"x","background":false,"prompt":null}`,
	} {
		resp := postOpenAI(t, gw+"/v1/responses", ph, body)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		assert.Check(t, is.Equal(resp.StatusCode, 200), "%s: %s", name, b)
	}
	// Allowed by the owner: forwarded.
	_, gw2, ph2 := start(t, up, func(c *Config) {
		c.API = "openai"
		c.Policy.AllowServerTools = []string{"web_search"}
	})
	resp := postOpenAI(t, gw2+"/v1/responses", ph2, refusedBodies["web_search"])
	resp.Body.Close()
	assert.Check(t, is.Equal(resp.StatusCode, 200))
}

// TestOpenAIStreamsWithoutBuffering: the first Responses event reaches the
// client while the upstream holds the stream open; usage comes from
// response.completed.
func TestOpenAIStreamsWithoutBuffering(t *testing.T) {
	release := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"model\":\"m\",\"usage\":null}}\n\n")
		w.(http.Flusher).Flush()
		<-release
		fmt.Fprint(w, "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"model\":\"m\",\"usage\":{\"input_tokens\":7,\"output_tokens\":9,\"input_tokens_details\":{\"cached_tokens\":3}}}}\n\n")
	}))
	defer up.Close()
	defer func() {
		select {
		case <-release:
		default:
			close(release)
		}
	}()
	g, gw, ph := start(t, up.URL, openaiGateway)
	resp := postOpenAI(t, gw+"/v1/responses", ph, fmt.Sprintf(responsesBody, true))
	defer resp.Body.Close()
	got := make(chan string, 1)
	br := bufio.NewReader(resp.Body)
	go func() {
		line, _ := br.ReadString('\n')
		got <- line
	}()
	select {
	case line := <-got:
		assert.Equal(t, line, "event: response.created\n")
	case <-time.After(5 * time.Second):
		t.Fatal("the first event was held back by the gateway")
	}
	close(release)
	_, _ = io.ReadAll(br)
	u := g.Usage()
	assert.Check(t, is.Equal(u.InputTokens, int64(7)))
	assert.Check(t, is.Equal(u.OutputTokens, int64(9)))
	assert.Check(t, is.Equal(u.CacheReadTokens, int64(3)))
}

// TestOpenAILimitsEndTheTurn: the output-token limit, counted from the
// Responses stream, refuses the next request.
func TestOpenAILimitsEndTheTurn(t *testing.T) {
	_, up := scripted(t, modelapi.Text("a"), modelapi.Text("b"))
	g, gw, ph := start(t, up, func(c *Config) {
		c.API = "openai"
		c.MaxOutputTokens = 5
	})
	resp := postOpenAI(t, gw+"/v1/responses", ph, fmt.Sprintf(responsesBody, true))
	_, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, resp.StatusCode, 200)
	resp = postOpenAI(t, gw+"/v1/responses", ph, fmt.Sprintf(responsesBody, true))
	resp.Body.Close()
	assert.Check(t, is.Equal(resp.StatusCode, 429))
	assert.Check(t, is.Contains(g.Usage().Limit, "output tokens"))
}
