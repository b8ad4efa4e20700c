package config

import (
	"fmt"
	"maps"
	"net/url"
	"slices"
	"strings"

	"github.com/shrooms-cage/shrooms/internal/lazyre"
	"github.com/shrooms-cage/shrooms/pkg/profile"
)

// Gateway is one model provider served by shrooms' per-turn gateway
// ([gateway.NAME]): the agent's model requests go to a listener shrooms
// opens inside the cage's own network namespace, carrying a per-turn
// placeholder; the gateway checks it and sends the request on to Upstream
// with the real credential, which never enters the cage.
type Gateway struct {
	// API is the wire protocol: "anthropic" (the Messages API; the key goes
	// in x-api-key).
	API string `toml:"api"`
	// Upstream is the provider's base URL (https://api.anthropic.com).
	Upstream string `toml:"upstream"`
	// Auth is how the gateway signs in upstream: "api-key" (Token holds the
	// key) or "oauth" (Token holds the owner's Claude Code .credentials.json,
	// a subscription sign-in: it seeds the account's tokens in the state
	// directory once; the gateway refreshes them there, and the cage gets
	// placeholder credentials), or "chatgpt" (api "openai": Token holds the
	// owner's Codex auth.json with a ChatGPT sign-in, seeded and refreshed
	// the same way; the upstream is then the ChatGPT backend's Codex API,
	// https://chatgpt.com/backend-api/codex, and the cage gets no tokens).
	Auth string `toml:"auth"`
	// Token names the [tokens] entry holding the real key (or sign-in).
	Token string `toml:"token"`
	// TokenURL and ClientID are the OAuth refresh endpoint and client
	// ("" means Claude Code's own).
	TokenURL string `toml:"token_url"`
	ClientID string `toml:"client_id"`
	// MaxRequests and MaxOutputTokens end a turn that exceeds them (0: no
	// limit).
	MaxRequests     int64 `toml:"max_requests"`
	MaxOutputTokens int64 `toml:"max_output_tokens"`
	// AllowBetas are anthropic-beta values forwarded beyond the gateway's
	// built-in list (betas the pinned agents send that grant no capability
	// on the provider's side); any other beta is refused (HTTP 403).
	AllowBetas []string `toml:"allow_betas"`
	// AllowServerTools are capabilities the provider runs on its side with
	// the owner's key, refused unless listed: a server tool type
	// ("web_search_20250305") or its family ("web_search"), "mcp_servers",
	// "container", "url_sources" or "file_sources" (images and documents the
	// provider fetches). Each is an egress path that network.policy does
	// not see.
	AllowServerTools []string `toml:"allow_server_tools"`
	// History is what the gateway does when a resumed session's history is
	// not the one it forwarded before (the conversation pin, invariant
	// 10): "refuse" (the default) ends the turn before the provider gets
	// the request (status history-mismatch); "report" forwards it and
	// records the mismatch in `run --json`; "off" neither pins nor checks.
	History string `toml:"history"`
}

// gatewayAllowItem is one allow_betas or allow_server_tools entry.
var gatewayAllowItem = lazyre.New(`^[a-z0-9][a-z0-9_.-]{0,99}$`)

func validateGatewayAllow(key string, list []string) error {
	for i, v := range list {
		if !gatewayAllowItem().MatchString(v) {
			return &Error{Key: fmt.Sprintf("%s[%d]", key, i), Msg: fmt.Sprintf("%q is not a beta or tool name (1-100 of a-z 0-9 _ . -)", v)}
		}
		if slices.Index(list, v) != i {
			return &Error{Key: fmt.Sprintf("%s[%d]", key, i), Msg: fmt.Sprintf("%q listed twice", v)}
		}
	}
	return nil
}

// GatewayAPIs are the protocols a [gateway.NAME] table may name.
var GatewayAPIs = []string{"anthropic", "gemini", "openai"}

func (c *Config) validateGateways() error {
	for _, name := range slices.Sorted(maps.Keys(c.Gateway)) {
		g := c.Gateway[name]
		key := "gateway." + name
		// Defaults, filled in like any other.
		if g.API == "" {
			g.API = "anthropic"
		}
		if g.Auth == "" {
			g.Auth = "api-key"
		}
		if g.History == "" {
			g.History = "refuse"
		}
		c.Gateway[name] = g
		if g.History != "refuse" && g.History != "report" && g.History != "off" {
			return &Error{Key: key + ".history", Msg: fmt.Sprintf("%q is not refuse, report or off", g.History)}
		}
		if g.Auth != "api-key" && g.Auth != "oauth" && g.Auth != "chatgpt" {
			return &Error{Key: key + ".auth", Msg: fmt.Sprintf("%q is not api-key, oauth or chatgpt", g.Auth)}
		}
		if g.Auth == "oauth" && g.API != "anthropic" {
			return &Error{Key: key + ".auth", Msg: "oauth is the Claude subscription sign-in (api = \"anthropic\"); an openai gateway signs in with auth = \"api-key\" or \"chatgpt\""}
		}
		if g.Auth == "chatgpt" && g.API != "openai" {
			return &Error{Key: key + ".auth", Msg: "chatgpt is Codex's ChatGPT sign-in, for api = \"openai\""}
		}
		if g.TokenURL != "" {
			if u, err := url.Parse(g.TokenURL); err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
				return &Error{Key: key + ".token_url", Msg: fmt.Sprintf("%q must be an http(s) URL", g.TokenURL)}
			}
		}
		if g.Auth == "api-key" && (g.TokenURL != "" || g.ClientID != "") {
			return &Error{Key: key, Msg: "token_url and client_id apply to auth = \"oauth\" or \"chatgpt\" only"}
		}
		if !tokenName().MatchString(name) {
			return &Error{Key: key, Msg: "gateway names are 1-63 of a-z 0-9 _ -"}
		}
		if !slices.Contains(GatewayAPIs, g.API) {
			return &Error{Key: key + ".api", Msg: fmt.Sprintf("%q is not a supported API (use %v)", g.API, GatewayAPIs)}
		}
		u, err := url.Parse(g.Upstream)
		if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
			return &Error{Key: key + ".upstream", Msg: fmt.Sprintf("%q must be an http(s)://host[:port][/path] URL", g.Upstream)}
		}
		if _, ok := c.Tokens[g.Token]; !ok {
			return &Error{Key: key + ".token", Msg: fmt.Sprintf("names token %q, which [tokens] does not define", g.Token)}
		}
		if g.MaxRequests < 0 || g.MaxOutputTokens < 0 {
			return &Error{Key: key, Msg: "max_requests and max_output_tokens must be 0 (no limit) or positive"}
		}
		if err := validateGatewayAllow(key+".allow_betas", g.AllowBetas); err != nil {
			return err
		}
		if err := validateGatewayAllow(key+".allow_server_tools", g.AllowServerTools); err != nil {
			return err
		}
	}
	return nil
}

// GatewayEnv are the variables the gateway sets in the cage for an API; an
// agent that uses the gateway may not set them itself.
func GatewayEnv(api string) []string {
	switch api {
	case "anthropic":
		return []string{"ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", "ANTHROPIC_AUTH_TOKEN"}
	case "openai":
		return []string{"OPENAI_API_KEY", "OPENAI_BASE_URL", "CODEX_API_KEY"}
	case "gemini":
		return []string{"GEMINI_API_KEY", "GOOGLE_API_KEY", "GOOGLE_GEMINI_BASE_URL", "GOOGLE_GENAI_USE_VERTEXAI", "GOOGLE_GENAI_USE_GCA", "GEMINI_API_KEY_AUTH_MECHANISM", "GEMINI_CLI_CUSTOM_HEADERS"}
	}
	return nil
}

func (c *Config) validateAgentGateway(key string, a Agent) error {
	if a.Gateway == "" {
		return nil
	}
	g, ok := c.Gateway[a.Gateway]
	if !ok {
		return &Error{Key: key + ".gateway", Msg: fmt.Sprintf("names gateway %q, which [gateway] does not define", a.Gateway)}
	}
	if g.Auth == "oauth" && !slices.ContainsFunc(a.Home, func(p string) bool { return slices.Contains(profile.SignInProfiles(), p) }) {
		return &Error{Key: key + ".gateway", Msg: fmt.Sprintf("gateway %q signs in with a subscription (auth = \"oauth\"), which needs a HOME profile it can sign in (%s)", a.Gateway, strings.Join(profile.SignInProfiles(), ", "))}
	}
	for _, name := range a.Home {
		if p, ok := profile.Lookup(name); ok && p.API != "" && p.API != g.API {
			return &Error{Key: key + ".gateway", Msg: fmt.Sprintf("gateway %q speaks the %s API; the %s profile's agent needs an api = %q gateway", a.Gateway, g.API, name, p.API)}
		}
	}
	for _, v := range GatewayEnv(g.API) {
		if _, dup := a.Env[v]; dup {
			return &Error{Key: key + ".env." + v, Msg: "is set by the gateway for this agent; remove it"}
		}
		if _, dup := a.TokenEnv[v]; dup {
			return &Error{Key: key + ".token_env." + v, Msg: "is set by the gateway for this agent (the real token stays outside the cage); remove it"}
		}
	}
	return nil
}
