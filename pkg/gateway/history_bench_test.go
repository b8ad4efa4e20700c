package gateway

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/shrooms-cage/shrooms/pkg/history"
)

// historyConversation is an agent's growing conversation of about size
// bytes: each request is the last one, the answer to it and a new user
// message, with the cache mark moved to the newest message (as Claude
// Code does).
type historyConversation struct {
	msgs [][]byte
	n    int
}

func newHistoryConversation(size int) *historyConversation {
	line := `line of output \"quoted\" é \u001b[31mred\u001b[0m\n`
	c := &historyConversation{}
	for total := 0; total < size; {
		i := len(c.msgs)
		u := fmt.Sprintf(`{"role":"user","content":[{"type":"tool_result","tool_use_id":"t%d","content":"%s"}]}`, i, strings.Repeat(line, 100))
		a := fmt.Sprintf(`{"role":"assistant","content":[{"type":"text","text":"%s"},{"type":"tool_use","id":"t%d","name":"tool1","input":{"command":"ls -la"}}]}`, strings.Repeat("word ", 200), i+1)
		c.msgs = append(c.msgs, []byte(u), []byte(a))
		total += len(u) + len(a)
	}
	c.msgs = append(c.msgs, []byte(`{"role":"user","content":[{"type":"text","text":"go","cache_control":{"type":"ephemeral"}}]}`))
	return c
}

// body is the next request; answered appends the answer the upstream
// gave and a new user message.
func (c *historyConversation) body() []byte {
	var b bytes.Buffer
	b.WriteString(`{"model":"m","max_tokens":1,"stream":false,"metadata":{"user_id":"u"},"tools":[{"name":"tool1","input_schema":{"type":"object"}}],"messages":[`)
	b.Write(bytes.Join(c.msgs, []byte(",")))
	b.WriteString(`]}`)
	return b.Bytes()
}

func (c *historyConversation) answered() {
	c.n++
	last := len(c.msgs) - 1
	c.msgs[last] = bytes.Replace(c.msgs[last], []byte(`,"cache_control":{"type":"ephemeral"}`), nil, 1)
	c.msgs = append(c.msgs, []byte(`{"role":"assistant","content":[{"type":"text","text":"ok"}]}`),
		[]byte(fmt.Sprintf(`{"role":"user","content":[{"type":"text","text":"next %d","cache_control":{"type":"ephemeral"}}]}`, c.n)))
}

// BenchmarkHistoryPin: the conversation pin's added cost per request, on a
// 1 MiB and a 20 MiB history: the same gateway forwarding the same growing
// conversation (each request the last one plus the answer and a new
// message) with history off and with the pin, side by side; p50 of each
// request's round trip and the p50 added. "steady" requests follow one
// another in a turn; "first" is each a turn's first (a new tracker that
// loads the pin, as a new turn's gateway does, after the last turn's
// gateway closed and kept its last request); "first-hash" the same after
// a killed turn (nothing kept: the pin's raw digests).
func BenchmarkHistoryPin(b *testing.B) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"type":"message","role":"assistant","model":"m","content":[{"type":"text","text":"ok"}],"usage":{"input_tokens":1,"output_tokens":1}}`)
	})}
	go func() { _ = srv.Serve(ln) }()
	b.Cleanup(func() { srv.Close() })
	u, _ := url.Parse("http://" + ln.Addr().String())
	for _, size := range []int{1 << 20, 20 << 20} {
		for _, mode := range []string{"steady", "first", "first-hash"} {
			b.Run(fmt.Sprintf("%dMiB/%s", size>>20, mode), func(b *testing.B) {
				var targets [2]string
				var ph string
				var pinned *Gateway
				dir := b.TempDir()
				for i, pin := range []bool{false, true} {
					ph, _ = NewPlaceholder()
					cfg := Config{API: "anthropic", Upstream: u, Key: []byte(realKey), Placeholder: ph}
					if pin {
						// The first request pins the history (a session the
						// gateway has not seen may not start with one).
						cfg.History = history.NewTracker(dir, history.Report)
					}
					g, err := New(cfg)
					if err != nil {
						b.Fatal(err)
					}
					// One placeholder for both gateways.
					g.cfg.Placeholder = "benchmark-placeholder-0123456789abcdef"
					gl, err := net.Listen("tcp", "127.0.0.1:0")
					if err != nil {
						b.Fatal(err)
					}
					g.Serve(gl)
					b.Cleanup(func() { g.Close() })
					if pin {
						pinned = g
					}
					targets[i] = "http://" + gl.Addr().String() + "/v1/messages"
				}
				convs := [2]*historyConversation{newHistoryConversation(size), newHistoryConversation(size)}
				client := &http.Client{Transport: &http.Transport{}}
				var lat [2][]time.Duration
				send := func(i int) {
					body := convs[i].body()
					req, _ := http.NewRequest(http.MethodPost, targets[i], bytes.NewReader(body))
					req.Header.Set("X-Api-Key", "benchmark-placeholder-0123456789abcdef")
					req.Header.Set("X-Claude-Code-Session-Id", "bench-session")
					start := time.Now()
					resp, err := client.Do(req)
					if err != nil {
						b.Fatal(err)
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					lat[i] = append(lat[i], time.Since(start))
					if resp.StatusCode != 200 {
						b.Fatalf("status %d", resp.StatusCode)
					}
					convs[i].answered()
				}
				// The first request of each (the whole history canonicalised:
				// a turn's first) is not the steady state measured.
				send(0)
				send(1)
				pinned.cfg.History = history.NewTracker(dir, history.Refuse)
				send(0)
				send(1)
				lat = [2][]time.Duration{}
				b.ResetTimer()
				for n := 0; n < b.N; n++ {
					send(0)
					if mode != "steady" {
						// The last answer pinned, then a new turn's tracker.
						b.StopTimer()
						pinned.exchanges.Wait()
						if mode == "first" {
							_ = pinned.cfg.History.Close() // the turn ends
						}
						pinned.cfg.History = history.NewTracker(dir, history.Refuse)
						<-pinned.cfg.History.Preload() // as Serve does, while the cage starts
						// A new turn's gateway is a new process: the last
						// turn's garbage is not collected on its first
						// request.
						runtime.GC()
						b.StartTimer()
					}
					send(1)
				}
				b.StopTimer()
				if r := pinned.HistoryReports(); len(r) != 1 || r[0].Verdict != history.VerdictContinued {
					b.Fatalf("the pin did not follow the conversation: %+v", r)
				}
				p50 := func(d []time.Duration) float64 {
					s := slices.Clone(d)
					slices.Sort(s)
					return float64(s[len(s)/2].Microseconds()) / 1000
				}
				off, on := p50(lat[0]), p50(lat[1])
				b.ReportMetric(off, "p50-off-ms")
				b.ReportMetric(on, "p50-pin-ms")
				b.ReportMetric(on-off, "p50-added-ms")
				b.ReportMetric(on/off, "ratio")
			})
		}
	}
}
