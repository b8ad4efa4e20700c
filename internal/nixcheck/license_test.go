package nixcheck

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

// TestLicenseMatches: the repository's LICENSE is Apache-2.0 and the Nix
// package says so (not unfree).
func TestLicenseMatches(t *testing.T) {
	lic, err := os.ReadFile(filepath.Join(repo, "LICENSE"))
	assert.NilError(t, err)
	text := strings.Join(strings.Fields(string(lic)), " ")
	assert.Check(t, strings.HasPrefix(text, "Apache License Version 2.0, January 2004"), "%.80s", text)
	assert.Check(t, is.Contains(text, "END OF TERMS AND CONDITIONS"))
	pkg, err := os.ReadFile(filepath.Join(repo, "nix/package.nix"))
	assert.NilError(t, err)
	assert.Check(t, is.Contains(string(pkg), "license = lib.licenses.asl20;"))
	assert.Check(t, !strings.Contains(string(pkg), "unfree"))
	_, err = os.Stat(filepath.Join(repo, "SECURITY.md"))
	assert.NilError(t, err, "SECURITY.md says how to report a vulnerability")
}
