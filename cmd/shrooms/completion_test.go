package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

func completionScript(t *testing.T, shell string) string {
	t.Helper()
	var out, errb bytes.Buffer
	code := run([]string{"shrooms", "completion", shell}, strings.NewReader(""), &out, &errb)
	assert.Assert(t, is.Equal(code, 0), errb.String())
	return out.String()
}

// TestBashCompletion sources the generated script in a real bash and asks
// it to complete command lines.
func TestBashCompletion(t *testing.T) {
	bash, err := exec.LookPath("bash")
	assert.NilError(t, err)
	script := filepath.Join(t.TempDir(), "shrooms.bash")
	assert.NilError(t, os.WriteFile(script, []byte(completionScript(t, "bash")), 0o644))
	complete := func(words ...string) string {
		t.Helper()
		// COMP_WORDS as bash fills it: the line split into words, the last
		// one being completed.
		prog := `source "$1"; shift; COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1)); _shrooms; echo "${COMPREPLY[*]}"`
		out, err := exec.Command(bash, append([]string{"-c", prog, "bash", script}, words...)...).CombinedOutput()
		assert.NilError(t, err, "%s", out)
		return strings.TrimSpace(string(out))
	}
	assert.Check(t, is.Equal(complete("shrooms", "ru"), "run"))
	assert.Check(t, is.Equal(complete("shrooms", "--config", "net", "ap"), "")) // "net" is --config's value
	assert.Check(t, is.Equal(complete("shrooms", "--config", "/etc/x.toml", "net", "st"), "status"))
	assert.Check(t, is.Equal(complete("shrooms", "--json", "config", "c"), "check"))
	assert.Check(t, is.Equal(complete("shrooms", "run", "--js"), "--json"), "global flags go after the command too")
	assert.Check(t, is.Equal(complete("shrooms", "run", "--task", "t1", "--wo"), "--worktree"))
	assert.Check(t, is.Contains(complete("shrooms", ""), "doctor"))
}

func TestFishCompletion(t *testing.T) {
	s := completionScript(t, "fish")
	assert.Check(t, is.Contains(s, "complete -c shrooms"))
	assert.Check(t, is.Contains(s, "-a 'run'"))
	assert.Check(t, is.Contains(s, "complete -c shrooms -l task -x -a '(shrooms complete-tasks 2>/dev/null)'"))
	var out, errb bytes.Buffer
	code := run([]string{"shrooms", "completion", "tcsh"}, strings.NewReader(""), &out, &errb)
	assert.Check(t, is.Equal(code, ExitUsage))
	assert.Check(t, is.Contains(errb.String(), "unknown shell"))
}

// fakeShrooms puts a `shrooms` on PATH that is this test binary running
// main with cfg, so the scripts' `shrooms complete-tasks` lists its tasks.
func fakeShrooms(t *testing.T, cfg string) string {
	t.Helper()
	bin := t.TempDir()
	script := "#!/bin/sh\nSHROOMS_TEST_MAIN=1 SHROOMS_CONFIG=" + cfg + " exec " + os.Args[0] + " \"$@\"\n"
	assert.NilError(t, os.WriteFile(filepath.Join(bin, "shrooms"), []byte(script), 0o755))
	return bin + ":" + os.Getenv("PATH")
}

// tasksState makes a state dir with tasks t-one and t-two (and a name
// that is no task id) and a config naming it.
func tasksState(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, d := range []string{"t-one", "t-two", "Not_A_Task"} {
		assert.NilError(t, os.MkdirAll(filepath.Join(dir, "state", "tasks", d), 0o700))
	}
	cfg := filepath.Join(dir, "config.toml")
	assert.NilError(t, os.WriteFile(cfg, []byte("[state]\ndir = \""+filepath.Join(dir, "state")+"\"\n[network]\npolicy = \"none\"\n"), 0o600))
	return cfg
}

// TestZshCompletion loads the generated script in a real zsh and asks it
// to complete command lines, task ids after --task included (from the
// state directory, through `shrooms complete-tasks`).
func TestZshCompletion(t *testing.T) {
	zsh, err := exec.LookPath("zsh")
	assert.NilError(t, err, "zsh is installed by make setup")
	script := filepath.Join(t.TempDir(), "_shrooms")
	assert.NilError(t, os.WriteFile(script, []byte(completionScript(t, "zsh")), 0o644))
	path := fakeShrooms(t, tasksState(t))
	complete := func(words ...string) string {
		t.Helper()
		// compadd and compdef stubbed: they print what would be offered.
		prog := `compadd() { [[ $1 == -- ]] && shift; print -r -- "$@"; }; compdef() { :; }; source "$1"; shift; words=("$@"); CURRENT=$#; _shrooms`
		cmd := exec.Command(zsh, append([]string{"-f", "-c", prog, "zsh", script}, words...)...)
		cmd.Env = append(os.Environ(), "PATH="+path)
		out, err := cmd.CombinedOutput()
		assert.NilError(t, err, "%s", out)
		return strings.TrimSpace(string(out))
	}
	assert.Check(t, is.Contains(complete("shrooms", ""), "doctor"))
	assert.Check(t, is.Contains(complete("shrooms", "run", "--"), "--worktree"))
	assert.Check(t, is.Contains(complete("shrooms", "--config", "x.toml", "outbox", ""), "collect"))
	assert.Check(t, is.Equal(complete("shrooms", "status", "--task", ""), "t-one t-two"))
}

// TestTaskIDCompletion: bash completes --task with the state directory's
// task ids.
func TestTaskIDCompletion(t *testing.T) {
	bash, err := exec.LookPath("bash")
	assert.NilError(t, err)
	script := filepath.Join(t.TempDir(), "shrooms.bash")
	assert.NilError(t, os.WriteFile(script, []byte(completionScript(t, "bash")), 0o644))
	prog := `source "$1"; shift; COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1)); _shrooms; echo "${COMPREPLY[*]}"`
	cmd := exec.Command(bash, "-c", prog, "bash", script, "shrooms", "log", "--task", "t-t")
	cmd.Env = append(os.Environ(), "PATH="+fakeShrooms(t, tasksState(t)))
	out, err := cmd.CombinedOutput()
	assert.NilError(t, err, "%s", out)
	assert.Check(t, is.Equal(strings.TrimSpace(string(out)), "t-two"))
}

// TestManPage: the man page comes from the CLI definition: every visible
// command and its flags, in roff.
func TestManPage(t *testing.T) {
	var out, errb bytes.Buffer
	code := run([]string{"shrooms", "man"}, strings.NewReader(""), &out, &errb)
	assert.Assert(t, is.Equal(code, 0), errb.String())
	page := out.String()
	assert.Check(t, strings.HasPrefix(page, ".nh\n.TH shrooms 1"), page[:min(200, len(page))])
	for _, want := range []string{"run", "outbox", "collect", "--worktree", "--result-file", "--wait", "commit"} {
		assert.Check(t, is.Contains(page, want))
	}
	if man, err := exec.LookPath("man"); err == nil {
		cmd := exec.Command(man, "-l", "-")
		cmd.Stdin = strings.NewReader(page)
		cmd.Env = append(os.Environ(), "MANPAGER=cat", "PAGER=cat")
		rendered, err := cmd.CombinedOutput()
		assert.NilError(t, err, "%s", rendered)
	}
}
