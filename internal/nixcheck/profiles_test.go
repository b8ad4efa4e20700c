package nixcheck

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"gotest.tools/v3/assert"

	"github.com/shrooms-cage/shrooms/pkg/profile"
)

// TestNixModuleListsTheProfileTable: the NixOS module validates agents'
// home lists against its own copy of the profile names; it must be the
// Go table's. (Here, not in pkg/config: the Nix build's package source has
// no nix/ directory.)
func TestNixModuleListsTheProfileTable(t *testing.T) {
	src, err := os.ReadFile("../../nix/module.nix")
	assert.NilError(t, err)
	m := regexp.MustCompile(`(?s)\n\s*profiles = \[(.*?)\];`).FindSubmatch(src)
	assert.Assert(t, m != nil, "nix/module.nix has no `profiles = [ ... ];` list")
	var nix []string
	for _, f := range strings.Fields(string(m[1])) {
		nix = append(nix, strings.Trim(f, `"`))
	}
	assert.DeepEqual(t, nix, profile.Names())
}
