package history

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
)

// TestCapturedRequestsCanonical: in real requests of Claude Code 2.1.332
// and opencode 1.18.33 (testdata/requests: one session each, across three
// resumed turns, captured through the gateway), every message a request
// repeats from the one before is canonically equal, though the clients
// rewrite some of them (the cache mark moves; Claude Code sends a message
// first as one text block, then as a string).
func TestCapturedRequestsCanonical(t *testing.T) {
	for _, agent := range []string{"claude", "oc"} {
		files, err := filepath.Glob(filepath.Join("testdata", "requests", agent+"-*.json"))
		assert.NilError(t, err)
		assert.Assert(t, len(files) >= 5)
		var prev json.RawMessage
		var total, same, canon int
		for _, f := range files {
			b, err := os.ReadFile(f)
			assert.NilError(t, err)
			var req struct {
				Messages json.RawMessage `json:"messages"`
			}
			assert.NilError(t, json.Unmarshal(b, &req))
			if prev != nil {
				a, s, c, err := PrefixStats(prev, req.Messages)
				assert.NilError(t, err)
				total, same, canon = total+a, same+s, canon+c
			}
			prev = req.Messages
		}
		assert.Equal(t, canon, total, agent)
		assert.Assert(t, same < total, "%s: the clients do rewrite repeated messages (else the canonical form is untested)", agent)
		t.Logf("%s: %d repeated messages, %d byte-identical (as stored), %d canonically equal", strings.TrimSuffix(agent, "-"), total, same, canon)
	}
}
