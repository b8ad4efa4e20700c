package gateway

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/shrooms-cage/shrooms/internal/modelapi"
)

const realKey = "sk-ant-REAL-KEY-never-in-the-cage"

// start runs a gateway on loopback in front of upstream.
func start(t *testing.T, upstream string, mod func(*Config)) (*Gateway, string, string) {
	t.Helper()
	u, err := url.Parse(upstream)
	assert.NilError(t, err)
	ph, err := NewPlaceholder()
	assert.NilError(t, err)
	cfg := Config{API: "anthropic", Upstream: u, Key: []byte(realKey), Placeholder: ph}
	if mod != nil {
		mod(&cfg)
	}
	g, err := New(cfg)
	assert.NilError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	assert.NilError(t, err)
	g.Serve(ln)
	t.Cleanup(func() { g.Close() })
	return g, "http://" + ln.Addr().String(), ph
}

func scripted(t *testing.T, steps ...modelapi.Step) (*modelapi.Server, string) {
	t.Helper()
	s := modelapi.New(steps...)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	assert.NilError(t, err)
	s.Serve(ln)
	t.Cleanup(func() { s.Close() })
	return s, "http://" + ln.Addr().String()
}

func post(t *testing.T, url, key string, stream bool) *http.Response {
	t.Helper()
	body := fmt.Sprintf(`{"model":"claude-test","max_tokens":10,"stream":%t,"messages":[{"role":"user","content":"hi"}],"tools":[{"name":"Bash","input_schema":{}}]}`, stream)
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	assert.NilError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("anthropic-version", "2023-06-01")
	if key != "" {
		req.Header.Set("X-Api-Key", key)
	}
	req.Header.Set("Cookie", "session=cage")
	resp, err := http.DefaultClient.Do(req)
	assert.NilError(t, err)
	return resp
}

func TestForwardsWithTheRealKeyAndCountsUsage(t *testing.T) {
	api, up := scripted(t, modelapi.Text("one"), modelapi.Text("two"))
	g, gw, ph := start(t, up, nil)

	resp := post(t, gw+"/v1/messages", ph, false)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, resp.StatusCode, 200, string(b))
	assert.Assert(t, is.Contains(string(b), `"one"`))

	resp = post(t, gw+"/v1/messages?beta=true", ph, true)
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, resp.StatusCode, 200, string(b))
	assert.Assert(t, is.Contains(string(b), "event: message_stop"))

	for _, r := range api.Requests() {
		assert.Equal(t, r.Header.Get("X-Api-Key"), realKey, "the upstream gets the real key")
		assert.Equal(t, r.Header.Get("Cookie"), "", "no cookie of the cage's reaches the upstream")
		for k, vs := range r.Header {
			for _, v := range vs {
				assert.Assert(t, !strings.Contains(v, ph), "the placeholder reached the upstream in %s", k)
			}
		}
		assert.Assert(t, !strings.Contains(string(r.Body), ph))
	}
	u := g.Usage()
	assert.Equal(t, u.Requests, int64(2))
	assert.Equal(t, u.InputTokens, int64(20))
	assert.Equal(t, u.OutputTokens, int64(10)) // 5 (JSON) + 1 at message_start + 4 more by message_delta
	assert.DeepEqual(t, u.Models, []string{"claude-test"})
}

func TestRefusesOtherCredentials(t *testing.T) {
	api, up := scripted(t)
	g, gw, _ := start(t, up, nil)
	other, err := NewPlaceholder() // another turn's or task's placeholder
	assert.NilError(t, err)
	for _, key := range []string{"", other, realKey, "sk-ant-shrooms-placeholder-"} {
		resp := post(t, gw+"/v1/messages", key, false)
		resp.Body.Close()
		assert.Equal(t, resp.StatusCode, http.StatusUnauthorized, "key %q", key)
	}
	// A bearer token is checked the same way.
	req, _ := http.NewRequest(http.MethodGet, gw+"/v1/models", nil)
	req.Header.Set("Authorization", "Bearer "+other)
	resp, err := http.DefaultClient.Do(req)
	assert.NilError(t, err)
	resp.Body.Close()
	assert.Equal(t, resp.StatusCode, http.StatusUnauthorized)
	assert.Equal(t, len(api.Requests()), 0, "nothing reached the upstream")
	assert.Equal(t, g.Usage().Refused, int64(5))
}

func TestRefusesPathsOutsideTheAPI(t *testing.T) {
	api, up := scripted(t)
	_, gw, ph := start(t, up, nil)
	for _, c := range []struct{ method, path string }{
		{http.MethodGet, "/v1/messages"},
		{http.MethodPost, "/v1/files"},
		{http.MethodPost, "/v1/messages/batches"},
		{http.MethodGet, "/api/oauth/profile"},
		{http.MethodPost, "/v1/models"},
		{http.MethodGet, "/v1/models/a/b"},
		{http.MethodPost, "/v1/messages/../../admin"},
		{http.MethodPost, "/v1/messages%2f..%2fadmin"},
	} {
		req, _ := http.NewRequest(c.method, gw+c.path, strings.NewReader("{}"))
		req.Header.Set("X-Api-Key", ph)
		resp, err := http.DefaultClient.Do(req)
		assert.NilError(t, err)
		resp.Body.Close()
		assert.Assert(t, resp.StatusCode == http.StatusForbidden || resp.StatusCode == http.StatusNotFound || resp.StatusCode == http.StatusMovedPermanently,
			"%s %s: %d", c.method, c.path, resp.StatusCode)
	}
	assert.Equal(t, len(api.Requests()), 0)
	// Positive control: an API path goes through.
	req, _ := http.NewRequest(http.MethodGet, gw+"/v1/models", nil)
	req.Header.Set("X-Api-Key", ph)
	resp, err := http.DefaultClient.Do(req)
	assert.NilError(t, err)
	resp.Body.Close()
	assert.Equal(t, resp.StatusCode, 200)
	assert.Equal(t, len(api.Requests()), 1)
}

// TestStreamsWithoutBuffering: the first event reaches the client while
// the upstream still holds the stream open.
func TestStreamsWithoutBuffering(t *testing.T) {
	release := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"model\":\"m\",\"usage\":{\"input_tokens\":7,\"output_tokens\":1}}}\n\n")
		w.(http.Flusher).Flush()
		<-release
		fmt.Fprint(w, "event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":9}}\n\n")
	}))
	defer up.Close()
	defer func() {
		select {
		case <-release:
		default:
			close(release)
		}
	}()
	g, gw, ph := start(t, up.URL, nil)
	resp := post(t, gw+"/v1/messages", ph, true)
	defer resp.Body.Close()
	got := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(resp.Body).ReadString('\n')
		got <- line
	}()
	select {
	case line := <-got:
		assert.Equal(t, line, "event: message_start\n")
	case <-time.After(5 * time.Second):
		t.Fatal("the first event was held back by the gateway")
	}
	close(release)
	_, _ = io.ReadAll(resp.Body)
	assert.Equal(t, g.Usage().OutputTokens, int64(9))
	assert.Equal(t, g.Usage().InputTokens, int64(7))
}

func TestLimitsEndTheTurn(t *testing.T) {
	_, up := scripted(t, modelapi.Text("a"), modelapi.Text("b"), modelapi.Text("c"))
	var calls atomic.Int32
	var reason atomic.Value
	g, gw, ph := start(t, up, func(c *Config) {
		c.MaxRequests = 2
		c.OnLimit = func(r string) { calls.Add(1); reason.Store(r) }
	})
	for i, want := range []int{200, 200, 429, 429} {
		resp := post(t, gw+"/v1/messages", ph, false)
		_, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		assert.Equal(t, resp.StatusCode, want, "request %d", i)
	}
	assert.Equal(t, calls.Load(), int32(1))
	assert.Assert(t, is.Contains(reason.Load().(string), "limit of 2 model requests"))
	assert.Assert(t, is.Contains(g.Usage().Limit, "limit of 2 model requests"))

	_, up2 := scripted(t, modelapi.Text("a"), modelapi.Text("b"))
	g2, gw2, ph2 := start(t, up2, func(c *Config) { c.MaxOutputTokens = 5 })
	for i, want := range []int{200, 429} {
		resp := post(t, gw2+"/v1/messages", ph2, false)
		_, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		assert.Equal(t, resp.StatusCode, want, "request %d", i)
		// The proxy may read the answer's end just after the client has it.
		for j := 0; j < 100 && g2.Usage().OutputTokens < 5; j++ {
			time.Sleep(5 * time.Millisecond)
		}
	}
	assert.Assert(t, is.Contains(g2.Usage().Limit, "output tokens"))
}

func TestUpstreamUnreachable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	assert.NilError(t, err)
	addr := ln.Addr().String()
	ln.Close()
	u, _ := url.Parse("http://" + addr)
	err = Preflight(context.Background(), u)
	assert.ErrorContains(t, err, "is unreachable")
	_, gw, ph := start(t, "http://"+addr, nil)
	resp := post(t, gw+"/v1/messages", ph, false)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, resp.StatusCode, http.StatusBadGateway)
	assert.Assert(t, is.Contains(string(b), "upstream unreachable"))
	assert.Assert(t, !strings.Contains(string(b), realKey))
}

func TestUpstreamPathPrefix(t *testing.T) {
	var seen atomic.Value
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen.Store(r.URL.Path + "?" + r.URL.RawQuery)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"type":"message","model":"m","usage":{"input_tokens":1,"output_tokens":2}}`)
	}))
	defer up.Close()
	_, gw, ph := start(t, up.URL+"/proxy/anthropic/", nil)
	resp := post(t, gw+"/v1/messages?beta=true", ph, false)
	resp.Body.Close()
	assert.Equal(t, seen.Load(), "/proxy/anthropic/v1/messages?beta=true")
}

func TestNewRejectsBadConfig(t *testing.T) {
	u, _ := url.Parse("https://api.example")
	for _, c := range []Config{
		{API: "bedrock", Upstream: u, Key: []byte("k"), Placeholder: strings.Repeat("p", 40)},
		{API: "anthropic", Upstream: u, Placeholder: strings.Repeat("p", 40)},
		{API: "anthropic", Upstream: u, Key: []byte("k"), Placeholder: "short"},
		{API: "anthropic", Key: []byte("k"), Placeholder: strings.Repeat("p", 40)},
	} {
		_, err := New(c)
		assert.Assert(t, err != nil, "%+v", c)
	}
}
