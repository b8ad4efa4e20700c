package config

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
)

// TestNixModuleListsTheProfileTable: the NixOS module validates agents'
// home lists against its own copy of the profile names; it must be the
// Go table's.
func TestNixModuleListsTheProfileTable(t *testing.T) {
	src, err := os.ReadFile("../../nix/module.nix")
	assert.NilError(t, err)
	m := regexp.MustCompile(`(?s)\n\s*profiles = \[(.*?)\];`).FindSubmatch(src)
	assert.Assert(t, m != nil, "nix/module.nix has no `profiles = [ ... ];` list")
	var nix []string
	for _, f := range strings.Fields(string(m[1])) {
		nix = append(nix, strings.Trim(f, `"`))
	}
	assert.DeepEqual(t, nix, HomeProfiles)
}

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
