package seccomp

import (
	"encoding/json"
	"os"
	"testing"

	"gotest.tools/v3/assert"
)

func TestInstallIsIdempotentAndExact(t *testing.T) {
	dir := t.TempDir()
	p, err := Install(dir)
	assert.NilError(t, err)
	assert.Equal(t, p, Path(dir))
	b, err := os.ReadFile(p)
	assert.NilError(t, err)
	assert.DeepEqual(t, b, Profile())
	var v map[string]any
	assert.NilError(t, json.Unmarshal(b, &v), "the profile is JSON")
	assert.NilError(t, os.WriteFile(p, []byte("tampered"), 0o644))
	p2, err := Install(dir)
	assert.NilError(t, err)
	b, _ = os.ReadFile(p2)
	assert.DeepEqual(t, b, Profile())
}
