package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
)

// Claude Code's subscription sign-in, as its .credentials.json holds it.
const (
	// DefaultTokenURL is where Claude Code refreshes its sign-in.
	DefaultTokenURL = "https://console.anthropic.com/v1/oauth/token"
	// DefaultClientID is Claude Code's OAuth client id.
	DefaultClientID = "9d1c250a-e61b-44d9-88ed-5944d1962f5e"
	// refreshAhead refreshes a token this long before it expires.
	refreshAhead = 5 * time.Minute
	// farFuture is the expiry of the cage's placeholder sign-in (2100-01-01):
	// the agent never tries to refresh it itself.
	farFuture = int64(4102444800000)
)

// oauthToken is one claudeAiOauth entry.
type oauthToken struct {
	AccessToken      string   `json:"accessToken"`
	RefreshToken     string   `json:"refreshToken"`
	ExpiresAt        int64    `json:"expiresAt"` // Unix milliseconds
	Scopes           []string `json:"scopes"`
	SubscriptionType string   `json:"subscriptionType,omitempty"`
	RateLimitTier    string   `json:"rateLimitTier,omitempty"`
}

type credentialsFile struct {
	ClaudeAiOauth *oauthToken `json:"claudeAiOauth"`
}

// OAuth is the host-side sign-in of one subscription account: its tokens
// live in Path (root-only, in shrooms' state directory), seeded once from
// Seed (the owner's .credentials.json). Every gateway of every task of that
// account refreshes through the same file under an exclusive lock, so the
// account has one refresh chain: a rotated refresh token is never used
// twice, and parallel tasks never log each other out.
type OAuth struct {
	Path     string
	Seed     string
	TokenURL string
	ClientID string
	// Client is used for refreshes (nil: a default client).
	Client *http.Client
	// Now is the clock (nil: time.Now).
	Now func() time.Time
}

func (o *OAuth) now() time.Time {
	if o.Now != nil {
		return o.Now()
	}
	return time.Now()
}

// load reads the store, seeding it from Seed the first time.
func (o *OAuth) load() (*oauthToken, error) {
	b, err := os.ReadFile(o.Path)
	if errors.Is(err, os.ErrNotExist) {
		if b, err = os.ReadFile(o.Seed); err != nil {
			return nil, fmt.Errorf("gateway sign-in: read the seed credentials %s: %w", o.Seed, err)
		}
		tok, err := parseCredentials(b, o.Seed)
		if err != nil {
			return nil, err
		}
		return tok, o.save(tok)
	}
	if err != nil {
		return nil, fmt.Errorf("gateway sign-in: %w", err)
	}
	return parseCredentials(b, o.Path)
}

func parseCredentials(b []byte, name string) (*oauthToken, error) {
	var c credentialsFile
	if err := json.Unmarshal(b, &c); err != nil || c.ClaudeAiOauth == nil || c.ClaudeAiOauth.AccessToken == "" || c.ClaudeAiOauth.RefreshToken == "" {
		return nil, fmt.Errorf("gateway sign-in: %s is not a Claude Code .credentials.json with claudeAiOauth access and refresh tokens", name)
	}
	return c.ClaudeAiOauth, nil
}

func (o *OAuth) save(tok *oauthToken) error {
	if err := os.MkdirAll(filepath.Dir(o.Path), 0o700); err != nil {
		return fmt.Errorf("gateway sign-in: %w", err)
	}
	b, err := json.MarshalIndent(credentialsFile{ClaudeAiOauth: tok}, "", "  ")
	if err != nil {
		return fmt.Errorf("gateway sign-in: %w", err)
	}
	tmp := o.Path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("gateway sign-in: %w", err)
	}
	if err := os.Rename(tmp, o.Path); err != nil {
		return fmt.Errorf("gateway sign-in: %w", err)
	}
	return nil
}

// lock takes the account's refresh lock (released when the file closes).
func (o *OAuth) lock(ctx context.Context) (*os.File, error) {
	if err := os.MkdirAll(filepath.Dir(o.Path), 0o700); err != nil {
		return nil, fmt.Errorf("gateway sign-in: %w", err)
	}
	f, err := os.OpenFile(o.Path+".lock", os.O_RDWR|os.O_CREATE|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, fmt.Errorf("gateway sign-in: lock: %w", err)
	}
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return f, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("gateway sign-in: lock: %w", err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Access returns a valid access token, refreshing it first when it expires
// within five minutes.
func (o *OAuth) Access(ctx context.Context) (string, error) {
	l, err := o.lock(ctx)
	if err != nil {
		return "", err
	}
	defer l.Close()
	tok, err := o.load()
	if err != nil {
		return "", err
	}
	if time.UnixMilli(tok.ExpiresAt).Sub(o.now()) > refreshAhead {
		return tok.AccessToken, nil
	}
	if err := o.refresh(ctx, tok); err != nil {
		return "", err
	}
	return tok.AccessToken, nil
}

// refresh trades the refresh token for new tokens and stores them before
// anyone uses them.
func (o *OAuth) refresh(ctx context.Context, tok *oauthToken) error {
	body, _ := json.Marshal(map[string]string{"grant_type": "refresh_token", "refresh_token": tok.RefreshToken, "client_id": o.ClientID})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, o.TokenURL, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("gateway sign-in: refresh: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	client := o.Client
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
		return fmt.Errorf("gateway sign-in: refresh refused (HTTP %d); sign in again and replace %s", resp.StatusCode, o.Path)
	}
	var r struct {
		AccessToken  string `json:"access_token"`
		RefreshToken string `json:"refresh_token"`
		ExpiresIn    int64  `json:"expires_in"`
	}
	if err := json.Unmarshal(b, &r); err != nil || r.AccessToken == "" || r.ExpiresIn <= 0 {
		return fmt.Errorf("gateway sign-in: refresh answered without an access token and expiry")
	}
	tok.AccessToken = r.AccessToken
	if r.RefreshToken != "" {
		tok.RefreshToken = r.RefreshToken
	}
	tok.ExpiresAt = o.now().Add(time.Duration(r.ExpiresIn) * time.Second).UnixMilli()
	return o.save(tok)
}

// CageCredentials is the .credentials.json the cage gets: the account's
// scopes and subscription type, the placeholder as its access token, no
// refresh token, and an expiry far enough away that the agent never tries
// to refresh on its own.
func (o *OAuth) CageCredentials(ctx context.Context, placeholder string) ([]byte, error) {
	l, err := o.lock(ctx)
	if err != nil {
		return nil, err
	}
	tok, err := o.load()
	l.Close()
	if err != nil {
		return nil, err
	}
	cage := oauthToken{
		AccessToken: placeholder, RefreshToken: "shrooms-gateway-refreshes-on-the-host", ExpiresAt: farFuture,
		Scopes: tok.Scopes, SubscriptionType: tok.SubscriptionType, RateLimitTier: tok.RateLimitTier,
	}
	if cage.Scopes == nil {
		cage.Scopes = []string{}
	}
	return json.Marshal(credentialsFile{ClaudeAiOauth: &cage})
}
