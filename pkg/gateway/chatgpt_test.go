package gateway

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/shrooms-cage/shrooms/internal/modelapi"
)

// fakeJWT is an unsigned JWT whose exp is exp.
func fakeJWT(name string, exp time.Time) string {
	enc := base64.RawURLEncoding.EncodeToString
	claims, _ := json.Marshal(map[string]any{"exp": exp.Unix(), "sub": name})
	return enc([]byte(`{"alg":"none"}`)) + "." + enc(claims) + "." + enc([]byte(name))
}

// rotatingTokens is a token endpoint whose refresh tokens rotate on use and
// are refused when used again (as ChatGPT's are).
type rotatingTokens struct {
	mu      sync.Mutex
	current string
	n       int
	reused  int
}

func (s *rotatingTokens) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var body map[string]string
	_ = json.NewDecoder(r.Body).Decode(&body)
	s.mu.Lock()
	defer s.mu.Unlock()
	if body["grant_type"] != "refresh_token" || body["client_id"] != DefaultChatGPTClientID || body["refresh_token"] != s.current {
		s.reused++
		w.WriteHeader(http.StatusUnauthorized)
		fmt.Fprint(w, `{"error":"refresh_token_reused","error_description":"refresh token was already used"}`)
		return
	}
	s.n++
	s.current = fmt.Sprintf("rt-%d", s.n)
	_ = json.NewEncoder(w).Encode(map[string]string{
		"access_token": fakeJWT(fmt.Sprintf("at-%d", s.n), time.Now().Add(time.Hour)), "refresh_token": s.current, "id_token": "id",
	})
}

// TestChatGPTOneRefreshForTwoTasks: two tasks' gateways on one account
// (two stores' users, one store), their turns at once, the access token
// expired: one refresh, no reuse of a rotated token, every upstream request
// with the fresh token and the account id, never the placeholder.
func TestChatGPTOneRefreshForTwoTasks(t *testing.T) {
	tokens := &rotatingTokens{current: "rt-0"}
	ts := httptest.NewServer(tokens)
	defer ts.Close()
	dir := t.TempDir()
	seed := filepath.Join(dir, "owner-auth.json")
	seedJSON, _ := json.Marshal(map[string]any{"auth_mode": "chatgpt", "OPENAI_API_KEY": nil, "tokens": map[string]string{
		"id_token": "id", "access_token": fakeJWT("at-0", time.Now().Add(-time.Minute)), "refresh_token": "rt-0", "account_id": "acct-1"}})
	assert.NilError(t, os.WriteFile(seed, seedJSON, 0o600))
	store := filepath.Join(dir, "state", "gateway", "chatgpt", "auth.json")

	s, up := scripted(t)
	for i := 0; i < 8; i++ {
		s.Append(modelapi.Text("ok"))
	}
	var gws []string
	var phs []string
	for i := 0; i < 2; i++ {
		_, gw, ph := start(t, up+"/backend-api/codex", func(c *Config) {
			c.API = "openai"
			c.Key = nil
			c.ChatGPT = &ChatGPT{Path: store, Seed: seed, TokenURL: ts.URL + "/oauth/token", ClientID: DefaultChatGPTClientID}
		})
		gws, phs = append(gws, gw), append(phs, ph)
	}
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			resp := postOpenAI(t, gws[i%2]+"/v1/responses", phs[i%2], fmt.Sprintf(responsesBody, true))
			_, _ = io.ReadAll(resp.Body)
			resp.Body.Close()
			assert.Check(t, is.Equal(resp.StatusCode, 200))
		}(i)
	}
	wg.Wait()
	assert.Equal(t, tokens.n, 1, "one refresh for the account")
	assert.Equal(t, tokens.reused, 0, "no rotated refresh token was used again")
	reqs := s.Requests()
	assert.Equal(t, len(reqs), 8)
	for _, r := range reqs {
		assert.Check(t, is.Equal(r.Path, "/backend-api/codex/responses"))
		assert.Check(t, is.Equal(r.Header.Get("Authorization"), "Bearer "+fakeJWT("at-1", jwtExpiry(r.Header.Get("Authorization")[len("Bearer "):]))))
		assert.Check(t, is.Equal(r.Header.Get("Chatgpt-Account-Id"), "acct-1"))
	}
	var stored codexAuth
	b, err := os.ReadFile(store)
	assert.NilError(t, err)
	assert.NilError(t, json.Unmarshal(b, &stored))
	assert.Equal(t, stored.Tokens.RefreshToken, "rt-1", "the rotated token is stored")
	fi, err := os.Stat(store)
	assert.NilError(t, err)
	assert.Equal(t, fi.Mode().Perm(), os.FileMode(0o600))
	// The seed is read once: a later change to it is not adopted.
	assert.NilError(t, os.WriteFile(seed, []byte("{broken"), 0o600))
	resp := postOpenAI(t, gws[0]+"/v1/responses", phs[0], fmt.Sprintf(responsesBody, true))
	resp.Body.Close()
	assert.Equal(t, resp.StatusCode, 200)
	assert.Equal(t, tokens.n, 1)
}

// TestChatGPTBadSeed: an auth.json that is not a ChatGPT sign-in fails the
// request with one line (502), and nothing goes upstream.
func TestChatGPTBadSeed(t *testing.T) {
	dir := t.TempDir()
	seed := filepath.Join(dir, "auth.json")
	assert.NilError(t, os.WriteFile(seed, []byte(`{"auth_mode":"apikey","OPENAI_API_KEY":"sk-x"}`), 0o600))
	s, up := scripted(t, modelapi.Text("x"))
	_, gw, ph := start(t, up, func(c *Config) {
		c.API = "openai"
		c.Key = nil
		c.ChatGPT = &ChatGPT{Path: filepath.Join(dir, "store.json"), Seed: seed, TokenURL: "http://127.0.0.1:1", ClientID: DefaultChatGPTClientID}
	})
	resp := postOpenAI(t, gw+"/v1/responses", ph, fmt.Sprintf(responsesBody, false))
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, resp.StatusCode, 502)
	assert.Check(t, is.Contains(string(b), "is not a Codex auth.json with a ChatGPT sign-in"))
	assert.Equal(t, len(s.Requests()), 0)
}
