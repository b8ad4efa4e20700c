package agents_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/shrooms-cage/shrooms/internal/itest"
	"github.com/shrooms-cage/shrooms/internal/modelapi"
	"github.com/shrooms-cage/shrooms/internal/tbworld"
	"github.com/shrooms-cage/shrooms/pkg/worktree/guard"
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

func turnImports(e *tbworld.World, agent string, args ...string) (string, importsResult) {
	e.T.Helper()
	code, out, errb := e.CLI(append([]string{"--json", "run", "--task", e.Task(agent), "--agent", agent, "--worktree", e.Worktree, "--no-stdin", "--"}, args...)...)
	assert.Equal(e.T, code, 0, "turn of %s failed\nstdout: %s\nstderr: %s\nmodel API log:\n%s", agent, out, errb, e.API.Log())
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	var res importsResult
	assert.NilError(e.T, json.Unmarshal([]byte(lines[len(lines)-1]), &res), "last stdout line: %s", lines[len(lines)-1])
	return strings.Join(lines[:len(lines)-1], "\n"), res
}

// ownerFiles writes the owner's files into the worktree before the first
// turn (which records them as trusted) and commits them.
func ownerFiles(e *tbworld.World, files map[string]string) {
	e.T.Helper()
	for rel, content := range files {
		p := filepath.Join(e.Worktree, rel)
		assert.NilError(e.T, os.MkdirAll(filepath.Dir(p), 0o755))
		assert.NilError(e.T, os.WriteFile(p, []byte(content), 0o644))
	}
	git(e.T, e.Worktree, "add", "-A")
	git(e.T, e.Worktree, "-c", "user.name=t", "-c", "user.email=t@example.invalid", "commit", "-qm", "owner's config")
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
// CLAUDE.md imports guide/notes.md (`@guide/notes.md`). Real Claude Code
// turn 1 rewrites guide/notes.md with a code word through its Bash tool
// (and appends to scripts/env.sh, which the trusted .envrc sources: listed
// as agent config, run by .envrc).
// The positive control (a bare `podman run` of claude, a fresh session, on
// a copy of the worktree) sends the code word to the model: Claude Code
// follows the import. Turn 2 through shrooms, also a fresh session, sends
// the owner's notes (the trusted copy is mounted over the edit) and not
// the code word; run --json lists guide/notes.md masked, and turn 1's
// worktree_changes lists it as agent config imported by CLAUDE.md.
func TestClaudeImportedFileEditDoesNotReachNextSession(t *testing.T) {
	itest.Require(t, itest.Root, itest.Podman, itest.Nftables, itest.Netns)
	e := newEnv(t)
	nonce := e.Prefix
	owner := "OWNERNOTES-" + nonce
	word := "IMPORTWORD-42-" + nonce
	ownerFiles(e, map[string]string{
		"CLAUDE.md":      "Project rules. Read the notes: @guide/notes.md\n",
		"guide/notes.md": "Owner's notes " + owner + "\n",
		".envrc":         "source_env scripts/env.sh\n",
		"scripts/env.sh": "export OWNER=1\n",
	})
	e.API.Append(
		// The code word exists only once the shell expands it.
		bash(`echo "Code word IMPORTWORD-$((6*7))-`+nonce+`" > /work/guide/notes.md`),
		// A script the trusted .envrc sources (run by direnv on the host).
		bash(`echo 'touch /tmp/owned' >> /work/scripts/env.sh`),
		modelapi.Text("edited "+nonce),
	)
	out, r1 := turnImports(e, "claude", "-p", "--output-format", "json", "edit the notes "+nonce)
	assert.Assert(t, !parseClaude(t, out).IsError, out)
	assert.Equal(t, e.API.Remaining(), 0, "turn 1 did not run the whole script:\n%s", e.API.Log())
	assert.Assert(t, r1.WorktreeGuard != nil && r1.WorktreeGuard.Recorded)
	assert.Assert(t, is.Contains(requestBodies(e.API.Scripted()), owner), "turn 1 loaded the owner's import")
	assert.Assert(t, r1.WorktreeChanges != nil)
	whys := map[string]string{}
	for _, c := range r1.WorktreeChanges.AgentConfig {
		whys[c.Path] = c.Why
	}
	assert.Equal(t, whys["guide/notes.md"], "imported by the trusted CLAUDE.md (Claude Code @import)", "turn 1's agent config: %+v", r1.WorktreeChanges)
	assert.Equal(t, whys["scripts/env.sh"], "run by the trusted .envrc (direnv, on entering the directory)", "turn 1's agent config: %+v", r1.WorktreeChanges)

	// Positive control: a fresh claude session without shrooms.
	before := len(e.API.Scripted())
	e.API.Append(modelapi.Text("control " + nonce))
	control(e, "claude", []string{"ANTHROPIC_BASE_URL=" + e.APIURL, "ANTHROPIC_API_KEY=" + apiKey},
		"claude", "--dangerously-skip-permissions", "-p", "--output-format", "json", "hello "+nonce)
	ctl := requestBodies(requestsSince(e.API, before))
	assert.Assert(t, is.Contains(ctl, word), "positive control: the edited import reaches the model without shrooms")

	// Turn 2 through shrooms: a fresh session.
	before = len(e.API.Scripted())
	e.API.Append(modelapi.Text("fresh " + nonce))
	out, r2 := turnImports(e, "claude", "-p", "--output-format", "json", "hello again "+nonce)
	assert.Equal(t, parseClaude(t, out).Result, "fresh "+nonce)
	got := requestBodies(requestsSince(e.API, before))
	assert.Assert(t, got != "")
	assert.Assert(t, !strings.Contains(got, word), "the turn's edit of the imported file reached the next session")
	assert.Assert(t, is.Contains(got, owner), "the trusted copy of the import is what the session loads")
	assert.Assert(t, listed(r2.WorktreeGuard.Masked, "guide/notes.md"), "masked: %v", r2.WorktreeGuard.Masked)
	ok := false
	for _, c := range r2.WorktreeGuard.Changes {
		ok = ok || (c.Path == "guide/notes.md" && c.Change == "modified" && strings.Contains(c.Why, "CLAUDE.md"))
	}
	assert.Assert(t, ok, "changes: %+v", r2.WorktreeGuard.Changes)
	data, err := os.ReadFile(filepath.Join(e.Worktree, "guide/notes.md"))
	assert.NilError(t, err)
	assert.Assert(t, is.Contains(string(data), word), "the worktree keeps the turn's edit (masked, not reverted)")

	// The commit path names it; trusting it unmasks it.
	code, stdout, stderr := e.CLI("commit", "--task", e.Task("claude"), "-m", "notes")
	assert.Equal(t, code, 121, "%s %s", stdout, stderr)
	assert.Assert(t, is.Contains(stderr, "guide/notes.md (modified: imported by the trusted CLAUDE.md"))
	code, stdout, stderr = e.CLI("commit", "--task", e.Task("claude"), "-m", "notes", "--allow-agent-config", "guide/notes.md")
	assert.Equal(t, code, 0, "%s %s", stdout, stderr)
	code, stdout, stderr = e.CLI("spec", "--task", e.Task("claude"), "--agent", "claude", "--worktree", e.Worktree, "--no-stdin")
	assert.Equal(t, code, 0, stderr)
	assert.Assert(t, !strings.Contains(stdout, `"/work/guide/notes.md"`), "the accepted import is still masked")
}

// TestOpencodeInstructionsGlobEditDoesNotReachNextSession: the owner's
// trusted opencode.json has `"instructions": ["guide/*.md"]`. Real opencode
// turn 1 edits guide/style.md and creates guide/planted.md (a new match of
// the glob), each with a code word. The positive control (bare `podman
// run` of opencode, a fresh session) sends both code words to the model.
// Turn 2 through shrooms (fresh) sends neither and the owner's style text
// instead; run --json lists both masked.
func TestOpencodeInstructionsGlobEditDoesNotReachNextSession(t *testing.T) {
	itest.Require(t, itest.Root, itest.Podman, itest.Nftables, itest.Netns)
	e := newEnv(t)
	nonce := e.Prefix
	owner := "OWNERSTYLE-" + nonce
	edited := "GLOBEDIT-42-" + nonce
	planted := "GLOBNEW-42-" + nonce
	ownerFiles(e, map[string]string{
		"opencode.json":  `{"$schema": "https://opencode.ai/config.json", "instructions": ["guide/*.md"]}` + "\n",
		"guide/style.md": "Owner's style " + owner + "\n",
	})
	e.API.Append(
		ocBash(`echo "Code word GLOBEDIT-$((6*7))-`+nonce+`" > /work/guide/style.md; echo "Code word GLOBNEW-$((6*7))-`+nonce+`" > /work/guide/planted.md`),
		modelapi.Text("edited "+nonce),
	)
	_, r1 := turnImports(e, "opencode", "--format", "json", "edit the style "+nonce)
	assert.Equal(t, e.API.Remaining(), 0, "turn 1 did not run the whole script:\n%s", e.API.Log())
	assert.Assert(t, r1.WorktreeGuard != nil && r1.WorktreeGuard.Recorded)
	assert.Assert(t, is.Contains(requestBodies(e.API.Scripted()), owner), "turn 1 loaded the owner's instructions")
	var agentConfig []string
	for _, c := range r1.WorktreeChanges.AgentConfig {
		agentConfig = append(agentConfig, c.Path)
	}
	assert.Assert(t, listed(agentConfig, "guide/planted.md", "guide/style.md"), "turn 1's agent config: %v", agentConfig)

	before := len(e.API.Scripted())
	e.API.Append(modelapi.Text("control " + nonce))
	control(e, "opencode", []string{"ANTHROPIC_API_KEY=" + apiKey, "npm_config_offline=true"},
		"opencode", "run", "--format", "json", "hello "+nonce)
	ctl := requestBodies(requestsSince(e.API, before))
	assert.Assert(t, is.Contains(ctl, edited), "positive control: the edited instructions file reaches the model")
	assert.Assert(t, is.Contains(ctl, planted), "positive control: the new glob match reaches the model")

	before = len(e.API.Scripted())
	e.API.Append(modelapi.Text("fresh " + nonce))
	_, r2 := turnImports(e, "opencode", "--format", "json", "hello again "+nonce)
	got := requestBodies(requestsSince(e.API, before))
	assert.Assert(t, got != "")
	assert.Assert(t, !strings.Contains(got, edited), "the edited instructions file reached the next session")
	assert.Assert(t, !strings.Contains(got, planted), "the planted glob match reached the next session")
	assert.Assert(t, is.Contains(got, owner), "the trusted instructions still load (opencode.json is trusted and unchanged)")
	assert.DeepEqual(t, r2.WorktreeGuard.Masked, []string{"guide/planted.md", "guide/style.md"})
}

// TestImportRulesMatchTheAgents runs the real agents (bare `podman run`,
// no shrooms) on a worktree whose CLAUDE.md and AGENTS.md use every form
// of reference the guard's reader distinguishes, each target carrying its
// own code word, and checks that every file an agent loaded is one the
// guard trusts by digest (the guard's reading may load more, never less),
// and that the cases the docs state hold for these binaries.
func TestImportRulesMatchTheAgents(t *testing.T) {
	itest.Require(t, itest.Root, itest.Podman, itest.Nftables, itest.Netns)
	e := newEnv(t)
	nonce := e.Prefix
	word := func(id string) string { return "RULE-" + id + "-" + nonce }
	files := map[string]string{
		"CLAUDE.md": strings.Join([]string{
			"Plain @guide/plain.md and a fragment @guide/frag.md#part",
			"A trailing dot @guide/dot.md.",
			"In a span `@guide/span.md` here",
			"```", "@guide/fenced.md", "```",
			"<!-- @guide/comment.md -->",
			"A chain @guide/c1.md and a cycle @guide/cycle-a.md",
			"An escaped space @guide/my\\ file.md",
			"",
		}, "\n"),
		"AGENTS.md":        "Shared rules. @guide/agents-import.md\n",
		"opencode.json":    `{"instructions": ["rules/*.md"]}` + "\n",
		"rules/main.md":    word("oc-glob") + "\n",
		"guide/cycle-a.md": word("cycle-a") + " @cycle-b.md\n",
		"guide/cycle-b.md": word("cycle-b") + " @cycle-a.md\n",
		"guide/my file.md": word("space") + "\n",
	}
	ids := []string{"plain", "frag", "dot", "span", "fenced", "comment", "agents-import"}
	for _, id := range ids {
		files["guide/"+id+".md"] = word(id) + "\n"
	}
	for i := 1; i <= 6; i++ {
		next := ""
		if i < 6 {
			next = fmt.Sprintf(" @c%d.md", i+1)
		}
		files[fmt.Sprintf("guide/c%d.md", i)] = word(fmt.Sprintf("c%d", i)) + next + "\n"
	}
	ownerFiles(e, files)
	file := map[string]string{"oc-glob": "rules/main.md", "cycle-a": "guide/cycle-a.md", "cycle-b": "guide/cycle-b.md", "space": "guide/my file.md"}
	for _, id := range ids {
		file[id] = "guide/" + id + ".md"
	}
	for i := 1; i <= 6; i++ {
		file[fmt.Sprintf("c%d", i)] = fmt.Sprintf("guide/c%d.md", i)
	}

	// What the guard trusts by digest.
	store := guard.Store{Dir: filepath.Join(e.Dir, "rules-trust")}
	res, err := store.Trust(context.Background(), e.Worktree, nil)
	assert.NilError(t, err)
	guarded := map[string]bool{"AGENTS.md": true, "CLAUDE.md": true, "opencode.json": true}
	for _, l := range res.Loads {
		guarded[l] = true
	}

	loaded := func(agent string, envs []string, args ...string) []string {
		home := filepath.Join(e.Dir, agent+"-rules-home")
		work := filepath.Join(e.Dir, agent+"-rules-work")
		for _, c := range [][]string{{"mkdir", "-p", home + "/.config/opencode", work}, {"cp", "-a", e.Worktree + "/.", work + "/"},
			{"cp", filepath.Join(e.Dir, "opencode.json"), home + "/.config/opencode/opencode.json"}, {"chown", "-R", "1000:1000", home, work}} {
			out, err := exec.Command(c[0], c[1:]...).CombinedOutput()
			assert.NilError(t, err, "%v: %s", c, out)
		}
		before := len(e.API.Scripted())
		e.API.Append(modelapi.Text("rules " + nonce))
		bare(e, home, work, envs, args...)
		body := requestBodies(requestsSince(e.API, before))
		assert.Assert(t, body != "", "%s sent no request", agent)
		var got []string
		for id := range file {
			if strings.Contains(body, word(id)) {
				got = append(got, id)
			}
		}
		slices.Sort(got)
		t.Logf("%s loaded: %v", agent, got)
		for _, id := range got {
			assert.Assert(t, guarded[file[id]], "%s loaded %s, which the guard does not trust by digest (trusted loads: %v)", agent, file[id], res.Loads)
		}
		return got
	}
	claude := loaded("claude", []string{"ANTHROPIC_BASE_URL=" + e.APIURL, "ANTHROPIC_API_KEY=" + apiKey},
		"claude", "--dangerously-skip-permissions", "-p", "--output-format", "json", "rules "+nonce)
	// Claude Code 2.1.332: code spans, fenced blocks and HTML comments are
	// not read; a trailing dot is part of the path; four hops are read.
	assert.DeepEqual(t, claude, []string{"c1", "c2", "c3", "c4", "cycle-a", "cycle-b", "frag", "plain", "space"})
	opencode := loaded("opencode", []string{"ANTHROPIC_API_KEY=" + apiKey, "npm_config_offline=true"},
		"opencode", "run", "--format", "json", "rules "+nonce)
	assert.Assert(t, slices.Contains(opencode, "oc-glob"), "opencode loads its instructions glob: %v", opencode)
	// The guard's reading is wider where it is unsure: it trusts these too.
	for _, rel := range []string{"guide/comment.md", "guide/c5.md"} {
		assert.Assert(t, guarded[rel], "%s: %v", rel, res.Loads)
	}
	for _, rel := range []string{"guide/span.md", "guide/fenced.md", "guide/c6.md"} {
		assert.Assert(t, !guarded[rel], "%s: %v", rel, res.Loads)
	}
}

// TestOpencodeTrustedMCPScriptEditDoesNotRun: the owner's trusted
// opencode.json starts a local MCP server, `sh scripts/mcp.sh` (it only
// drops a marker). Real opencode turn 1 appends a payload to
// scripts/mcp.sh. The positive control (bare `podman run` of opencode on a
// copy) runs the payload; turn 2 through shrooms runs the owner's script
// (the trusted copy is mounted over the edit) and not the payload, and
// run --json lists scripts/mcp.sh masked.
func TestOpencodeTrustedMCPScriptEditDoesNotRun(t *testing.T) {
	itest.Require(t, itest.Root, itest.Podman, itest.Nftables, itest.Netns)
	e := newEnv(t)
	nonce := e.Prefix
	ownerFiles(e, map[string]string{
		// With $schema: opencode adds it to a project config that lacks it,
		// which would be a change (masked, project config off).
		"opencode.json":  `{"$schema": "https://opencode.ai/config.json", "mcp": {"tools": {"type": "local", "command": ["sh", "scripts/mcp.sh"]}}}` + "\n",
		"scripts/mcp.sh": "mkdir -p /work/.m; touch /work/.m/owner-mcp\n",
	})
	e.API.Append(
		ocBash(`echo 'touch /work/.m/evil-mcp' >> /work/scripts/mcp.sh`),
		modelapi.Text("edited "+nonce),
	)
	_, r1 := turnImports(e, "opencode", "--format", "json", "edit the server "+nonce)
	assert.Equal(t, e.API.Remaining(), 0, "turn 1 did not run the whole script:\n%s", e.API.Log())
	assert.Assert(t, r1.WorktreeGuard != nil && r1.WorktreeGuard.Recorded)
	assert.Assert(t, slices.Contains(markers(t, e.Worktree), "owner-mcp"), "turn 1 ran the owner's trusted server")
	assert.NilError(t, os.RemoveAll(filepath.Join(e.Worktree, ".m")))

	e.API.Append(modelapi.Text("control " + nonce))
	ctlWork, _ := control(e, "opencode", []string{"ANTHROPIC_API_KEY=" + apiKey, "npm_config_offline=true"},
		"opencode", "run", "--format", "json", "hello "+nonce)
	assert.Assert(t, slices.Contains(markers(t, ctlWork), "evil-mcp"), "positive control: the edited server script runs without shrooms: %v", markers(t, ctlWork))

	e.API.Append(modelapi.Text("fresh " + nonce))
	_, r2 := turnImports(e, "opencode", "--format", "json", "hello again "+nonce)
	got := markers(t, e.Worktree)
	assert.Assert(t, !slices.Contains(got, "evil-mcp"), "the edited server script ran through shrooms: %v", got)
	assert.Assert(t, slices.Contains(got, "owner-mcp"), "the trusted copy of the server script ran: %v", got)
	assert.DeepEqual(t, r2.WorktreeGuard.Masked, []string{"scripts/mcp.sh"})
}
