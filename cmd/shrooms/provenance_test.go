package main

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/shrooms-cage/shrooms/internal/itest"
)

// TestResultProvenanceAndWorktreeChanges: run --json names the image (as
// podman inspects it), the config file's digest (its bytes' sha256), and
// what the turn changed in the worktree, with the agent config it planted
// flagged; a turn that changes nothing reports nothing.
func TestResultProvenanceAndWorktreeChanges(t *testing.T) {
	e, _ := integration(t, "")
	wt := filepath.Join(e.Dir, "repo")
	assert.NilError(t, os.Mkdir(wt, 0o755))
	git(t, wt, "init", "-q", "-b", "main")
	for _, f := range []string{"keep.txt", "edit.txt", "gone.txt", "AGENTS.md"} {
		assert.NilError(t, os.WriteFile(filepath.Join(wt, f), []byte(f+"\n"), 0o644))
	}
	task := e.Task("prov")
	code, stdout, stderr := e.Shrooms("run", "--json", "--task", task, "--agent", "shell", "--worktree", wt, "--", "-c",
		`echo more >> /work/edit.txt && rm /work/gone.txt && echo new > /work/new.txt && mkdir -p /work/src/.claude && echo '{"hooks":{}}' > /work/src/.claude/settings.json && echo evil >> /work/AGENTS.md`)
	assert.Equal(t, code, 0, stderr)
	m := lastObject(t, stdout)

	ch := m["worktree_changes"].(map[string]any)
	assert.Equal(t, ch["added"], float64(4), "new.txt, src, src/.claude, settings.json: %v", ch)
	assert.Equal(t, ch["modified"], float64(2), "edit.txt, AGENTS.md: %v", ch)
	assert.Equal(t, ch["deleted"], float64(1), "gone.txt: %v", ch)
	var flagged []string
	for _, a := range ch["agent_config"].([]any) {
		a := a.(map[string]any)
		flagged = append(flagged, a["path"].(string)+" "+a["change"].(string))
		assert.Check(t, a["why"].(string) != "")
	}
	assert.DeepEqual(t, flagged, []string{"AGENTS.md modified", "src/.claude added"})
	assert.Check(t, ch["scan_ms"].(float64) > 0)

	img := m["image"].(map[string]any)
	out, err := exec.Command("podman", "--url", itest.Socket(), "image", "inspect", itest.TestImage, "--format", "{{.ID}} {{.Digest}}").Output()
	assert.NilError(t, err)
	assert.Equal(t, img["id"].(string)+" "+img["digest"].(string), strings.TrimSpace(string(out)))
	assert.Equal(t, img["name"], itest.TestImage)

	b, err := os.ReadFile(e.Config)
	assert.NilError(t, err)
	sum := sha256.Sum256(b)
	assert.Equal(t, m["config_digest"], "sha256:"+hex.EncodeToString(sum[:]))
	_, sealed := m["seal_digest"]
	assert.Check(t, !sealed, "policy none has no seal to name")

	// A turn that changes nothing.
	code, stdout, stderr = e.Shrooms("run", "--json", "--task", task, "--agent", "shell", "--worktree", wt, "--", "-c", "cat /work/keep.txt")
	assert.Equal(t, code, 0, stderr)
	ch = lastObject(t, stdout)["worktree_changes"].(map[string]any)
	assert.Check(t, is.DeepEqual([]any{ch["added"], ch["modified"], ch["deleted"], ch["agent_config_count"]}, []any{0.0, 0.0, 0.0, 0.0}))
}
