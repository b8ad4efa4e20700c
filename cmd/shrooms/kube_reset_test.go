package main

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/shrooms-cage/shrooms/internal/itest"
)

// TestKubeResetHomeUnprivileged runs `shrooms kube reset-home` as the pod's
// init container does: as uid/gid 1000 with no capabilities. It resets a
// root that uid owns; it refuses --uid/--gid other than its own, and a root
// someone else owns (positive control: the same command as root resets it).
func TestKubeResetHomeUnprivileged(t *testing.T) {
	itest.Require(t, itest.Root)
	dir := t.TempDir()
	// The test binary, where uid 1000 may run it.
	bin := filepath.Join(dir, "shrooms")
	data, err := os.ReadFile(os.Args[0])
	assert.NilError(t, err)
	assert.NilError(t, os.WriteFile(bin, data, 0o755))
	// Only the test's own directories (t.TempDir's and its parent) are
	// opened up; above them every directory must be searchable already.
	for d := dir; d != "/"; d = filepath.Dir(d) {
		st, err := os.Stat(d)
		assert.NilError(t, err)
		if st.Mode().Perm()&0o001 == 0 {
			assert.Assert(t, d == dir || d == filepath.Dir(dir), "%s is not searchable by uid 1000 (set TMPDIR)", d)
			assert.NilError(t, os.Chmod(d, st.Mode().Perm()|0o005))
		}
	}
	cfg := filepath.Join(dir, "config.toml")
	assert.NilError(t, os.WriteFile(cfg, []byte("[home.claude.settings]\nmodel = \"m\"\n[agents.sh]\ncommand = [\"/bin/sh\"]\nhome = [\"claude\", \"shell\"]\n"), 0o644))
	mk := func(name string, uid int) string {
		p := filepath.Join(dir, name)
		assert.NilError(t, os.Mkdir(p, 0o700))
		assert.NilError(t, os.Chown(p, uid, uid))
		return p
	}
	vol, policy := mk("volume", 1000), mk("policy", 1000)
	reset := func(asUID uint32, root, ids string) (int, string, string) {
		cmd := exec.Command(bin, "--config", cfg, "kube", "reset-home", "--agent", "sh", "--root", root, "--policy", policy, "--uid", ids, "--gid", ids)
		cmd.Env = []string{"SHROOMS_TEST_MAIN=1", "PATH=/usr/bin:/bin"}
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: asUID, Gid: asUID, Groups: []uint32{}}}
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else {
			assert.NilError(t, err)
		}
		return code, out.String(), errb.String()
	}

	code, out, errOut := reset(1000, filepath.Join(vol, "shrooms"), "1000")
	assert.Equal(t, code, 0, "stderr: %s", errOut)
	var rep struct {
		Baseline []string `json:"baseline"`
	}
	assert.NilError(t, json.Unmarshal([]byte(out), &rep), out)
	assert.Check(t, is.Contains(rep.Baseline, ".claude/settings.json"))
	for _, p := range []string{"shrooms", "shrooms/.shrooms", "shrooms/.shrooms/lock", "shrooms/home", "shrooms/home/.claude/settings.json"} {
		st, err := os.Lstat(filepath.Join(vol, p))
		assert.NilError(t, err, p)
		assert.Equal(t, st.Sys().(*syscall.Stat_t).Uid, uint32(1000), p)
	}
	// A second turn's reset on the same root.
	code, _, errOut = reset(1000, filepath.Join(vol, "shrooms"), "1000")
	assert.Equal(t, code, 0, "stderr: %s", errOut)

	code, _, errOut = reset(1000, filepath.Join(vol, "shrooms"), "1001")
	assert.Equal(t, code, ExitUsage)
	assert.Check(t, is.Contains(errOut, "running as uid 1000 gid 1000 without privilege, --uid/--gid must be those (got 1001:1001)"))

	foreign := mk("foreign", 0)
	assert.NilError(t, os.Chmod(foreign, 0o755))
	code, _, errOut = reset(1000, foreign, "1000")
	assert.Check(t, code != 0)
	assert.Check(t, is.Contains(errOut, "must be owned by uid 1000 (the reset's user)"))
	code, _, errOut = reset(0, foreign, "1000")
	assert.Equal(t, code, 0, "positive control, as root: %s", errOut)
}
