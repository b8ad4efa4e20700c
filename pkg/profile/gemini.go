package profile

import (
	"encoding/json"
	"maps"
	"slices"
	"strings"
)

// Gemini is Google's Gemini CLI (pinned: 0.61.0, scripts/build-agent-image.sh).
func (table) Gemini() Profile {
	return Profile{
		Name:         "gemini",
		Settings:     ".gemini/settings.json",
		API:          "gemini",
		Instructions: ".gemini/GEMINI.md",
		PolicyDir:    "gemini",
		// No credential file: the API key is the gateway's.
		BootstrapTargets: []string{},
		PolicyDest:       "/etc/gemini-cli",
		// Gemini CLI 0.61.0 skips a system settings file that is not owned
		// by root (uid 0 in the cage) in a root-owned directory.
		PolicyRootOwned: true,
		Keep:            geminiKeepList(),
		Policy:          geminiPolicy,
		// Approvals off (the cage is the boundary): --yolo needs a trusted
		// folder, and --skip-trust trusts /work for this session only
		// (nothing is written to trustedFolders.json). The system settings
		// path is named so a .env file cannot point it elsewhere.
		Agent: &Agent{
			Command: []string{"gemini", "--skip-trust", "--yolo"},
			Env:     map[string]string{"GEMINI_CLI_SYSTEM_SETTINGS_PATH": "/etc/gemini-cli/settings.json", "GEMINI_TELEMETRY_ENABLED": "false"},
			Home:    []string{"gemini", "shell"},
		},
	}
}

// geminiProject is the short id Gemini CLI 0.61.0 gives the project /work
// (its base name): its sessions are ~/.gemini/tmp/work/chats/.
const geminiProject = "work"

func geminiKeepList() []Rule {
	chats := r(".gemini/tmp/"+geminiProject+"/chats/session-*.jsonl", KindLines)
	chats.Lines = func() LineFilter { return geminiChatFilter{} }
	return []Rule{chats}
}

// geminiEnforced are the keys of /etc/gemini-cli/settings.json shrooms
// always sets. Gemini CLI 0.61.0 layers the system settings over the
// user's (~/.gemini/settings.json) and the project's (.gemini/settings.json):
// a settings file planted during a turn cannot turn telemetry, usage
// statistics, the update check or IDE integration back on, add tool
// discovery or call commands, or turn folder trust off.
var geminiEnforced = map[string]any{
	"telemetry": map[string]any{"enabled": false, "logPrompts": false},
	"privacy":   map[string]any{"usageStatisticsEnabled": false},
	"general":   map[string]any{"enableAutoUpdate": false, "enableAutoUpdateNotification": false},
	"ide":       map[string]any{"enabled": false},
	"tools":     map[string]any{"discoveryCommand": "", "callCommand": ""},
	"security":  map[string]any{"folderTrust": map[string]any{"enabled": true}, "blockGitExtensions": true},
}

// geminiDefaults are the system settings that hold unless the owner's
// home.gemini.managed sets the same top-level key: no MCP server (user,
// project or extension), no hooks, no extensions, no skills.
var geminiDefaults = map[string]any{
	"mcp":         map[string]any{"allowed": []any{}, "excluded": []any{"*"}},
	"hooksConfig": map[string]any{"enabled": false},
	"admin":       map[string]any{"mcp": map[string]any{"enabled": false}, "extensions": map[string]any{"enabled": false}, "skills": map[string]any{"enabled": false}},
	"skills":      map[string]any{"enabled": false},
}

// geminiPolicy is /etc/gemini-cli/settings.json: geminiDefaults under the
// owner's keys, geminiEnforced over them, and with a gateway the API-key
// sign-in (its base URL and placeholder come from the environment).
func geminiPolicy(managed map[string]any, gw Gateway) (map[string]any, error) {
	enforced := maps.Clone(geminiEnforced)
	if gw.GeminiBaseURL != "" {
		sec := maps.Clone(enforced["security"].(map[string]any))
		sec["auth"] = map[string]any{"selectedType": "gemini-api-key", "enforcedType": "gemini-api-key", "useExternal": false}
		enforced["security"] = sec
	}
	owner := maps.Clone(geminiDefaults)
	maps.Copy(owner, managed)
	settings, err := Merge(enforced, owner)
	if err != nil {
		return nil, err
	}
	return map[string]any{"settings.json": settings}, nil
}

// Gemini CLI's kept state (the pinned 0.61.0): the saved sessions of the
// project /work, ~/.gemini/tmp/work/chats/session-*.jsonl, that
// `--resume` reads, rebuilt record by record. Everything else under
// ~/.gemini (settings.json, GEMINI.md, extensions, commands, skills,
// policies, trustedFolders.json, projects.json, installation id, history,
// checkpoints, OAuth credentials) and ~/.env is reset every turn. The
// API key is not in HOME: the gateway holds it.

// geminiMetaFields are a session file's first record: its identity.
var geminiMetaFields = map[string]bool{"sessionId": true, "projectHash": true, "startTime": true, "lastUpdated": true, "kind": true}

// geminiMessageFields are the fields kept of a user or gemini message
// record; toolCalls keep their conversation fields (geminiToolCallFields).
var geminiMessageFields = []string{"id", "timestamp", "type", "content", "toolCalls", "tokens", "model"}

var geminiToolCallFields = []string{"id", "name", "args", "result", "status", "timestamp"}

// geminiChatFilter rebuilds one Gemini CLI session record.
type geminiChatFilter struct{}

func (geminiChatFilter) record(rec map[string]json.RawMessage, drops *lineDrops) map[string]json.RawMessage {
	if set, ok := rec["$set"]; ok {
		return geminiSet(set, drops)
	}
	if _, ok := rec["sessionId"]; ok {
		out := map[string]json.RawMessage{}
		for _, k := range slices.Sorted(maps.Keys(rec)) {
			if s, isString := rawString(rec[k]); geminiMetaFields[k] && isString && len(s) <= 256 {
				out[k] = rec[k]
			} else {
				drops.add("session."+printableType(k), "not a session identity field")
			}
		}
		return out
	}
	typ, _ := rawString(rec["type"])
	if typ != "user" && typ != "gemini" {
		drops.add("record "+printableType(typ), "not a conversation message (info, error, warning, unknown)")
		return nil
	}
	if typ == "user" && geminiContextMessage(rec["content"]) {
		drops.add("user message of harness context (<session_context>)", "context the CLI writes each session; re-read from the reset HOME and the guarded worktree")
		return nil
	}
	out := map[string]json.RawMessage{}
	for k, v := range rec {
		switch {
		case k == "toolCalls":
			out[k] = geminiToolCalls(v, drops)
		case slices.Contains(geminiMessageFields, k):
			out[k] = v
		default:
			drops.add("message field "+printableType(k), "metadata; not conversation (thoughts, display)")
		}
	}
	return out
}

// geminiSet keeps a $set record's lastUpdated; the initial message list it
// may carry is the harness context and is dropped.
func geminiSet(set json.RawMessage, drops *lineDrops) map[string]json.RawMessage {
	var fields map[string]json.RawMessage
	if json.Unmarshal(set, &fields) != nil {
		drops.add("$set (not an object)", "not a Gemini session record")
		return nil
	}
	out := map[string]json.RawMessage{}
	for k, v := range fields {
		if s, ok := rawString(v); k == "lastUpdated" && ok && len(s) <= 64 {
			out[k] = v
		} else {
			drops.add("$set."+printableType(k), "session state; not conversation")
		}
	}
	if len(out) == 0 {
		return nil
	}
	return map[string]json.RawMessage{"$set": mustJSON(out)}
}

// geminiToolCalls keeps each tool call's conversation fields.
func geminiToolCalls(v json.RawMessage, drops *lineDrops) json.RawMessage {
	var calls []map[string]json.RawMessage
	if json.Unmarshal(v, &calls) != nil {
		drops.add("toolCalls (not an array of objects)", "not conversation")
		return json.RawMessage("[]")
	}
	out := make([]map[string]json.RawMessage, 0, len(calls))
	for _, c := range calls {
		kept := map[string]json.RawMessage{}
		for k, f := range c {
			if slices.Contains(geminiToolCallFields, k) {
				kept[k] = f
			} else {
				drops.add("toolCalls field "+printableType(k), "display metadata; not conversation")
			}
		}
		out = append(out, kept)
	}
	return mustJSON(out)
}

// geminiContextMessage reports whether a user message's content is the
// <session_context> block the CLI writes itself.
func geminiContextMessage(content json.RawMessage) bool {
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
		if strings.HasPrefix(strings.TrimLeft(p.Text, " \t\r\n"), "<session_context>") {
			return true
		}
	}
	return false
}
