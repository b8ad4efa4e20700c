package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
)

func runtimeConfig(v string) string {
	return "[cage]\nimage = \"x\"\nruntime = " + `"` + v + `"` + "\n"
}

func TestRuntimeAccepted(t *testing.T) {
	runc := "/usr/sbin/runc" // make setup installs Debian's runc here (and /usr/bin/runc links to it)
	if _, err := os.Stat(runc); err != nil {
		t.Fatalf("runc not installed at %s: %v", runc, err)
	}
	for _, v := range []string{"default", "runc", "crun", "runsc", "kata", runc, "/usr/bin/runc"} {
		c, err := Parse("t.toml", []byte(runtimeConfig(v)))
		assert.NilError(t, err, v)
		assert.Equal(t, c.Cage.Runtime, v)
	}
	c, err := Load("")
	assert.NilError(t, err)
	assert.Equal(t, c.Cage.Runtime, RuntimeDefault)
}

func TestRuntimeRefused(t *testing.T) {
	dir := t.TempDir()
	loose := filepath.Join(dir, "runsc")
	assert.NilError(t, os.WriteFile(loose, []byte("#!/bin/sh\n"), 0o755))
	assert.NilError(t, os.Chmod(loose, 0o777))
	// Root's own file, mode fine, but in a directory others may write.
	tight := filepath.Join(dir, "runsc-tight")
	assert.NilError(t, os.WriteFile(tight, []byte("#!/bin/sh\n"), 0o755))
	assert.NilError(t, os.Chmod(dir, 0o777))
	for v, want := range map[string]string{
		"gvisor":            "use \"default\"",
		"bin/runc":          "use \"default\"",
		"/nonexistent/runc": "no such file",
		"/usr/bin":          "not a regular file",
		"/etc/passwd":       "not executable",
		loose:               "writable by group or others",
		tight:               "is not root's alone",
	} {
		_, err := Parse("t.toml", []byte(runtimeConfig(v)))
		assert.ErrorContains(t, err, want, v)
		assert.ErrorContains(t, err, "t.toml:3: cage.runtime:", v)
		assert.Assert(t, !strings.Contains(err.Error(), "\n"), "one line: %q", err)
	}
}
