package gateway

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
)

// benchUpstream serves a streamed Messages answer: a message_start event,
// then size bytes of content_block_delta events, then message_stop.
func benchUpstream(b *testing.B, size int) string {
	b.Helper()
	chunk := "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"" + strings.Repeat("x", 900) + "\"}}\n\n"
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"model\":\"m\",\"usage\":{\"input_tokens\":1,\"output_tokens\":1}}}\n\n")
		w.(http.Flusher).Flush()
		for n := 0; n < size; n += len(chunk) {
			fmt.Fprint(w, chunk)
		}
		fmt.Fprint(w, "event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":99}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n")
	})}
	go func() { _ = srv.Serve(ln) }()
	b.Cleanup(func() { srv.Close() })
	return "http://" + ln.Addr().String()
}

// benchTarget returns the URL to call and the key: the upstream itself
// (direct) or a gateway in front of it.
func benchTarget(b *testing.B, upstream string, viaGateway bool) (string, string) {
	b.Helper()
	if !viaGateway {
		return upstream, realKey
	}
	u, _ := url.Parse(upstream)
	ph, _ := NewPlaceholder()
	g, err := New(Config{API: "anthropic", Upstream: u, Key: []byte(realKey), Placeholder: ph})
	if err != nil {
		b.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	g.Serve(ln)
	b.Cleanup(func() { g.Close() })
	return "http://" + ln.Addr().String(), ph
}

func benchRequest(b *testing.B, client *http.Client, target, key string, firstByteOnly bool) int64 {
	req, _ := http.NewRequest(http.MethodPost, target+"/v1/messages", strings.NewReader(`{"model":"m","stream":true,"max_tokens":1,"messages":[]}`))
	req.Header.Set("X-Api-Key", key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	if firstByteOnly {
		if _, err := bufio.NewReader(resp.Body).ReadByte(); err != nil {
			b.Fatal(err)
		}
		return 1
	}
	n, err := io.Copy(io.Discard, resp.Body)
	if err != nil {
		b.Fatal(err)
	}
	return n
}

// BenchmarkFirstByte: from sending a streamed request to its first byte,
// direct to the upstream vs through the gateway (same upstream, one run).
func BenchmarkFirstByte(b *testing.B) {
	up := benchUpstream(b, 1<<20)
	for _, via := range []bool{false, true} {
		name := map[bool]string{false: "direct", true: "gateway"}[via]
		b.Run(name, func(b *testing.B) {
			target, key := benchTarget(b, up, via)
			client := &http.Client{Transport: &http.Transport{}}
			for i := 0; i < b.N; i++ {
				benchRequest(b, client, target, key, true)
			}
		})
	}
}

// BenchmarkStream64MiB: a 64 MiB streamed answer read whole, direct vs
// through the gateway (which also parses every event for usage).
func BenchmarkStream64MiB(b *testing.B) {
	up := benchUpstream(b, 64<<20)
	for _, via := range []bool{false, true} {
		name := map[bool]string{false: "direct", true: "gateway"}[via]
		b.Run(name, func(b *testing.B) {
			target, key := benchTarget(b, up, via)
			client := &http.Client{Transport: &http.Transport{}}
			var n int64
			for i := 0; i < b.N; i++ {
				n = benchRequest(b, client, target, key, false)
			}
			b.SetBytes(n)
		})
	}
}

// benchBody is a Messages request of about size bytes shaped like an agent
// turn's: a long history of text and tool results, and a dozen tools.
// With images, each tool result has a small base64 image (a "source" key):
// the check then walks the content blocks. Tool output has terminal
// colours (\u001b escapes) either way.
func benchBody(size int, images bool) []byte {
	var b strings.Builder
	b.WriteString(`{"model":"m","max_tokens":1,"stream":false,"tools":[`)
	for i := 0; i < 12; i++ {
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, `{"name":"tool%d","description":"%s","input_schema":{"type":"object","properties":{"command":{"type":"string"}}}}`, i, strings.Repeat("d", 2000))
	}
	b.WriteString(`],"messages":[`)
	line := `line of output \"quoted\" é \u001b[31mred\u001b[0m\n`
	image := ""
	if images {
		image = `,{"type":"image","source":{"type":"base64","media_type":"image/png","data":"` + strings.Repeat("iVBORw0KGgo", 20) + `"}}`
	}
	msg := `{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":"` + strings.Repeat(line, 100) + `"}` + image + `]},` +
		`{"role":"assistant","content":[{"type":"text","text":"` + strings.Repeat("word ", 200) + `"},{"type":"tool_use","id":"t","name":"tool1","input":{"command":"ls -la"}}]}`
	for first := true; b.Len() < size; first = false {
		if !first {
			b.WriteString(",")
		}
		b.WriteString(msg)
	}
	b.WriteString(`]}`)
	return []byte(b.String())
}

// BenchmarkRequestCheck: a 1 MiB and a 20 MiB request sent through the
// gateway, with its body check and without (the same gateway, reading the
// body whole either way), and the check alone.
func BenchmarkRequestCheck(b *testing.B) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"type":"message","model":"m","usage":{"input_tokens":1,"output_tokens":1}}`)
	})}
	go func() { _ = srv.Serve(ln) }()
	b.Cleanup(func() { srv.Close() })
	u, _ := url.Parse("http://" + ln.Addr().String())
	for _, c := range []struct {
		size   int
		images bool
	}{{1 << 20, false}, {1 << 20, true}, {20 << 20, false}, {20 << 20, true}} {
		size := c.size
		body := benchBody(size, c.images)
		kind := map[bool]string{false: "text", true: "images"}[c.images]
		if err := (Policy{}).checkBody(body); err != nil {
			b.Fatal(err)
		}
		for _, check := range []bool{false, true} {
			name := fmt.Sprintf("%dMiB-%s/forward", size>>20, kind)
			if check {
				name += "+check"
			}
			b.Run(name, func(b *testing.B) {
				ph, _ := NewPlaceholder()
				g, err := New(Config{API: "anthropic", Upstream: u, Key: []byte(realKey), Placeholder: ph})
				if err != nil {
					b.Fatal(err)
				}
				g.noBodyCheck = !check
				gl, err := net.Listen("tcp", "127.0.0.1:0")
				if err != nil {
					b.Fatal(err)
				}
				g.Serve(gl)
				b.Cleanup(func() { g.Close() })
				client := &http.Client{Transport: &http.Transport{}}
				b.SetBytes(int64(len(body)))
				for i := 0; i < b.N; i++ {
					req, _ := http.NewRequest(http.MethodPost, "http://"+gl.Addr().String()+"/v1/messages", bytes.NewReader(body))
					req.Header.Set("X-Api-Key", ph)
					resp, err := client.Do(req)
					if err != nil {
						b.Fatal(err)
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != 200 {
						b.Fatalf("status %d", resp.StatusCode)
					}
				}
			})
		}
		b.Run(fmt.Sprintf("%dMiB-%s/check-only", size>>20, kind), func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			for i := 0; i < b.N; i++ {
				if err := (Policy{}).checkBody(body); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// benchResponsesUpstream serves a streamed Responses answer: created, size
// bytes of output_text.delta events, then completed with usage.
func benchResponsesUpstream(b *testing.B, size int) string {
	b.Helper()
	chunk := "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"output_index\":0,\"content_index\":0,\"delta\":\"" + strings.Repeat("x", 900) + "\"}\n\n"
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"model\":\"m\",\"usage\":null}}\n\n")
		w.(http.Flusher).Flush()
		for n := 0; n < size; n += len(chunk) {
			fmt.Fprint(w, chunk)
		}
		fmt.Fprint(w, "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"model\":\"m\",\"usage\":{\"input_tokens\":1,\"output_tokens\":99}}}\n\n")
	})}
	go func() { _ = srv.Serve(ln) }()
	b.Cleanup(func() { srv.Close() })
	return "http://" + ln.Addr().String()
}

// benchResponsesRequest posts a streamed Responses request (through an
// "openai" gateway when viaGateway) and reads its first byte or all of it.
func benchResponses(b *testing.B, size int, firstByteOnly bool) {
	up := benchResponsesUpstream(b, size)
	for _, via := range []bool{false, true} {
		name := map[bool]string{false: "direct", true: "gateway"}[via]
		b.Run(name, func(b *testing.B) {
			target, key := up, realKey
			if via {
				u, _ := url.Parse(up)
				ph, _ := NewPlaceholder()
				g, err := New(Config{API: "openai", Upstream: u, Key: []byte(realKey), Placeholder: ph})
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
				req, _ := http.NewRequest(http.MethodPost, target+"/v1/responses", strings.NewReader(`{"model":"m","stream":true,"input":"hi","tools":[{"type":"function","name":"exec_command"}]}`))
				req.Header.Set("Authorization", "Bearer "+key)
				req.Header.Set("Content-Type", "application/json")
				resp, err := client.Do(req)
				if err != nil {
					b.Fatal(err)
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

// BenchmarkResponsesFirstByte: the Responses API's first byte, direct vs
// through an "openai" gateway (same upstream, one run).
func BenchmarkResponsesFirstByte(b *testing.B) { benchResponses(b, 1<<20, true) }

// BenchmarkResponsesStream64MiB: a 64 MiB streamed Responses answer read
// whole, direct vs through the gateway (which scans it for usage).
func BenchmarkResponsesStream64MiB(b *testing.B) { benchResponses(b, 64<<20, false) }
