package homereset

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gotest.tools/v3/assert"

	"github.com/shrooms-cage/shrooms/pkg/config"
)

// TestPlanPolicyThenWrite: planning writes nothing; Write puts exactly the
// planned bytes (their digests) where the mounts say, world-readable; the
// gateway's base URL is pinned in opencode's policy.
func TestPlanPolicyThenWrite(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "policy")
	pol, err := PlanPolicy(dir, config.Default(), []string{"shell", "opencode", "claude"}, PolicyGateway{AnthropicBaseURL: "http://127.0.0.1:1"})
	assert.NilError(t, err)
	_, err = os.Stat(dir)
	assert.Assert(t, os.IsNotExist(err), "planning wrote %s", dir)
	assert.Equal(t, len(pol.Mounts), 2)
	assert.Equal(t, pol.Mounts[0].Dest, "/etc/opencode")
	assert.Equal(t, pol.Mounts[1].Source, filepath.Join(dir, "claude-code"))

	assert.NilError(t, pol.Write())
	for _, m := range pol.Mounts {
		for name, digest := range m.Files {
			b, err := os.ReadFile(filepath.Join(m.Source, name))
			assert.NilError(t, err)
			sum := sha256.Sum256(b)
			assert.Equal(t, "sha256:"+hex.EncodeToString(sum[:]), digest, name)
			fi, err := os.Stat(filepath.Join(m.Source, name))
			assert.NilError(t, err)
			assert.Equal(t, fi.Mode().Perm(), os.FileMode(0o644))
		}
	}
	oc, err := os.ReadFile(filepath.Join(dir, "opencode", "opencode.json"))
	assert.NilError(t, err)
	assert.Assert(t, strings.Contains(string(oc), `"baseURL": "http://127.0.0.1:1/v1"`), string(oc))

	_, err = PlanPolicy("relative", config.Default(), []string{"claude"}, PolicyGateway{})
	assert.ErrorContains(t, err, "must be absolute")
	_, err = PlanPolicy(dir, config.Default(), []string{"zsh"}, PolicyGateway{})
	assert.ErrorContains(t, err, `unknown HOME profile "zsh"`)
}
