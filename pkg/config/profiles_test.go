package config

import (
	"testing"

	"gotest.tools/v3/assert"
)

// TestProfileTable: names are unique, and a profile with a managed policy
// or a baseline names both of its paths.
func TestProfileTable(t *testing.T) {
	seen := map[string]bool{}
	for _, p := range agentProfiles() {
		assert.Assert(t, !seen[p.Name], "duplicate profile %s", p.Name)
		seen[p.Name] = true
		assert.Equal(t, p.PolicyDir == "", p.PolicyDest == "", p.Name)
		assert.Equal(t, p.Settings == "", p.Instructions == "", p.Name)
		got, ok := Profile(p.Name)
		assert.Assert(t, ok)
		assert.DeepEqual(t, got, p)
		assert.Assert(t, HomeBootstrapTargets[p.Name] != nil, p.Name)
	}
	_, ok := Profile("zsh")
	assert.Assert(t, !ok)
}
