package profile

import (
	"maps"
	"slices"
	"strings"
)

// Claude is Claude Code (pinned: 2.1.332).
func (table) Claude() Profile {
	return Profile{
		Name:             "claude",
		Settings:         ".claude/settings.json",
		Instructions:     ".claude/CLAUDE.md",
		BootstrapTargets: []string{".claude/.credentials.json", ".claude.json"},
		PolicyDir:        "claude-code",
		PolicyDest:       "/etc/claude-code",
		Keep:             claudeKeepList(),
		Seeded:           []string{".claude.json"},
		Policy:           claudePolicy,
		SignIn:           ".claude/.credentials.json",
		Agent: &Agent{
			Command: []string{"claude", "--dangerously-skip-permissions"},
			Env:     map[string]string{"DISABLE_AUTOUPDATER": "1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"},
			Home:    []string{"claude", "shell"},
		},
	}
}

// claudeKeepList: sign-in and onboarding state, transcripts, prompt history.
func claudeKeepList() []Rule {
	transcript := func(pattern string) Rule {
		ru := r(pattern, KindLines)
		ru.Lines = func() LineFilter { return newTranscriptFilter() }
		return ru
	}
	history := r(".claude/history.jsonl", KindLines)
	history.Lines = func() LineFilter { return historyFilter{} }
	return []Rule{
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
		transcript(".claude/projects/*/{uuid}.jsonl"),
		transcript(".claude/projects/*/{uuid}/subagents/agent-*.jsonl"),
		r(".claude/projects/*/{uuid}/tool-results/*.txt", KindBlob),
		r(".claude/projects/*/{uuid}/tool-results/*.json", KindBlob),
		history,
	}
}

// claudeEnforced are the managed-settings keys shrooms always sets: only
// managed hooks run, only managed (that is: no) MCP servers load, no project
// MCP servers are auto-approved, no plugin marketplace is trusted; and the
// bypass-permissions warning is accepted (the cage, not the prompts, is the
// boundary: an interactive Claude would otherwise ask at every turn, as the
// reset drops the user-level acceptance; Claude Code reads the key from
// the policy scope too).
var claudeEnforced = map[string]any{
	"skipDangerousModePermissionPrompt": true,
	"allowManagedHooksOnly":             true,
	"allowManagedMcpServersOnly":        true,
	"allowedMcpServers":                 []any{},
	"enableAllProjectMcpServers":        false,
	"strictKnownMarketplaces":           []any{},
}

// claudePolicy is /etc/claude-code: managed-settings.json (claudeEnforced
// plus the owner's keys) and managed-mcp.json ({"mcpServers":{}}: no MCP
// server at all, plugin servers included). Claude Code takes the gateway
// from ANTHROPIC_BASE_URL in the environment, so gw pins nothing here.
func claudePolicy(managed map[string]any, _ Gateway) (map[string]any, error) {
	settings, err := Merge(claudeEnforced, managed)
	if err != nil {
		return nil, err
	}
	return map[string]any{"managed-settings.json": settings, "managed-mcp.json": map[string]any{"mcpServers": map[string]any{}}}, nil
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
//
// In a Claude turn (env owns "claude") it also sets shrooms' own seeds
// (claudeSeed), whatever the file held.
func filterClaudeJSON(in map[string]any, env *FilterEnv) (map[string]any, []FieldDrop) {
	seeding := env.owns("claude")
	out := map[string]any{}
	var dropped []FieldDrop
	for _, k := range slices.Sorted(maps.Keys(in)) {
		v := in[k]
		switch {
		case k == "projects":
			projects, ok := v.(map[string]any)
			if !ok {
				dropped = append(dropped, FieldDrop{k, "not an object"})
				continue
			}
			kept, d := filterClaudeProjects(projects, seeding)
			dropped = append(dropped, d...)
			out[k] = kept
		case strings.HasSuffix(k, "MigrationComplete") && isType(v, "bool"):
			out[k] = v
		case claudeKeep[k] != "" && isType(v, claudeKeep[k]) && namesSomewhere(v):
			dropped = append(dropped, FieldDrop{k, "names a path, URL or command"})
		case claudeKeep[k] != "" && isType(v, claudeKeep[k]):
			out[k] = v
		case claudeForced[k] != nil:
		case (k == "customApiKeyResponses" || k == "fullscreenUpsellSeenCount") && seeding:
			// Replaced by the seed below, not a drop to report.
		default:
			dropped = append(dropped, FieldDrop{k, "not on the allowlist of sign-in and onboarding state"})
		}
	}
	for k, v := range claudeForced {
		out[k] = v
	}
	if seeding {
		claudeSeed(out, env.APIKey)
	}
	return out, dropped
}

// claudeSeed sets what shrooms itself puts in ~/.claude.json for a Claude
// turn, so that an interactive Claude Code in the cage asks nothing: the
// onboarding done (which also skips its first-run connectivity check to
// api.anthropic.com), /work trusted, and apiKey (the gateway placeholder
// in the cage's environment) approved. Never taken from what a turn wrote:
// the filter drops those keys from the kept file first.
func claudeSeed(out map[string]any, apiKey string) {
	out["hasCompletedOnboarding"] = true
	// The fullscreen-renderer upsell (a dialog on a later start) counts as
	// seen: Claude Code shows it while this is below 3.
	out["fullscreenUpsellSeenCount"] = 3
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
	if key := strings.TrimSpace(apiKey); key != "" {
		// Claude Code records an approved key by its last 20 characters.
		out["customApiKeyResponses"] = map[string]any{"approved": []any{key[max(0, len(key)-20):]}, "rejected": []any{}}
	}
}

// otherProject stands in the report for a project key other than /work.
const otherProject = "projects.(a project other than /work)"

// filterClaudeProjects keeps ~/.claude.json's projects["/work"]: numbers
// and booleans of its last* keys, lastSessionId when it is a session id,
// and projectOnboardingSeenCount. Other projects are dropped: the cage's
// one project is /work, and a project key is a path.
func filterClaudeProjects(projects map[string]any, seeding bool) (map[string]any, []FieldDrop) {
	kept := map[string]any{}
	var dropped []FieldDrop
	for _, p := range slices.Sorted(maps.Keys(projects)) {
		if p != cageWork {
			dropped = append(dropped, FieldDrop{otherProject, "a path other than the cage's worktree"})
			continue
		}
		pv, ok := projects[p].(map[string]any)
		if !ok {
			dropped = append(dropped, FieldDrop{"projects." + p, "not an object"})
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
				dropped = append(dropped, FieldDrop{"projects." + p + "." + pk, "not per-project session state"})
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

// filterClaudeCredentials rebuilds ~/.claude/.credentials.json: only the
// claude.ai OAuth sign-in the cage's agent uses. Every other slot
// (mcpOAuth, enterpriseGateway, ...) is dropped.
func filterClaudeCredentials(in map[string]any, _ *FilterEnv) (map[string]any, []FieldDrop) {
	out := map[string]any{}
	var dropped []FieldDrop
	for _, k := range slices.Sorted(maps.Keys(in)) {
		if k != "claudeAiOauth" {
			dropped = append(dropped, FieldDrop{k, "only the claudeAiOauth sign-in is kept"})
			continue
		}
		o, ok := in[k].(map[string]any)
		if !ok {
			dropped = append(dropped, FieldDrop{k, "not an object"})
			continue
		}
		ne, d, ok := filterFields(o, []field{{"accessToken", "string", true}, {"refreshToken", "string", false},
			{"expiresAt", "number", false}, {"scopes", "strings", false}, {"subscriptionType", "string?", false},
			{"rateLimitTier", "string?", false}}, k+".")
		dropped = append(dropped, d...)
		if !ok {
			dropped = append(dropped, FieldDrop{k, "a required field is missing or of the wrong type"})
			continue
		}
		out[k] = ne
	}
	return out, dropped
}
