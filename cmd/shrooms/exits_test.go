package main

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

func git(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", append([]string{"-C", dir, "-c", "user.name=t", "-c", "user.email=t@t", "-c", "safe.directory=*"}, args...)...)
	cmd.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null")
	out, err := cmd.CombinedOutput()
	assert.NilError(t, err, string(out))
	return strings.TrimSpace(string(out))
}

// TestSanctionedExits: a turn on a git worktree leaves a file in the
// worktree and a report (plus a planted symlink) in the outbox; the cage
// cannot write .git; collect delivers only the report; commit records
// exactly the worktree change; reset reports and resets HOME.
func TestSanctionedExits(t *testing.T) {
	e, client := integration(t, "")
	task := e.Task("exits")
	wt := filepath.Join(e.Dir, "repo")
	assert.NilError(t, os.Mkdir(wt, 0o755))
	git(t, wt, "init", "-q", "-b", "main")
	assert.NilError(t, os.WriteFile(filepath.Join(wt, "README"), []byte("hi\n"), 0o644))
	git(t, wt, "add", "README")
	git(t, wt, "commit", "-q", "-m", "init")
	head := git(t, wt, "rev-parse", "HEAD")

	code, stdout, stderr := e.Shrooms("run", "--task", task, "--agent", "shell", "--worktree", wt, "--", "-c", `
echo change > /work/new.txt
if echo x >> /work/.git/config 2>/dev/null; then echo "git config WRITABLE"; fi
if touch /work/.git/hooks/pre-commit 2>/dev/null; then echo "hooks WRITABLE"; fi
cat /work/.git/HEAD
echo report > /outbox/report.txt
ln -s /etc/shadow /outbox/shadow
echo planted > /home/agent/.bashrc
`)
	assert.Equal(t, code, 0, stderr)
	assert.Assert(t, !strings.Contains(stdout, "WRITABLE"), stdout)
	assert.Assert(t, is.Contains(stdout, "ref: refs/heads/main"), "positive control: .git is readable")

	code, stdout, stderr = e.Shrooms("outbox", "list", "--task", task)
	assert.Equal(t, code, 0, stderr)
	assert.Assert(t, is.Contains(stdout, "would deliver report.txt"))
	assert.Assert(t, is.Contains(stdout, `refused "shadow"`))

	inside := filepath.Join(wt, "delivery")
	code, _, stderr = e.Shrooms("outbox", "collect", "--task", task, "--to", inside)
	assert.Equal(t, code, ExitUsage, stderr)
	_, err := os.Stat(inside)
	assert.Assert(t, os.IsNotExist(err), "a refused collect created its delivery directory")

	to := filepath.Join(e.Dir, "delivery")
	code, stdout, stderr = e.Shrooms("--json", "outbox", "collect", "--task", task, "--to", to)
	assert.Equal(t, code, 0, stderr)
	var rep struct {
		Files    []struct{ Name string }
		Rejected []struct{ Name, Reason string }
	}
	assert.NilError(t, json.Unmarshal([]byte(stdout), &rep))
	assert.Equal(t, len(rep.Files), 1)
	assert.Equal(t, rep.Files[0].Name, "report.txt")
	got, err := os.ReadFile(filepath.Join(to, "files", "1", "report.txt"))
	assert.NilError(t, err)
	assert.Equal(t, string(got), "report\n")
	_, err = os.Stat(filepath.Join(to, "manifest.json"))
	assert.NilError(t, err)

	code, stdout, stderr = e.Shrooms("commit", "--task", task, "-m", "agent work")
	assert.Equal(t, code, 0, stderr)
	id := strings.TrimSpace(stdout)
	assert.Equal(t, git(t, wt, "rev-parse", "HEAD"), id)
	assert.Equal(t, git(t, wt, "rev-parse", "HEAD~1"), head)
	assert.Equal(t, git(t, wt, "show", "--name-only", "--format=", "HEAD"), "new.txt")
	code, stdout, _ = e.Shrooms("commit", "--task", task, "-m", "again")
	assert.Equal(t, code, 0)
	assert.Equal(t, stdout, "nothing to commit\n")

	code, stdout, stderr = e.Shrooms("reset", "--task", task, "--dry-run")
	assert.Equal(t, code, 0, stderr)
	assert.Assert(t, is.Contains(stdout, "would reset"))
	assert.Assert(t, is.Contains(stdout, "removed .bashrc"))
	code, _, stderr = e.Shrooms("reset", "--task", task)
	assert.Equal(t, code, 0, stderr)
	code, stdout, _ = e.Shrooms("reset", "--task", task, "--dry-run")
	assert.Equal(t, code, 0)
	assert.Assert(t, !strings.Contains(stdout, ".bashrc"), "reset left .bashrc: %s", stdout)

	// forget removes what shrooms keeps of the task, nothing of the worktree.
	code, _, stderr = e.Shrooms("forget", "--task", task)
	assert.Equal(t, code, 0, stderr)
	ok, err := client.VolumeExists(context.Background(), "shrooms-home-"+e.Prefix+"-"+task)
	assert.NilError(t, err)
	assert.Assert(t, !ok, "the HOME volume survived forget")
	_, err = os.Stat(filepath.Join(e.Dir, "state", "tasks", task))
	assert.Assert(t, os.IsNotExist(err), "the task state survived forget")
	mi, err := os.ReadFile("/proc/self/mountinfo")
	assert.NilError(t, err)
	assert.Assert(t, !strings.Contains(string(mi), task), "a mount of the task survived forget")
	_, err = os.Stat(filepath.Join(wt, "new.txt"))
	assert.NilError(t, err, "forget touched the worktree")

	// forget of a task of which nothing is kept is done already: exit 0.
	code, stdout, stderr = e.Shrooms("--json", "forget", "--task", e.Task("never"))
	assert.Equal(t, code, 0, stderr)
	assert.Assert(t, strings.Contains(stdout, `"forgotten":false`), stdout)
	for _, args := range [][]string{
		{"forget", "--task", "../x"},
		{"commit", "--task", e.Task("never"), "-m", "x"},
		{"outbox", "collect", "--task", e.Task("never")},
		{"reset", "--task", e.Task("never")},
		{"commit", "--task", task, "-m", "x", "--author", "nobody"},
	} {
		code, _, stderr := e.Shrooms(args...)
		assert.Equal(t, code, ExitUsage, "%v: %s", args, stderr)
		assert.Assert(t, strings.Count(strings.TrimSpace(stderr), "\n") == 0, stderr)
	}
}
