package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

// hostileNames is shell that sets CSI, OSC and ST (as UTF-8 code points),
// RLO, LRI/PDI, the same C1 controls as raw bytes, and an escape sequence.
const hostileNames = `CSI=$(printf '\302\233'); OSC=$(printf '\302\235'); ST=$(printf '\302\234')
RLO=$(printf '\342\200\256'); LRI=$(printf '\342\201\246'); PDI=$(printf '\342\201\251')
RAW=$(printf '\233\235\234'); ESC=$(printf '\033]0;pwned\007')
`

// TestNamesAreEscapedEverywhere: a turn names guarded and unguarded paths
// with C1 controls and bidi characters; the next turns' stderr (the mask
// list), run --json, run's text output, the result file, log and status (text
// and JSON) hold none of them raw, and show them escaped. A guarded path
// with raw C1 bytes and an escape sequence refuses the next turn with one
// escaped line.
func TestNamesAreEscapedEverywhere(t *testing.T) {
	e, _ := integration(t, "")
	wt := filepath.Join(e.Dir, "repo")
	assert.NilError(t, os.Mkdir(wt, 0o755))
	git(t, wt, "init", "-q", "-b", "main")
	task := e.Task("names")
	var outputs []string
	check := func(what string, code int, stdout, stderr string) {
		t.Helper()
		assertShowable(t, []byte(stdout), what+" stdout")
		assertShowable(t, []byte(stderr), what+" stderr")
		outputs = append(outputs, stdout, stderr)
	}

	code, stdout, stderr := e.Shrooms("run", "--json", "--task", task, "--agent", "shell", "--worktree", wt, "--", "-c", hostileNames+`
set -e
mkdir -p "/work/a${CSI}2J/.claude" "/work/x${RLO}gpj.sh" "/work/o${OSC}0;t${ST}" "/work/i${LRI}x${PDI}"
echo '{}' > "/work/a${CSI}2J/.claude/settings.json"
echo evil > "/work/x${RLO}gpj.sh/CLAUDE.md"
echo evil > "/work/o${OSC}0;t${ST}/AGENTS.md"
echo plain > "/work/plain${CSI}${RLO}.txt"
mkdir -p "/work/i${LRI}x${PDI}/.git" "/work/r${RAW}/.git"
`)
	assert.Equal(t, code, 0, stderr)
	check("turn 1 --json", code, stdout, stderr)
	assert.Assert(t, is.Contains(stdout, `"i\\u2066x\\u2069/.git"`), "the nested repository is listed, escaped")
	assert.Assert(t, is.Contains(stdout, `"x\\u202egpj.sh/CLAUDE.md"`), "the agent config is listed, escaped")
	assert.Assert(t, is.Contains(stdout, `"r\\ufffd\\ufffd\\ufffd/.git"`), "JSON cannot carry the raw bytes: U+FFFD each, escaped")

	result := filepath.Join(e.Dir, "result.json")
	code, stdout, stderr = e.Shrooms("run", "--json", "--result-file", result, "--task", task, "--agent", "shell", "--worktree", wt, "--", "-c", "true")
	assert.Equal(t, code, 0, stderr)
	check("turn 2 --json", code, stdout, stderr)
	for _, want := range []string{`a\u009b2J/.claude`, `x\u202egpj.sh/CLAUDE.md`, `o\u009d0;t\u009c/AGENTS.md`} {
		assert.Assert(t, is.Contains(stderr, want), "the mask list names it, escaped")
		assert.Assert(t, is.Contains(stdout, strings.ReplaceAll(want, `\`, `\\`)), "run --json names it, escaped")
	}
	b, err := os.ReadFile(result)
	assert.NilError(t, err)
	check("result file", 0, string(b), "")
	assert.Assert(t, is.Contains(string(b), `a\\u009b2J/.claude`))

	code, stdout, stderr = e.Shrooms("run", "--task", task, "--agent", "shell", "--worktree", wt, "--", "-c", "true")
	assert.Equal(t, code, 0, stderr)
	check("turn 3 text", code, stdout, stderr)
	assert.Assert(t, is.Contains(stderr, `x\u202egpj.sh/CLAUDE.md`))

	// The owner trusts a path by the name shrooms showed: it is no longer
	// masked; the others still are.
	code, stdout, stderr = e.Shrooms("trust", "--task", task, `x\u202egpj.sh/CLAUDE.md`)
	assert.Equal(t, code, 0, stderr)
	check("trust", code, stdout, stderr)
	assert.Assert(t, is.Contains(stdout, `trusted x\u202egpj.sh/CLAUDE.md`))
	code, stdout, stderr = e.Shrooms("run", "--task", task, "--agent", "shell", "--worktree", wt, "--", "-c", "true")
	assert.Equal(t, code, 0, stderr)
	assert.Assert(t, !strings.Contains(stderr, "gpj.sh"), stderr)
	assert.Assert(t, is.Contains(stderr, `a\u009b2J/.claude`), stderr)
	code, _, stderr = e.Shrooms("trust", "--task", task, `bad\q`)
	assert.Equal(t, code, ExitUsage, stderr)

	// A guarded path with raw C1 bytes and an escape sequence.
	code, stdout, stderr = e.Shrooms("run", "--json", "--task", task, "--agent", "shell", "--worktree", wt, "--", "-c", hostileNames+`
mkdir -p "/work/q${RAW}${ESC}" && echo evil > "/work/q${RAW}${ESC}/CLAUDE.md"`)
	assert.Equal(t, code, 0, stderr)
	check("turn 4 --json", code, stdout, stderr)
	code, stdout, stderr = e.Shrooms("run", "--json", "--task", task, "--agent", "shell", "--worktree", wt, "--", "-c", "true")
	check("turn 5 refused", code, stdout, stderr)
	assert.Assert(t, code != 0, "a guarded path that cannot be shown refuses the turn")
	assert.Equal(t, strings.Count(stderr, "\n"), 1, "one line: %q", stderr)
	assert.Assert(t, is.Contains(stderr, `q\\x9b\\x9d\\x9c\\x1b]0;pwned\\a/CLAUDE.md`), "the name, escaped")

	for _, args := range [][]string{
		{"log", "--task", task}, {"--json", "log", "--task", task},
		{"status", "--task", task}, {"--json", "status", "--task", task},
	} {
		code, stdout, stderr := e.Shrooms(args...)
		assert.Equal(t, code, 0, "%v: %s", args, stderr)
		check(strings.Join(args, " "), code, stdout, stderr)
	}
	// Positive control: the names did reach the output, escaped.
	all := strings.Join(outputs, "")
	for _, esc := range []string{`\u009b`, `\u009d`, `\u009c`, `\u202e`, `\u2066`, `\u2069`, `\x9b`, `\x1b`} {
		assert.Assert(t, is.Contains(all, esc))
	}
}
