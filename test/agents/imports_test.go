package agents_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/shrooms-cage/shrooms/internal/itest"
	"github.com/shrooms-cage/shrooms/internal/modelapi"
)

// importsResult is the part of `run --json`'s result the imports tests read.
type importsResult struct {
	ExitCode      int `json:"exit_code"`
	WorktreeGuard *struct {
		Recorded bool     `json:"recorded"`
		Masked   []string `json:"masked"`
		Changes  []struct {
			Path   string `json:"path"`
			Change string `json:"change"`
			Why    string `json:"why"`
		} `json:"changes"`
	} `json:"worktree_guard"`
	WorktreeChanges *struct {
		AgentConfig []struct {
			Path   string `json:"path"`
			Change string `json:"change"`
			Why    string `json:"why"`
		} `json:"agent_config"`
	} `json:"worktree_changes"`
}

func (e *env) turnImports(agent string, args ...string) (string, importsResult) {
	e.t.Helper()
	code, out, errb := e.run(append([]string{"--json", "run", "--task", e.task(agent), "--agent", agent, "--worktree", e.worktree, "--no-stdin", "--"}, args...)...)
	assert.Equal(e.t, code, 0, "turn of %s failed\nstdout: %s\nstderr: %s\nmodel API log:\n%s", agent, out, errb, e.api.Log())
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	var res importsResult
	assert.NilError(e.t, json.Unmarshal([]byte(lines[len(lines)-1]), &res), "last stdout line: %s", lines[len(lines)-1])
	return strings.Join(lines[:len(lines)-1], "\n"), res
}

// ownerFiles writes the owner's files into the worktree before the first
// turn (which records them as trusted) and commits them.
func (e *env) ownerFiles(files map[string]string) {
	e.t.Helper()
	for rel, content := range files {
		p := filepath.Join(e.worktree, rel)
		assert.NilError(e.t, os.MkdirAll(filepath.Dir(p), 0o755))
		assert.NilError(e.t, os.WriteFile(p, []byte(content), 0o644))
	}
	git(e.t, e.worktree, "add", "-A")
	git(e.t, e.worktree, "-c", "user.name=t", "-c", "user.email=t@example.invalid", "commit", "-qm", "owner's config")
}

func requestBodies(reqs []modelapi.Request) string {
	var b strings.Builder
	for _, r := range reqs {
		b.Write(r.Body)
	}
	return b.String()
}

func listed(paths []string, want ...string) bool {
	for _, w := range want {
		if !slices.Contains(paths, w) {
			return false
		}
	}
	return true
}

// TestClaudeImportedFileEditDoesNotReachNextSession: the owner's trusted
// CLAUDE.md imports docs/notes.md (`@docs/notes.md`). Real Claude Code
// turn 1 rewrites docs/notes.md with a code word through its Bash tool.
// The positive control (a bare `podman run` of claude, a fresh session, on
// a copy of the worktree) sends the code word to the model: Claude Code
// follows the import. Turn 2 through shrooms, also a fresh session, sends
// the owner's notes (the trusted copy is mounted over the edit) and not
// the code word; run --json lists docs/notes.md masked, and turn 1's
// worktree_changes lists it as agent config imported by CLAUDE.md.
func TestClaudeImportedFileEditDoesNotReachNextSession(t *testing.T) {
	itest.Require(t, itest.Root, itest.Podman, itest.Nftables, itest.Netns)
	e := newEnv(t)
	nonce := e.name
	owner := "OWNERNOTES-" + nonce
	word := "IMPORTWORD-42-" + nonce
	e.ownerFiles(map[string]string{
		"CLAUDE.md":     "Project rules. Read the notes: @docs/notes.md\n",
		"docs/notes.md": "Owner's notes " + owner + "\n",
	})
	e.api.Append(
		// The code word exists only once the shell expands it.
		bash(`echo "Code word IMPORTWORD-$((6*7))-`+nonce+`" > /work/docs/notes.md`),
		modelapi.Text("edited "+nonce),
	)
	out, r1 := e.turnImports("claude", "-p", "--output-format", "json", "edit the notes "+nonce)
	assert.Assert(t, !parseClaude(t, out).IsError, out)
	assert.Equal(t, e.api.Remaining(), 0, "turn 1 did not run the whole script:\n%s", e.api.Log())
	assert.Assert(t, r1.WorktreeGuard != nil && r1.WorktreeGuard.Recorded)
	assert.Assert(t, is.Contains(requestBodies(e.api.Scripted()), owner), "turn 1 loaded the owner's import")
	assert.Assert(t, r1.WorktreeChanges != nil)
	found := false
	for _, c := range r1.WorktreeChanges.AgentConfig {
		if c.Path == "docs/notes.md" {
			found = true
			assert.Equal(t, c.Why, "imported by the trusted CLAUDE.md (Claude Code @import)")
		}
	}
	assert.Assert(t, found, "turn 1's worktree_changes list docs/notes.md: %+v", r1.WorktreeChanges)

	// Positive control: a fresh claude session without shrooms.
	before := len(e.api.Scripted())
	e.api.Append(modelapi.Text("control " + nonce))
	e.control("claude", []string{"ANTHROPIC_BASE_URL=" + e.apiURL, "ANTHROPIC_API_KEY=" + apiKey},
		"claude", "--dangerously-skip-permissions", "-p", "--output-format", "json", "hello "+nonce)
	ctl := requestBodies(requestsSince(e.api, before))
	assert.Assert(t, is.Contains(ctl, word), "positive control: the edited import reaches the model without shrooms")

	// Turn 2 through shrooms: a fresh session.
	before = len(e.api.Scripted())
	e.api.Append(modelapi.Text("fresh " + nonce))
	out, r2 := e.turnImports("claude", "-p", "--output-format", "json", "hello again "+nonce)
	assert.Equal(t, parseClaude(t, out).Result, "fresh "+nonce)
	got := requestBodies(requestsSince(e.api, before))
	assert.Assert(t, got != "")
	assert.Assert(t, !strings.Contains(got, word), "the turn's edit of the imported file reached the next session")
	assert.Assert(t, is.Contains(got, owner), "the trusted copy of the import is what the session loads")
	assert.Assert(t, listed(r2.WorktreeGuard.Masked, "docs/notes.md"), "masked: %v", r2.WorktreeGuard.Masked)
	ok := false
	for _, c := range r2.WorktreeGuard.Changes {
		ok = ok || (c.Path == "docs/notes.md" && c.Change == "modified" && strings.Contains(c.Why, "CLAUDE.md"))
	}
	assert.Assert(t, ok, "changes: %+v", r2.WorktreeGuard.Changes)
	data, err := os.ReadFile(filepath.Join(e.worktree, "docs/notes.md"))
	assert.NilError(t, err)
	assert.Assert(t, is.Contains(string(data), word), "the worktree keeps the turn's edit (masked, not reverted)")

	// The commit path names it; trusting it unmasks it.
	code, stdout, stderr := e.run("commit", "--task", e.task("claude"), "-m", "notes")
	assert.Equal(t, code, 121, "%s %s", stdout, stderr)
	assert.Assert(t, is.Contains(stderr, "docs/notes.md (modified: imported by the trusted CLAUDE.md"))
}

// TestOpencodeInstructionsGlobEditDoesNotReachNextSession: the owner's
// trusted opencode.json has `"instructions": ["docs/*.md"]`. Real opencode
// turn 1 edits docs/style.md and creates docs/planted.md (a new match of
// the glob), each with a code word. The positive control (bare `podman
// run` of opencode, a fresh session) sends both code words to the model.
// Turn 2 through shrooms (fresh) sends neither and the owner's style text
// instead; run --json lists both masked.
func TestOpencodeInstructionsGlobEditDoesNotReachNextSession(t *testing.T) {
	itest.Require(t, itest.Root, itest.Podman, itest.Nftables, itest.Netns)
	e := newEnv(t)
	nonce := e.name
	owner := "OWNERSTYLE-" + nonce
	edited := "GLOBEDIT-42-" + nonce
	planted := "GLOBNEW-42-" + nonce
	e.ownerFiles(map[string]string{
		"opencode.json": `{"$schema": "https://opencode.ai/config.json", "instructions": ["docs/*.md"]}` + "\n",
		"docs/style.md": "Owner's style " + owner + "\n",
	})
	e.api.Append(
		ocBash(`echo "Code word GLOBEDIT-$((6*7))-`+nonce+`" > /work/docs/style.md; echo "Code word GLOBNEW-$((6*7))-`+nonce+`" > /work/docs/planted.md`),
		modelapi.Text("edited "+nonce),
	)
	_, r1 := e.turnImports("opencode", "--format", "json", "edit the style "+nonce)
	assert.Equal(t, e.api.Remaining(), 0, "turn 1 did not run the whole script:\n%s", e.api.Log())
	assert.Assert(t, r1.WorktreeGuard != nil && r1.WorktreeGuard.Recorded)
	assert.Assert(t, is.Contains(requestBodies(e.api.Scripted()), owner), "turn 1 loaded the owner's instructions")
	var agentConfig []string
	for _, c := range r1.WorktreeChanges.AgentConfig {
		agentConfig = append(agentConfig, c.Path)
	}
	assert.Assert(t, listed(agentConfig, "docs/planted.md", "docs/style.md"), "turn 1's agent config: %v", agentConfig)

	before := len(e.api.Scripted())
	e.api.Append(modelapi.Text("control " + nonce))
	e.control("opencode", []string{"ANTHROPIC_API_KEY=" + apiKey, "npm_config_offline=true"},
		"opencode", "run", "--format", "json", "hello "+nonce)
	ctl := requestBodies(requestsSince(e.api, before))
	assert.Assert(t, is.Contains(ctl, edited), "positive control: the edited instructions file reaches the model")
	assert.Assert(t, is.Contains(ctl, planted), "positive control: the new glob match reaches the model")

	before = len(e.api.Scripted())
	e.api.Append(modelapi.Text("fresh " + nonce))
	_, r2 := e.turnImports("opencode", "--format", "json", "hello again "+nonce)
	got := requestBodies(requestsSince(e.api, before))
	assert.Assert(t, got != "")
	assert.Assert(t, !strings.Contains(got, edited), "the edited instructions file reached the next session")
	assert.Assert(t, !strings.Contains(got, planted), "the planted glob match reached the next session")
	assert.Assert(t, is.Contains(got, owner), "the trusted instructions still load (opencode.json is trusted and unchanged)")
	assert.DeepEqual(t, r2.WorktreeGuard.Masked, []string{"docs/planted.md", "docs/style.md"})
}
