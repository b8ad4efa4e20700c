package profile

import (
	"testing"

	"gotest.tools/v3/assert"
)

// TestClaudeSeeds: in a Claude turn ~/.claude.json gets shrooms' seeds
// (onboarding done, /work trusted, the gateway placeholder approved by its
// last 20 characters, as Claude Code records an approval), replacing what
// the file held; in another agent's turn those keys are dropped and
// reported, and nothing is seeded.
func TestClaudeSeeds(t *testing.T) {
	planted := map[string]any{
		"userID":                "u1",
		"customApiKeyResponses": map[string]any{"approved": []any{"planted-by-the-turn!"}, "rejected": []any{}},
		"projects":              map[string]any{"/work": map[string]any{"hasTrustDialogAccepted": false, "lastSessionId": "0b6e2f4c-2d7a-4c1e-9f3b-6a5d4c3b2a10"}},
	}
	key := "sk-ant-shrooms-placeholder-0123456789abcdef0123456789abcdef"
	out, dropped := filterClaudeJSON(planted, &FilterEnv{Own: []string{"claude", "shell"}, APIKey: key})
	assert.Equal(t, len(dropped), 0, "seeded keys are replaced, not reported: %v", dropped)
	assert.Equal(t, out["hasCompletedOnboarding"], true)
	assert.Equal(t, out["fullscreenUpsellSeenCount"], 3)
	assert.DeepEqual(t, out["customApiKeyResponses"], map[string]any{"approved": []any{key[len(key)-20:]}, "rejected": []any{}})
	assert.DeepEqual(t, out["projects"], map[string]any{"/work": map[string]any{"hasTrustDialogAccepted": true, "lastSessionId": "0b6e2f4c-2d7a-4c1e-9f3b-6a5d4c3b2a10"}})
	assert.Equal(t, out["userID"], "u1")

	// No placeholder (a real key through token_env): nothing approved.
	out, _ = filterClaudeJSON(map[string]any{}, &FilterEnv{Own: []string{"claude"}})
	assert.Assert(t, out["customApiKeyResponses"] == nil)
	assert.Equal(t, out["hasCompletedOnboarding"], true)

	// A shell turn keeping Claude's state: no seeds, the turn's keys dropped.
	out, dropped = filterClaudeJSON(planted, &FilterEnv{Own: []string{"shell"}, APIKey: key})
	assert.Assert(t, out["customApiKeyResponses"] == nil && out["hasCompletedOnboarding"] == nil)
	assert.DeepEqual(t, out["projects"], map[string]any{"/work": map[string]any{"lastSessionId": "0b6e2f4c-2d7a-4c1e-9f3b-6a5d4c3b2a10"}})
	var keys []string
	for _, d := range dropped {
		keys = append(keys, d.Key)
	}
	assert.DeepEqual(t, keys, []string{"customApiKeyResponses", "projects./work.hasTrustDialogAccepted"})
}
