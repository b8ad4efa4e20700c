package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

// otherAgentFiles are the worktree files agents other than shrooms' own
// load (Gemini CLI, Crush, Copilot CLI, Cursor CLI, Aider, Amp), each with
// the guarded root it lies in. Each is planted at the root and in a
// subdirectory: those tools search from the working directory up.
var otherAgentFiles = []struct{ file, root string }{
	{".gemini/settings.json", ".gemini"}, {".gemini/.env", ".gemini"},
	{"GEMINI.md", "GEMINI.md"}, {".env", ".env"},
	{"crushrc", "crushrc"}, {".crushrc", ".crushrc"}, {"crush.json", "crush.json"}, {".crush.json", ".crush.json"},
	{".github/hooks/h.json", ".github/hooks"},
	{".cursor/hooks.json", ".cursor"}, {".cursor/mcp.json", ".cursor"},
	{".aider.conf.yml", ".aider.conf.yml"}, {".amp/settings.json", ".amp"},
	{"CRUSH.md", "CRUSH.md"}, {"CRUSH.local.md", "CRUSH.local.md"}, {"crush.md", "crush.md"}, {"Crush.local.md", "Crush.local.md"},
	{"gemini.md", "gemini.md"}, {"agents.md", "agents.md"}, {".github/copilot-instructions.md", ".github/copilot-instructions.md"},
}

// TestOtherAgentsWorktreeFilesMaskedListedAndRefused: turn 1 plants each
// file another agent loads; run --json lists each as agent config; the
// next turn's cage sees none of the planted bytes (masked), while a
// planted file the guard does not know (the positive control: same turn,
// same cat) is seen; `commit` refuses until --allow-agent-config names
// every root, and commits with it.
func TestOtherAgentsWorktreeFilesMaskedListedAndRefused(t *testing.T) {
	e, _ := integration(t, "")
	wt := filepath.Join(e.Dir, "repo")
	assert.NilError(t, os.Mkdir(wt, 0o755))
	git(t, wt, "init", "-q", "-b", "main")
	assert.NilError(t, os.WriteFile(filepath.Join(wt, "README"), []byte("hi\n"), 0o644))
	git(t, wt, "add", "README")
	git(t, wt, "commit", "-q", "-m", "init")
	task := e.Task("others")

	var plant, show strings.Builder
	var roots []string
	for _, dir := range []string{"", "sub/pkg/"} {
		for _, f := range otherAgentFiles {
			p := "/work/" + dir + f.file
			plant.WriteString("mkdir -p $(dirname " + p + ") && echo PLANTED-" + dir + f.file + " > " + p + "\n")
			show.WriteString("cat " + p + " 2>/dev/null; echo\n")
			if r := dir + f.root; !slices.Contains(roots, r) {
				roots = append(roots, r)
			}
		}
	}
	plant.WriteString("mkdir -p /work/notes && echo CONTROL-VISIBLE > /work/notes/plain.txt\n")
	show.WriteString("cat /work/notes/plain.txt\n")
	slices.Sort(roots)

	code, stdout, stderr := e.Shrooms("run", "--json", "--task", task, "--agent", "shell", "--worktree", wt, "--", "-c", plant.String())
	assert.Equal(t, code, 0, stderr)
	var listed []string
	for _, a := range lastObject(t, stdout)["worktree_changes"].(map[string]any)["agent_config"].([]any) {
		a := a.(map[string]any)
		assert.Check(t, a["why"].(string) != "", "%v", a)
		listed = append(listed, a["path"].(string))
	}
	for _, r := range roots {
		assert.Check(t, slices.Contains(listed, r), "%s not listed as agent config: %v", r, listed)
	}

	code, stdout, stderr = e.Shrooms("run", "--json", "--task", task, "--agent", "shell", "--worktree", wt, "--", "-c", show.String())
	assert.Equal(t, code, 0, stderr)
	assert.Assert(t, is.Contains(stdout, "CONTROL-VISIBLE"), "positive control: the cage reads the worktree")
	assert.Assert(t, !strings.Contains(stdout, "PLANTED-"), "a planted file reached the next cage:\n%s", stdout)
	var masked []string
	for _, m := range lastObject(t, stdout)["worktree_guard"].(map[string]any)["masked"].([]any) {
		masked = append(masked, m.(string))
	}
	assert.DeepEqual(t, masked, roots)
	b, err := os.ReadFile(filepath.Join(wt, "sub/pkg/.crushrc"))
	assert.NilError(t, err)
	assert.Equal(t, string(b), "PLANTED-sub/pkg/.crushrc\n", "the host's worktree keeps the planted bytes: the mask hid them")

	code, stdout, stderr = e.Shrooms("commit", "--task", task, "-m", "agent work")
	assert.Equal(t, code, 121, "commit with untrusted agent config: %s %s", stdout, stderr)
	for _, r := range roots {
		assert.Check(t, is.Contains(stderr, r+" (added"))
	}
	args := []string{"--json", "commit", "--task", task, "-m", "agent work"}
	for _, r := range roots {
		args = append(args, "--allow-agent-config", r)
	}
	code, stdout, stderr = e.Shrooms(args[:len(args)-2]...)
	assert.Equal(t, code, 121, "one root not named is still refused: %s %s", stdout, stderr)
	code, stdout, stderr = e.Shrooms(args...)
	assert.Equal(t, code, 0, "commit with every root accepted: %s %s", stdout, stderr)
	var committed struct {
		Commit   string   `json:"commit"`
		Accepted []string `json:"accepted"`
	}
	assert.NilError(t, json.Unmarshal([]byte(stdout), &committed), stdout)
	assert.Assert(t, committed.Commit != "")
	assert.Equal(t, len(committed.Accepted), len(roots))
}
