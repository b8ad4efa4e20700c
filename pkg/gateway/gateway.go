// Package gateway is invariant 9 (credentials stay outside): a per-turn
// reverse proxy between the agent and its model provider. shrooms opens its
// listener inside the cage's own network namespace (on the cage's loopback,
// so only that cage can reach it and no seal rule is needed) for exactly
// the lifetime of the turn. The cage holds a random per-turn placeholder in
// place of the key; the gateway accepts only that placeholder, only the
// provider's API paths, sends the request to the one configured upstream
// with the real credential, streams the answer back unbuffered (SSE), and
// counts the turn's requests and tokens from the provider's usage fields.
package gateway

import (
	"bufio"
	"bytes"
	"compress/flate"
	"compress/gzip"
	"compress/zlib"
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"path"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/shrooms-cage/shrooms/pkg/history"
)

// Port is where the gateway listens on the cage's loopback. Every cage has
// a network namespace of its own, so the port is the same in every turn.
const Port = 4180

// BaseURL is the gateway's address as the agent sees it.
func BaseURL() string { return fmt.Sprintf("http://127.0.0.1:%d", Port) }

// maxRequestBody bounds what the agent may send in one request.
const maxRequestBody = 64 << 20

// Config is one turn's gateway.
type Config struct {
	// API is the provider protocol: "anthropic" (the Messages API, the key
	// in x-api-key) or "openai" (Responses and Chat Completions, the key as
	// a bearer token).
	API string
	// Upstream is the provider's base URL.
	Upstream *url.URL
	// Key is the real API key (sent as x-api-key), or OAuth the account's
	// subscription sign-in (a bearer token, refreshed on the host). Neither
	// leaves this process except on requests to Upstream.
	Key   []byte
	OAuth *OAuth
	// ChatGPT is a ChatGPT sign-in (api "openai" only): the upstream is the
	// ChatGPT backend's Codex API (https://chatgpt.com/backend-api/codex),
	// which takes the Responses paths without /v1 and the account's id.
	ChatGPT *ChatGPT
	// Placeholder is the only credential the gateway accepts from the cage.
	Placeholder string
	// MaxRequests and MaxOutputTokens (0: none) end the turn: once one is
	// reached, further requests are refused and OnLimit is called once.
	MaxRequests     int64
	MaxOutputTokens int64
	OnLimit         func(reason string)
	// Policy is what requests may ask of the provider beyond the built-in
	// set (betas, server-side tools).
	Policy Policy
	// History pins each provider session's conversation (nil: off). On a
	// mismatch under history.Refuse the request is not forwarded and
	// OnHistory is called once.
	History   *history.Tracker
	OnHistory func(reason string)
	// Transport overrides the upstream transport (tests).
	Transport http.RoundTripper
}

// Usage is what a turn's agent asked of its model, for `run --json`.
type Usage struct {
	// Requests were forwarded upstream; Refused were not (wrong
	// placeholder, path or method, or over a limit).
	Requests            int64    `json:"requests"`
	Refused             int64    `json:"refused"`
	InputTokens         int64    `json:"inputTokens"`
	OutputTokens        int64    `json:"outputTokens"`
	CacheReadTokens     int64    `json:"cacheReadTokens"`
	CacheCreationTokens int64    `json:"cacheCreationTokens"`
	Models              []string `json:"models"`
	// Limit names the limit that ended the turn ("" if none).
	Limit string `json:"limit,omitempty"`
}

// Gateway serves one turn.
type Gateway struct {
	cfg   Config
	proxy *httputil.ReverseProxy
	srv   *http.Server

	// noBodyCheck skips the request body's check (benchmarks only: its
	// cost against plain forwarding).
	noBodyCheck bool

	mu sync.Mutex
	// exchanges counts the history exchanges in flight (Close waits).
	exchanges sync.WaitGroup
	usage     Usage
	limited   bool
	// historyEnded: a history mismatch ended the turn; every later
	// request is refused.
	historyEnded string
}

// NewPlaceholder returns a fresh per-turn placeholder credential. It is
// shaped like an Anthropic key so clients that check the prefix accept it.
func NewPlaceholder() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("gateway placeholder: %w", err)
	}
	return "sk-ant-shrooms-placeholder-" + hex.EncodeToString(b), nil
}

// New returns a gateway for cfg; Serve starts it.
func New(cfg Config) (*Gateway, error) {
	if cfg.API != "anthropic" && cfg.API != "openai" && cfg.API != "gemini" {
		return nil, fmt.Errorf("gateway: unsupported API %q", cfg.API)
	}
	if cfg.Upstream == nil || (cfg.Upstream.Scheme != "https" && cfg.Upstream.Scheme != "http") || cfg.Upstream.Host == "" {
		return nil, fmt.Errorf("gateway: upstream must be an http(s) URL")
	}
	creds := 0
	for _, set := range []bool{len(cfg.Key) > 0, cfg.OAuth != nil, cfg.ChatGPT != nil} {
		if set {
			creds++
		}
	}
	if creds != 1 || len(cfg.Placeholder) < 32 {
		return nil, fmt.Errorf("gateway: a key or a sign-in (one of them) and a placeholder of at least 32 characters are required")
	}
	if cfg.ChatGPT != nil && cfg.API != "openai" || cfg.OAuth != nil && cfg.API != "anthropic" {
		return nil, fmt.Errorf("gateway: a ChatGPT sign-in needs api openai, a Claude sign-in api anthropic")
	}
	g := &Gateway{cfg: cfg, usage: Usage{Models: []string{}}}
	transport := cfg.Transport
	if transport == nil {
		transport = &http.Transport{
			// No proxy from the environment: the upstream is the one named.
			Proxy:                 nil,
			DialContext:           (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			ForceAttemptHTTP2:     true,
			TLSHandshakeTimeout:   30 * time.Second,
			ResponseHeaderTimeout: 15 * time.Minute,
			IdleConnTimeout:       90 * time.Second,
			MaxIdleConnsPerHost:   8,
		}
	}
	g.proxy = &httputil.ReverseProxy{
		Rewrite:       g.rewrite,
		Transport:     transport,
		FlushInterval: -1, // stream every write: SSE reaches the agent as it comes
		ModifyResponse: func(resp *http.Response) error {
			resp.Header.Del("Set-Cookie")
			if err := decodeBody(resp); err != nil {
				return err
			}
			ur := &usageReader{body: resp.Body, g: g, openai: cfg.API == "openai", gemini: cfg.API == "gemini", sse: strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream"), length: resp.ContentLength}
			if ex, ok := resp.Request.Context().Value(exchangeKey{}).(*history.Exchange); ok && resp.StatusCode == http.StatusOK && cfg.API == "anthropic" {
				ur.answer = &ex.Answer
			}
			resp.Body = ur
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			var enc *encodingError
			if errors.As(err, &enc) {
				g.apiError(w, http.StatusBadGateway, "api_error", "shrooms gateway: "+enc.Error())
				return
			}
			g.apiError(w, http.StatusBadGateway, "api_error", "shrooms gateway: upstream unreachable: "+oneLine(err))
		},
	}
	g.srv = &http.Server{Handler: g, ReadHeaderTimeout: 30 * time.Second}
	return g, nil
}

// Serve serves ln until Close.
func (g *Gateway) Serve(ln net.Listener) {
	// The pins of the sessions the turn most likely resumes are read while
	// the cage starts, not on its first request.
	g.cfg.History.Preload()
	go func() { _ = g.srv.Serve(ln) }()
}

// Close stops the gateway at once: the listener and every connection.
//
// It waits (a bounded while) for the answers in flight to be pinned: the
// client may have read an answer before its handler recorded it, and the
// next turn reads the pin. Then the history tracker keeps each session's
// last request for the next turn.
func (g *Gateway) Close() error {
	err := g.srv.Close()
	done := make(chan struct{})
	go func() { g.exchanges.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
	}
	// The sessions' last requests, kept for the next turn's first
	// compare (a cache: an error leaves the pins as they are).
	_ = g.cfg.History.Close()
	return err
}

// Usage returns the turn's usage so far.
func (g *Gateway) Usage() Usage {
	g.mu.Lock()
	defer g.mu.Unlock()
	u := g.usage
	u.Models = slices.Clone(g.usage.Models)
	return u
}

// allowed reports whether method and path are part of the provider's API as
// agents use it.
func allowed(api, method, p string) bool {
	p = path.Clean("/" + p)
	switch api {
	case "anthropic":
		switch {
		case method == http.MethodPost && (p == "/v1/messages" || p == "/v1/messages/count_tokens"):
			return true
		case method == http.MethodGet && (p == "/v1/models" || strings.HasPrefix(p, "/v1/models/") && !strings.Contains(p[len("/v1/models/"):], "/")):
			return true
		}
	case "openai":
		return openaiAllowed(method, p)
	case "gemini":
		return geminiAllowed(method, p)
	}
	return false
}

func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !g.authorized(r) {
		g.refuse()
		g.apiError(w, http.StatusUnauthorized, "authentication_error", "shrooms gateway: this turn's credential is required")
		return
	}
	if !allowed(g.cfg.API, r.Method, r.URL.Path) || r.URL.RawPath != "" && r.URL.RawPath != r.URL.Path {
		g.refuse()
		g.apiError(w, http.StatusForbidden, "permission_error", fmt.Sprintf("shrooms gateway: %s %s is not an API path this gateway forwards", r.Method, r.URL.Path))
		return
	}
	body, info, err := g.readRequest(w, r)
	if err != nil {
		g.refuse()
		var ref *refusal
		if errors.As(err, &ref) {
			g.apiError(w, http.StatusForbidden, "permission_error", "shrooms gateway: "+ref.msg)
			return
		}
		g.apiError(w, http.StatusBadRequest, "invalid_request_error", "shrooms gateway: "+oneLine(err))
		return
	}
	ex, refusal := g.checkHistory(r, info)
	if refusal != "" {
		g.refuse()
		g.apiError(w, http.StatusForbidden, "permission_error", "shrooms gateway: "+refusal)
		return
	}
	if reason := g.admit(); reason != "" {
		g.apiError(w, http.StatusTooManyRequests, "rate_limit_error", "shrooms gateway: "+reason)
		return
	}
	if ex != nil {
		r = r.WithContext(context.WithValue(r.Context(), exchangeKey{}, ex))
		g.exchanges.Add(1)
		defer func() {
			g.historyDone(ex, r.Context().Err() == nil)
			g.exchanges.Done()
		}()
	}
	if g.cfg.OAuth != nil {
		access, err := g.cfg.OAuth.Access(r.Context())
		if err != nil {
			g.apiError(w, http.StatusBadGateway, "api_error", "shrooms "+oneLine(err))
			return
		}
		r = r.WithContext(context.WithValue(r.Context(), bearerKey{}, access))
	}
	if g.cfg.ChatGPT != nil {
		access, account, err := g.cfg.ChatGPT.Access(r.Context())
		if err != nil {
			g.apiError(w, http.StatusBadGateway, "api_error", "shrooms "+oneLine(err))
			return
		}
		r = r.WithContext(context.WithValue(context.WithValue(r.Context(), bearerKey{}, access), accountKey{}, account))
	}
	r.Body, r.ContentLength = http.NoBody, 0
	if len(body) > 0 {
		r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
	}
	g.proxy.ServeHTTP(w, r)
}

// readRequest reads the whole request body and checks it and its betas
// against the policy: nothing is forwarded before the gateway has read it.
func (g *Gateway) readRequest(w http.ResponseWriter, r *http.Request) ([]byte, requestInfo, error) {
	if g.cfg.API == "anthropic" {
		if err := g.cfg.Policy.checkBetas(r.Header); err != nil {
			return nil, requestInfo{}, err
		}
	}
	if ce := r.Header.Get("Content-Encoding"); ce != "" && !strings.EqualFold(ce, "identity") {
		return nil, requestInfo{}, refused("a request body with Content-Encoding %q is not read", printable(ce))
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxRequestBody))
	if err != nil {
		return nil, requestInfo{}, fmt.Errorf("request body: %w", err)
	}
	if r.Method != http.MethodPost {
		if len(body) != 0 {
			return nil, requestInfo{}, refused("a %s request has no body", r.Method)
		}
		return body, requestInfo{}, nil
	}
	if g.noBodyCheck {
		return body, requestInfo{}, nil
	}
	if g.cfg.API == "openai" {
		// The conversation pin reads Messages API histories only: an
		// openai gateway's requests are not pinned (docs/kept-state.md).
		return body, requestInfo{}, g.cfg.Policy.checkOpenAIBody(body)
	}
	if g.cfg.API == "gemini" {
		// Not pinned either (docs/kept-state.md).
		return body, requestInfo{}, g.cfg.Policy.checkGeminiBody(body)
	}
	info, err := g.cfg.Policy.parseBody(body)
	return body, info, err
}

// bearerKey carries a request's upstream access token to rewrite;
// accountKey the ChatGPT account id.
type (
	bearerKey  struct{}
	accountKey struct{}
)

// authorized checks the turn's placeholder in x-api-key or a bearer token.
func (g *Gateway) authorized(r *http.Request) bool {
	want := []byte(g.cfg.Placeholder)
	if g.cfg.API == "gemini" {
		return geminiAuthorized(r, want)
	}
	if k := r.Header.Get("X-Api-Key"); k != "" {
		return subtle.ConstantTimeCompare([]byte(k), want) == 1
	}
	if a, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
		return subtle.ConstantTimeCompare([]byte(a), want) == 1
	}
	return false
}

func (g *Gateway) refuse() {
	g.mu.Lock()
	g.usage.Refused++
	g.mu.Unlock()
}

// admit counts a request against the limits; it returns why it is refused.
func (g *Gateway) admit() string {
	g.mu.Lock()
	reason := ""
	switch {
	case g.usage.Limit != "":
		reason = g.usage.Limit
	case g.cfg.MaxRequests > 0 && g.usage.Requests >= g.cfg.MaxRequests:
		reason = fmt.Sprintf("the turn's limit of %d model requests is reached", g.cfg.MaxRequests)
	case g.cfg.MaxOutputTokens > 0 && g.usage.OutputTokens >= g.cfg.MaxOutputTokens:
		reason = fmt.Sprintf("the turn's limit of %d output tokens is reached", g.cfg.MaxOutputTokens)
	}
	if reason == "" {
		g.usage.Requests++
		g.mu.Unlock()
		return ""
	}
	g.usage.Refused++
	first := g.usage.Limit == ""
	g.usage.Limit = reason
	g.mu.Unlock()
	if first && g.cfg.OnLimit != nil {
		g.cfg.OnLimit(reason)
	}
	return reason
}

// rewrite sends the request to the upstream with the real key and nothing
// of the cage's credentials, cookies or proxy headers.
func (g *Gateway) rewrite(pr *httputil.ProxyRequest) {
	up := g.cfg.Upstream
	out := pr.Out
	out.URL.Scheme = up.Scheme
	out.URL.Host = up.Host
	p := path.Clean("/" + pr.In.URL.Path)
	if g.cfg.ChatGPT != nil {
		// The ChatGPT backend serves the Responses API below its own base,
		// without the /v1 prefix.
		p = strings.TrimPrefix(p, "/v1")
	}
	out.URL.Path = strings.TrimSuffix(up.Path, "/") + p
	out.URL.RawPath = ""
	out.URL.RawQuery = pr.In.URL.RawQuery
	if g.cfg.API == "gemini" {
		// The placeholder may ride in key=; the real key goes in the
		// header only.
		q := out.URL.Query()
		q.Del("key")
		out.URL.RawQuery = q.Encode()
		out.Header.Del("X-Goog-Api-Key")
	}
	out.Host = up.Host
	// Usage and limits are read from the answer: it comes uncompressed.
	out.Header.Set("Accept-Encoding", "identity")
	out.Header.Del("Content-Encoding")
	for _, h := range []string{"Authorization", "X-Api-Key", "Cookie", "Proxy-Authorization", "Forwarded", "X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto", "X-Real-Ip"} {
		out.Header.Del(h)
	}
	out.Header.Del("Chatgpt-Account-Id")
	if access, ok := pr.In.Context().Value(bearerKey{}).(string); ok {
		out.Header.Set("Authorization", "Bearer "+access)
		if account, ok := pr.In.Context().Value(accountKey{}).(string); ok {
			out.Header.Set("Chatgpt-Account-Id", account)
		}
		return
	}
	if g.cfg.API == "openai" {
		out.Header.Set("Authorization", "Bearer "+string(g.cfg.Key))
		return
	}
	if g.cfg.API == "gemini" {
		out.Header.Set("X-Goog-Api-Key", string(g.cfg.Key))
		return
	}
	out.Header.Set("X-Api-Key", string(g.cfg.Key))
}

// usageReader passes the upstream body through unchanged and reads the
// provider's usage fields from it as it goes.
type usageReader struct {
	body io.ReadCloser
	g    *Gateway
	sse  bool
	// openai: the body is an OpenAI answer (its usage fields differ).
	openai bool
	// gemini: the body is a Gemini answer; geminiLast the stream's
	// previous running totals.
	gemini     bool
	geminiLast geminiUsage
	line       []byte // SSE: the partial line so far
	// streamOut is the output count the stream reported last (its
	// message_delta events carry cumulative counts).
	streamOut int64
	json      bytes.Buffer
	done      bool
	// length is the answer's Content-Length (-1 unknown): its usage is
	// counted when the last byte is read, before the agent sees it, so a
	// limit holds for the very next request.
	length int64
	read   int64
	// answer reassembles the answer for the history pin (nil: not pinned).
	answer *history.Answer
}

// maxUsageJSON bounds how much of a non-streamed answer is kept to read
// its usage; a larger answer is still passed through, just not counted.
const maxUsageJSON = 16 << 20

func (u *usageReader) Read(p []byte) (int, error) {
	n, err := u.body.Read(p)
	u.read += int64(n)
	if n > 0 {
		if u.sse {
			u.scanSSE(p[:n])
		} else if u.json.Len()+n <= maxUsageJSON {
			u.json.Write(p[:n])
		}
	}
	if (errors.Is(err, io.EOF) || u.length >= 0 && u.read >= u.length) && !u.sse && !u.done {
		u.done = true
		if u.gemini {
			u.g.recordGemini(u.json.Bytes(), nil)
		} else if u.openai {
			u.g.recordOpenAI(u.json.Bytes(), false)
		} else {
			u.g.record(u.json.Bytes(), nil)
			if u.answer != nil && u.json.Len() < maxUsageJSON {
				u.answer.Message(u.json.Bytes())
			}
		}
	}
	return n, err
}

func (u *usageReader) Close() error { return u.body.Close() }

// scanSSE reads the stream's data lines as they pass. Only events with a
// "usage" key are decoded (message_start, message_delta): content deltas,
// nearly all of a long answer, cannot hold that byte sequence (a quote
// inside a JSON string is escaped) and are skipped without decoding.
func (u *usageReader) scanSSE(b []byte) {
	for len(b) > 0 {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			if len(u.line)+len(b) <= maxSSELine {
				u.line = append(u.line, b...)
			}
			return
		}
		line := b[:i]
		if len(u.line) > 0 {
			line = append(u.line, line...)
			u.line = u.line[:0]
		}
		b = b[i+1:]
		data, ok := bytes.CutPrefix(line, []byte("data:"))
		if !ok {
			continue
		}
		if u.gemini {
			if bytes.Contains(data, []byte(`"usageMetadata"`)) {
				u.g.recordGemini(data, &u.geminiLast)
			}
		} else if bytes.Contains(data, []byte(`"usage"`)) {
			if u.openai {
				u.g.recordOpenAI(bytes.TrimSpace(data), true)
			} else {
				u.g.record(bytes.TrimSpace(data), &u.streamOut)
			}
		}
		if u.answer != nil {
			u.answer.Event(data)
		}
	}
}

// maxSSELine bounds a partial line kept between reads; a longer line is
// not one that carries usage.
const maxSSELine = 1 << 20

// usageFields are the parts of a Messages API answer or stream event that
// carry usage.
type usageFields struct {
	Type    string `json:"type"`
	Model   string `json:"model"`
	Usage   *usage `json:"usage"`
	Message *struct {
		Model string `json:"model"`
		Usage *usage `json:"usage"`
	} `json:"message"`
}

type usage struct {
	InputTokens         int64 `json:"input_tokens"`
	OutputTokens        int64 `json:"output_tokens"`
	CacheReadTokens     int64 `json:"cache_read_input_tokens"`
	CacheCreationTokens int64 `json:"cache_creation_input_tokens"`
}

// record adds the usage in one JSON answer or stream event. A stream's
// message_start carries the input and the first output count, and its
// message_delta events the cumulative output count (streamOut tracks it).
func (g *Gateway) record(data []byte, streamOut *int64) {
	var f usageFields
	if len(data) == 0 || json.Unmarshal(data, &f) != nil {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	add := func(model string, u *usage) {
		g.addModel(model)
		if u == nil {
			return
		}
		g.usage.InputTokens += u.InputTokens
		g.usage.OutputTokens += u.OutputTokens
		g.usage.CacheReadTokens += u.CacheReadTokens
		g.usage.CacheCreationTokens += u.CacheCreationTokens
	}
	switch {
	case f.Type == "message_start" && f.Message != nil && streamOut != nil:
		add(f.Message.Model, f.Message.Usage)
		if f.Message.Usage != nil {
			*streamOut = f.Message.Usage.OutputTokens
		}
	case f.Type == "message_delta" && f.Usage != nil && streamOut != nil:
		g.usage.OutputTokens += max(0, f.Usage.OutputTokens-*streamOut)
		*streamOut = max(*streamOut, f.Usage.OutputTokens)
	case f.Type == "message" && streamOut == nil:
		add(f.Model, f.Usage)
	}
}

// addModel notes a model the turn used (g.mu held).
func (g *Gateway) addModel(model string) {
	if model != "" && !slices.Contains(g.usage.Models, model) && len(g.usage.Models) < 32 {
		g.usage.Models = append(g.usage.Models, model)
	}
}

// apiError writes an error in the shape of the gateway's API.
func (g *Gateway) apiError(w http.ResponseWriter, status int, typ, msg string) {
	if g.cfg.API == "gemini" {
		geminiError(w, status, msg)
		return
	}
	if g.cfg.API == "openai" {
		openaiError(w, status, typ, msg)
		return
	}
	apiError(w, status, typ, msg)
}

func apiError(w http.ResponseWriter, status int, typ, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"type": "error", "error": map[string]string{"type": typ, "message": msg}})
}

func oneLine(err error) string { return strings.Join(strings.Fields(err.Error()), " ") }

// Preflight checks that the upstream accepts TCP connections, so a turn
// whose model is unreachable is refused before its cage exists.
func Preflight(ctx context.Context, upstream *url.URL) error {
	host := upstream.Host
	if upstream.Port() == "" {
		port := "443"
		if upstream.Scheme == "http" {
			port = "80"
		}
		host = net.JoinHostPort(upstream.Hostname(), port)
	}
	d := net.Dialer{Timeout: 5 * time.Second}
	c, err := d.DialContext(ctx, "tcp", host)
	if err != nil {
		return fmt.Errorf("gateway upstream %s is unreachable: %s", upstream.Redacted(), oneLine(err))
	}
	return c.Close()
}

// decodeBody makes the answer's body plain bytes for the usage count: the
// gateway asks for identity, but an upstream may compress anyway. gzip and
// deflate are decoded here; any other encoding fails the request (the
// gateway would count nothing of it).
func decodeBody(resp *http.Response) error {
	ce := strings.ToLower(strings.TrimSpace(resp.Header.Get("Content-Encoding")))
	var dec io.ReadCloser
	switch ce {
	case "", "identity":
		return nil
	case "gzip", "x-gzip":
		dec = &gzipBody{body: resp.Body}
	case "deflate":
		dec = &deflateBody{body: resp.Body}
	default:
		resp.Body.Close()
		return &encodingError{ce}
	}
	resp.Body = dec
	resp.Header.Del("Content-Encoding")
	resp.Header.Del("Content-Length")
	resp.ContentLength = -1
	resp.Uncompressed = true
	return nil
}

// encodingError is an answer in an encoding the gateway cannot read.
type encodingError struct{ encoding string }

func (e *encodingError) Error() string {
	return fmt.Sprintf("the answer has Content-Encoding %q, which the gateway cannot read to count usage", printable(e.encoding))
}

// gzipBody decodes a gzip body lazily: its header is read on the first
// Read, so a stream's first event is not waited for here.
type gzipBody struct {
	body io.ReadCloser
	zr   *gzip.Reader
	err  error
}

func (b *gzipBody) Read(p []byte) (int, error) {
	if b.zr == nil && b.err == nil {
		b.zr, b.err = gzip.NewReader(b.body)
	}
	if b.err != nil {
		return 0, b.err
	}
	return b.zr.Read(p)
}

func (b *gzipBody) Close() error { return b.body.Close() }

// deflateBody decodes HTTP's deflate: zlib-wrapped as RFC 9110 says, or raw
// DEFLATE as some servers send it.
type deflateBody struct {
	body io.ReadCloser
	r    io.Reader
	err  error
}

func (b *deflateBody) Read(p []byte) (int, error) {
	if b.r == nil && b.err == nil {
		br := bufio.NewReader(b.body)
		head, err := br.Peek(2)
		switch {
		case err != nil:
			b.err = err
		case head[0]&0x0f == 8 && (uint16(head[0])<<8|uint16(head[1]))%31 == 0:
			b.r, b.err = zlib.NewReader(br)
		default:
			b.r = flate.NewReader(br)
		}
	}
	if b.err != nil {
		return 0, b.err
	}
	return b.r.Read(p)
}

func (b *deflateBody) Close() error { return b.body.Close() }
