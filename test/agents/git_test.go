package agents_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/shrooms-cage/shrooms/internal/modelapi"
)

// TestGitInTheCage: the worktree's .git is root-owned and read-only in the
// cage, so git refuses it as "dubious ownership" unless /work is a safe
// directory; every cage gets that from its environment
// (GIT_CONFIG_COUNT/KEY/VALUE) and from a system git config shrooms mounts
// read-only (Claude Code clears those variables from its own git commands),
// never from a file a turn can write. Real Claude Code's first request to
// the model carries the real git status (the modified file, the last
// commit), and its Bash tool's git status/log/diff work, while a commit (a
// write to .git) still fails. Each source alone suffices; the control, in
// the same cage: git without both refuses the repository.
func TestGitInTheCage(t *testing.T) {
	e := newEnv(t)
	nonce := e.Prefix
	git(t, e.Worktree, "-c", "user.name=t", "-c", "user.email=t@example.invalid", "commit", "-q", "--allow-empty", "-m", "subject-"+nonce)
	assert.NilError(t, os.WriteFile(filepath.Join(e.Worktree, "README"), []byte("changed "+nonce+"\n"), 0o644))

	e.API.Append(
		bash(`cd /work && { echo "== status"; git status --short; echo "== log"; git log --oneline -1; echo "== diff"; git diff | grep '^+changed'; `+
			`echo "== commit"; git -c user.name=a -c user.email=a@b commit -qam x 2>&1 && echo WRITE-OK || echo WRITE-REFUSED; `+
			`echo "== env only"; GIT_CONFIG_NOSYSTEM=1 git status --short; echo "== system only"; env -u GIT_CONFIG_COUNT git status --short; `+
			`echo "== control"; GIT_CONFIG_NOSYSTEM=1 env -u GIT_CONFIG_COUNT git status 2>&1 | head -n 2; } > /work/git.txt 2>&1`),
		modelapi.Text("git done "+nonce),
	)
	out, _ := runTurn(e, "claude", "-p", "--output-format", "json", "look at git "+nonce)
	r := parseClaude(t, out)
	assert.Assert(t, !r.IsError, out)
	reqs := e.API.Scripted()
	assert.Assert(t, len(reqs) >= 1, e.API.Log())
	first := string(reqs[0].Body)
	// Claude Code's context: "# gitStatus ... Status: ... Recent commits: ...".
	gs := "(no gitStatus in the first request)"
	if a := strings.Index(first, "# gitStatus"); a >= 0 {
		gs = first[a:]
		if b := strings.Index(gs, "</system-reminder>"); b > 0 {
			gs = gs[:b]
		}
	}
	t.Logf("the first request's git status: %s", gs)
	assert.Check(t, is.Contains(gs, "subject-"+nonce), "the last commit is in the git status")
	assert.Check(t, is.Contains(gs, "M README"), "the modified file is in the git status")
	assert.Check(t, !strings.Contains(gs, "(unavailable)"), "Claude Code could not read the git status")

	b, err := os.ReadFile(filepath.Join(e.Worktree, "git.txt"))
	assert.NilError(t, err)
	got := string(b)
	t.Logf("the agent's git:\n%s", got)
	status, rest, _ := strings.Cut(got, "== env only")
	each, rest, _ := strings.Cut(rest, "== control")
	assert.Check(t, is.Equal(strings.Count(each, " M README"), 2), "either source alone makes /work safe")
	assert.Check(t, is.Contains(status, " M README"), "git status works")
	assert.Check(t, is.Contains(status, "subject-"+nonce), "git log works")
	assert.Check(t, is.Contains(status, "+changed "+nonce), "git diff works")
	assert.Check(t, is.Contains(status, "WRITE-REFUSED"), "a write to .git still fails")
	assert.Check(t, !strings.Contains(status, "WRITE-OK"))
	assert.Check(t, !strings.Contains(status, "dubious"))
	assert.Check(t, is.Contains(rest, "dubious ownership"), "control: without the cage's git environment git refuses /work")
	assert.Equal(t, strings.Count(gitOut(t, e.Worktree, "log", "--oneline"), "\n"), 2, "no commit was made")
}

func gitOut(t *testing.T, dir string, args ...string) string {
	t.Helper()
	out, err := exec.Command("git", append([]string{"-C", dir}, args...)...).CombinedOutput()
	assert.NilError(t, err, "git %v: %s", args, out)
	return string(out)
}
