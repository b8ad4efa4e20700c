package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

// tokenServer is an OAuth token endpoint that rotates refresh tokens: each
// refresh token works once, as the provider's does.
type tokenServer struct {
	mu        sync.Mutex
	valid     map[string]bool
	n         int
	refreshes atomic.Int32
	refused   atomic.Int32
}

func (s *tokenServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var req map[string]string
	_ = json.NewDecoder(r.Body).Decode(&req)
	s.mu.Lock()
	defer s.mu.Unlock()
	if req["grant_type"] != "refresh_token" || req["client_id"] != DefaultClientID || !s.valid[req["refresh_token"]] {
		s.refused.Add(1)
		http.Error(w, `{"error":"invalid_grant"}`, http.StatusBadRequest)
		return
	}
	delete(s.valid, req["refresh_token"])
	s.n++
	next := fmt.Sprintf("refresh-%d", s.n)
	s.valid[next] = true
	s.refreshes.Add(1)
	_ = json.NewEncoder(w).Encode(map[string]any{"access_token": fmt.Sprintf("access-%d", s.n), "refresh_token": next, "expires_in": 3600})
}

func seed(t *testing.T, expiresAt time.Time) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "credentials.json")
	b, _ := json.Marshal(map[string]any{"claudeAiOauth": map[string]any{
		"accessToken": "access-0", "refreshToken": "refresh-0", "expiresAt": expiresAt.UnixMilli(),
		"scopes": []string{"user:inference"}, "subscriptionType": "max"}})
	assert.NilError(t, os.WriteFile(p, b, 0o600))
	return p
}

func TestOAuthRefreshesOncePerAccountAcrossTasks(t *testing.T) {
	ts := &tokenServer{valid: map[string]bool{"refresh-0": true}}
	srv := httptest.NewServer(ts)
	defer srv.Close()
	store := filepath.Join(t.TempDir(), "gateway", "anthropic", "credentials.json")
	seedPath := seed(t, time.Now().Add(-time.Hour)) // expired: every task wants a refresh

	// Eight tasks' gateways of one account, each with its own OAuth value
	// (as separate shrooms processes would have), refresh at once.
	var wg sync.WaitGroup
	got := make([]string, 8)
	errs := make([]error, 8)
	for i := range got {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			o := &OAuth{Path: store, Seed: seedPath, TokenURL: srv.URL, ClientID: DefaultClientID}
			got[i], errs[i] = o.Access(context.Background())
		}(i)
	}
	wg.Wait()
	for i := range got {
		assert.NilError(t, errs[i])
		assert.Equal(t, got[i], "access-1", "task %d", i)
	}
	assert.Equal(t, ts.refreshes.Load(), int32(1), "one refresh chain for the account")
	assert.Equal(t, ts.refused.Load(), int32(0), "no rotated refresh token was reused (no forced re-login)")
	b, err := os.ReadFile(store)
	assert.NilError(t, err)
	assert.Assert(t, is.Contains(string(b), `"refresh-1"`))
	st, err := os.Stat(store)
	assert.NilError(t, err)
	assert.Equal(t, st.Mode().Perm(), os.FileMode(0o600))

	// Later: fresh token, no refresh.
	o := &OAuth{Path: store, Seed: seedPath, TokenURL: srv.URL, ClientID: DefaultClientID}
	a, err := o.Access(context.Background())
	assert.NilError(t, err)
	assert.Equal(t, a, "access-1")
	assert.Equal(t, ts.refreshes.Load(), int32(1))
	// Near expiry: refreshed with the rotated token.
	o.Now = func() time.Time { return time.Now().Add(58 * time.Minute) }
	a, err = o.Access(context.Background())
	assert.NilError(t, err)
	assert.Equal(t, a, "access-2")
}

func TestOAuthRefusedRefreshSaysWhatToDo(t *testing.T) {
	ts := &tokenServer{valid: map[string]bool{}}
	srv := httptest.NewServer(ts)
	defer srv.Close()
	o := &OAuth{Path: filepath.Join(t.TempDir(), "c.json"), Seed: seed(t, time.Now()), TokenURL: srv.URL, ClientID: DefaultClientID}
	_, err := o.Access(context.Background())
	assert.ErrorContains(t, err, "refresh refused (HTTP 400); sign in again")

	bad := filepath.Join(t.TempDir(), "bad.json")
	assert.NilError(t, os.WriteFile(bad, []byte(`{"claudeAiOauth":{}}`), 0o600))
	o = &OAuth{Path: filepath.Join(t.TempDir(), "c.json"), Seed: bad, TokenURL: srv.URL, ClientID: DefaultClientID}
	_, err = o.Access(context.Background())
	assert.ErrorContains(t, err, "not a Claude Code .credentials.json")
}

func TestCageCredentialsHoldNoRealToken(t *testing.T) {
	o := &OAuth{Path: filepath.Join(t.TempDir(), "c.json"), Seed: seed(t, time.Now().Add(time.Hour)), TokenURL: "http://unused", ClientID: DefaultClientID}
	ph, _ := NewPlaceholder()
	b, err := o.CageCredentials(context.Background(), ph)
	assert.NilError(t, err)
	s := string(b)
	for _, real := range []string{"access-0", "refresh-0"} {
		assert.Assert(t, !strings.Contains(s, real), "a real token in the cage's credentials: %s", s)
	}
	var c credentialsFile
	assert.NilError(t, json.Unmarshal(b, &c))
	assert.Equal(t, c.ClaudeAiOauth.AccessToken, ph)
	assert.Equal(t, c.ClaudeAiOauth.ExpiresAt, farFuture)
	assert.Equal(t, c.ClaudeAiOauth.SubscriptionType, "max")
}

func TestGatewayInjectsTheBearerToken(t *testing.T) {
	var auth, apiKey atomic.Value
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		auth.Store(r.Header.Get("Authorization"))
		apiKey.Store(r.Header.Get("X-Api-Key"))
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"type":"message","model":"m","usage":{"input_tokens":1,"output_tokens":1}}`)
	}))
	defer up.Close()
	o := &OAuth{Path: filepath.Join(t.TempDir(), "c.json"), Seed: seed(t, time.Now().Add(time.Hour)), TokenURL: "http://unused", ClientID: DefaultClientID}
	_, gw, ph := start(t, up.URL, func(c *Config) { c.Key = nil; c.OAuth = o })
	req, _ := http.NewRequest(http.MethodPost, gw+"/v1/messages", strings.NewReader("{}"))
	req.Header.Set("Authorization", "Bearer "+ph)
	resp, err := http.DefaultClient.Do(req)
	assert.NilError(t, err)
	_, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, resp.StatusCode, 200)
	assert.Equal(t, auth.Load(), "Bearer access-0")
	assert.Equal(t, apiKey.Load(), "")
}
