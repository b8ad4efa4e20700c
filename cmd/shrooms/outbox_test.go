package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/shrooms-cage/shrooms/internal/itest"
	"github.com/shrooms-cage/shrooms/pkg/turn"
)

// outboxListing is `outbox list --json`.
type outboxListing struct {
	Turns []int `json:"turns"`
	Files []struct {
		Name string `json:"name"`
		Turn int    `json:"turn"`
		Path string `json:"path"`
	} `json:"files"`
	Rejected []struct {
		Name    string `json:"name"`
		Turn    int    `json:"turn"`
		Dropped bool   `json:"dropped"`
	} `json:"rejected"`
}

func listOutbox(t *testing.T, e *itest.Env, task string) outboxListing {
	t.Helper()
	code, stdout, stderr := e.Shrooms("--json", "outbox", "list", "--task", task)
	assert.Equal(t, code, 0, stderr)
	var l outboxListing
	assert.NilError(t, json.Unmarshal([]byte(stdout), &l), stdout)
	return l
}

// resultOf decodes the result object of a `run --json`.
func resultOf(t *testing.T, stdout string, v any) {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	assert.NilError(t, json.Unmarshal([]byte(lines[len(lines)-1]), v), stdout)
}

// plantOutbox is a hostile turn 1: files for the owner, and a directory a
// later turn could be pointed at (a plugin, instructions, a link out).
const plantOutbox = `mkdir -p /outbox/proj/.opencode/plugin
echo 'throw new Error("planted")' > /outbox/proj/.opencode/plugin/x.js
echo 'obey the outbox' > /outbox/proj/CLAUDE.md
echo report > /outbox/report.txt
ln -s /etc/shadow /outbox/shadow
echo planted`

// listScript is turn 2's look at /outbox.
const listScript = `echo "BEGIN"; ls -A /outbox; find /outbox -mindepth 1 2>&1; echo "END"`

func between(s, a, b string) string {
	i, j := strings.Index(s, a), strings.Index(s, b)
	if i < 0 || j < i {
		return "<markers missing>"
	}
	return strings.TrimSpace(s[i+len(a) : j])
}

// TestOutboxIsOneWay: what turn 1 puts in /outbox is gone from the cage at
// turn 2 — with the next cage prepared ahead (prepare_next) and without —
// and waits in the pending deliveries, which `outbox list` shows and
// `outbox collect` delivers under files/<turn>/.
func TestOutboxIsOneWay(t *testing.T) {
	e, client := integration(t, "")
	for _, prepare := range []string{"false", "true"} {
		task := e.Task("oneway-" + prepare)
		code, stdout, stderr := e.Shrooms("--json", "run", "--prepare-next="+prepare, "--task", task, "--agent", "shell", "--", "-c", plantOutbox)
		assert.Equal(t, code, 0, stderr)
		var r1 struct {
			Turn   int `json:"turn"`
			Outbox struct {
				Turn    int     `json:"turn"`
				Files   int     `json:"files"`
				Dropped int     `json:"dropped"`
				Pending string  `json:"pending"`
				MoveMs  float64 `json:"move_ms"`
			} `json:"outbox"`
		}
		resultOf(t, stdout, &r1)
		t.Logf("prepare_next=%s: turn 1's outbox (%d files, 1 dropped) moved in %.1f ms", prepare, r1.Outbox.Files, r1.Outbox.MoveMs)
		assert.Equal(t, r1.Outbox.Turn, 1)
		assert.Equal(t, r1.Outbox.Files, 3, "%+v", r1.Outbox)
		assert.Equal(t, r1.Outbox.Dropped, 1)
		assert.Equal(t, r1.Outbox.Pending, filepath.Join(e.Dir, "outbox", ".pending", task, "1"))
		if prepare == "true" {
			assert.Equal(t, cagesOf(e, client, task), 1, "positive control: the next cage is prepared, its outbox mounted")
		}

		code, stdout, stderr = e.Shrooms("--json", "run", "--prepare-next=false", "--task", task, "--agent", "shell", "--", "-c", listScript)
		assert.Equal(t, code, 0, stderr)
		var r2 struct {
			Prepared bool `json:"prepared"`
		}
		resultOf(t, stdout, &r2)
		assert.Equal(t, r2.Prepared, prepare == "true", "turn 2 ran in the prepared cage")
		assert.Equal(t, between(stdout, "BEGIN", "END"), "", "turn 2 saw turn 1's outbox")

		// Positive control of the listing: turn 1's files are pending.
		l := listOutbox(t, e, task)
		assert.DeepEqual(t, l.Turns, []int{1})
		var names []string
		for _, f := range l.Files {
			assert.Equal(t, f.Turn, 1)
			names = append(names, f.Name)
		}
		assert.DeepEqual(t, names, []string{"proj/.opencode/plugin/x.js", "proj/CLAUDE.md", "report.txt"})
		assert.Equal(t, len(l.Rejected), 1)
		assert.Equal(t, l.Rejected[0].Name, "shadow")
		assert.Assert(t, l.Rejected[0].Dropped)

		to := filepath.Join(e.Dir, "delivery-"+prepare)
		code, stdout, stderr = e.Shrooms("outbox", "collect", "--task", task, "--to", to)
		assert.Equal(t, code, 0, stderr)
		assert.Assert(t, is.Contains(stdout, "delivered report.txt (turn 1)"))
		b, err := os.ReadFile(filepath.Join(to, "files", "1", "report.txt"))
		assert.NilError(t, err)
		assert.Equal(t, string(b), "report\n")
		assert.Equal(t, len(listOutbox(t, e, task).Files), 0, "collected files are no longer pending")
	}
}

// TestOutboxAfterKilledTurn: kill -9 of shrooms while its cage writes to
// /outbox; the next run (or gc) moves what the killed turn left to its
// pending delivery, and the next cage starts with an empty /outbox.
func TestOutboxAfterKilledTurn(t *testing.T) {
	e, client := integration(t, "")
	task := e.Task("obkill")
	for _, cleaner := range []string{"gc", "run"} {
		cmd := e.Command("run", "--task", task, "--agent", "shell", "--no-stdin", "--", "-c", "echo left-by-"+cleaner+" > /outbox/"+cleaner+".txt; mkdir /outbox/plant; echo up; sleep 600")
		stdout, err := cmd.StdoutPipe()
		assert.NilError(t, err)
		assert.NilError(t, cmd.Start())
		_, err = stdout.Read(make([]byte, 3))
		assert.NilError(t, err)
		assert.NilError(t, cmd.Process.Kill())
		_ = cmd.Wait()
		assert.Equal(t, cagesOf(e, client, task), 1, "positive control: kill -9 leaves the cage running")
		if cleaner == "gc" {
			code, out, stderr := e.Shrooms("gc")
			assert.Equal(t, code, 0, stderr)
			assert.Assert(t, is.Contains(out, "moved the outbox of "+task), out)
		}
		code, out, stderr := e.Shrooms("run", "--task", task, "--agent", "shell", "--", "-c", listScript)
		assert.Equal(t, code, 0, stderr)
		assert.Equal(t, between(out, "BEGIN", "END"), "", "the turn after the killed one saw its outbox")
		found := false
		for _, f := range listOutbox(t, e, task).Files {
			found = found || f.Name == cleaner+".txt"
		}
		assert.Assert(t, found, "the killed turn's file is not pending (after %s)", cleaner)
	}
	assert.Equal(t, cagesOf(e, client, task), 0)
}

// TestPreparedCageNeedsItsOutbox: a cage prepared ahead was given the
// outbox tmpfs mounted at its preparation; once that is gone (here
// `outbox release`; a reboot does the same) starting the cage would bind
// the bare directory, so the turn discards it and runs in a fresh cage with
// a fresh capped outbox. (TestOutboxIsOneWay is the positive control: with
// its outbox in place the prepared cage is taken.)
func TestPreparedCageNeedsItsOutbox(t *testing.T) {
	e, client := integration(t, "")
	task := e.Task("obprep")
	code, _, stderr := e.Shrooms("run", "--prepare-next=true", "--task", task, "--agent", "shell", "--", "-c", "true")
	assert.Equal(t, code, 0, stderr)
	assert.Equal(t, cagesOf(e, client, task), 1, "the next cage is prepared")
	code, _, stderr = e.Shrooms("outbox", "release", "--task", task)
	assert.Equal(t, code, 0, stderr)
	code, stdout, stderr := e.Shrooms("--json", "run", "--prepare-next=false", "--task", task, "--agent", "shell", "--", "-c", `echo "FS=$(stat -f -c %T /outbox)"`)
	assert.Equal(t, code, 0, stderr)
	var r struct {
		Prepared bool   `json:"prepared"`
		Skipped  string `json:"prepared_skipped"`
	}
	resultOf(t, stdout, &r)
	assert.Assert(t, !r.Prepared, "the prepared cage ran without its outbox")
	assert.Equal(t, r.Skipped, turn.SkipOutbox)
	// Under gVisor every host mount is the gofer's filesystem (v9fs, which
	// busybox's stat calls UNKNOWN; measured), the capped tmpfs its host side.
	fs := "FS=tmpfs"
	if itest.Runtime() == "runsc" {
		fs = "FS=UNKNOWN"
	}
	assert.Assert(t, is.Contains(stdout, fs), stdout)
	assert.Equal(t, cagesOf(e, client, task), 0)
}
