// Package modelapi is a scripted stand-in for the Anthropic Messages API,
// the OpenAI Responses and Chat Completions APIs and the Gemini API
// (generateContent, streamGenerateContent), for tests that run real agents
// (Claude Code, opencode, Codex, Gemini CLI) against a model whose every answer
// the test decides. Each POST /v1/messages, /v1/responses,
// /v1/chat/completions or /v1beta/models/M:[stream]generateContent that offers tools is the agent's own loop and gets the
// next step of the script: a tool call or a final text, streamed as
// server-sent events when the request asks for it.
// Requests without tools (titles, summaries) get a short fixed text and
// consume no step. Every request is recorded, body and all, so a test can
// assert what the agent sent (e.g. that a resumed session replays turn 1).
package modelapi

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"
)

// Step is one scripted model answer: a tool call when Tool is set, else a
// final text.
type Step struct {
	Tool  string          // tool name, e.g. "Bash"
	Input json.RawMessage // the tool's input object
	Text  string          // text sent before the tool call, or the final text
	// InputTokens is the usage the answer reports as read (10 when 0): a
	// test sets it near the context window to make an agent compact.
	InputTokens int
}

// ToolCall is a step that calls tool with input (marshalled to JSON).
func ToolCall(tool string, input any) Step {
	b, err := json.Marshal(input)
	if err != nil {
		panic(fmt.Sprintf("modelapi: tool input: %v", err)) // a test's own literal
	}
	return Step{Tool: tool, Input: b}
}

// Text is a step that ends the agent's turn with text.
func Text(s string) Step { return Step{Text: s} }

// Request is one request the server received.
type Request struct {
	Method string
	Path   string
	Header http.Header
	Body   []byte
	// Step is the index of the script step it was answered with, -1 when it
	// consumed none.
	Step int
	// Stream reports whether it asked for server-sent events.
	Stream bool
	// At is when it arrived.
	At time.Time
}

// SideText answers model requests that offer no tools.
const SideText = "ok"

// Server is the scripted API. Its zero value is not usable; use New.
type Server struct {
	mu       sync.Mutex
	script   []Step
	next     int
	requests []Request
	overrun  int
	srv      *http.Server
}

// New returns a server that answers with script, in order.
func New(script ...Step) *Server {
	s := &Server{script: script}
	s.srv = &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second}
	return s
}

// Append adds steps to the end of the script.
func (s *Server) Append(steps ...Step) {
	s.mu.Lock()
	s.script = append(s.script, steps...)
	s.mu.Unlock()
}

// Serve answers on ln in the background until Close.
func (s *Server) Serve(ln net.Listener) {
	go s.srv.Serve(ln) //nolint:errcheck // ErrServerClosed after Close
}

// Close stops the server and its connections.
func (s *Server) Close() error { return s.srv.Close() }

// Requests returns every request received so far, in order.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.requests...)
}

// Scripted returns the requests that consumed a script step, in order.
func (s *Server) Scripted() []Request {
	var out []Request
	for _, r := range s.Requests() {
		if r.Step >= 0 {
			out = append(out, r)
		}
	}
	return out
}

// Remaining is the number of script steps not yet used.
func (s *Server) Remaining() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.script) - s.next
}

// Overrun is the number of tool-offering requests that came after the
// script ran out (answered with a final text).
func (s *Server) Overrun() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.overrun
}

// Log renders the request log (method, path, step) for test failures.
func (s *Server) Log() string {
	var b strings.Builder
	for i, r := range s.Requests() {
		fmt.Fprintf(&b, "%d: %s %s step=%d stream=%v %d bytes\n", i, r.Method, r.Path, r.Step, r.Stream, len(r.Body))
	}
	return b.String()
}

// messagesRequest is the part of a Messages API request the server reads.
type messagesRequest struct {
	Model    string            `json:"model"`
	Stream   bool              `json:"stream"`
	Tools    []json.RawMessage `json:"tools"`
	Messages []json.RawMessage `json:"messages"`
}

// ServeHTTP routes one request.
func (s *Server) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	body, err := io.ReadAll(io.LimitReader(req.Body, 64<<20))
	if err != nil {
		apiError(w, http.StatusBadRequest, "invalid_request_error", "read body: "+err.Error())
		return
	}
	rec := Request{Method: req.Method, Path: req.URL.Path, Header: req.Header.Clone(), Body: body, Step: -1, At: time.Now()}
	path := strings.TrimSuffix(req.URL.Path, "/")
	switch {
	case req.Method == http.MethodPost && strings.HasSuffix(path, "/v1/messages/count_tokens"):
		s.record(rec)
		writeJSON(w, map[string]any{"input_tokens": 1 + len(body)/4})
	case req.Method == http.MethodPost && strings.HasSuffix(path, "/v1/messages"):
		var mr messagesRequest
		if err := json.Unmarshal(body, &mr); err != nil {
			s.record(rec)
			apiError(w, http.StatusBadRequest, "invalid_request_error", "body is not a Messages API request: "+err.Error())
			return
		}
		rec.Stream = mr.Stream
		step := Text(SideText)
		if len(mr.Tools) > 0 {
			step, rec.Step = s.take()
		}
		s.record(rec)
		model := mr.Model
		if model == "" {
			model = "scripted"
		}
		id := fmt.Sprintf("msg_scripted_%d", len(s.Requests()))
		if mr.Stream {
			stream(w, id, model, step)
		} else {
			writeJSON(w, message(id, model, step, true))
		}
	// "/responses": the ChatGPT backend serves it as .../codex/responses.
	case req.Method == http.MethodPost && (strings.HasSuffix(path, "/responses") || strings.HasSuffix(path, "/v1/chat/completions")):
		s.serveOpenAI(w, rec, strings.HasSuffix(path, "/v1/chat/completions"))
	case req.Method == http.MethodPost && strings.Contains(path, "/models/") && (strings.HasSuffix(path, ":generateContent") || strings.HasSuffix(path, ":streamGenerateContent") || strings.HasSuffix(path, ":countTokens")):
		s.serveGemini(w, req, rec)
	case req.Method == http.MethodGet && strings.HasSuffix(path, "/v1beta/models"):
		s.record(rec)
		writeJSON(w, map[string]any{"models": []any{map[string]any{"name": "models/gemini-2.5-pro", "supportedGenerationMethods": []any{"generateContent", "countTokens"}}}})
	case req.Method == http.MethodGet && strings.HasSuffix(path, "/v1/models"):
		s.record(rec)
		// Both APIs' list shapes at once (Anthropic: data/has_more;
		// OpenAI: object/data; Codex's model discovery: models).
		writeJSON(w, map[string]any{"object": "list", "data": []any{}, "models": []any{}, "has_more": false})
	default:
		s.record(rec)
		apiError(w, http.StatusNotFound, "not_found_error", "modelapi: no such endpoint: "+req.Method+" "+req.URL.Path)
	}
}

func (s *Server) record(r Request) {
	s.mu.Lock()
	s.requests = append(s.requests, r)
	s.mu.Unlock()
}

// take returns the next step and its index, or a final text past the end.
func (s *Server) take() (Step, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.next >= len(s.script) {
		s.overrun++
		return Text("script exhausted"), -1
	}
	s.next++
	return s.script[s.next-1], s.next - 1
}

func (st Step) stopReason() string {
	if st.Tool != "" {
		return "tool_use"
	}
	return "end_turn"
}

func (st Step) input() json.RawMessage {
	if len(st.Input) == 0 {
		return json.RawMessage("{}")
	}
	return st.Input
}

// blocks are the content blocks of a step's answer.
func (st Step) blocks(id string) []map[string]any {
	var out []map[string]any
	if st.Text != "" {
		out = append(out, map[string]any{"type": "text", "text": st.Text})
	}
	if st.Tool != "" {
		out = append(out, map[string]any{"type": "tool_use", "id": "toolu_" + id, "name": st.Tool, "input": st.input()})
	}
	return out
}

func usage(st Step, out int) map[string]any {
	in := st.InputTokens
	if in == 0 {
		in = 10
	}
	return map[string]any{"input_tokens": in, "output_tokens": out, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
}

// message is the non-streaming answer (with full content), or the
// message_start skeleton (content empty, no stop reason yet).
func message(id, model string, st Step, full bool) map[string]any {
	m := map[string]any{
		"id": id, "type": "message", "role": "assistant", "model": model,
		"content": []any{}, "stop_reason": nil, "stop_sequence": nil, "usage": usage(st, 1),
	}
	if full {
		m["content"] = st.blocks(id)
		m["stop_reason"] = st.stopReason()
		m["usage"] = usage(st, 5)
	}
	return m
}

// stream writes the answer as the Messages API's server-sent events.
func stream(w http.ResponseWriter, id, model string, st Step) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	f, _ := w.(http.Flusher)
	ev := func(name string, data map[string]any) {
		data["type"] = name
		b, _ := json.Marshal(data)
		fmt.Fprintf(w, "event: %s\ndata: %s\n\n", name, b)
		if f != nil {
			f.Flush()
		}
	}
	ev("message_start", map[string]any{"message": message(id, model, st, false)})
	ev("ping", map[string]any{})
	for i, b := range st.blocks(id) {
		switch b["type"] {
		case "text":
			ev("content_block_start", map[string]any{"index": i, "content_block": map[string]any{"type": "text", "text": ""}})
			ev("content_block_delta", map[string]any{"index": i, "delta": map[string]any{"type": "text_delta", "text": b["text"]}})
		case "tool_use":
			ev("content_block_start", map[string]any{"index": i, "content_block": map[string]any{"type": "tool_use", "id": b["id"], "name": b["name"], "input": map[string]any{}}})
			// Split the input in two deltas, as the real API streams it.
			in := string(st.input())
			half := len(in) / 2
			for _, part := range []string{in[:half], in[half:]} {
				ev("content_block_delta", map[string]any{"index": i, "delta": map[string]any{"type": "input_json_delta", "partial_json": part}})
			}
		}
		ev("content_block_stop", map[string]any{"index": i})
	}
	ev("message_delta", map[string]any{"delta": map[string]any{"stop_reason": st.stopReason(), "stop_sequence": nil}, "usage": map[string]any{"input_tokens": usage(st, 5)["input_tokens"], "output_tokens": 5}})
	ev("message_stop", map[string]any{})
}

func writeJSON(w http.ResponseWriter, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		apiError(w, http.StatusInternalServerError, "api_error", err.Error())
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = io.Copy(w, bytes.NewReader(b))
}

func apiError(w http.ResponseWriter, code int, typ, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	b, _ := json.Marshal(map[string]any{"type": "error", "error": map[string]any{"type": typ, "message": msg}})
	_, _ = w.Write(b)
}
