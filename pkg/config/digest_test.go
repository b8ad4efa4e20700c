package config

import (
	"os"
	"path/filepath"
	"testing"

	"gotest.tools/v3/assert"
)

// The digest names the bytes of the file read, so any edit (a comment
// included) changes it; the defaults have one digest of their own.
func TestDigest(t *testing.T) {
	dir := t.TempDir()
	a := filepath.Join(dir, "a.toml")
	assert.NilError(t, os.WriteFile(a, []byte("[cage]\nmemory = \"1g\"\n"), 0o644))
	ca, err := Load(a)
	assert.NilError(t, err)
	// sha256 of the file's bytes, computed independently: printf '[cage]\nmemory = "1g"\n' | sha256sum
	assert.Equal(t, ca.Digest(), "sha256:03a2a6028c16400c40f8b4abb8ce9bf7c1cabb9a2986aeb8c8dc07d7269c65ca")
	assert.NilError(t, os.WriteFile(a, []byte("# edited\n[cage]\nmemory = \"1g\"\n"), 0o644))
	cb, err := Load(a)
	assert.NilError(t, err)
	assert.Assert(t, cb.Digest() != ca.Digest())

	d1, err := Load("")
	assert.NilError(t, err)
	d2, err := Load("")
	assert.NilError(t, err)
	assert.Equal(t, d1.Digest(), d2.Digest(), "the defaults' digest is stable")
	assert.Assert(t, d1.Digest() != ca.Digest())
	d2.Cage.Memory = 1 << 30
	assert.Assert(t, d1.Digest() != d2.Digest(), "the defaults' digest covers their values")
}
