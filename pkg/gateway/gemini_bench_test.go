package gateway

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
)

// benchGeminiUpstream serves a streamed generateContent answer (SSE):
// size bytes of text chunks, the last carrying usageMetadata.
func benchGeminiUpstream(b *testing.B, size int) string {
	b.Helper()
	chunk := `data: {"candidates":[{"content":{"role":"model","parts":[{"text":"` + strings.Repeat("x", 900) + `"}]}}],"modelVersion":"m"}` + "\r\n\r\n"
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, chunk)
		w.(http.Flusher).Flush()
		for n := len(chunk); n < size; n += len(chunk) {
			fmt.Fprint(w, chunk)
		}
		fmt.Fprint(w, `data: {"candidates":[{"content":{"role":"model","parts":[{"text":"."}]},"finishReason":"STOP"}],"usageMetadata":{"promptTokenCount":1,"candidatesTokenCount":99,"totalTokenCount":100},"modelVersion":"m"}`+"\r\n\r\n")
	})}
	go func() { _ = srv.Serve(ln) }()
	b.Cleanup(func() { srv.Close() })
	return "http://" + ln.Addr().String()
}

// benchGemini posts a streamed streamGenerateContent request (through a
// "gemini" gateway when viaGateway) and reads its first byte or all of it.
func benchGemini(b *testing.B, size int, firstByteOnly bool) {
	up := benchGeminiUpstream(b, size)
	for _, via := range []bool{false, true} {
		name := map[bool]string{false: "direct", true: "gateway"}[via]
		b.Run(name, func(b *testing.B) {
			target, key := up, realKey
			if via {
				u, _ := url.Parse(up)
				ph, _ := NewPlaceholder()
				g, err := New(Config{API: "gemini", Upstream: u, Key: []byte(realKey), Placeholder: ph})
				if err != nil {
					b.Fatal(err)
				}
				ln, err := net.Listen("tcp", "127.0.0.1:0")
				if err != nil {
					b.Fatal(err)
				}
				g.Serve(ln)
				b.Cleanup(func() { g.Close() })
				target, key = "http://"+ln.Addr().String(), ph
			}
			client := &http.Client{Transport: &http.Transport{}}
			var n int64
			for i := 0; i < b.N; i++ {
				req, _ := http.NewRequest(http.MethodPost, target+"/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse",
					strings.NewReader(`{"contents":[{"role":"user","parts":[{"text":"hi"}]}],"tools":[{"functionDeclarations":[{"name":"run_shell_command"}]}]}`))
				req.Header.Set("X-Goog-Api-Key", key)
				req.Header.Set("Content-Type", "application/json")
				resp, err := client.Do(req)
				if err != nil {
					b.Fatal(err)
				}
				if resp.StatusCode != http.StatusOK {
					body, _ := io.ReadAll(resp.Body)
					b.Fatalf("%s: %s %s", name, resp.Status, body)
				}
				if firstByteOnly {
					if _, err := bufio.NewReader(resp.Body).ReadByte(); err != nil {
						b.Fatal(err)
					}
					n = 1
				} else if n, err = io.Copy(io.Discard, resp.Body); err != nil {
					b.Fatal(err)
				}
				resp.Body.Close()
			}
			if !firstByteOnly {
				b.SetBytes(n)
			}
		})
	}
}

// BenchmarkGeminiFirstByte: the Gemini API's first streamed byte, direct
// vs through a "gemini" gateway (same upstream, one run).
func BenchmarkGeminiFirstByte(b *testing.B) { benchGemini(b, 1<<20, true) }

// BenchmarkGeminiStream64MiB: a 64 MiB streamed Gemini answer read whole,
// direct vs through the gateway (which scans it for usage).
func BenchmarkGeminiStream64MiB(b *testing.B) { benchGemini(b, 64<<20, false) }
