package modelapi

import (
	"encoding/json"
	"fmt"
	"net/http"
)

// openaiRequest is the part of a Responses or Chat Completions request the
// server reads.
type openaiRequest struct {
	Model    string            `json:"model"`
	Stream   bool              `json:"stream"`
	Tools    []json.RawMessage `json:"tools"`
	Input    json.RawMessage   `json:"input"`
	Messages []json.RawMessage `json:"messages"`
}

// offersTools reports whether the request offers tools: in its tools array,
// or (Codex's code mode) in an input item of type additional_tools.
func (r *openaiRequest) offersTools() bool {
	if len(r.Tools) > 0 {
		return true
	}
	var items []struct {
		Type  string            `json:"type"`
		Tools []json.RawMessage `json:"tools"`
	}
	if json.Unmarshal(r.Input, &items) != nil {
		return false
	}
	for _, it := range items {
		if it.Type == "additional_tools" && len(it.Tools) > 0 {
			return true
		}
	}
	return false
}

// serveOpenAI answers a Responses (chat false) or Chat Completions request
// with the next script step.
func (s *Server) serveOpenAI(w http.ResponseWriter, rec Request, chat bool) {
	var or openaiRequest
	if err := json.Unmarshal(rec.Body, &or); err != nil {
		s.record(rec)
		openaiError(w, http.StatusBadRequest, "body is not an OpenAI API request: "+err.Error())
		return
	}
	rec.Stream = or.Stream
	step := Text(SideText)
	if or.offersTools() {
		step, rec.Step = s.take()
	}
	s.record(rec)
	model := or.Model
	if model == "" {
		model = "scripted"
	}
	n := len(s.Requests())
	switch {
	case chat && or.Stream:
		chatStream(w, n, model, step)
	case chat:
		writeJSON(w, chatCompletion(n, model, step))
	case or.Stream:
		responsesStream(w, n, model, step)
	default:
		writeJSON(w, response(n, model, step, "completed"))
	}
}

// outputItems are a step's Responses output items: a message with its
// text, then a function call.
func (st Step) outputItems(n int) []map[string]any {
	var out []map[string]any
	if st.Text != "" {
		out = append(out, map[string]any{
			"type": "message", "id": fmt.Sprintf("msg_scripted_%d", n), "role": "assistant", "status": "completed",
			"content": []any{map[string]any{"type": "output_text", "text": st.Text, "annotations": []any{}}},
		})
	}
	if st.Tool != "" {
		out = append(out, map[string]any{
			"type": "function_call", "id": fmt.Sprintf("fc_scripted_%d", n), "call_id": fmt.Sprintf("call_scripted_%d", n),
			"name": st.Tool, "arguments": string(st.input()), "status": "completed",
		})
	}
	return out
}

func openaiUsage() map[string]any {
	return map[string]any{
		"input_tokens": 10, "output_tokens": 5, "total_tokens": 15,
		"input_tokens_details": map[string]any{"cached_tokens": 0}, "output_tokens_details": map[string]any{"reasoning_tokens": 0},
	}
}

// response is a Responses API response object.
func response(n int, model string, st Step, status string) map[string]any {
	r := map[string]any{
		"id": fmt.Sprintf("resp_scripted_%d", n), "object": "response", "created_at": 1700000000,
		"status": status, "model": model, "output": []any{}, "usage": nil,
	}
	if status == "completed" {
		r["output"] = st.outputItems(n)
		r["usage"] = openaiUsage()
	}
	return r
}

// responsesStream writes the answer as the Responses API's server-sent
// events: created, each item added/delta/done, completed (with usage).
func responsesStream(w http.ResponseWriter, n int, model string, st Step) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	f, _ := w.(http.Flusher)
	seq := 0
	ev := func(name string, data map[string]any) {
		data["type"] = name
		data["sequence_number"] = seq
		seq++
		b, _ := json.Marshal(data)
		fmt.Fprintf(w, "event: %s\ndata: %s\n\n", name, b)
		if f != nil {
			f.Flush()
		}
	}
	ev("response.created", map[string]any{"response": response(n, model, st, "in_progress")})
	for i, item := range st.outputItems(n) {
		ev("response.output_item.added", map[string]any{"output_index": i, "item": item})
		switch item["type"] {
		case "message":
			ev("response.output_text.delta", map[string]any{"output_index": i, "item_id": item["id"], "content_index": 0, "delta": st.Text})
			ev("response.output_text.done", map[string]any{"output_index": i, "item_id": item["id"], "content_index": 0, "text": st.Text})
		case "function_call":
			args := string(st.input())
			half := len(args) / 2
			for _, part := range []string{args[:half], args[half:]} {
				ev("response.function_call_arguments.delta", map[string]any{"output_index": i, "item_id": item["id"], "delta": part})
			}
			ev("response.function_call_arguments.done", map[string]any{"output_index": i, "item_id": item["id"], "arguments": args})
		}
		ev("response.output_item.done", map[string]any{"output_index": i, "item": item})
	}
	ev("response.completed", map[string]any{"response": response(n, model, st, "completed")})
}

// chatCompletion is a Chat Completions answer.
func chatCompletion(n int, model string, st Step) map[string]any {
	msg := map[string]any{"role": "assistant", "content": st.Text}
	finish := "stop"
	if st.Tool != "" {
		finish = "tool_calls"
		msg["tool_calls"] = []any{map[string]any{"id": fmt.Sprintf("call_scripted_%d", n), "type": "function", "function": map[string]any{"name": st.Tool, "arguments": string(st.input())}}}
	}
	return map[string]any{
		"id": fmt.Sprintf("chatcmpl_scripted_%d", n), "object": "chat.completion", "created": 1700000000, "model": model,
		"choices": []any{map[string]any{"index": 0, "message": msg, "finish_reason": finish}},
		"usage":   map[string]any{"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
	}
}

// chatStream writes the answer as Chat Completions chunks, the last one
// with usage (as stream_options.include_usage asks).
func chatStream(w http.ResponseWriter, n int, model string, st Step) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	f, _ := w.(http.Flusher)
	chunk := func(delta map[string]any, finish any, usage any) {
		b, _ := json.Marshal(map[string]any{
			"id": fmt.Sprintf("chatcmpl_scripted_%d", n), "object": "chat.completion.chunk", "created": 1700000000, "model": model,
			"choices": []any{map[string]any{"index": 0, "delta": delta, "finish_reason": finish}}, "usage": usage,
		})
		fmt.Fprintf(w, "data: %s\n\n", b)
		if f != nil {
			f.Flush()
		}
	}
	full := chatCompletion(n, model, st)
	msg := full["choices"].([]any)[0].(map[string]any)["message"].(map[string]any)
	chunk(msg, nil, nil)
	chunk(map[string]any{}, full["choices"].([]any)[0].(map[string]any)["finish_reason"], full["usage"])
	fmt.Fprint(w, "data: [DONE]\n\n")
}

func openaiError(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	b, _ := json.Marshal(map[string]any{"error": map[string]any{"type": "invalid_request_error", "message": msg}})
	_, _ = w.Write(b)
}
