package gateway

import (
	"bytes"
	"encoding/json"
	"io"
	"testing"
)

// FuzzUsageReader: whatever the upstream sends, in whatever chunks, the
// agent gets exactly those bytes, and counting never panics or goes
// negative.
func FuzzUsageReader(f *testing.F) {
	f.Add([]byte("event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"model\":\"m\",\"usage\":{\"input_tokens\":3,\"output_tokens\":1}}}\n\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":7}}\n\n"), uint8(5), true)
	f.Add([]byte(`{"type":"message","model":"m","usage":{"input_tokens":1,"output_tokens":2}}`), uint8(3), false)
	f.Add([]byte("data: {\"usage\":{\"output_tokens\":-5},\"type\":\"message_delta\"}\n"), uint8(1), true)
	f.Add([]byte("data:"), uint8(0), true)
	f.Fuzz(func(t *testing.T, body []byte, chunk uint8, sse bool) {
		g := &Gateway{usage: Usage{Models: []string{}}}
		r := &usageReader{body: io.NopCloser(&chunked{b: body, n: int(chunk)%64 + 1}), g: g, sse: sse, length: -1}
		out, err := io.ReadAll(r)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(out, body) {
			t.Fatalf("the gateway changed the answer: %q != %q", out, body)
		}
		u := g.Usage()
		if u.OutputTokens < 0 && sse {
			t.Fatalf("negative output count from a stream: %+v", u)
		}
		if len(u.Models) > 32 {
			t.Fatalf("unbounded model list: %d", len(u.Models))
		}
	})
}

// fetched reports whether v holds a source of type url or file outside a
// tool input.
func fetched(v any) bool {
	switch v := v.(type) {
	case []any:
		for _, e := range v {
			if fetched(e) {
				return true
			}
		}
	case map[string]any:
		for k, e := range v {
			if k == "input" {
				continue
			}
			if src, ok := e.(map[string]any); ok && k == "source" && (src["type"] == "url" || src["type"] == "file") {
				return true
			}
			if fetched(e) {
				return true
			}
		}
	}
	return false
}

// chunked reads b in pieces of n bytes.
type chunked struct {
	b []byte
	n int
}

func (c *chunked) Read(p []byte) (int, error) {
	if len(c.b) == 0 {
		return 0, io.EOF
	}
	n := min(c.n, len(p), len(c.b))
	copy(p, c.b[:n])
	c.b = c.b[n:]
	return n, nil
}

// FuzzCheckBody: whatever the agent sends, the request check never panics,
// and a body it accepts is one JSON object in which a generic decoder (the
// provider's view, exact keys) finds no mcp_servers, no container and no
// tool with a type other than "custom".
func FuzzCheckBody(f *testing.F) {
	for _, c := range serverSide {
		f.Add([]byte(c.body))
	}
	f.Add([]byte(`{"model":"m","tools":[{"name":"a"}],"tools":[{"type":"web_fetch_20250910"}]}`))
	f.Add([]byte(`{"tools":[{"type":"custom","Type":"web_search_20250305"}]}`))
	f.Add([]byte(`{"mcp\u005fservers":[]}`))
	f.Add([]byte(`{"tools":[{"name":"Bash","input_schema":{"type":"object"}}],"messages":[{"role":"user","content":"{\"mcp_servers\":1}"}]}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		if (Policy{}).checkBody(body) != nil {
			return
		}
		var top map[string]any
		if err := json.Unmarshal(body, &top); err != nil {
			t.Fatalf("accepted a body that is not one JSON object: %v", err)
		}
		for _, k := range []string{"mcp_servers", "container"} {
			if _, ok := top[k]; ok {
				t.Fatalf("accepted %s", k)
			}
		}
		for _, k := range []string{"messages", "system"} {
			if fetched(top[k]) {
				t.Fatalf("accepted a content block the provider fetches: %s", body)
			}
		}
		tools, _ := top["tools"].([]any)
		for _, tl := range tools {
			m, _ := tl.(map[string]any)
			if ty, ok := m["type"]; ok && ty != "custom" {
				t.Fatalf("accepted a tool of type %v", ty)
			}
		}
	})
}
