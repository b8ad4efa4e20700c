package agents_test

import (
	"context"
	"encoding/json"
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

	"github.com/shrooms-cage/shrooms/internal/itest"
	"github.com/shrooms-cage/shrooms/internal/modelapi"
	"github.com/shrooms-cage/shrooms/internal/tbworld"
)

// Class 4 of issue 24: a nested repository handed to the owner's git. The
// agent's own shell tool runs `git init` in /work/sub and sets
// core.fsmonitor, core.pager, core.sshCommand, an alias and a pre-commit
// hook, each touching its own marker in a host directory the cage never
// sees: a marker exists only if the owner's git on the host ran it.

// nestedPlant is the agent's tool call that arms sub/.git for markers.
func nestedPlant(markers string) string {
	m := func(what string) string { return "touch " + markers + "/" + what }
	return `git init -q /work/sub && cd /work/sub && git config core.fsmonitor "` + m("fsmonitor") + `; false" && git config core.pager "` + m("pager") + `; cat" && git config core.sshCommand "` + m("ssh") + `; false" && git config alias.hi "!` + m("alias") + `" && git remote add origin ssh://example.invalid/x && printf '#!/bin/sh\n` + m("hook") + `\n' > .git/hooks/pre-commit && chmod 755 .git/hooks/pre-commit && echo planted-nested`
}

// hostGitVectors runs, as the worktree's owner (root here, as the worktree
// is root's), what runs a repository's config and hooks: status
// (fsmonitor), an alias, a fetch over ssh (sshCommand), a commit (the hook)
// and a forced pager on a terminal (pager). It returns the markers that
// appeared, removing them.
func hostGitVectors(t *testing.T, dir, markers string) []string {
	t.Helper()
	home := t.TempDir()
	ptm, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	assert.NilError(t, err)
	defer ptm.Close()
	assert.NilError(t, unix.IoctlSetPointerInt(int(ptm.Fd()), unix.TIOCSPTLCK, 0))
	n, err := unix.IoctlGetInt(int(ptm.Fd()), unix.TIOCGPTN)
	assert.NilError(t, err)
	pts, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
	assert.NilError(t, err)
	defer pts.Close()
	go func() { _, _ = io.Copy(io.Discard, ptm) }()
	for _, args := range [][]string{{"status"}, {"hi"}, {"fetch", "origin"}, {"commit", "--allow-empty", "-qm", "owner"}, {"-p", "log", "-1"}} {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		cmd := exec.CommandContext(ctx, "git", append([]string{"-C", dir}, args...)...)
		cmd.Env = []string{"HOME=" + home, "PATH=/usr/bin:/bin", "GIT_CONFIG_NOSYSTEM=1", "PAGER=cat", "TERM=dumb",
			"GIT_AUTHOR_NAME=o", "GIT_AUTHOR_EMAIL=o@example.org", "GIT_COMMITTER_NAME=o", "GIT_COMMITTER_EMAIL=o@example.org"}
		if args[0] == "-p" {
			cmd.Stdout = pts
		}
		_ = cmd.Run()
		assert.Assert(t, ctx.Err() == nil, "git %v hung", args)
		cancel()
	}
	ents, err := os.ReadDir(markers)
	assert.NilError(t, err)
	var got []string
	for _, e := range ents {
		got = append(got, e.Name())
		assert.NilError(t, os.Remove(filepath.Join(markers, e.Name())))
	}
	slices.Sort(got)
	return got
}

// nestedRepoCorpus: turn 1 (through shrooms) plants; run --json names
// sub/.git as agent config; the owner's git in sub runs none of the five;
// turn 2 resumes the session; positive control: sub/.git chowned to the
// owner (what the give-back did before) runs all five.
func nestedRepoCorpus(t *testing.T, e *tbworld.World, agent string, tool func(string) modelapi.Step, turn1, turn2 []string, session func(string) string) {
	nonce := e.Prefix
	markers := filepath.Join(e.Dir, "host-markers")
	assert.NilError(t, os.Mkdir(markers, 0o755))
	e.API.Append(tool(nestedPlant(markers)), modelapi.Text("planted "+nonce))
	code, out, errb := e.CLI(append([]string{"--json", "run", "--task", e.Task(agent), "--agent", agent, "--worktree", e.Worktree, "--no-stdin", "--"}, append(turn1, "plant things "+nonce)...)...)
	assert.Equal(t, code, 0, "turn 1: %s %s\n%s", out, errb, e.API.Log())
	assert.Equal(t, e.API.Remaining(), 0, "turn 1 did not run the whole script:\n%s", e.API.Log())
	for _, r := range e.API.Scripted() {
		assert.Assert(t, !strings.Contains(string(r.Body), "Exit code"), "the plant failed: %.2000s", r.Body)
	}
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	var res struct {
		WorktreeChanges struct {
			AgentConfig []struct{ Path, Change, Why string } `json:"agent_config"`
		} `json:"worktree_changes"`
		Worktree struct {
			Kept []string `json:"kept_nested_repos"`
		} `json:"worktree"`
	}
	assert.NilError(t, json.Unmarshal([]byte(lines[len(lines)-1]), &res))
	var flagged []string
	for _, c := range res.WorktreeChanges.AgentConfig {
		flagged = append(flagged, c.Path+" "+c.Change+": "+c.Why)
	}
	assert.Assert(t, is.Contains(flagged, "sub/.git added: a nested git repository: its config and hooks run in the owner's git"), "%v", flagged)
	assert.DeepEqual(t, res.Worktree.Kept, []string{"sub/.git"})
	sid := session(strings.Join(lines[:len(lines)-1], "\n"))

	sub := filepath.Join(e.Worktree, "sub")
	assert.DeepEqual(t, hostGitVectors(t, sub, markers), []string(nil))

	n := len(e.API.Scripted())
	e.API.Append(modelapi.Text("resumed " + nonce))
	code, out, errb = e.CLI(append([]string{"run", "--task", e.Task(agent), "--agent", agent, "--worktree", e.Worktree, "--no-stdin", "--"}, append(turn2, sid, "continue "+nonce)...)...)
	assert.Equal(t, code, 0, "turn 2: %s %s\n%s", out, errb, e.API.Log())
	reqs := requestsSince(e.API, n)
	assert.Assert(t, len(reqs) > 0 && strings.Contains(string(reqs[0].Body), "plant things "+nonce), "the session continued with turn 1's messages")
	assert.DeepEqual(t, hostGitVectors(t, sub, markers), []string(nil))

	// Positive control: handed to the owner, the same repository runs all five.
	assert.NilError(t, exec.Command("chown", "-R", "0:0", filepath.Join(sub, ".git")).Run())
	assert.NilError(t, exec.Command("chmod", "o+rx", filepath.Join(sub, ".git")).Run())
	assert.DeepEqual(t, hostGitVectors(t, sub, markers), []string{"alias", "fsmonitor", "hook", "pager", "ssh"})
	t.Logf("%s: class 4 (nested repository): 5 vectors fire when handed to the owner, none through shrooms", agent)
}

func TestClaudeNestedRepoStaysTheCage(t *testing.T) {
	itest.Require(t, itest.Root, itest.Podman, itest.Nftables, itest.Netns)
	e := newEnv(t)
	nestedRepoCorpus(t, e, "claude", bash,
		[]string{"-p", "--output-format", "json"},
		[]string{"-p", "--output-format", "json", "--resume"},
		func(out string) string { return parseClaude(t, out).SessionID })
}

func TestOpencodeNestedRepoStaysTheCage(t *testing.T) {
	itest.Require(t, itest.Root, itest.Podman, itest.Nftables, itest.Netns)
	e := newEnv(t)
	nestedRepoCorpus(t, e, "opencode", ocBash,
		[]string{"--format", "json"},
		[]string{"--format", "json", "--session"},
		func(out string) string { return opencodeSession(t, out) })
}
