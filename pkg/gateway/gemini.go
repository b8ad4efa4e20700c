package gateway

import (
	"bytes"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
)

// The Gemini API as Gemini CLI uses it: POST
// /v1beta/models/MODEL:generateContent, :streamGenerateContent (SSE with
// alt=sse, else a JSON array of chunks) and :countTokens, and GET
// /v1beta/models[/MODEL]. Everything else (files, cached contents, tuned
// models, batches, the Live API) is refused with 403.

// geminiMethods are the model methods the gateway forwards.
var geminiMethods = map[string]bool{"generateContent": true, "streamGenerateContent": true, "countTokens": true}

// geminiAllowed reports whether method and p (cleaned) are a Gemini API
// path the gateway forwards.
func geminiAllowed(method, p string) bool {
	for _, v := range []string{"/v1beta/models", "/v1/models"} {
		rest, ok := strings.CutPrefix(p, v)
		switch {
		case !ok:
			continue
		case method == http.MethodGet:
			return rest == "" || strings.HasPrefix(rest, "/") && !strings.ContainsAny(rest[1:], "/:")
		case method == http.MethodPost && strings.HasPrefix(rest, "/"):
			model, m, found := strings.Cut(rest[1:], ":")
			return found && model != "" && !strings.Contains(model, "/") && geminiMethods[m]
		}
	}
	return false
}

// geminiAuthorized checks the placeholder in x-goog-api-key or the key
// query parameter (never both).
func geminiAuthorized(r *http.Request, want []byte) bool {
	h, q := r.Header.Get("X-Goog-Api-Key"), r.URL.Query()["key"]
	switch {
	case h != "" && len(q) == 0:
		return subtle.ConstantTimeCompare([]byte(h), want) == 1
	case h == "" && len(q) == 1:
		return subtle.ConstantTimeCompare([]byte(q[0]), want) == 1
	}
	return false
}

// geminiClientTools are the tool kinds the client runs (function
// declarations: Gemini CLI's own tools). Google Search grounding, URL
// context, code execution, computer use, file search, Maps and any kind not
// known are run by the provider, and refused unless allow_server_tools
// lists them.
var geminiClientTools = map[string]bool{"functionDeclarations": true}

// checkGeminiBody refuses a generateContent or countTokens request that
// asks the provider to act on its side (server tools, cached contents,
// files by URI) unless the policy allows it, and any body it cannot read
// as one JSON object.
func (p Policy) checkGeminiBody(body []byte) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	err := object(dec, func(key string) error {
		switch key {
		case "tools":
			return p.checkGeminiTools(dec)
		case "cachedContent":
			return p.refuseNonNull(dec, key, "stored_prompts")
		case "contents", "generateContentRequest":
			var raw json.RawMessage
			if err := dec.Decode(&raw); err != nil {
				return refused("%s: %s", key, oneLine(err))
			}
			if bytes.Contains(raw, []byte(`"fileUri"`)) || bytes.Contains(raw, []byte(`file_uri`)) || bytes.Contains(raw, []byte(`\u00`)) {
				if !p.allowsServer("url_sources") {
					return refused("%s: a file by URI the provider fetches with the owner's key (gateway.NAME.allow_server_tools = [\"url_sources\"])", key)
				}
			}
			if key == "generateContentRequest" {
				return p.checkGeminiBody(raw)
			}
			return nil
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

// checkGeminiTools reads a tools array: each entry may hold only client
// tool kinds, or server tools the policy allows.
func (p Policy) checkGeminiTools(dec *json.Decoder) error {
	var tools []map[string]json.RawMessage
	if err := dec.Decode(&tools); err != nil {
		return refused("tools is not an array of objects: %s", oneLine(err))
	}
	for i, tool := range tools {
		for kind, v := range tool {
			if geminiClientTools[kind] || string(v) == "null" || p.allowsServer(kind) {
				continue
			}
			return refused("tools[%d] is a server tool (%q), run by the provider with the owner's key (gateway.NAME.allow_server_tools)", i, printable(kind))
		}
	}
	return nil
}

// geminiUsage is the part of a Gemini answer (or stream chunk) that carries
// usage.
type geminiUsage struct {
	ModelVersion  string `json:"modelVersion"`
	UsageMetadata *struct {
		PromptTokenCount        int64 `json:"promptTokenCount"`
		CandidatesTokenCount    int64 `json:"candidatesTokenCount"`
		ThoughtsTokenCount      int64 `json:"thoughtsTokenCount"`
		CachedContentTokenCount int64 `json:"cachedContentTokenCount"`
	} `json:"usageMetadata"`
}

// recordGemini adds the usage of one answer, one SSE chunk, or a JSON
// array of chunks. A stream's chunks carry running totals: only the last
// chunk's count is added (the caller passes each chunk, so the previous
// totals are subtracted through last).
func (g *Gateway) recordGemini(data []byte, last *geminiUsage) {
	data = bytes.TrimSpace(data)
	if len(data) > 0 && data[0] == '[' {
		var chunks []json.RawMessage
		if json.Unmarshal(data, &chunks) != nil {
			return
		}
		var prev geminiUsage
		for _, c := range chunks {
			g.recordGemini(c, &prev)
		}
		return
	}
	var f geminiUsage
	if len(data) == 0 || json.Unmarshal(data, &f) != nil {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.addModel(f.ModelVersion)
	u := f.UsageMetadata
	if u == nil {
		return
	}
	in, out, cached := u.PromptTokenCount, u.CandidatesTokenCount+u.ThoughtsTokenCount, u.CachedContentTokenCount
	if last != nil && last.UsageMetadata != nil {
		l := last.UsageMetadata
		in -= l.PromptTokenCount
		out -= l.CandidatesTokenCount + l.ThoughtsTokenCount
		cached -= l.CachedContentTokenCount
	}
	g.usage.InputTokens += max(0, in)
	g.usage.OutputTokens += max(0, out)
	g.usage.CacheReadTokens += max(0, cached)
	if last != nil {
		*last = f
	}
}

// geminiError writes an error in the Gemini API's shape.
func geminiError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	st := map[int]string{401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 429: "RESOURCE_EXHAUSTED", 400: "INVALID_ARGUMENT"}[status]
	if st == "" {
		st = "UNAVAILABLE"
	}
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{"code": status, "message": msg, "status": st}})
}
