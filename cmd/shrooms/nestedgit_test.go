package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

// The worktree's owner in these tests: not root, so git's ownership check
// and file permissions are the owner's, as on a real machine.
const ownerUID = 4242

// ownedRepo makes a git work tree owned by ownerUID under a directory the
// owner can reach, a HOME for the owner's git, and a directory anyone may
// write markers to.
func ownedRepo(t *testing.T) (wt, home, markers string) {
	t.Helper()
	base, err := os.MkdirTemp("", "shrooms-nestedgit-")
	assert.NilError(t, err)
	t.Cleanup(func() { os.RemoveAll(base) })
	assert.NilError(t, os.Chmod(base, 0o755))
	wt, home, markers = filepath.Join(base, "repo"), filepath.Join(base, "home"), filepath.Join(base, "m")
	for _, d := range []string{wt, home, markers} {
		assert.NilError(t, os.Mkdir(d, 0o755))
	}
	assert.NilError(t, os.Chmod(markers, 0o777))
	git(t, wt, "init", "-q", "-b", "main")
	assert.NilError(t, os.WriteFile(filepath.Join(wt, "README"), []byte("hi\n"), 0o644))
	git(t, wt, "add", "README")
	git(t, wt, "commit", "-q", "-m", "init")
	assert.NilError(t, chownR(wt, ownerUID))
	assert.NilError(t, os.Chown(home, ownerUID, ownerUID))
	return wt, home, markers
}

func chownR(root string, uid int) error {
	return filepath.WalkDir(root, func(p string, _ os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, uid, uid)
	})
}

// openPTY returns a pseudo-terminal's two ends (the owner's git pages only
// to a terminal).
func openPTY(t *testing.T) (master, slave *os.File) {
	t.Helper()
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	assert.NilError(t, err)
	assert.NilError(t, unix.IoctlSetPointerInt(int(m.Fd()), unix.TIOCSPTLCK, 0))
	n, err := unix.IoctlGetInt(int(m.Fd()), unix.TIOCGPTN)
	assert.NilError(t, err)
	s, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
	assert.NilError(t, err)
	go func() { _, _ = io.Copy(io.Discard, m) }()
	t.Cleanup(func() { s.Close(); m.Close() })
	return m, s
}

// ownerGit runs the host's git as the worktree's owner, with the owner's
// HOME and no system config (what the owner's shell prompt or hand does).
func ownerGit(t *testing.T, home, dir string, tty *os.File, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "git", append([]string{"-C", dir}, args...)...)
	cmd.Env = []string{"HOME=" + home, "PATH=/usr/bin:/bin", "GIT_CONFIG_NOSYSTEM=1", "PAGER=cat", "TERM=dumb",
		"GIT_AUTHOR_NAME=o", "GIT_AUTHOR_EMAIL=o@example.org", "GIT_COMMITTER_NAME=o", "GIT_COMMITTER_EMAIL=o@example.org"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: ownerUID, Gid: ownerUID}}
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if tty != nil {
		cmd.Stdout = tty
	}
	_ = cmd.Run() // refusals are expected; the markers say what ran
	assert.Assert(t, ctx.Err() == nil, "git %v hung", args)
	return out.String()
}

// vectors runs, as the owner, what runs a repository's config and hooks:
// status (core.fsmonitor), an alias, a fetch over ssh (core.sshCommand), a
// commit (the pre-commit hook) and a forced pager on a terminal (core.pager).
func vectors(t *testing.T, home, dir string) string {
	_, tty := openPTY(t)
	var out strings.Builder
	out.WriteString(ownerGit(t, home, dir, nil, "status"))
	out.WriteString(ownerGit(t, home, dir, nil, "hi"))
	out.WriteString(ownerGit(t, home, dir, nil, "fetch", "origin"))
	out.WriteString(ownerGit(t, home, dir, nil, "commit", "--allow-empty", "-q", "-m", "owner"))
	out.WriteString(ownerGit(t, home, dir, tty, "-p", "log", "-1"))
	return out.String()
}

func fired(t *testing.T, markers string) []string {
	t.Helper()
	ents, err := os.ReadDir(markers)
	assert.NilError(t, err)
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
		assert.NilError(t, os.Remove(filepath.Join(markers, e.Name())))
	}
	slices.Sort(out)
	return out
}

// plantRepo is the shell (the test image has no git: a turn needs none)
// that lays out a git directory at $1 whose config and hook touch markers
// named <what>-$2 on the host.
func plantRepo(markers string) string {
	return fmt.Sprintf(`plant() {
	d=/work/$1; mkdir -p "$d/objects" "$d/refs/heads" "$d/hooks"
	printf 'ref: refs/heads/main\n' > "$d/HEAD"
	cat > "$d/config" <<EOF
[core]
	repositoryformatversion = 0
	bare = false
	fsmonitor = "touch %[1]s/fsmonitor-$2; false"
	pager = "touch %[1]s/pager-$2; cat"
	sshCommand = "touch %[1]s/ssh-$2; false"
[alias]
	hi = "!touch %[1]s/alias-$2"
[remote "origin"]
	url = ssh://example.invalid/x
	fetch = +refs/heads/*:refs/remotes/origin/*
EOF
	printf '#!/bin/sh\ntouch %[1]s/hook-%%s\n' "$2" > "$d/hooks/pre-commit"; chmod 755 "$d/hooks/pre-commit"
}
`, markers)
}

// TestNestedRepoStaysTheCages: a turn creates sub/.git (fsmonitor, pager,
// sshCommand, an alias and a pre-commit hook, each touching its own marker)
// and ptr/.git, a gitdir pointer to a git directory it laid out beside it.
// run --json lists both (and the pointer's target) as agent config and
// names them as kept with the task's user; the owner's git runs none of
// the five in either, also with safe.directory=* in the owner's config;
// shrooms commit refuses, naming sub/.git. Positive control: the same
// repositories chowned to the owner run all five.
func TestNestedRepoStaysTheCages(t *testing.T) {
	e, _ := integration(t, "")
	wt, home, markers := ownedRepo(t)
	task := e.Task("nested")
	code, stdout, stderr := e.Shrooms("run", "--json", "--task", task, "--agent", "shell", "--worktree", wt, "--", "-c", plantRepo(markers)+`
set -e
mkdir -p /work/sub /work/ptr
echo work > /work/sub/file.txt
plant sub/.git sub
plant payload ptr
printf 'gitdir: ../payload\n' > /work/ptr/.git
`)
	assert.Equal(t, code, 0, stderr)
	m := lastObject(t, stdout)
	flagged := map[string]string{}
	for _, a := range m["worktree_changes"].(map[string]any)["agent_config"].([]any) {
		a := a.(map[string]any)
		flagged[a["path"].(string)] = a["change"].(string) + ": " + a["why"].(string)
	}
	const why = "added: a nested git repository: its config and hooks run in the owner's git"
	assert.DeepEqual(t, flagged, map[string]string{"sub/.git": why, "ptr/.git": why, "payload": why})
	kept := m["worktree"].(map[string]any)["kept_nested_repos"].([]any)
	assert.DeepEqual(t, kept, []any{"payload", "ptr/.git", "sub/.git"})
	for _, p := range []string{"sub", "sub/file.txt", "ptr"} {
		fi, err := os.Lstat(filepath.Join(wt, p))
		assert.NilError(t, err)
		assert.Equal(t, fi.Sys().(*syscall.Stat_t).Uid, uint32(ownerUID), "%s is given back", p)
	}

	for _, dir := range []string{"sub", "ptr"} {
		out := vectors(t, home, filepath.Join(wt, dir))
		assert.DeepEqual(t, fired(t, markers), []string(nil))
		assert.Assert(t, out != "", "git said nothing")
	}
	// The owner who told git to trust every directory: the permissions
	// still keep the repository out of the owner's reach.
	assert.NilError(t, os.WriteFile(filepath.Join(home, ".gitconfig"), []byte("[safe]\n\tdirectory = *\n"), 0o644))
	for _, dir := range []string{"sub", "ptr"} {
		vectors(t, home, filepath.Join(wt, dir))
		assert.DeepEqual(t, fired(t, markers), []string(nil))
	}
	assert.NilError(t, os.Remove(filepath.Join(home, ".gitconfig")))

	code, _, stderr = e.Shrooms("commit", "--task", task, "-m", "agent work")
	assert.Assert(t, code != 0)
	assert.Assert(t, is.Contains(stderr, "(payload, ptr/.git, sub/.git)"), stderr)

	// A later turn and its give-back leave them so too.
	code, _, stderr = e.Shrooms("run", "--task", task, "--agent", "shell", "--worktree", wt, "--", "-c", "cat /work/sub/.git/HEAD")
	assert.Equal(t, code, 0, stderr)
	vectors(t, home, filepath.Join(wt, "sub"))
	assert.DeepEqual(t, fired(t, markers), []string(nil))

	// Positive control: chowned to the owner, the same repositories run
	// every vector.
	for _, p := range []string{"sub/.git", "ptr/.git", "payload"} {
		assert.NilError(t, chownR(filepath.Join(wt, p), ownerUID))
	}
	vectors(t, home, filepath.Join(wt, "sub"))
	assert.DeepEqual(t, fired(t, markers), []string{"alias-sub", "fsmonitor-sub", "hook-sub", "pager-sub", "ssh-sub"})
	vectors(t, home, filepath.Join(wt, "ptr"))
	assert.DeepEqual(t, fired(t, markers), []string{"alias-ptr", "fsmonitor-ptr", "hook-ptr", "pager-ptr", "ssh-ptr"})
}

// TestNestedRepoStaysTheCagesOnEveryExit: the turn plants a nested
// repository and is then stopped by SIGTERM, or killed with -9 and cleaned
// up by gc or by the task's next run: every path gives the worktree back
// and leaves the repository with the task's user; the owner's git status
// runs no fsmonitor in it.
func TestNestedRepoStaysTheCagesOnEveryExit(t *testing.T) {
	e, client := integration(t, "")
	wt, home, markers := ownedRepo(t)
	task := e.Task("nestexit")
	for i, how := range []string{"sigterm", "kill-gc", "kill-run"} {
		dir := fmt.Sprintf("r%d", i)
		cmd := e.Command("run", "--task", task, "--agent", "shell", "--worktree", wt, "--", "-c",
			plantRepo(markers)+fmt.Sprintf("mkdir -p /work/%[1]s && plant %[1]s/.git %[1]s && echo up && sleep 600", dir))
		stdout, err := cmd.StdoutPipe()
		assert.NilError(t, err)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		assert.NilError(t, cmd.Start())
		_, err = stdout.Read(make([]byte, 3))
		assert.NilError(t, err, stderr.String())
		if how == "sigterm" {
			assert.NilError(t, cmd.Process.Signal(syscall.SIGTERM))
		} else {
			assert.NilError(t, cmd.Process.Kill())
		}
		_ = cmd.Wait()
		if how != "sigterm" {
			fi, err := os.Lstat(wt)
			assert.NilError(t, err)
			assert.Assert(t, fi.Sys().(*syscall.Stat_t).Uid != ownerUID, "positive control: kill -9 leaves the worktree with the task")
		}
		switch how {
		case "kill-gc":
			code, _, stderr := e.Shrooms("gc")
			assert.Equal(t, code, 0, stderr)
		case "kill-run":
			code, _, stderr := e.Shrooms("run", "--task", task, "--agent", "shell", "--worktree", wt, "--", "-c", "true")
			assert.Equal(t, code, 0, stderr)
		}
		e.WaitIdle(task)
		assert.Equal(t, cagesOf(e, client, task), 0, how)
		for _, p := range []string{".", dir} {
			fi, err := os.Lstat(filepath.Join(wt, p))
			assert.NilError(t, err)
			assert.Equal(t, fi.Sys().(*syscall.Stat_t).Uid, uint32(ownerUID), "%s: %s is given back", how, p)
		}
		fi, err := os.Lstat(filepath.Join(wt, dir, ".git"))
		assert.NilError(t, err)
		assert.Assert(t, fi.Sys().(*syscall.Stat_t).Uid != ownerUID, "%s: the nested .git was handed to the owner", how)
		assert.Equal(t, fi.Mode().Perm()&0o007, os.FileMode(0), how)
		ownerGit(t, home, filepath.Join(wt, dir), nil, "status")
		assert.DeepEqual(t, fired(t, markers), []string(nil))
	}
	// Positive control: chowned to the owner, the last one runs fsmonitor.
	assert.NilError(t, chownR(filepath.Join(wt, "r2", ".git"), ownerUID))
	ownerGit(t, home, filepath.Join(wt, "r2"), nil, "status")
	assert.DeepEqual(t, fired(t, markers), []string{"fsmonitor-r2"})
}
