package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/shrooms-cage/shrooms/internal/itest"
)

// TestHangupEndsTheTurn: `run --tty` in a tmux pane, and the terminal goes
// away (tmux kill-server: the pane's pty is hung up, shrooms gets SIGHUP
// as the session leader, as on a closed window or a dropped ssh). shrooms
// ends the turn as on SIGTERM: the cage is removed, the
// worktree is its owner's again, and the result file and the turn record
// say "interrupted". The positive control: while the turn runs, the cage is
// there and the worktree's new files belong to the task's user.
func TestHangupEndsTheTurn(t *testing.T) {
	e, client := integration(t, chownWalks)
	tm := itest.NewTmux(t)
	wt := filepath.Join(e.Dir, "repo")
	assert.NilError(t, os.Mkdir(wt, 0o755))
	git(t, wt, "init", "-q", "-b", "main")
	assert.NilError(t, os.Lchown(wt, 4242, 4242))
	task := e.Task("hup")
	result := filepath.Join(e.Dir, "result.json")
	// shrooms itself is the pane's process (the session leader), which the
	// hang-up signals.
	tm.Start(100, 30, []string{"SHROOMS_TEST_MAIN=1"}, os.Args[0], "--config", e.Config, "run", "--tty", "--task", task,
		"--agent", "shell", "--worktree", wt, "--result-file", result, "--",
		"-c", "mkdir -p /work/h/u && echo up > /work/h/u/p; echo cage-up; sleep 600")
	pid := tm.PanePID()
	tm.WaitFor("cage-up", 90*time.Second)

	uid := func(p string) uint32 {
		fi, err := os.Lstat(p)
		assert.NilError(t, err)
		return fi.Sys().(*syscall.Stat_t).Uid
	}
	assert.Equal(t, cagesOf(e, client, task), 1, "positive control: the cage runs")
	assert.Assert(t, uid(filepath.Join(wt, "h", "u", "p")) != 4242, "positive control: the cage's files belong to the task's user while it runs")

	tm.KillServer()
	itest.WaitGone(t, pid, 90*time.Second)
	e.WaitIdle(task)

	assert.Equal(t, cagesOf(e, client, task), 0, "the cage is removed after the hang-up")
	for _, p := range []string{wt, filepath.Join(wt, "h"), filepath.Join(wt, "h", "u"), filepath.Join(wt, "h", "u", "p")} {
		assert.Equal(t, uid(p), uint32(4242), "%s is given back", p)
	}
	b, err := os.ReadFile(result)
	assert.NilError(t, err)
	var res struct {
		Status string `json:"status"`
		Turn   int    `json:"turn"`
	}
	assert.NilError(t, json.Unmarshal(b, &res), "%s", b)
	assert.Equal(t, res.Status, "interrupted", "%s", b)
	assert.Equal(t, res.Turn, 1)
	rec, err := os.ReadFile(filepath.Join(e.Dir, "state", "tasks", task, "turns.jsonl"))
	assert.NilError(t, err, "the turn record is written")
	lines := strings.Split(strings.TrimSpace(string(rec)), "\n")
	assert.Equal(t, len(lines), 1)
	assert.Check(t, is.Contains(lines[0], `"status":"interrupted"`))
}
