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
	assert.Check(t, is.Equal(complete("shrooms", "--json", "config", ""), "check"))
	assert.Check(t, is.Equal(complete("shrooms", "run", "--task", "t1", "--wo"), "--worktree"))
	assert.Check(t, is.Contains(complete("shrooms", ""), "doctor"))
}

func TestFishCompletion(t *testing.T) {
	s := completionScript(t, "fish")
	assert.Check(t, is.Contains(s, "complete -c shrooms"))
	assert.Check(t, is.Contains(s, "-a 'run'"))
	var out, errb bytes.Buffer
	code := run([]string{"shrooms", "completion", "zsh"}, strings.NewReader(""), &out, &errb)
	assert.Check(t, is.Equal(code, ExitUsage))
	assert.Check(t, is.Contains(errb.String(), "unknown shell"))
}
