package gateway

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// A ChatGPT sign-in, as Codex's ~/.codex/auth.json holds it. The refresh
// token rotates on every use: two holders of one auth.json log each other
// out ("refresh token was already used"). So the account's tokens live on
// the host only, in one store per account, refreshed under that store's
// lock; the cage gets the per-turn placeholder and no auth.json tokens.
const (
	// DefaultChatGPTTokenURL is where Codex refreshes a ChatGPT sign-in.
	DefaultChatGPTTokenURL = "https://auth.openai.com/oauth/token"
	// DefaultChatGPTClientID is Codex's OAuth client id.
	DefaultChatGPTClientID = "app_EMoamEEZ73f0CkXaXp7hrann"
)

// codexAuth is the part of Codex's auth.json a ChatGPT sign-in is.
type codexAuth struct {
	AuthMode string      `json:"auth_mode"`
	Tokens   *codexToken `json:"tokens"`
	// LastRefresh is when the tokens were last refreshed (RFC 3339).
	LastRefresh string `json:"last_refresh,omitempty"`
}

type codexToken struct {
	IDToken      string `json:"id_token,omitempty"`
	AccessToken  string `json:"access_token"`
	RefreshToken string `json:"refresh_token"`
	AccountID    string `json:"account_id"`
}

// ChatGPT is the host-side ChatGPT sign-in of one account: its tokens live
// in Path (root-only, in shrooms' state directory), seeded once from Seed
// (the owner's auth.json). Every gateway of every task of the account
// refreshes through the same file under one exclusive lock, re-reading it
// after the lock: a token another process rotated is adopted, never
// redeemed again.
type ChatGPT struct {
	Path     string
	Seed     string
	TokenURL string
	ClientID string
	// Client is used for refreshes (nil: a default client).
	Client *http.Client
	// Now is the clock (nil: time.Now).
	Now func() time.Time
}

func (c *ChatGPT) now() time.Time {
	if c.Now != nil {
		return c.Now()
	}
	return time.Now()
}

func (c *ChatGPT) load() (*codexToken, error) {
	b, err := os.ReadFile(c.Path)
	if errors.Is(err, os.ErrNotExist) {
		if b, err = os.ReadFile(c.Seed); err != nil {
			return nil, fmt.Errorf("gateway sign-in: read the seed auth.json %s: %w", c.Seed, err)
		}
		tok, err := parseCodexAuth(b, c.Seed)
		if err != nil {
			return nil, err
		}
		return tok, c.save(tok)
	}
	if err != nil {
		return nil, fmt.Errorf("gateway sign-in: %w", err)
	}
	return parseCodexAuth(b, c.Path)
}

func parseCodexAuth(b []byte, name string) (*codexToken, error) {
	var a codexAuth
	if err := json.Unmarshal(b, &a); err != nil || a.Tokens == nil || a.Tokens.AccessToken == "" || a.Tokens.RefreshToken == "" || a.Tokens.AccountID == "" {
		return nil, fmt.Errorf("gateway sign-in: %s is not a Codex auth.json with a ChatGPT sign-in (tokens.access_token, refresh_token, account_id)", name)
	}
	return a.Tokens, nil
}

func (c *ChatGPT) save(tok *codexToken) error {
	if err := os.MkdirAll(filepath.Dir(c.Path), 0o700); err != nil {
		return fmt.Errorf("gateway sign-in: %w", err)
	}
	b, err := json.MarshalIndent(codexAuth{AuthMode: "chatgpt", Tokens: tok, LastRefresh: c.now().UTC().Format(time.RFC3339)}, "", "  ")
	if err != nil {
		return fmt.Errorf("gateway sign-in: %w", err)
	}
	tmp := c.Path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("gateway sign-in: %w", err)
	}
	if err := os.Rename(tmp, c.Path); err != nil {
		return fmt.Errorf("gateway sign-in: %w", err)
	}
	return nil
}

// jwtExpiry reads the exp claim of a JWT access token (unverified: it is
// the provider's own token, read only to know when to refresh it); zero
// when it has none.
func jwtExpiry(token string) time.Time {
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return time.Time{}
	}
	b, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(parts[1], "="))
	if err != nil {
		return time.Time{}
	}
	var claims struct {
		Exp int64 `json:"exp"`
	}
	if json.Unmarshal(b, &claims) != nil || claims.Exp <= 0 {
		return time.Time{}
	}
	return time.Unix(claims.Exp, 0)
}

// Access returns a valid access token and the account id, refreshing first
// when the token expires within five minutes (or has no expiry to read).
func (c *ChatGPT) Access(ctx context.Context) (string, string, error) {
	l, err := (&OAuth{Path: c.Path}).lock(ctx)
	if err != nil {
		return "", "", err
	}
	defer l.Close()
	// Read after the lock: another process may have rotated the tokens.
	tok, err := c.load()
	if err != nil {
		return "", "", err
	}
	if jwtExpiry(tok.AccessToken).Sub(c.now()) > refreshAhead {
		return tok.AccessToken, tok.AccountID, nil
	}
	if err := c.refresh(ctx, tok); err != nil {
		return "", "", err
	}
	return tok.AccessToken, tok.AccountID, nil
}

// refresh trades the refresh token for new tokens and stores them before
// anyone uses them.
func (c *ChatGPT) refresh(ctx context.Context, tok *codexToken) error {
	body, _ := json.Marshal(map[string]string{"client_id": c.ClientID, "grant_type": "refresh_token", "refresh_token": tok.RefreshToken, "scope": "openid profile email"})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.TokenURL, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("gateway sign-in: refresh: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	client := c.Client
	if client == nil {
		client = &http.Client{Timeout: 30 * time.Second}
	}
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("gateway sign-in: refresh: %s", oneLine(err))
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("gateway sign-in: refresh refused (HTTP %d); sign in with codex again and replace %s", resp.StatusCode, c.Path)
	}
	var r struct {
		IDToken      string `json:"id_token"`
		AccessToken  string `json:"access_token"`
		RefreshToken string `json:"refresh_token"`
	}
	if err := json.Unmarshal(b, &r); err != nil || r.AccessToken == "" {
		return fmt.Errorf("gateway sign-in: refresh answered without an access token")
	}
	tok.AccessToken = r.AccessToken
	if r.RefreshToken != "" {
		tok.RefreshToken = r.RefreshToken
	}
	if r.IDToken != "" {
		tok.IDToken = r.IDToken
	}
	return c.save(tok)
}
