package profile

import (
	"encoding/json"
	"maps"
	"slices"
)

// Opencode is opencode (pinned: see pinnedOpencode).
func (table) Opencode() Profile {
	return Profile{
		Name:             "opencode",
		Settings:         ".config/opencode/opencode.json",
		Instructions:     ".config/opencode/AGENTS.md",
		BootstrapTargets: []string{".local/share/opencode/auth.json", ".local/share/opencode/mcp-auth.json"},
		PolicyDir:        "opencode",
		PolicyDest:       "/etc/opencode",
		Keep:             opencodeKeepList(),
		Policy:           opencodePolicy,
		Agent: &Agent{
			Command: []string{"opencode", "run", "--auto"},
			Env:     map[string]string{"OPENCODE_DISABLE_AUTOUPDATE": "1", "OPENCODE_DISABLE_MODELS_FETCH": "1", "OPENCODE_DISABLE_LSP_DOWNLOAD": "1"},
			Home:    []string{"opencode", "shell"},
		},
	}
}

// opencodeKeepList: provider and MCP sign-ins, and the sessions database.
func opencodeKeepList() []Rule {
	db := r(".local/share/opencode/opencode.db", KindDatabase)
	db.Magic = "SQLite format 3\x00"
	db.Rebuild = rebuildOpencodeDB
	db.Update = updateOpencodeDB
	db.Unchanged = sameAsTrusted
	db.UpdateInPlace = updateOpencodeDBInPlace
	// opencode.db-wal is folded into the rebuilt opencode.db and -shm
	// is rebuilt by SQLite, so neither is kept. The pre-SQLite session
	// tree (storage/) is not kept either: the pinned opencode keeps its
	// sessions in opencode.db and only imports storage/ into a new one.
	return []Rule{
		rf(".local/share/opencode/auth.json", filterOpencodeAuth),
		rf(".local/share/opencode/mcp-auth.json", filterMcpAuth),
		db,
	}
}

// opencodeEnforced are the keys of /etc/opencode/opencode.json shrooms always
// sets. opencode merges user config over nothing it can subtract, so these
// only add safe defaults; the HOME reset is what removes planted plugins.
var opencodeEnforced = map[string]any{
	"$schema":    "https://opencode.ai/config.json",
	"autoupdate": false,
	"share":      "disabled",
	"plugin":     []any{},
	"mcp":        map[string]any{},
}

// opencodePolicy is /etc/opencode/opencode.json: opencodeEnforced plus the
// owner's keys, and gw's anthropic base URL pinned.
func opencodePolicy(managed map[string]any, gw Gateway) (map[string]any, error) {
	enforced := opencodeEnforced
	if gw.AnthropicBaseURL != "" {
		enforced = maps.Clone(opencodeEnforced)
		enforced["provider"] = map[string]any{"anthropic": map[string]any{"options": map[string]any{"baseURL": gw.AnthropicBaseURL + "/v1"}}}
	}
	oc, err := Merge(enforced, managed)
	if err != nil {
		return nil, err
	}
	return map[string]any{"opencode.json": oc}, nil
}

// NewFilterEnv reads what the filters need from the baseline (its files'
// contents by HOME-relative path): the MCP server URLs of the owner's
// opencode config.
func NewFilterEnv(baseline map[string][]byte) *FilterEnv {
	env := &FilterEnv{mcpURLs: map[string]string{}}
	oc, _ := Lookup("opencode")
	data, ok := baseline[oc.Settings]
	if !ok {
		return env
	}
	var cfg struct {
		MCP map[string]struct {
			URL string `json:"url"`
		} `json:"mcp"`
	}
	if json.Unmarshal(data, &cfg) == nil {
		for name, s := range cfg.MCP {
			if s.URL != "" {
				env.mcpURLs[name] = s.URL
			}
		}
	}
	return env
}

// filterOpencodeAuth rebuilds opencode's auth.json per provider type from a
// field allowlist: api {type, key}, oauth {type, refresh, access, expires,
// accountId?}. "wellknown" entries (which fetch remote config and set
// environment variables), enterpriseUrl (the next turn's token and prompts
// would go to that host), api metadata and any other field are dropped, and
// so is a string that looks like a URL.
func filterOpencodeAuth(in map[string]any, _ *FilterEnv) (map[string]any, []FieldDrop) {
	out := map[string]any{}
	var dropped []FieldDrop
	for _, provider := range slices.Sorted(maps.Keys(in)) {
		e, ok := in[provider].(map[string]any)
		var spec []field
		switch {
		case !validName(provider):
			// Not named: such a name is a URL or arbitrary text the turn chose.
			dropped = append(dropped, FieldDrop{badName, "not a provider id (a wellknown entry's URL, or worse)"})
			continue
		case !ok:
			dropped = append(dropped, FieldDrop{provider, "not an object"})
			continue
		case e["type"] == "api":
			spec = []field{{"type", "string", true}, {"key", "string", true}}
		case e["type"] == "oauth":
			spec = []field{{"type", "string", true}, {"refresh", "string", true}, {"access", "string", true},
				{"expires", "number", true}, {"accountId", "string", false}}
		default:
			dropped = append(dropped, FieldDrop{provider, "only api and oauth entries are kept"})
			continue
		}
		ne, d, ok := filterFields(e, spec, provider+".")
		dropped = append(dropped, d...)
		if !ok {
			dropped = append(dropped, FieldDrop{provider, "a required field is missing or of the wrong type"})
			continue
		}
		out[provider] = ne
	}
	return out, dropped
}

// filterMcpAuth rebuilds opencode's mcp-auth.json: per MCP server, its
// OAuth tokens and client registration. serverUrl (which opencode requires
// to equal the server's configured URL before it uses the token) is kept
// only when it is exactly the URL the owner's baseline config gives that
// server; codeVerifier and oauthState (a sign-in in progress) are dropped.
func filterMcpAuth(in map[string]any, env *FilterEnv) (map[string]any, []FieldDrop) {
	out := map[string]any{}
	var dropped []FieldDrop
	for _, name := range slices.Sorted(maps.Keys(in)) {
		e, ok := in[name].(map[string]any)
		if !validName(name) {
			dropped = append(dropped, FieldDrop{badName, "not an MCP server name"})
			continue
		}
		if !ok {
			dropped = append(dropped, FieldDrop{name, "not an MCP server entry"})
			continue
		}
		ne := map[string]any{}
		for _, k := range slices.Sorted(maps.Keys(e)) {
			var spec []field
			switch k {
			case "tokens":
				spec = []field{{"accessToken", "string", true}, {"refreshToken", "string", false},
					{"expiresAt", "number", false}, {"scope", "string", false}}
			case "clientInfo":
				spec = []field{{"clientId", "string", true}, {"clientSecret", "string", false},
					{"clientIdIssuedAt", "number", false}, {"clientSecretExpiresAt", "number", false}}
			case "serverUrl":
				if u, _ := e[k].(string); env != nil && u != "" && env.mcpURLs[name] == u {
					ne[k] = u
				} else {
					dropped = append(dropped, FieldDrop{name + "." + k, "URL-bearing, and not the URL the owner configured for this server"})
				}
				continue
			default:
				dropped = append(dropped, FieldDrop{name + "." + k, "not OAuth state of a finished sign-in"})
				continue
			}
			o, isObj := e[k].(map[string]any)
			if !isObj {
				dropped = append(dropped, FieldDrop{name + "." + k, "not an object"})
				continue
			}
			no, d, ok := filterFields(o, spec, name+"."+k+".")
			dropped = append(dropped, d...)
			if !ok {
				dropped = append(dropped, FieldDrop{name + "." + k, "a required field is missing or of the wrong type"})
				continue
			}
			ne[k] = no
		}
		out[name] = ne
	}
	return out, dropped
}
