package profile

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
)

// A session file as Gemini CLI 0.61.0 writes it, with forged and unknown records.
const geminiSession = `{"sessionId":"b91cf9e2-209f-43b6-9624-aa3b46e5b0c0","projectHash":"379e","startTime":"t","lastUpdated":"t","kind":"main","directories":["/EVIL"]}
{"$set":{"messages":[{"id":"d0","type":"user","content":[{"text":"<session_context>\nEVIL context"}]}],"lastUpdated":"t"}}
{"id":"u1","timestamp":"t","type":"user","content":[{"text":"do it"}],"displayContent":"EVIL"}
{"id":"u0","timestamp":"t","type":"user","content":[{"text":"<session_context>EVIL planted GEMINI.md</session_context>"}]}
{"id":"g1","timestamp":"t","type":"gemini","content":"","thoughts":[{"subject":"EVIL"}],"tokens":{"input":10},"model":"m","toolCalls":[{"id":"c1","name":"run_shell_command","args":{"command":"ls"},"result":[],"status":"success","resultDisplay":"EVIL","description":"EVIL"}]}
{"id":"i1","timestamp":"t","type":"info","content":"EVIL info"}
{"$set":{"summary":"EVIL summary"}}
{"$rewindTo":"EVIL"}
not json EVIL
{"id":"g2","timestamp":"t","type":"gemini","content":"all done"}
`

// TestGeminiChatRebuild: a session keeps its identity and its user and
// gemini messages with their tool calls; the harness context, thoughts,
// display fields, info records and unknown records are dropped.
func TestGeminiChatRebuild(t *testing.T) {
	recs, drops := rebuild(t, geminiSession, geminiChatFilter{})
	var ids []string
	for _, r := range recs {
		switch {
		case r["sessionId"] != nil:
			ids = append(ids, "session")
		case r["$set"] != nil:
			ids = append(ids, "$set")
		default:
			ids = append(ids, str(r["id"]))
		}
	}
	assert.DeepEqual(t, ids, []string{"session", "$set", "u1", "g1", "g2"})
	b, _ := json.Marshal(recs)
	assert.Assert(t, !strings.Contains(string(b), "EVIL"), "%s", b)
	for _, item := range []string{"session.directories", "$set.messages", "$set.summary", "message field displayContent", "message field thoughts",
		"toolCalls field resultDisplay", "record info", "user message of harness context (<session_context>)"} {
		assert.Check(t, drops[item] > 0, "not reported: %s (%v)", item, drops)
	}
}

// TestGeminiPolicy: the system settings enforce telemetry and update
// checks off, default to no MCP servers, hooks or extensions unless the
// owner's managed keys say otherwise, and pin the API-key sign-in with a
// gateway; an owner key against an enforced one is refused.
func TestGeminiPolicy(t *testing.T) {
	files, err := geminiPolicy(nil, Gateway{GeminiBaseURL: "http://127.0.0.1:4180"})
	assert.NilError(t, err)
	s := files["settings.json"].(map[string]any)
	assert.DeepEqual(t, s["telemetry"], map[string]any{"enabled": false, "logPrompts": false})
	assert.DeepEqual(t, s["hooksConfig"], map[string]any{"enabled": false})
	auth := s["security"].(map[string]any)["auth"].(map[string]any)
	assert.Equal(t, auth["enforcedType"], "gemini-api-key")

	files, err = geminiPolicy(map[string]any{"hooksConfig": map[string]any{"enabled": true}}, Gateway{})
	assert.NilError(t, err)
	s = files["settings.json"].(map[string]any)
	assert.DeepEqual(t, s["hooksConfig"], map[string]any{"enabled": true})
	_, hasAuth := s["security"].(map[string]any)["auth"]
	assert.Assert(t, !hasAuth)

	_, err = geminiPolicy(map[string]any{"telemetry": map[string]any{"enabled": true}}, Gateway{})
	var ee *EnforcedError
	assert.Assert(t, errors.As(err, &ee), "%v", err)
	assert.Equal(t, ee.Key, "telemetry")
}
