package homereset

import (
	"encoding/json"
	"fmt"
	"maps"
	"path"
	"slices"
	"strings"

	"github.com/shrooms-cage/shrooms/pkg/config"
)

// kind is how a keep-list entry is validated and carried over. Every kept
// file is parsed and rebuilt from an allowlist except Claude's tool-results
// files (output the model reads back on request; nothing parses them as
// state), which are carried opaque.
type kind int

const (
	// kindFilter: a small JSON object rebuilt from a key allowlist.
	kindFilter kind = iota
	// kindBlob: hard-linked into the new HOME after type, filesystem and
	// size checks.
	kindBlob
	// kindOpencodeDB: opencode.db (with its -wal folded in), rebuilt from the
	// pinned schema's table and column allowlist (opencodedb.go).
	kindOpencodeDB
	// kindTranscript: a Claude Code session transcript, rebuilt record by
	// record (cctranscript.go).
	kindTranscript
	// kindHistory: ~/.claude/history.jsonl, rebuilt line by line.
	kindHistory
)

// rule is one keep-list entry: a HOME-relative pattern whose segments are
// path.Match patterns of one name (e.g. "*.jsonl"), a name holding "{uuid}"
// (a session id: "{uuid}.jsonl"), or a final "**" (any path below). No
// segment below the first two may be named "memory" (Claude's auto memory
// is loaded as instructions).
type rule struct {
	pattern []string
	kind    kind
	filter  func(map[string]any, *filterEnv) (map[string]any, []fieldDrop)
	magic   string
	mode    uint32
}

// fieldDrop is a key a filter left out, and why.
type fieldDrop struct{ key, reason string }

// filterEnv is what filters know of the owner's configuration.
type filterEnv struct {
	// mcpURLs are the MCP server URLs the owner's opencode baseline config
	// names, by server name.
	mcpURLs map[string]string
	// claude is set in a turn of Claude Code (the claude profile among the
	// turn's own): the rebuilt ~/.claude.json gets shrooms' seeds.
	claude *claudeSeed
}

// claudeSeed is what shrooms itself puts in ~/.claude.json for a Claude
// turn, so that an interactive Claude Code in the cage asks nothing: the
// onboarding done, /work trusted, and the API key the cage's environment
// holds (the gateway placeholder) approved. Never taken from what a turn
// wrote: the filter drops those keys from the kept file first.
type claudeSeed struct {
	// apiKey is the ANTHROPIC_API_KEY of the cage ("" for none, or a real
	// key handed in through token_env, which is never written to HOME).
	apiKey string
}

// apply sets the seeds in a rebuilt ~/.claude.json.
func (c *claudeSeed) apply(out map[string]any) {
	out["hasCompletedOnboarding"] = true
	projects, _ := out["projects"].(map[string]any)
	if projects == nil {
		projects = map[string]any{}
		out["projects"] = projects
	}
	work, _ := projects[cageWork].(map[string]any)
	if work == nil {
		work = map[string]any{}
		projects[cageWork] = work
	}
	work["hasTrustDialogAccepted"] = true
	if c.apiKey != "" {
		// Claude Code approves a key by its last 20 characters (trimmed).
		key := strings.TrimSpace(c.apiKey)
		out["customApiKeyResponses"] = map[string]any{"approved": []any{key[max(0, len(key)-20):]}, "rejected": []any{}}
	}
}

func r(pattern string, k kind) rule {
	return rule{pattern: strings.Split(pattern, "/"), kind: k, mode: 0o600}
}

func rf(pattern string, f func(map[string]any, *filterEnv) (map[string]any, []fieldDrop)) rule {
	ru := r(pattern, kindFilter)
	ru.filter = f
	return ru
}

// keepList is a profile's keep-list (the profiles are config's table):
// credentials and sessions, nothing that runs code or instructs the agent.
// Everything else under HOME is removed every turn.
func keepList(profile string) []rule {
	switch profile {
	case "claude":
		return []rule{
			rf(".claude/.credentials.json", filterClaudeCredentials),
			rf(".claude.json", filterClaudeJSON),
			// Transcripts and what --resume reads, as Claude Code 2.1.332
			// writes them: <session>.jsonl, and below <session>/
			// subagents/agent-<id>.jsonl (both rebuilt: conversation
			// records only, cwd pinned) and tool-results/<id>.txt|.json
			// (output the model reads back, carried opaque). Never
			// projects/<p>/memory/ (auto memory is loaded as instructions):
			// the session-id segments cannot match it, and no "memory"
			// segment matches anywhere. Not subagents/agent-<id>.meta.json
			// either: it carries a revived subagent's permission mode and
			// hook switches. Not file-history/ (checkpoints): rewind writes
			// them back to the paths the transcript's file-history records
			// name, and those records are state, dropped from the rebuilt
			// transcript (docs/kept-state.md).
			r(".claude/projects/*/{uuid}.jsonl", kindTranscript),
			r(".claude/projects/*/{uuid}/subagents/agent-*.jsonl", kindTranscript),
			r(".claude/projects/*/{uuid}/tool-results/*.txt", kindBlob),
			r(".claude/projects/*/{uuid}/tool-results/*.json", kindBlob),
			r(".claude/history.jsonl", kindHistory),
		}
	case "opencode":
		db := r(".local/share/opencode/opencode.db", kindOpencodeDB)
		db.magic = "SQLite format 3\x00"
		// opencode.db-wal is folded into the rebuilt opencode.db and -shm
		// is rebuilt by SQLite, so neither is kept. The pre-SQLite session
		// tree (storage/) is not kept either: the pinned opencode keeps its
		// sessions in opencode.db and only imports storage/ into a new one.
		return []rule{
			rf(".local/share/opencode/auth.json", filterOpencodeAuth),
			rf(".local/share/opencode/mcp-auth.json", filterMcpAuth),
			db,
		}
	}
	// shell: generic dotfiles keep nothing; they come from the baseline.
	return nil
}

// rulesFor returns the keep-list of all profiles, or an error for an unknown one.
func rulesFor(profiles []string) ([]rule, error) {
	var rules []rule
	for _, p := range profiles {
		if _, ok := config.Profile(p); !ok {
			return nil, fmt.Errorf("unknown HOME profile %q (use %s)", p, strings.Join(config.HomeProfiles, ", "))
		}
		rules = append(rules, keepList(p)...)
	}
	return rules, nil
}

// matchFile returns the rule that keeps a file at path segs, if any.
func matchFile(rules []rule, segs []string) *rule {
	for i := range rules {
		if globMatch(rules[i].pattern, segs, false) {
			return &rules[i]
		}
	}
	return nil
}

// mayContain reports whether a directory at segs may hold kept files.
func mayContain(rules []rule, segs []string) bool {
	for i := range rules {
		if globMatch(rules[i].pattern, segs, true) {
			return true
		}
	}
	return false
}

// globMatch matches path segs against pattern; with prefix it reports whether
// segs is a proper ancestor of some match.
func globMatch(pattern, segs []string, prefix bool) bool {
	for i, p := range pattern {
		if p == "**" {
			return len(segs) > i || prefix && len(segs) == i
		}
		if i == len(segs) {
			return prefix
		}
		if !segMatch(p, segs[i]) || i >= 2 && segs[i] == "memory" {
			return false
		}
	}
	return !prefix && len(segs) == len(pattern)
}

// segMatch matches one path segment: "{uuid}" stands for a session id.
func segMatch(p, s string) bool {
	if pre, post, ok := strings.Cut(p, "{uuid}"); ok {
		return len(s) == len(pre)+36+len(post) && strings.HasPrefix(s, pre) && strings.HasSuffix(s, post) && isUUID(s[len(pre):len(pre)+36])
	}
	ok, _ := path.Match(p, s)
	return ok
}

// isUUID reports whether s is a lowercase 8-4-4-4-12 hex UUID.
func isUUID(s string) bool {
	if len(s) != 36 {
		return false
	}
	for i, c := range s {
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return false
			}
		default:
			if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
				return false
			}
		}
	}
	return true
}

// claudeKeep are the ~/.claude.json top-level keys that carry sign-in and
// onboarding state; every other key (mcpServers, customApiKeyResponses,
// primaryApiKey, ...) is dropped.
var claudeKeep = map[string]string{
	"oauthAccount":           "object",
	"userID":                 "string",
	"hasCompletedOnboarding": "bool",
	"lastOnboardingVersion":  "string",
	"firstStartTime":         "string",
	"numStartups":            "number",
	"installMethod":          "string",
	"autoUpdates":            "bool",
	"tipsHistory":            "object",
	"lastReleaseNotesSeen":   "string",
	"editorMode":             "string",
}

// claudeForced are keys shrooms sets regardless of what the file held.
var claudeForced = map[string]any{"autoConnectIde": false, "autoInstallIdeExtension": false}

// filterClaudeJSON rebuilds ~/.claude.json from the allowlist: sign-in and
// onboarding state, and for the cage's one project (/work) only its last
// session id and last-run metrics and the onboarding counter. No kept value
// may name a path, a URL or a command: a string holding a slash, a
// backslash or an address is dropped (none of the kept keys holds one in
// what the pinned Claude Code writes). It returns the dropped key paths
// (never values; a project path is named only when it is /work).
func filterClaudeJSON(in map[string]any, env *filterEnv) (map[string]any, []fieldDrop) {
	out := map[string]any{}
	var dropped []fieldDrop
	for _, k := range slices.Sorted(maps.Keys(in)) {
		v := in[k]
		switch {
		case k == "projects":
			projects, ok := v.(map[string]any)
			if !ok {
				dropped = append(dropped, fieldDrop{k, "not an object"})
				continue
			}
			kept, d := filterClaudeProjects(projects, env != nil && env.claude != nil)
			dropped = append(dropped, d...)
			out[k] = kept
		case strings.HasSuffix(k, "MigrationComplete") && isType(v, "bool"):
			out[k] = v
		case claudeKeep[k] != "" && isType(v, claudeKeep[k]) && namesSomewhere(v):
			dropped = append(dropped, fieldDrop{k, "names a path, URL or command"})
		case claudeKeep[k] != "" && isType(v, claudeKeep[k]):
			out[k] = v
		case claudeForced[k] != nil:
		case k == "customApiKeyResponses" && env != nil && env.claude != nil:
			// Replaced by the seed below, not a drop to report.
		default:
			dropped = append(dropped, fieldDrop{k, "not on the allowlist of sign-in and onboarding state"})
		}
	}
	for k, v := range claudeForced {
		out[k] = v
	}
	if env != nil && env.claude != nil {
		env.claude.apply(out)
	}
	return out, dropped
}

// otherProject stands in the report for a project key other than /work.
const otherProject = "projects.(a project other than /work)"

// filterClaudeProjects keeps ~/.claude.json's projects["/work"]: numbers
// and booleans of its last* keys, lastSessionId when it is a session id,
// and projectOnboardingSeenCount. Other projects are dropped: the cage's
// one project is /work, and a project key is a path.
func filterClaudeProjects(projects map[string]any, seeding bool) (map[string]any, []fieldDrop) {
	kept := map[string]any{}
	var dropped []fieldDrop
	for _, p := range slices.Sorted(maps.Keys(projects)) {
		if p != cageWork {
			dropped = append(dropped, fieldDrop{otherProject, "a path other than the cage's worktree"})
			continue
		}
		pv, ok := projects[p].(map[string]any)
		if !ok {
			dropped = append(dropped, fieldDrop{"projects." + p, "not an object"})
			continue
		}
		np := map[string]any{}
		for _, pk := range slices.Sorted(maps.Keys(pv)) {
			x := pv[pk]
			s, isStr := x.(string)
			switch {
			case pk == "lastSessionId" && isStr && isUUID(s):
				np[pk] = x
			case (strings.HasPrefix(pk, "last") || pk == "projectOnboardingSeenCount") && (isType(x, "number") || isType(x, "bool")):
				np[pk] = x
			case pk == "hasTrustDialogAccepted" && seeding:
				// Replaced by the seed, not a drop to report.
			default:
				dropped = append(dropped, fieldDrop{"projects." + p + "." + pk, "not per-project session state"})
			}
		}
		kept[p] = np
	}
	return kept, dropped
}

// namesSomewhere reports whether a kept value (or a value of a kept
// object) is a string that could name a path, a URL or a command.
func namesSomewhere(v any) bool {
	switch x := v.(type) {
	case string:
		return strings.ContainsAny(x, "/\\") || looksLikeURL(x)
	case map[string]any:
		for _, e := range x {
			if namesSomewhere(e) {
				return true
			}
		}
	}
	return false
}

// filterOpencodeAuth rebuilds opencode's auth.json per provider type from a
// field allowlist: api {type, key}, oauth {type, refresh, access, expires,
// accountId?}. "wellknown" entries (which fetch remote config and set
// environment variables), enterpriseUrl (the next turn's token and prompts
// would go to that host), api metadata and any other field are dropped, and
// so is a string that looks like a URL.
func filterOpencodeAuth(in map[string]any, _ *filterEnv) (map[string]any, []fieldDrop) {
	out := map[string]any{}
	var dropped []fieldDrop
	for _, provider := range slices.Sorted(maps.Keys(in)) {
		e, ok := in[provider].(map[string]any)
		var spec []field
		switch {
		case !validName(provider):
			// Not named: such a name is a URL or arbitrary text the turn chose.
			dropped = append(dropped, fieldDrop{badName, "not a provider id (a wellknown entry's URL, or worse)"})
			continue
		case !ok:
			dropped = append(dropped, fieldDrop{provider, "not an object"})
			continue
		case e["type"] == "api":
			spec = []field{{"type", "string", true}, {"key", "string", true}}
		case e["type"] == "oauth":
			spec = []field{{"type", "string", true}, {"refresh", "string", true}, {"access", "string", true},
				{"expires", "number", true}, {"accountId", "string", false}}
		default:
			dropped = append(dropped, fieldDrop{provider, "only api and oauth entries are kept"})
			continue
		}
		ne, d, ok := filterFields(e, spec, provider+".")
		dropped = append(dropped, d...)
		if !ok {
			dropped = append(dropped, fieldDrop{provider, "a required field is missing or of the wrong type"})
			continue
		}
		out[provider] = ne
	}
	return out, dropped
}

// filterClaudeCredentials rebuilds ~/.claude/.credentials.json: only the
// claude.ai OAuth sign-in the cage's agent uses. Every other slot
// (mcpOAuth, enterpriseGateway, ...) is dropped.
func filterClaudeCredentials(in map[string]any, _ *filterEnv) (map[string]any, []fieldDrop) {
	out := map[string]any{}
	var dropped []fieldDrop
	for _, k := range slices.Sorted(maps.Keys(in)) {
		if k != "claudeAiOauth" {
			dropped = append(dropped, fieldDrop{k, "only the claudeAiOauth sign-in is kept"})
			continue
		}
		o, ok := in[k].(map[string]any)
		if !ok {
			dropped = append(dropped, fieldDrop{k, "not an object"})
			continue
		}
		ne, d, ok := filterFields(o, []field{{"accessToken", "string", true}, {"refreshToken", "string", false},
			{"expiresAt", "number", false}, {"scopes", "strings", false}, {"subscriptionType", "string?", false},
			{"rateLimitTier", "string?", false}}, k+".")
		dropped = append(dropped, d...)
		if !ok {
			dropped = append(dropped, fieldDrop{k, "a required field is missing or of the wrong type"})
			continue
		}
		out[k] = ne
	}
	return out, dropped
}

// filterMcpAuth rebuilds opencode's mcp-auth.json: per MCP server, its
// OAuth tokens and client registration. serverUrl (which opencode requires
// to equal the server's configured URL before it uses the token) is kept
// only when it is exactly the URL the owner's baseline config gives that
// server; codeVerifier and oauthState (a sign-in in progress) are dropped.
func filterMcpAuth(in map[string]any, env *filterEnv) (map[string]any, []fieldDrop) {
	out := map[string]any{}
	var dropped []fieldDrop
	for _, name := range slices.Sorted(maps.Keys(in)) {
		e, ok := in[name].(map[string]any)
		if !validName(name) {
			dropped = append(dropped, fieldDrop{badName, "not an MCP server name"})
			continue
		}
		if !ok {
			dropped = append(dropped, fieldDrop{name, "not an MCP server entry"})
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
					dropped = append(dropped, fieldDrop{name + "." + k, "URL-bearing, and not the URL the owner configured for this server"})
				}
				continue
			default:
				dropped = append(dropped, fieldDrop{name + "." + k, "not OAuth state of a finished sign-in"})
				continue
			}
			o, isObj := e[k].(map[string]any)
			if !isObj {
				dropped = append(dropped, fieldDrop{name + "." + k, "not an object"})
				continue
			}
			no, d, ok := filterFields(o, spec, name+"."+k+".")
			dropped = append(dropped, d...)
			if !ok {
				dropped = append(dropped, fieldDrop{name + "." + k, "a required field is missing or of the wrong type"})
				continue
			}
			ne[k] = no
		}
		out[name] = ne
	}
	return out, dropped
}

// field is one allowlisted key of a JSON object: its type ("string",
// "string?" (or null), "number", "strings" (array of strings)) and whether
// the object is invalid without it.
type field struct {
	key, typ string
	required bool
}

// filterFields copies the allowlisted fields of in that have the right type
// and carry no URL. ok is false when a required field was not copied.
func filterFields(in map[string]any, spec []field, prefix string) (map[string]any, []fieldDrop, bool) {
	out := map[string]any{}
	var dropped []fieldDrop
	ok := true
	for _, k := range slices.Sorted(maps.Keys(in)) {
		i := slices.IndexFunc(spec, func(f field) bool { return f.key == k })
		switch {
		case i < 0 && urlKey(k):
			dropped = append(dropped, fieldDrop{prefix + k, "URL-bearing"})
		case i < 0:
			dropped = append(dropped, fieldDrop{prefix + k, "not on the allowlist"})
		case !fieldType(in[k], spec[i].typ):
			dropped = append(dropped, fieldDrop{prefix + k, "not a " + spec[i].typ})
		case looksLikeURL(in[k]):
			dropped = append(dropped, fieldDrop{prefix + k, "URL-bearing"})
		default:
			out[k] = in[k]
		}
	}
	for _, f := range spec {
		if _, kept := out[f.key]; f.required && !kept {
			ok = false
		}
	}
	return out, dropped, ok
}

func fieldType(v any, t string) bool {
	switch t {
	case "string?":
		return v == nil || isType(v, "string")
	case "strings":
		a, ok := v.([]any)
		if !ok {
			return false
		}
		for _, x := range a {
			if _, ok := x.(string); !ok {
				return false
			}
		}
		return true
	}
	return isType(v, t)
}

// urlKey reports whether a key's name says it holds an address.
func urlKey(k string) bool {
	k = strings.ToLower(k)
	return strings.Contains(k, "url") || strings.Contains(k, "endpoint") || strings.Contains(k, "host") || strings.Contains(k, "uri")
}

// looksLikeURL reports whether a value (or an element of it) is an address.
func looksLikeURL(v any) bool {
	switch x := v.(type) {
	case string:
		return strings.Contains(x, "://") || strings.HasPrefix(strings.ToLower(x), "www.")
	case []any:
		return slices.ContainsFunc(x, looksLikeURL)
	}
	return false
}

// badName stands in the report for an entry whose name is not a plain id,
// so that text a turn chose never reaches the report.
const badName = "(an entry whose name is not an id)"

// validName reports whether a provider or server name is a plain id.
func validName(s string) bool {
	if s == "" || len(s) > 128 {
		return false
	}
	for _, c := range s {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_' || c == '.') {
			return false
		}
	}
	return true
}

func isScalar(v any) bool {
	switch v.(type) {
	case string, bool, json.Number, float64, nil:
		return true
	}
	return false
}

func isType(v any, t string) bool {
	switch t {
	case "string":
		_, ok := v.(string)
		return ok
	case "bool":
		_, ok := v.(bool)
		return ok
	case "number":
		_, ok := v.(json.Number)
		return ok
	case "object":
		// Objects of state: nested values must not be code-bearing structures
		// we cannot judge, so only one level of scalars is accepted.
		m, ok := v.(map[string]any)
		if !ok {
			return false
		}
		for _, x := range m {
			if !isScalar(x) {
				return false
			}
		}
		return true
	}
	return false
}
