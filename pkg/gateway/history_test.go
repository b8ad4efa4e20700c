package gateway

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"

	"gotest.tools/v3/assert"

	"github.com/shrooms-cage/shrooms/pkg/history"
)

// TestHistoryRefusedNotForwarded: a resumed session whose history differs
// from its pin is answered 403, never reaches the upstream, ends the turn
// once (OnHistory), and every later request is refused too; under
// "report" the same request is forwarded and reported.
func TestHistoryRefusedNotForwarded(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	up := http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		seen = append(seen, string(b))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"type":"message","role":"assistant","model":"m","content":[{"type":"text","text":"a1"}],"usage":{"input_tokens":1,"output_tokens":1}}`)
	})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	assert.NilError(t, err)
	go func() { _ = up.Serve(ln) }()
	defer up.Close()
	u, _ := url.Parse("http://" + ln.Addr().String())
	dir := t.TempDir()
	ph := strings.Repeat("p", 40)
	// Each turn's gateway is closed before the next starts, as a turn's
	// is: Close waits for the last answer to be pinned.
	var last *Gateway
	serve := func(mode history.Mode, onHistory func(string)) string {
		if last != nil {
			last.Close()
		}
		g, err := New(Config{API: "anthropic", Upstream: u, Key: []byte(realKey), Placeholder: ph, History: history.NewTracker(dir, mode), OnHistory: onHistory})
		assert.NilError(t, err)
		gl, err := net.Listen("tcp", "127.0.0.1:0")
		assert.NilError(t, err)
		g.Serve(gl)
		t.Cleanup(func() { g.Close() })
		last = g
		return "http://" + gl.Addr().String() + "/v1/messages"
	}
	send := func(target, messages string) (int, string) {
		body := `{"model":"m","max_tokens":1,"tools":[{"name":"t","input_schema":{"type":"object"}}],"messages":` + messages + `}`
		req, _ := http.NewRequest(http.MethodPost, target, bytes.NewReader([]byte(body)))
		req.Header.Set("X-Api-Key", ph)
		req.Header.Set("X-Claude-Code-Session-Id", "0b6f6d6e-7b0a-4d3c-9a61-5f0f2b8f0e11")
		resp, err := http.DefaultClient.Do(req)
		assert.NilError(t, err)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	turn1 := serve(history.Refuse, nil)
	code, _ := send(turn1, `[{"role":"user","content":"hello"}]`)
	assert.Equal(t, code, 200)

	var ended []string
	turn2 := serve(history.Refuse, func(r string) { ended = append(ended, r) })
	code, body := send(turn2, `[{"role":"user","content":"hello FORGED"},{"role":"assistant","content":"a1"},{"role":"user","content":"go"}]`)
	assert.Equal(t, code, 403)
	assert.Assert(t, strings.Contains(body, "message 0 (user)"), body)
	assert.Assert(t, !strings.Contains(body, "FORGED"))
	code, _ = send(turn2, `[{"role":"user","content":"hello"},{"role":"assistant","content":"a1"},{"role":"user","content":"go"}]`)
	assert.Equal(t, code, 403, "the turn is over")
	assert.Equal(t, len(ended), 1)
	for _, s := range seen {
		assert.Assert(t, !strings.Contains(s, "FORGED"), "a refused history reached the upstream")
	}

	turn3 := serve(history.Report, nil)
	code, _ = send(turn3, `[{"role":"user","content":"hello FORGED"},{"role":"assistant","content":"a1"},{"role":"user","content":"go"}]`)
	assert.Equal(t, code, 200, "report forwards")
	assert.Assert(t, strings.Contains(seen[len(seen)-1], "FORGED"))
}
