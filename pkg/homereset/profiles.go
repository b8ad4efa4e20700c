package homereset

import (
	"encoding/json"
	"fmt"
	"maps"
	"path"
	"slices"
	"strings"
)

// kind is how a keep-list entry is validated and carried over.
type kind int

const (
	// kindJSON: a small JSON object, carried over byte for byte once it parses.
	kindJSON kind = iota
	// kindFilter: a small JSON object rebuilt from a key allowlist.
	kindFilter
	// kindBlob: session data (transcripts, databases), hard-linked into the new
	// HOME after type, filesystem and size checks; its content is state.
	kindBlob
)

// rule is one keep-list entry: a HOME-relative pattern whose segments are
// path.Match patterns of one name (e.g. "*.jsonl") or a final "**" (any
// path below).
type rule struct {
	pattern []string
	kind    kind
	filter  func(map[string]any) (map[string]any, []string)
	magic   string
	mode    uint32
}

func r(pattern string, k kind) rule {
	return rule{pattern: strings.Split(pattern, "/"), kind: k, mode: 0o600}
}

// keepLists are the profiles' keep-lists, from reference/agent-surface.md:
// credentials and sessions, nothing that runs code or instructs the agent.
// Everything else under HOME is removed every turn.
func keepList(profile string) []rule {
	switch profile {
	case "claude":
		claudeJSON := r(".claude.json", kindFilter)
		claudeJSON.filter = filterClaudeJSON
		return []rule{
			r(".claude/.credentials.json", kindJSON),
			claudeJSON,
			// Transcripts and what --resume/--continue/rewind read. Not
			// projects/<p>/memory/ (auto memory is loaded as instructions).
			r(".claude/projects/*/*.jsonl", kindBlob),
			r(".claude/projects/*/*/subagents/**", kindBlob),
			r(".claude/projects/*/*/tool-results/**", kindBlob),
			r(".claude/file-history/**", kindBlob),
			r(".claude/history.jsonl", kindBlob),
		}
	case "opencode":
		auth := r(".local/share/opencode/auth.json", kindFilter)
		auth.filter = filterOpencodeAuth
		db := r(".local/share/opencode/opencode.db", kindBlob)
		db.magic = "SQLite format 3\x00"
		return []rule{
			auth,
			r(".local/share/opencode/mcp-auth.json", kindJSON),
			db,
			r(".local/share/opencode/opencode.db-wal", kindBlob),
			r(".local/share/opencode/opencode.db-shm", kindBlob),
			// The pre-SQLite session layout.
			r(".local/share/opencode/storage/project/**", kindBlob),
			r(".local/share/opencode/storage/session/**", kindBlob),
			r(".local/share/opencode/storage/message/**", kindBlob),
			r(".local/share/opencode/storage/part/**", kindBlob),
		}
	}
	// shell: generic dotfiles keep nothing; they come from the baseline.
	return nil
}

// rulesFor returns the keep-list of all profiles, or an error for an unknown one.
func rulesFor(profiles []string) ([]rule, error) {
	var rules []rule
	for _, p := range profiles {
		switch p {
		case "claude", "opencode", "shell":
		default:
			return nil, fmt.Errorf("unknown HOME profile %q (use claude, opencode, shell)", p)
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
		if ok, _ := path.Match(p, segs[i]); !ok {
			return false
		}
	}
	return !prefix && len(segs) == len(pattern)
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
// onboarding state, and per project only session ids, last-run metrics and
// the onboarding counter. It returns the dropped key paths (never values).
func filterClaudeJSON(in map[string]any) (map[string]any, []string) {
	out := map[string]any{}
	var dropped []string
	for _, k := range slices.Sorted(maps.Keys(in)) {
		v := in[k]
		switch {
		case k == "projects":
			projects, ok := v.(map[string]any)
			if !ok {
				dropped = append(dropped, k)
				continue
			}
			kept := map[string]any{}
			for _, p := range slices.Sorted(maps.Keys(projects)) {
				pv, ok := projects[p].(map[string]any)
				if !ok {
					dropped = append(dropped, "projects."+p)
					continue
				}
				np := map[string]any{}
				for _, pk := range slices.Sorted(maps.Keys(pv)) {
					if (strings.HasPrefix(pk, "last") || pk == "projectOnboardingSeenCount") && isScalar(pv[pk]) {
						np[pk] = pv[pk]
					} else {
						dropped = append(dropped, "projects."+p+"."+pk)
					}
				}
				kept[p] = np
			}
			out[k] = kept
		case strings.HasSuffix(k, "MigrationComplete") && isType(v, "bool"):
			out[k] = v
		case claudeKeep[k] != "" && isType(v, claudeKeep[k]):
			out[k] = v
		case claudeForced[k] != nil:
		default:
			dropped = append(dropped, k)
		}
	}
	for k, v := range claudeForced {
		out[k] = v
	}
	return out, dropped
}

// filterOpencodeAuth keeps only api and oauth entries of opencode's
// auth.json, with scalar fields; "wellknown" entries (which fetch remote
// config and set environment variables) and anything else are dropped.
func filterOpencodeAuth(in map[string]any) (map[string]any, []string) {
	out := map[string]any{}
	var dropped []string
	for _, provider := range slices.Sorted(maps.Keys(in)) {
		e, ok := in[provider].(map[string]any)
		if !ok || (e["type"] != "api" && e["type"] != "oauth") {
			dropped = append(dropped, provider)
			continue
		}
		ne := map[string]any{}
		for _, k := range slices.Sorted(maps.Keys(e)) {
			if isScalar(e[k]) {
				ne[k] = e[k]
			} else {
				dropped = append(dropped, provider+"."+k)
			}
		}
		out[provider] = ne
	}
	return out, dropped
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
