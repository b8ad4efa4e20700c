package modelapi

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
)

// geminiRequest is the part of a Gemini API generateContent request the
// server reads.
type geminiRequest struct {
	Contents []json.RawMessage `json:"contents"`
	Tools    []struct {
		FunctionDeclarations []json.RawMessage `json:"functionDeclarations"`
	} `json:"tools"`
}

func (r *geminiRequest) offersTools() bool {
	for _, t := range r.Tools {
		if len(t.FunctionDeclarations) > 0 {
			return true
		}
	}
	return false
}

// geminiModel is the model a /v1beta/models/MODEL:method path names.
func geminiModel(path string) (model, method string) {
	rest := path[strings.Index(path, "/models/")+len("/models/"):]
	model, method, _ = strings.Cut(rest, ":")
	return model, method
}

// serveGemini answers generateContent and streamGenerateContent with the
// next script step (SSE with alt=sse, else a JSON array of chunks), and
// countTokens with a count.
func (s *Server) serveGemini(w http.ResponseWriter, req *http.Request, rec Request) {
	model, method := geminiModel(req.URL.Path)
	if method == "countTokens" {
		s.record(rec)
		writeJSON(w, map[string]any{"totalTokens": 1 + len(rec.Body)/4})
		return
	}
	var gr geminiRequest
	if err := json.Unmarshal(rec.Body, &gr); err != nil {
		s.record(rec)
		geminiError(w, http.StatusBadRequest, "body is not a Gemini API request: "+err.Error())
		return
	}
	rec.Stream = method == "streamGenerateContent"
	step := Text(SideText)
	if gr.offersTools() {
		step, rec.Step = s.take()
	}
	s.record(rec)
	n := len(s.Requests())
	switch {
	case rec.Stream && req.URL.Query().Get("alt") == "sse":
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		f, _ := w.(http.Flusher)
		for _, c := range geminiChunks(n, model, step) {
			b, _ := json.Marshal(c)
			fmt.Fprintf(w, "data: %s\r\n\r\n", b)
			if f != nil {
				f.Flush()
			}
		}
	case rec.Stream:
		writeJSON(w, geminiChunks(n, model, step))
	default:
		writeJSON(w, geminiAnswer(n, model, step.geminiParts(n), "STOP", true))
	}
}

// geminiParts are a step's content parts: its text, then a function call.
func (st Step) geminiParts(n int) []any {
	var parts []any
	if st.Text != "" {
		parts = append(parts, map[string]any{"text": st.Text})
	}
	if st.Tool != "" {
		parts = append(parts, map[string]any{"functionCall": map[string]any{
			"id": fmt.Sprintf("call_scripted_%d", n), "name": st.Tool, "args": st.input(),
		}})
	}
	return parts
}

// geminiAnswer is one GenerateContentResponse (or stream chunk).
func geminiAnswer(n int, model string, parts []any, finish string, withUsage bool) map[string]any {
	cand := map[string]any{"content": map[string]any{"role": "model", "parts": parts}, "index": 0}
	if finish != "" {
		cand["finishReason"] = finish
	}
	a := map[string]any{"candidates": []any{cand}, "modelVersion": model, "responseId": fmt.Sprintf("resp_scripted_%d", n)}
	if withUsage {
		a["usageMetadata"] = map[string]any{"promptTokenCount": 10, "candidatesTokenCount": 5, "totalTokenCount": 15}
	}
	return a
}

// geminiChunks split the answer as the API streams it: the text first,
// then the function call with the finish reason and the usage.
func geminiChunks(n int, model string, st Step) []map[string]any {
	parts := st.geminiParts(n)
	if len(parts) < 2 {
		return []map[string]any{geminiAnswer(n, model, parts, "STOP", true)}
	}
	return []map[string]any{geminiAnswer(n, model, parts[:1], "", false), geminiAnswer(n, model, parts[1:], "STOP", true)}
}

func geminiError(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	b, _ := json.Marshal(map[string]any{"error": map[string]any{"code": code, "message": msg, "status": "INVALID_ARGUMENT"}})
	_, _ = w.Write(b)
}
