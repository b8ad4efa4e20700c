package main

import (
	"context"
	"debug/elf"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/shrooms-cage/shrooms/pkg/podman"
	"github.com/shrooms-cage/shrooms/pkg/sealed"
	"github.com/shrooms-cage/shrooms/pkg/turn"
)

// requireStatic: a prepared cage runs this test binary as shrooms inside a
// busybox image, which has no C library.
func requireStatic(t *testing.T) {
	f, err := elf.Open(os.Args[0])
	assert.NilError(t, err)
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Fatalf("the test binary is dynamically linked; run the tests with CGO_ENABLED=0 (make test does)")
		}
	}
}

type runResult struct {
	Turn     int    `json:"turn"`
	ExitCode int    `json:"exit_code"`
	Prepared bool   `json:"prepared"`
	Skipped  string `json:"prepared_skipped"`
	Status   string `json:"status"`
}

func lastJSON(t *testing.T, stdout string) runResult {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	var r runResult
	assert.NilError(t, json.Unmarshal([]byte(lines[len(lines)-1]), &r), stdout)
	return r
}

func cageStates(t *testing.T, client *podman.Client, task string) []string {
	cages, err := client.ListByLabel(context.Background(), sealed.LabelTask, task)
	assert.NilError(t, err)
	var st []string
	for _, c := range cages {
		st = append(st, c.State)
	}
	return st
}

// TestPreparedCages: a prepared cage is created and initialised ahead, then
// run with the argv of the run that takes it; the HOME it sees is reset;
// anything different discards it, and nothing is left behind.
func TestPreparedCages(t *testing.T) {
	requireStatic(t)
	e, client := integration(t, "")
	task := e.Task("prep")

	code, stdout, stderr := e.Shrooms("prepare", "--task", task, "--agent", "shell", "--no-stdin")
	assert.Equal(t, code, 0, stderr)
	assert.Equal(t, len(strings.TrimSpace(stdout)), 64, stdout)
	assert.DeepEqual(t, cageStates(t, client, task), []string{"initialized"})
	code, stdout, _ = e.Shrooms("gc")
	assert.Equal(t, code, 0)
	assert.Assert(t, is.Contains(stdout, "removed 0"), "gc keeps a prepared cage that waits: %s", stdout)

	code, stdout, stderr = e.Shrooms("--json", "run", "--task", task, "--agent", "shell", "--no-stdin", "--prepare-next", "--", "-c", `echo "argv: $0 $1"; echo planted > ~/.profile; exit 5`, "one")
	assert.Equal(t, code, 5, stderr)
	assert.Assert(t, is.Contains(stdout, "argv: one"), stdout)
	r := lastJSON(t, stdout)
	assert.Assert(t, r.Prepared, "the prepared cage was not used")
	assert.Equal(t, r.Turn, 1)
	assert.DeepEqual(t, cageStates(t, client, task), []string{"initialized"}) // run --prepare-next prepared turn 2

	// Turn 2 takes the prepared cage: the HOME it sees was reset after turn 1.
	code, stdout, stderr = e.Shrooms("--json", "run", "--task", task, "--agent", "shell", "--no-stdin", "--", "-c", `cat ~/.profile 2>&1; echo turn2`)
	assert.Equal(t, code, 0, stderr)
	r = lastJSON(t, stdout)
	assert.Assert(t, r.Prepared)
	assert.Equal(t, r.Turn, 2)
	assert.Assert(t, is.Contains(stdout, "No such file"), "turn 1's .profile survived into a prepared turn: %s", stdout)
	assert.Equal(t, len(cageStates(t, client, task)), 0)

	// A run that differs (stdin attached) discards the prepared cage.
	code, _, stderr = e.Shrooms("prepare", "--task", task, "--agent", "shell", "--no-stdin")
	assert.Equal(t, code, 0, stderr)
	code, stdout, stderr = e.Shrooms("--json", "run", "--task", task, "--agent", "shell", "--stdin", "--", "-c", "true")
	assert.Equal(t, code, 0, stderr)
	r = lastJSON(t, stdout)
	assert.Assert(t, !r.Prepared)
	assert.Equal(t, r.Skipped, turn.SkipSpec, "why the prepared cage was passed over")
	assert.Equal(t, len(cageStates(t, client, task)), 0, "the discarded cage was left")

	// HOME touched after preparing: the prepared cage is discarded and the
	// turn resets HOME as usual.
	code, _, stderr = e.Shrooms("prepare", "--task", task, "--agent", "shell", "--no-stdin")
	assert.Equal(t, code, 0, stderr)
	v, err := client.InspectVolume(context.Background(), "shrooms-home-"+e.Prefix+"-"+task)
	assert.NilError(t, err)
	assert.NilError(t, os.WriteFile(filepath.Join(v.Mountpoint, "home", ".bashrc"), []byte("echo PWNED\n"), 0o644))
	code, stdout, stderr = e.Shrooms("--json", "run", "--task", task, "--agent", "shell", "--no-stdin", "--", "-c", "cat ~/.bashrc 2>&1; true")
	assert.Equal(t, code, 0, stderr)
	r = lastJSON(t, stdout)
	assert.Assert(t, !r.Prepared, "a prepared cage ran on a HOME changed after its reset")
	assert.Equal(t, r.Skipped, turn.SkipFingerprint, stdout)
	assert.Assert(t, !strings.Contains(stdout, "PWNED"), stdout)
	assert.Equal(t, len(cageStates(t, client, task)), 0)
}

// TestPreparedCageHomeRewritten: a file the reset laid down, rewritten in
// place on the host at the same size with its mtime set back, after the
// next cage was prepared. Nothing is removed, so a dry-run reset (the
// check before the HOME fingerprint) saw no difference; the fingerprint
// (ctime) does, and the turn resets HOME in a fresh cage.
func TestPreparedCageHomeRewritten(t *testing.T) {
	requireStatic(t)
	profile := filepath.Join(t.TempDir(), "profile")
	assert.NilError(t, os.WriteFile(profile, []byte("export OWNER_PROFILE=1\n"), 0o644))
	e, client := integration(t, fmt.Sprintf("[home.shell]\nfiles = { \".profile\" = %q }\n", profile))
	task := e.Task("rewrite")
	code, _, stderr := e.Shrooms("prepare", "--task", task, "--agent", "shell", "--no-stdin")
	assert.Equal(t, code, 0, stderr)
	v, err := client.InspectVolume(context.Background(), "shrooms-home-"+e.Prefix+"-"+task)
	assert.NilError(t, err)
	victim := filepath.Join(v.Mountpoint, "home", ".profile")
	before, err := os.Stat(victim)
	assert.NilError(t, err, "the reset laid down the owner's .profile")
	size := before.Size()
	assert.NilError(t, os.WriteFile(victim, []byte("PWNED"+strings.Repeat("\n", int(size)-5)), before.Mode()))
	assert.NilError(t, os.Chtimes(victim, before.ModTime(), before.ModTime()))
	rel := ".profile"
	code, stdout, stderr := e.Shrooms("--json", "run", "--task", task, "--agent", "shell", "--no-stdin", "--", "-c", "cat ~/"+rel+"; true")
	assert.Equal(t, code, 0, stderr)
	r := lastJSON(t, stdout)
	assert.Assert(t, !r.Prepared, "a prepared cage ran on a HOME file rewritten after its reset")
	assert.Equal(t, r.Skipped, turn.SkipFingerprint, stdout)
	assert.Assert(t, !strings.Contains(stdout, "PWNED"), stdout)
	assert.Assert(t, strings.Contains(stdout, "OWNER_PROFILE"), "the reset laid the owner's file down again: %s", stdout)

	// Positive control: prepared, HOME left alone, the cage is used.
	code, _, stderr = e.Shrooms("prepare", "--task", task, "--agent", "shell", "--no-stdin")
	assert.Equal(t, code, 0, stderr)
	code, stdout, stderr = e.Shrooms("--json", "run", "--task", task, "--agent", "shell", "--no-stdin", "--", "-c", "true")
	assert.Equal(t, code, 0, stderr)
	r = lastJSON(t, stdout)
	assert.Assert(t, r.Prepared, "an untouched HOME's prepared cage was not used (%s): %s", r.Skipped, stdout)
	assert.Equal(t, r.Skipped, "")
	assert.Equal(t, len(cageStates(t, client, task)), 0)
}

// TestPreparedCageAfterLateTeardown: the previous turn's detached teardown
// prepared the next cage and dropped the task lock; an explicit `prepare`
// replaced that cage; the teardown removes the previous turn's exited cage
// only then. The turn after takes the explicit preparation's cage.
func TestPreparedCageAfterLateTeardown(t *testing.T) {
	requireStatic(t)
	e, client := integration(t, "")
	task := e.Task("late")
	gate := filepath.Join(t.TempDir(), "gate")
	cmd := e.Command("--json", "run", "--task", task, "--agent", "shell", "--no-stdin", "--prepare-next", "--", "-c", "true")
	cmd.Env = append(cmd.Env, "SHROOMS_TEARDOWN_REMOVE_GATE="+gate)
	out, err := cmd.Output()
	assert.NilError(t, err, string(out))
	// Waits for the teardown's preparation (the task lock).
	code, _, stderr := e.Shrooms("prepare", "--task", task, "--agent", "shell", "--no-stdin")
	assert.Equal(t, code, 0, stderr)
	assert.NilError(t, os.WriteFile(gate, nil, 0o600))
	e.WaitIdle(task)
	code, stdout, stderr := e.Shrooms("--json", "run", "--task", task, "--agent", "shell", "--no-stdin", "--", "-c", "true")
	assert.Equal(t, code, 0, stderr)
	r := lastJSON(t, stdout)
	assert.Assert(t, r.Prepared, "the explicitly prepared cage was not used (%s): %s", r.Skipped, stdout)
	e.WaitIdle(task)
	assert.Equal(t, len(cageStates(t, client, task)), 0)
}

// TestPreparedTurnGuardsAgentConfigPlantedAfterPreparing: the guard's
// check of a prepared turn (taken beside the prepared cage's inspection)
// is the worktree's at the turn, not at the preparation: agent config
// planted after the cage was prepared makes the turn's masks differ from
// the cage's, so the cage is passed over and the planted file is masked.
// The control: with nothing planted the prepared cage is taken.
func TestPreparedTurnGuardsAgentConfigPlantedAfterPreparing(t *testing.T) {
	requireStatic(t)
	e, _ := integration(t, "")
	wt := filepath.Join(e.Dir, "repo")
	assert.NilError(t, os.Mkdir(wt, 0o755))
	git(t, wt, "init", "-q", "-b", "main")
	assert.NilError(t, os.WriteFile(filepath.Join(wt, "README"), []byte("hi\n"), 0o644))
	task := e.Task("guardahead")
	run := func(script string, next ...string) (runResult, string) {
		args := append(append([]string{"--json", "run", "--task", task, "--agent", "shell", "--worktree", wt, "--no-stdin"}, next...), "--", "-c", script)
		code, stdout, stderr := e.Shrooms(args...)
		assert.Equal(t, code, 0, stderr)
		return lastJSON(t, stdout), stdout
	}
	run("true", "--prepare-next")
	r, _ := run("true", "--prepare-next")
	assert.Assert(t, r.Prepared, "the control: an unchanged worktree's prepared cage is taken (%s)", r.Skipped)

	assert.NilError(t, os.WriteFile(filepath.Join(wt, "CLAUDE.md"), []byte("PLANTED\n"), 0o644))
	r, stdout := run("cat /work/CLAUDE.md 2>/dev/null; echo; cat /work/README")
	assert.Assert(t, is.Contains(stdout, "hi"), "the cage reads the worktree")
	assert.Assert(t, !strings.Contains(stdout, "PLANTED"), "agent config planted after the preparation reached the cage:\n%s", stdout)
	assert.Assert(t, !r.Prepared, "the cage prepared before the plant was taken")
	assert.Equal(t, r.Skipped, turn.SkipSpec)
	var masked []string
	for _, m := range lastObject(t, stdout)["worktree_guard"].(map[string]any)["masked"].([]any) {
		masked = append(masked, m.(string))
	}
	assert.DeepEqual(t, masked, []string{"CLAUDE.md"})
}
