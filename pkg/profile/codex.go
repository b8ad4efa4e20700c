package profile

import (
	"encoding/json"
	"maps"
	"slices"
	"strings"
)

// Codex is OpenAI's Codex CLI (pinned: 0.171.0, scripts/build-agent-image.sh).
func (table) Codex() Profile {
	return Profile{
		Name:             "codex",
		Settings:         ".codex/config.toml",
		SettingsTOML:     true,
		API:              "openai",
		Instructions:     ".codex/AGENTS.md",
		BootstrapTargets: []string{".codex/auth.json"},
		PolicyDir:        "codex",
		PolicyDest:       "/etc/codex",
		Keep:             codexKeepList(),
		Policy:           codexPolicy,
		// Approvals and its own sandbox off (the cage is the boundary); the
		// model is reached through a gateway whose provider the managed
		// config pins.
		Agent: &Agent{
			Command: []string{"codex", "exec", "--dangerously-bypass-approvals-and-sandbox", "--skip-git-repo-check"},
			Env:     map[string]string{},
			Home:    []string{"codex", "shell"},
		},
	}
}

func codexKeepList() []Rule {
	rollouts := r(".codex/sessions/[0-9][0-9][0-9][0-9]/[0-9][0-9]/[0-9][0-9]/rollout-*.jsonl", KindLines)
	rollouts.Lines = func() LineFilter { return codexRolloutFilter{} }
	return []Rule{rf(".codex/auth.json", filterCodexAuth), rollouts}
}

// codexEnforced are the keys of /etc/codex/managed_config.toml shrooms
// always sets: Codex 0.171.0 layers this file over the user's
// ~/.codex/config.toml, so a config.toml planted during a turn cannot add a
// notify program, turn the update check or web search on, or compress
// request bodies (which the gateway does not read). With a gateway, the
// provider is pinned too (codexGatewayProvider).
var codexEnforced = map[string]any{
	"notify":                      []any{},
	"check_for_update_on_startup": false,
	"web_search":                  "disabled",
	"features":                    map[string]any{"enable_request_compression": false},
}

// codexRequirements is /etc/codex/requirements.toml, the constraints Codex
// enforces over every config layer: no hooks (user, project, plugin or
// inline), and an MCP server allowlist that names none (user, project and
// plugin servers alike are refused).
var codexRequirements = map[string]any{
	"features":    map[string]any{"hooks": false},
	"mcp_servers": map[string]any{},
}

// codexGatewayProvider pins Codex's model provider to the turn's gateway:
// the Responses API over HTTP (no WebSocket, which the gateway does not
// forward), the per-turn placeholder from OPENAI_API_KEY.
func codexGatewayProvider(baseURL string) map[string]any {
	return map[string]any{
		"model_provider": "shrooms",
		"model_providers": map[string]any{"shrooms": map[string]any{
			"name": "shrooms gateway", "base_url": baseURL + "/v1", "env_key": "OPENAI_API_KEY",
			"wire_api": "responses", "supports_websockets": false,
		}},
	}
}

// codexPolicy is /etc/codex/managed_config.toml (codexEnforced, the owner's
// keys, gw's provider) and requirements.toml; the policy writer encodes
// *.toml files as TOML.
func codexPolicy(managed map[string]any, gw Gateway) (map[string]any, error) {
	enforced := maps.Clone(codexEnforced)
	if gw.OpenAIBaseURL != "" {
		maps.Copy(enforced, codexGatewayProvider(gw.OpenAIBaseURL))
	}
	mc, err := Merge(enforced, managed)
	if err != nil {
		return nil, err
	}
	return map[string]any{"managed_config.toml": mc, "requirements.toml": codexRequirements}, nil
}

// Codex's kept state (the pinned Codex 0.171.0): the sign-in
// ~/.codex/auth.json, rebuilt from its fields, and the session rollouts
// ~/.codex/sessions/YYYY/MM/DD/rollout-*.jsonl that `codex exec resume`
// reads, rebuilt record by record. Everything else under ~/.codex
// (config.toml, hooks.json, AGENTS.md, skills, plugins, the state, thread
// history, goals and logs databases, installation id) is reset every turn.

// filterCodexAuth rebuilds ~/.codex/auth.json: the sign-in mode, an API key
// and the ChatGPT tokens, nothing else.
func filterCodexAuth(in map[string]any, _ *FilterEnv) (map[string]any, []FieldDrop) {
	out, dropped, _ := filterFields(in, []field{
		{"auth_mode", "string", false},
		{"OPENAI_API_KEY", "string?", false},
		{"tokens", "object", false},
		{"last_refresh", "string", false},
	}, "")
	if m, ok := out["auth_mode"].(string); ok && m != "apikey" && m != "chatgpt" {
		delete(out, "auth_mode")
		dropped = append(dropped, FieldDrop{"auth_mode", "not apikey or chatgpt"})
	}
	if t, ok := out["tokens"].(map[string]any); ok {
		nt, d, _ := filterFields(t, []field{
			{"id_token", "string", false}, {"access_token", "string", false},
			{"refresh_token", "string", false}, {"account_id", "string", false},
		}, "tokens.")
		dropped = append(dropped, d...)
		out["tokens"] = nt
	}
	return out, dropped
}

// codexResponseItems are the rollout response items a resume replays as
// the conversation: messages of the user and the assistant, and tool calls
// with their outputs. Reasoning (opaque encrypted content), developer and
// system messages (instructions the harness writes every turn; a forged one
// would instruct the resumed model), compaction and ghost snapshots are not
// kept.
var codexResponseItems = map[string][]string{
	"message":                 {"type", "role", "content"},
	"function_call":           {"type", "name", "arguments", "call_id"},
	"function_call_output":    {"type", "call_id", "output"},
	"custom_tool_call":        {"type", "name", "input", "call_id"},
	"custom_tool_call_output": {"type", "call_id", "output"},
}

// codexMetaFields are the session_meta fields kept: the session's identity
// and the version that wrote it. cwd is pinned to /work; base_instructions
// (a resumed session's system prompt), git, workspace roots, dynamic tools,
// the provider and fork sources are dropped.
var codexMetaFields = map[string]bool{"id": true, "session_id": true, "timestamp": true, "originator": true, "cli_version": true, "source": true, "thread_source": true}

// codexRolloutFilter rebuilds one Codex rollout line.
type codexRolloutFilter struct{}

func (codexRolloutFilter) record(rec map[string]json.RawMessage, drops *lineDrops) map[string]json.RawMessage {
	typ, _ := rawString(rec["type"])
	var payload map[string]json.RawMessage
	if json.Unmarshal(rec["payload"], &payload) != nil || payload == nil {
		drops.add("(record without a payload object)", "not a Codex rollout record")
		return nil
	}
	out := map[string]json.RawMessage{"type": rec["type"]}
	if ts, ok := rawString(rec["timestamp"]); ok && len(ts) <= 64 {
		out["timestamp"] = rec["timestamp"]
	}
	switch typ {
	case "session_meta":
		p := map[string]json.RawMessage{"cwd": pinnedWork}
		for _, k := range slices.Sorted(maps.Keys(payload)) {
			s, isString := rawString(payload[k])
			switch {
			case k == "cwd":
				if s != cageWork {
					drops.add("session_meta.cwd (pinned to "+cageWork+")", "a path")
				}
			case codexMetaFields[k] && isString && len(s) <= 256:
				p[k] = payload[k]
			default:
				drops.add("session_meta."+k, "not on the allowlist of session identity fields (instructions, paths, tools, provider)")
			}
		}
		if _, ok := p["id"]; !ok {
			drops.add("(session_meta without an id)", "not a session")
			return nil
		}
		out["payload"] = mustJSON(p)
	case "response_item":
		it, _ := rawString(payload["type"])
		fields, ok := codexResponseItems[it]
		if !ok {
			drops.add("response_item "+printableType(it), "not a conversation item (reasoning, compaction, snapshots, unknown)")
			return nil
		}
		if it == "message" {
			role, _ := rawString(payload["role"])
			if role != "user" && role != "assistant" {
				drops.add("message of role "+printableType(role), "instructions the harness writes each turn; not kept")
				return nil
			}
			if role == "user" && codexContextMessage(payload["content"]) {
				drops.add("user message of harness context (AGENTS.md, environment, skills)", "instructions the harness re-reads each turn; the old copy would carry a planted AGENTS.md")
				return nil
			}
		}
		p := map[string]json.RawMessage{}
		for _, k := range fields {
			if v, ok := payload[k]; ok {
				p[k] = v
			}
		}
		for k := range payload {
			if !slices.Contains(fields, k) {
				drops.add("response_item field "+printableType(k), "metadata; not conversation")
			}
		}
		out["payload"] = mustJSON(p)
	default:
		drops.add("record "+printableType(typ), "state or event record; not conversation")
		return nil
	}
	return out
}

// codexContextPrefixes open the user-role messages Codex writes itself at
// a turn's start: the AGENTS.md files it loaded, the environment context,
// user instructions and skills. They are re-read from the (reset) HOME and
// the (guarded) worktree every turn.
var codexContextPrefixes = []string{"# AGENTS.md instructions", "<environment_context>", "<user_instructions>", "<INSTRUCTIONS>", "<skills_instructions>"}

// codexContextMessage reports whether a user message's content holds a
// context block Codex writes itself.
func codexContextMessage(content json.RawMessage) bool {
	var parts []struct {
		Text string `json:"text"`
	}
	if json.Unmarshal(content, &parts) != nil {
		var text string
		if json.Unmarshal(content, &text) != nil {
			return false
		}
		parts = append(parts, struct {
			Text string `json:"text"`
		}{text})
	}
	for _, p := range parts {
		t := strings.TrimLeft(p.Text, " \t\r\n")
		for _, pre := range codexContextPrefixes {
			if strings.HasPrefix(t, pre) {
				return true
			}
		}
	}
	return false
}

// printableType bounds a type name from a hostile file for the report.
func printableType(s string) string {
	if len(s) > 40 {
		s = s[:40] + "…"
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '.' || c == '-' || c == '…') {
			return "(unprintable)"
		}
	}
	if s == "" {
		return "(none)"
	}
	return s
}

func mustJSON(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // maps of RawMessage that were valid JSON
	}
	return b
}
