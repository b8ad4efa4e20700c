package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
)

// The OpenAI API as Codex (and any Responses or Chat Completions client)
// uses it: POST /v1/responses (streamed or not, and its /compact variant
// that Codex's remote compaction calls), POST /v1/chat/completions and
// GET /v1/models[/ID]. Nothing else — the Files, Vector Store, Assistants,
// Containers, Realtime and Batch endpoints, and the Responses WebSocket
// upgrade (a GET of /v1/responses), are refused with 403.

// openaiAllowed reports whether method and p (cleaned) are an OpenAI API
// path the gateway forwards.
func openaiAllowed(method, p string) bool {
	switch {
	case method == http.MethodPost && (p == "/v1/responses" || p == "/v1/responses/compact" || p == "/v1/chat/completions"):
		return true
	case method == http.MethodGet && (p == "/v1/models" || strings.HasPrefix(p, "/v1/models/") && !strings.Contains(p[len("/v1/models/"):], "/")):
		return true
	}
	return false
}

// openaiClientTools are the Responses/Chat tool types the client runs (in
// the cage). Every other type (web_search, file_search, code_interpreter,
// mcp, image_generation, computer_use_preview, and any type not known) is
// run by the provider, and refused unless allow_server_tools lists it or
// its family.
var openaiClientTools = map[string]bool{
	// Run by the client (Codex) in the cage.
	"function":    true,
	"custom":      true,
	"namespace":   true,
	"local_shell": true,
	"shell":       true,
	"apply_patch": true,
}

// checkOpenAIBody refuses a Responses or Chat Completions request that asks
// the provider to act on its side (server tools, remote MCP, stored
// prompts, background runs, fetched inputs) unless the policy allows it,
// and any body it cannot read as one JSON object with unique keys.
func (p Policy) checkOpenAIBody(body []byte) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	err := object(dec, func(key string) error {
		switch key {
		case "tools":
			return p.checkOpenAITools(dec, "tools")
		case "input", "messages":
			return p.checkOpenAIInput(dec, key)
		case "web_search_options":
			if !p.allowsServer("web_search") {
				return refused("%q asks the provider to search the web with the owner's key (gateway.NAME.allow_server_tools = [\"web_search\"])", key)
			}
			return skip(dec)
		case "background":
			// A background response runs on after the turn, unmetered by
			// this gateway.
			return p.refuseTrue(dec, key, "background")
		case "prompt", "conversation":
			// A stored prompt or conversation brings tools and context
			// the gateway cannot see.
			return p.refuseNonNull(dec, key, "stored_prompts")
		}
		return skip(dec)
	})
	if err != nil {
		return err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return refused("the request body is not one JSON object")
	}
	return nil
}

func (p Policy) refuseTrue(dec *json.Decoder, key, allow string) error {
	t, err := dec.Token()
	if err != nil {
		return refused("%s: %s", key, oneLine(err))
	}
	if v, ok := t.(bool); ok && v && !p.allowsServer(allow) {
		return refused("%q is refused (gateway.NAME.allow_server_tools = [%q])", key, allow)
	}
	if d, ok := t.(json.Delim); ok && (d == '{' || d == '[') {
		return refused("%s is not a boolean", key)
	}
	return nil
}

func (p Policy) refuseNonNull(dec *json.Decoder, key, allow string) error {
	var raw json.RawMessage
	if err := dec.Decode(&raw); err != nil {
		return refused("%s: %s", key, oneLine(err))
	}
	if string(raw) != "null" && !p.allowsServer(allow) {
		return refused("%q is refused (gateway.NAME.allow_server_tools = [%q])", key, allow)
	}
	return nil
}

// checkOpenAITools reads a tools array: every entry must be a client-side
// tool type (a namespace's own tools are checked the same way), or a server
// tool the policy allows.
func (p Policy) checkOpenAITools(dec *json.Decoder, where string) error {
	t, err := dec.Token()
	if err != nil {
		return refused("%s: %s", where, oneLine(err))
	}
	if t == nil {
		return nil
	}
	if t != json.Delim('[') {
		return refused("%s is not an array", where)
	}
	for i := 0; dec.More(); i++ {
		var tool map[string]json.RawMessage
		if err := dec.Decode(&tool); err != nil {
			return refused("%s[%d]: %s", where, i, oneLine(err))
		}
		var typ string
		if err := json.Unmarshal(tool["type"], &typ); err != nil {
			return refused("%s[%d].type is not a string", where, i)
		}
		if !openaiClientTools[typ] && !p.allowsServer(typ) {
			return refused("%s[%d] is a server tool (%q), run by the provider with the owner's key (gateway.NAME.allow_server_tools)", where, i, printable(typ))
		}
		if nested, ok := tool["tools"]; ok {
			inner := json.NewDecoder(bytes.NewReader(nested))
			inner.UseNumber()
			if err := p.checkOpenAITools(inner, where+"[].tools"); err != nil {
				return err
			}
		}
	}
	if _, err := dec.Token(); err != nil {
		return refused("%s: %s", where, oneLine(err))
	}
	return nil
}

// checkOpenAIInput reads a Responses input (a string or an item list) or a
// Chat messages list. Items that carry tools (Codex's additional_tools)
// are checked like the tools array; content parts the provider fetches
// (an image or file by URL, a file by id) need url_sources/file_sources.
func (p Policy) checkOpenAIInput(dec *json.Decoder, where string) error {
	var raw json.RawMessage
	if err := dec.Decode(&raw); err != nil {
		return refused("the request body is not JSON: %s", oneLine(err))
	}
	if !bytes.Contains(raw, []byte(`"tools"`)) && !bytes.Contains(raw, []byte(`_url"`)) && !bytes.Contains(raw, []byte(`"file_id"`)) && !bytes.Contains(raw, []byte(`\u00`)) {
		return nil // nothing in it can name tools or fetched sources
	}
	var items []map[string]json.RawMessage
	if json.Unmarshal(raw, &items) != nil {
		return nil // a plain string input
	}
	for i, it := range items {
		if tools, ok := it["tools"]; ok {
			inner := json.NewDecoder(bytes.NewReader(tools))
			inner.UseNumber()
			if err := p.checkOpenAITools(inner, where+"[].tools"); err != nil {
				return err
			}
		}
		if err := p.checkOpenAIParts(it, where, i); err != nil {
			return err
		}
		if content, ok := it["content"]; ok {
			var parts []map[string]json.RawMessage
			if json.Unmarshal(content, &parts) == nil {
				for _, part := range parts {
					if err := p.checkOpenAIParts(part, where, i); err != nil {
						return err
					}
				}
			}
		}
	}
	return nil
}

// checkOpenAIParts refuses a content part the provider fetches itself.
func (p Policy) checkOpenAIParts(part map[string]json.RawMessage, where string, i int) error {
	for _, k := range []string{"image_url", "file_url"} {
		v, ok := part[k]
		if !ok {
			continue
		}
		var s string
		if json.Unmarshal(v, &s) != nil {
			// Chat Completions: {"image_url": {"url": "..."}}.
			var o struct {
				URL string `json:"url"`
			}
			_ = json.Unmarshal(v, &o)
			s = o.URL
		}
		if !strings.HasPrefix(s, "data:") && !p.allowsServer("url_sources") {
			return refused("%s[%d]: a %s the provider fetches with the owner's key (gateway.NAME.allow_server_tools = [\"url_sources\"])", where, i, k)
		}
	}
	if v, ok := part["file_id"]; ok && string(v) != "null" && !p.allowsServer("file_sources") {
		return refused("%s[%d]: a file of the owner's account (gateway.NAME.allow_server_tools = [\"file_sources\"])", where, i)
	}
	return nil
}

// openaiUsage is the part of a Responses or Chat Completions answer (or
// stream event) that carries usage.
type openaiUsage struct {
	Type     string   `json:"type"`
	Object   string   `json:"object"`
	Model    string   `json:"model"`
	Usage    *oaUsage `json:"usage"`
	Response *struct {
		Model string   `json:"model"`
		Usage *oaUsage `json:"usage"`
	} `json:"response"`
}

type oaUsage struct {
	InputTokens        int64 `json:"input_tokens"`
	OutputTokens       int64 `json:"output_tokens"`
	PromptTokens       int64 `json:"prompt_tokens"`
	CompletionTokens   int64 `json:"completion_tokens"`
	InputTokensDetails *struct {
		CachedTokens int64 `json:"cached_tokens"`
	} `json:"input_tokens_details"`
	PromptTokensDetails *struct {
		CachedTokens int64 `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

// recordOpenAI adds the usage in one answer or stream event: a Responses
// stream reports it once, in response.completed (or .incomplete/.failed);
// a Chat stream in its last chunk; a plain answer at its top level.
func (g *Gateway) recordOpenAI(data []byte, stream bool) {
	var f openaiUsage
	if len(data) == 0 || json.Unmarshal(data, &f) != nil {
		return
	}
	model, u := f.Model, f.Usage
	switch {
	case stream && strings.HasPrefix(f.Type, "response.") && f.Response != nil:
		if f.Type != "response.completed" && f.Type != "response.incomplete" && f.Type != "response.failed" {
			return
		}
		model, u = f.Response.Model, f.Response.Usage
	case stream && f.Object == "chat.completion.chunk":
	case !stream && (f.Object == "response" || f.Object == "chat.completion" || f.Object == "response.compaction"):
	default:
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.addModel(model)
	if u == nil {
		return
	}
	g.usage.InputTokens += u.InputTokens + u.PromptTokens
	g.usage.OutputTokens += u.OutputTokens + u.CompletionTokens
	if u.InputTokensDetails != nil {
		g.usage.CacheReadTokens += u.InputTokensDetails.CachedTokens
	}
	if u.PromptTokensDetails != nil {
		g.usage.CacheReadTokens += u.PromptTokensDetails.CachedTokens
	}
}

// openaiError writes an error in the OpenAI API's shape.
func openaiError(w http.ResponseWriter, status int, typ, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{"type": typ, "message": msg, "code": nil, "param": nil}})
}
