package mounts

import (
	"os"
	"path/filepath"
	"testing"

	"gotest.tools/v3/assert"
)

func TestCheckHostDir(t *testing.T) {
	dir := t.TempDir()
	real := filepath.Join(dir, "real")
	assert.NilError(t, os.Mkdir(real, 0o755))
	assert.NilError(t, os.Symlink(real, filepath.Join(dir, "link")))
	assert.NilError(t, os.WriteFile(filepath.Join(dir, "file"), nil, 0o644))
	assert.NilError(t, os.Mkdir(filepath.Join(real, "sub"), 0o755))

	got, err := CheckHostDir(real+"/", "worktree", nil)
	assert.NilError(t, err, "positive control")
	assert.Equal(t, got, real)

	for _, tc := range []struct{ path, want string }{
		{"", "empty"},
		{"rel", "must be an absolute path"},
		{"/", "root directory"},
		{filepath.Join(dir, "nope"), "no such file or directory"},
		{filepath.Join(dir, "link"), "is a symbolic link"},
		{filepath.Join(dir, "link", "sub"), "is a symbolic link"},
		{filepath.Join(dir, "file"), "is not a directory"},
		{"/etc", "protected host directory /etc"},
		{"/etc/ssl", "protected host directory /etc"},
		{"/usr/share", "protected host directory /usr"},
		{"/var", "protected host directory /var/lib/containers"},
		{"/proc/sys", "protected host directory /proc"},
		{"/root", "contains /root"},
		{"/home", "contains /home"},
	} {
		_, err := CheckHostDir(tc.path, "worktree", nil)
		assert.ErrorContains(t, err, tc.want, tc.path)
	}
	_, err = CheckHostDir(real, "worktree", []string{filepath.Join(real, "sub")})
	assert.ErrorContains(t, err, "overlaps the protected host directory", "a worktree above shrooms' own state")
	_, err = CheckHostDir(filepath.Join(real, "sub"), "worktree", []string{real})
	assert.ErrorContains(t, err, "overlaps the protected host directory", "a worktree inside shrooms' own state")
}

func TestBuildPlan(t *testing.T) {
	p, err := Build(Input{HomeDir: "/h", OutboxDir: "/o/t", TmpSize: 1 << 20, RunSize: 1 << 20})
	assert.NilError(t, err)
	var dests []string
	for _, m := range p.Mounts {
		dests = append(dests, m.Dest)
	}
	assert.DeepEqual(t, dests, []string{"/tmp", "/run", "/home/agent", "/work", "/outbox"})
	assert.Equal(t, p.Mounts[3].Kind, Tmpfs, "no worktree: an empty tmpfs at /work")
	_, err = Build(Input{HomeDir: "rel"})
	assert.ErrorContains(t, err, "not an absolute host path")
}
