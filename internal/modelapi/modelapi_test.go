package modelapi

import (
	"bufio"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

func start(t *testing.T, steps ...Step) (*Server, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	assert.NilError(t, err)
	s := New(steps...)
	s.Serve(ln)
	t.Cleanup(func() { s.Close() })
	return s, "http://" + ln.Addr().String()
}

type event struct {
	name string
	data map[string]any
}

// readSSE parses a server-sent event stream.
func readSSE(t *testing.T, r io.Reader) []event {
	t.Helper()
	var out []event
	var cur event
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "event: "):
			cur.name = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			assert.NilError(t, json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &cur.data))
		case line == "":
			assert.Equal(t, cur.data["type"], cur.name, "event name and data type agree")
			out = append(out, cur)
			cur = event{}
		}
	}
	assert.NilError(t, sc.Err())
	return out
}

func post(t *testing.T, url, path, body string) *http.Response {
	t.Helper()
	resp, err := http.Post(url+path, "application/json", strings.NewReader(body))
	assert.NilError(t, err)
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

const withTools = `{"model":"claude-x","stream":true,"tools":[{"name":"Bash"}],"messages":[{"role":"user","content":"hi"}]}`

func TestStreamToolCall(t *testing.T) {
	input := map[string]any{"command": `echo "a b" > /tmp/x`, "description": "write"}
	s, url := start(t, ToolCall("Bash", input), Text("done"))

	resp := post(t, url, "/v1/messages", withTools)
	assert.Equal(t, resp.StatusCode, 200)
	assert.Equal(t, resp.Header.Get("Content-Type"), "text/event-stream")
	evs := readSSE(t, resp.Body)
	var names []string
	var partial strings.Builder
	for _, e := range evs {
		names = append(names, e.name)
		if d, ok := e.data["delta"].(map[string]any); ok && d["type"] == "input_json_delta" {
			partial.WriteString(d["partial_json"].(string))
		}
	}
	assert.DeepEqual(t, names, []string{
		"message_start", "ping", "content_block_start", "content_block_delta", "content_block_delta",
		"content_block_stop", "message_delta", "message_stop",
	})
	start := evs[0].data["message"].(map[string]any)
	assert.Equal(t, start["model"], "claude-x")
	assert.Equal(t, start["role"], "assistant")
	block := evs[2].data["content_block"].(map[string]any)
	assert.Equal(t, block["type"], "tool_use")
	assert.Equal(t, block["name"], "Bash")
	assert.Assert(t, strings.HasPrefix(block["id"].(string), "toolu_"))
	var got map[string]any
	assert.NilError(t, json.Unmarshal([]byte(partial.String()), &got), "the input_json_delta parts join to the input")
	assert.DeepEqual(t, got, input)
	assert.Equal(t, evs[6].data["delta"].(map[string]any)["stop_reason"], "tool_use")

	// The next request gets the final text and ends the turn.
	evs = readSSE(t, post(t, url, "/v1/messages", withTools).Body)
	assert.Equal(t, evs[2].data["content_block"].(map[string]any)["type"], "text")
	assert.Equal(t, evs[3].data["delta"].(map[string]any)["type"], "text_delta")
	assert.Equal(t, evs[3].data["delta"].(map[string]any)["text"], "done")
	assert.Equal(t, evs[5].data["delta"].(map[string]any)["stop_reason"], "end_turn")
	assert.Equal(t, s.Remaining(), 0)
	assert.Equal(t, s.Overrun(), 0)

	// Past the end: a final text, counted as an overrun.
	evs = readSSE(t, post(t, url, "/v1/messages", withTools).Body)
	assert.Equal(t, evs[3].data["delta"].(map[string]any)["text"], "script exhausted")
	assert.Equal(t, s.Overrun(), 1)
	steps := []int{}
	for _, r := range s.Requests() {
		steps = append(steps, r.Step)
	}
	assert.DeepEqual(t, steps, []int{0, 1, -1})
	assert.Equal(t, len(s.Scripted()), 2)
	assert.Equal(t, string(s.Scripted()[0].Body), withTools, "bodies are recorded verbatim")
}

func TestNonStreaming(t *testing.T) {
	s, url := start(t, Step{Tool: "Write", Input: json.RawMessage(`{"file_path":"/a"}`), Text: "writing"})
	resp := post(t, url, "/v1/messages", `{"model":"m","tools":[{"name":"Write"}],"messages":[]}`)
	assert.Equal(t, resp.StatusCode, 200)
	var m struct {
		Type       string           `json:"type"`
		StopReason string           `json:"stop_reason"`
		Content    []map[string]any `json:"content"`
	}
	assert.NilError(t, json.NewDecoder(resp.Body).Decode(&m))
	assert.Equal(t, m.Type, "message")
	assert.Equal(t, m.StopReason, "tool_use")
	assert.Equal(t, len(m.Content), 2)
	assert.Equal(t, m.Content[0]["text"], "writing")
	assert.Equal(t, m.Content[1]["name"], "Write")
	assert.DeepEqual(t, m.Content[1]["input"], map[string]any{"file_path": "/a"})
	assert.Assert(t, !s.Requests()[0].Stream)
}

func TestSideRequestsConsumeNoStep(t *testing.T) {
	s, url := start(t, Text("main"))
	// No tools: a title or summary request.
	evs := readSSE(t, post(t, url, "/v1/messages", `{"model":"small","stream":true,"messages":[{"role":"user","content":"title?"}]}`).Body)
	assert.Equal(t, evs[3].data["delta"].(map[string]any)["text"], SideText)
	assert.Equal(t, s.Remaining(), 1)

	resp := post(t, url, "/v1/messages/count_tokens", `{"messages":[]}`)
	assert.Equal(t, resp.StatusCode, 200)
	var ct map[string]any
	assert.NilError(t, json.NewDecoder(resp.Body).Decode(&ct))
	assert.Assert(t, ct["input_tokens"].(float64) > 0)

	resp = post(t, url, "/api/unknown", `{}`)
	assert.Equal(t, resp.StatusCode, 404)
	b, _ := io.ReadAll(resp.Body)
	assert.Assert(t, is.Contains(string(b), `"not_found_error"`))

	resp = post(t, url, "/v1/messages", `not json`)
	assert.Equal(t, resp.StatusCode, 400)

	assert.Equal(t, s.Remaining(), 1, "no side request consumed the step")
	assert.Equal(t, len(s.Requests()), 4, "every request is logged:\n%s", s.Log())
	assert.Assert(t, is.Contains(s.Log(), "POST /api/unknown step=-1"))
}

func TestAppend(t *testing.T) {
	s, url := start(t)
	s.Append(Text("later"))
	evs := readSSE(t, post(t, url, "/v1/messages", withTools).Body)
	assert.Equal(t, evs[3].data["delta"].(map[string]any)["text"], "later")
	assert.Equal(t, s.Overrun(), 0)
}
