package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/golden"

	"github.com/shrooms-cage/shrooms/internal/itest"
)

// These tests run without root and without podman: the config names a
// podman socket that does not exist, so anything that reaches podman exits
// 122, and everything refused before it exits 121.

const downSocket = "unix:///run/shrooms-test-nonexistent/podman.sock"

// downEnv is a config whose podman is unreachable.
func downEnv(t *testing.T, extra string) *itest.Env {
	t.Helper()
	e := itest.New(t, "dn", itest.WithMain(run), itest.WithoutPodman())
	dir := e.Dir
	e.Config = filepath.Join(dir, "config.toml")
	network := "[network]\npolicy = \"none\"\n"
	if strings.Contains(extra, "[network]") {
		network = ""
	}
	assert.NilError(t, os.WriteFile(e.Config, []byte(fmt.Sprintf(`[podman]
socket = %q
[state]
dir = %q
%s[outbox]
root = %q
%s`, downSocket, filepath.Join(dir, "state"), network, filepath.Join(dir, "outbox"), extra)), 0o600))
	return e
}

// shroomsCLI runs shrooms in-process with args as given (no --config added).
func shroomsCLI(args ...string) (int, string, string) {
	var out, errb bytes.Buffer
	code := run(append([]string{"shrooms"}, args...), strings.NewReader(""), &out, &errb)
	return code, out.String(), errb.String()
}

// lastJSON decodes the last line of stdout, which must be a JSON object.
func lastObject(t *testing.T, stdout string) map[string]any {
	t.Helper()
	assert.Assert(t, strings.HasSuffix(stdout, "\n"), "stdout does not end a line: %q", stdout)
	lines := strings.Split(strings.TrimSuffix(stdout, "\n"), "\n")
	var m map[string]any
	assert.NilError(t, json.Unmarshal([]byte(lines[len(lines)-1]), &m), "last line %q", lines[len(lines)-1])
	assert.Equal(t, m["schema"], float64(jsonSchema))
	return m
}

func TestGlobalFlagsBeforeOrAfterTheCommand(t *testing.T) {
	e := downEnv(t, "")
	for _, args := range [][]string{
		{"--json", "--config", e.Config, "run", "--task", "../x", "--agent", "shell"},
		{"run", "--task", "../x", "--agent", "shell", "--json", "--config", e.Config},
		{"--config", e.Config, "run", "--json", "--task", "../x", "--agent", "shell"},
	} {
		code, stdout, stderr := shroomsCLI(args...)
		assert.Equal(t, code, ExitUsage, "%v: %s", args, stderr)
		m := lastObject(t, stdout)
		assert.Equal(t, m["status"], "error", args)
		assert.Assert(t, is.Contains(m["error"].(string), `invalid task id "../x"`), args)
	}
	// After "--" a flag is the agent's, not shrooms'.
	code, stdout, _ := shroomsCLI("--config", e.Config, "run", "--task", "../x", "--agent", "shell", "--", "--json")
	assert.Equal(t, code, ExitUsage)
	assert.Equal(t, stdout, "", "no --json before --: no JSON")

	t.Setenv("SHROOMS_CONFIG", e.Config)
	code, stdout, _ = shroomsCLI("version", "--json")
	assert.Equal(t, code, 0)
	assert.Equal(t, lastObject(t, stdout)["version"], version)
}

func TestHelp(t *testing.T) {
	code, stdout, stderr := shroomsCLI("help", "run")
	assert.Equal(t, code, 0, stderr)
	assert.Assert(t, is.Contains(stdout, "shrooms run - run one turn"))
	assert.Assert(t, is.Contains(stdout, "--stdin"))
	assert.Assert(t, regexp.MustCompile(`--task ID .*\(required\)`).MatchString(stdout), stdout)
	assert.Assert(t, regexp.MustCompile(`--agent NAME .*\(required\)`).MatchString(stdout), stdout)
	assert.Assert(t, !regexp.MustCompile(`--worktree .*\(required\)`).MatchString(stdout), stdout)
	for _, line := range strings.Split(stdout, "\n") {
		if strings.Contains(line, "--timeout") {
			assert.Equal(t, strings.Count(line, "default"), 1, "one default for --timeout: %q", line)
			assert.Assert(t, is.Contains(line, "cage.timeout"))
		}
	}
	code, stdout2, _ := shroomsCLI("run", "--help")
	assert.Equal(t, code, 0)
	assert.Equal(t, stdout, stdout2, "help run and run --help agree")
	code, stdout, _ = shroomsCLI("help", "outbox", "list")
	assert.Equal(t, code, 0)
	assert.Assert(t, is.Contains(stdout, "shrooms outbox list - "), "help reaches subcommands: %s", stdout)
	code, _, stderr = shroomsCLI("help", "bogus")
	assert.Equal(t, code, ExitUsage, stderr)
	code, stdout, _ = shroomsCLI("help")
	assert.Equal(t, code, 0)
	assert.Assert(t, is.Contains(stdout, "Global flags (--config, --json) go before or after the command"))
}

// TestUsageErrors: one line on stderr, nothing on stdout, exit 121.
func TestUsageErrors(t *testing.T) {
	e := downEnv(t, "")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"run", "--agent", "shell"}, "required flag --task not set (see `shrooms run --help`)"},
		{[]string{"run", "--task", "t", "--agent", "shell", "--bogus"}, "flag provided but not defined: --bogus"},
		{[]string{"run", "--task", "t", "--agent", "shell", "--timeout", "soon"}, `invalid value "soon" for flag --timeout`},
		{[]string{"run", "--task"}, "flag needs an argument: --task"},
		{[]string{"outbox", "list"}, "required flag --task not set (see `shrooms outbox list --help`)"},
		{[]string{"bogus"}, `unknown command "bogus" (see ` + "`shrooms --help`)"},
		{[]string{"net", "bogus"}, `unknown command "bogus" (see ` + "`shrooms net --help`)"},
		{[]string{"commit", "--task", "t"}, "required flag --message not set"},
		{[]string{"run", "--task", "t", "--agent", "shell", "--stdin", "--no-stdin"}, "--stdin and --no-stdin contradict each other"},
	} {
		code, stdout, stderr := shroomsCLI(append([]string{"--config", e.Config}, tc.args...)...)
		assert.Equal(t, code, ExitUsage, "%v: %s", tc.args, stderr)
		assert.Equal(t, stdout, "", tc.args)
		assert.Assert(t, is.Contains(stderr, tc.want), tc.args)
		assert.Equal(t, strings.Count(stderr, "\n"), 1, "one line: %q", stderr)
		assert.Assert(t, strings.HasPrefix(stderr, "shrooms: "), stderr)
	}
}

// TestValidationBeforePodman: with podman down, bad input exits 121 (an
// orchestrator must not retry it) and good input exits 122.
func TestValidationBeforePodman(t *testing.T) {
	dir := t.TempDir()
	plain := filepath.Join(dir, "plain")
	repo := filepath.Join(dir, "repo")
	for _, d := range []string{plain, repo, filepath.Join(repo, ".git")} {
		assert.NilError(t, os.Mkdir(d, 0o755))
	}
	notJSON := filepath.Join(dir, "settings.json")
	assert.NilError(t, os.WriteFile(notJSON, []byte("not json"), 0o600))
	fifo := filepath.Join(dir, "fifo")
	assert.NilError(t, syscall.Mkfifo(fifo, 0o600))
	good := downEnv(t, "")
	existing := downEnv(t, "") // with state of task t1
	assert.NilError(t, os.MkdirAll(filepath.Join(existing.Dir, "state", "tasks", "t1"), 0o700))
	turn := func(e *itest.Env, extra ...string) []string {
		return append([]string{"--config", e.Config, "run", "--task", "t1", "--agent", "shell"}, extra...)
	}
	cases := []struct {
		name string
		args []string
		code int
		want string
	}{
		{"positive control: good input reaches podman", turn(good, "--worktree", repo), ExitHostNotReady, "podman API unreachable"},
		{"task id", []string{"--config", good.Config, "run", "--task", "A/b", "--agent", "shell"}, ExitUsage, "invalid task id"},
		{"agent", []string{"--config", good.Config, "run", "--task", "t1", "--agent", "nope"}, ExitUsage, `unknown agent "nope"`},
		{"worktree missing", turn(good, "--worktree", filepath.Join(dir, "nope")), ExitUsage, "no such file or directory"},
		{"worktree not a git work tree", turn(good, "--worktree", plain), ExitUsage, "not a git work tree"},
		{"worktree /tmp", turn(good, "--worktree", "/tmp"), ExitUsage, `worktree "/tmp"`},
		{"worktree /", turn(good, "--worktree", "/"), ExitUsage, "root directory"},
		{"token file missing", turn(downEnv(t, "[tokens]\nk = \""+filepath.Join(dir, "nope")+"\"\n"+shellUsesK)), ExitUsage, "tokens.k: cannot read"},
		{"token file a FIFO", turn(downEnv(t, "[tokens]\nk = \""+fifo+"\"\n"+shellUsesK)), ExitUsage, "is not a regular file"},
		{"seccomp file missing", turn(downEnv(t, "[cage]\nseccomp = \""+filepath.Join(dir, "nope.json")+"\"\n")), ExitUsage, "cage.seccomp: cannot read"},
		{"settings file not JSON", turn(downEnv(t, "[home.claude]\nsettings_file = \""+notJSON+"\"\n")), ExitUsage, "home.claude.settings_file"},
		{"scalar for a table", turn(downEnv(t, "[agents.shell]\ncommand = [\"sh\"]\nhome = [\"shell\"]\nenv = \"FOO=1\"\n")), ExitUsage, "agents.shell.env: must be a table"},
		{"token_env scalar", turn(downEnv(t, "[agents.shell]\ncommand = [\"sh\"]\nhome = [\"shell\"]\ntoken_env = \"KEY\"\n")), ExitUsage, "agents.shell.token_env: must be a table"},
		{"hostname_format", turn(downEnv(t, "[cage]\nhostname_format = \"cage-%d\"\n")), ExitUsage, "cage.hostname_format"},
		{"allowlist entry", turn(downEnv(t, "[network]\npolicy = \"allowlist\"\nallow = [\"10.0.0.0/8\"]\n")), ExitUsage, "network.allow[0]"},
		{"bootstrap task id", []string{"--config", good.Config, "bootstrap", "--task", "../x"}, ExitUsage, "invalid task id"},
		{"bootstrap agent", []string{"--config", good.Config, "bootstrap", "--task", "t1", "--agent", "nope"}, ExitUsage, "unknown agent"},
		{"reset agent", []string{"--config", existing.Config, "reset", "--task", "t1", "--agent", "nope"}, ExitUsage, "unknown agent"},
		{"positive control: an existing task reaches podman", []string{"--config", existing.Config, "forget", "--task", "t1"}, ExitHostNotReady, "podman API unreachable"},
		{"forget task id", []string{"--config", good.Config, "forget", "--task", "../x"}, ExitUsage, "invalid task id"},
		{"reset unknown task", []string{"--config", good.Config, "reset", "--task", "never-ran"}, ExitUsage, `unknown task "never-ran"`},
		{"trust unknown task", []string{"--config", good.Config, "trust", "--task", "never-ran"}, ExitUsage, `unknown task "never-ran"`},
		{"outbox task id", []string{"--config", good.Config, "outbox", "collect", "--task", "../x"}, ExitUsage, "invalid task id"},
		{"commit task id", []string{"--config", good.Config, "commit", "--task", "../x", "-m", "x"}, ExitUsage, "invalid task id"},
		{"spec worktree", []string{"--config", good.Config, "spec", "--task", "t1", "--agent", "shell", "--worktree", plain}, ExitUsage, "not a git work tree"},
		{"prepare agent", []string{"--config", good.Config, "prepare", "--task", "t1", "--agent", "nope"}, ExitUsage, "unknown agent"},
		{"probe agent", []string{"--config", good.Config, "probe", "--agent", "nope"}, ExitUsage, "unknown agent"},
	}
	for _, tc := range cases {
		code, _, stderr := shroomsCLI(tc.args...)
		assert.Equal(t, code, tc.code, "%s: %s", tc.name, stderr)
		assert.Assert(t, is.Contains(stderr, tc.want), tc.name)
		assert.Equal(t, strings.Count(stderr, "\n"), 1, "%s: one line: %q", tc.name, stderr)
	}
	_, err := os.Stat(filepath.Join(good.Dir, "state"))
	assert.Assert(t, os.IsNotExist(err), "bad input wrote no state")
}

// shellUsesK makes the shell agent use token k: token files are checked
// for the agents that use them only.
const shellUsesK = "[agents.shell]\ncommand = [\"sh\"]\nhome = [\"shell\"]\ntoken_env = { K = \"k\" }\n"

// TestJSONErrorGolden: under --json every error path ends stdout with one
// JSON object, compared with golden files (go test -update rewrites them).
func TestJSONErrorGolden(t *testing.T) {
	e := downEnv(t, "")
	assert.NilError(t, os.MkdirAll(filepath.Join(e.Dir, "state", "tasks", "t1"), 0o700)) // task t1 exists
	bad := downEnv(t, "[agents.shell]\ncommand = [\"sh\"]\nhome = [\"shell\"]\nenv = \"FOO=1\"\n")
	for _, tc := range []struct {
		name string
		args []string
		code int
	}{
		{"run-bad-task", []string{"--config", e.Config, "run", "--task", "../x", "--agent", "shell", "--json"}, ExitUsage},
		{"run-podman-down", []string{"--config", e.Config, "run", "--task", "t1", "--agent", "shell", "--json"}, ExitHostNotReady},
		{"run-bad-config", []string{"--config", bad.Config, "run", "--task", "t1", "--agent", "shell", "--json"}, ExitUsage},
		{"run-bad-flag", []string{"--config", e.Config, "run", "--task", "t1", "--bogus", "--json"}, ExitUsage},
		{"run-missing-flag", []string{"--json", "--config", e.Config, "run", "--agent", "shell"}, ExitUsage},
		{"unknown-command", []string{"--json", "bogus"}, ExitUsage},
		{"forget-podman-down", []string{"--config", e.Config, "forget", "--task", "t1", "--json"}, ExitHostNotReady},
		{"forget-unknown-task", []string{"--config", e.Config, "forget", "--task", "never-ran", "--json"}, 0},
		{"outbox-release-bad-task", []string{"--config", e.Config, "outbox", "release", "--task", "../x", "--json"}, ExitUsage},
		{"net-flush-bad-config", []string{"--config", bad.Config, "net", "flush", "--json"}, ExitUsage},
		{"gc-podman-down", []string{"--config", e.Config, "gc", "--json"}, ExitHostNotReady},
	} {
		code, stdout, stderr := shroomsCLI(tc.args...)
		assert.Equal(t, code, tc.code, "%s: %s", tc.name, stderr)
		lastObject(t, stdout)
		assert.Equal(t, strings.Count(stdout, "\n"), 1, "%s: one line: %q", tc.name, stdout)
		got := strings.NewReplacer(e.Config, "CONFIG", bad.Config, "BAD_CONFIG").Replace(stdout)
		got = regexp.MustCompile(`/v[0-9.]+/libpod`).ReplaceAllString(got, "/vX/libpod")
		got = regexp.MustCompile(`"(started|ended)_at":"[0-9T:.Z-]+"`).ReplaceAllString(got, `"${1}_at":"TIME"`)
		golden.Assert(t, got, filepath.Join("json", tc.name+".golden"))
	}
}

// TestResultStartsItsOwnLine: output without a trailing newline does not
// merge into the JSON line.
func TestResultStartsItsOwnLine(t *testing.T) {
	var buf bytes.Buffer
	so := &stdout{w: &buf}
	fmt.Fprint(so, "agent output without newline")
	assert.NilError(t, printJSON(so, map[string]any{"exitCode": 0}))
	assert.Equal(t, buf.String(), "agent output without newline\n{\"exit_code\":0,\"schema\":1}\n")

	buf.Reset()
	so = &stdout{w: &buf}
	fmt.Fprint(so, "line\n")
	assert.NilError(t, printJSON(so, map[string]any{}))
	assert.Equal(t, buf.String(), "line\n{\"schema\":1}\n", "no blank line after a complete one")
	assert.Assert(t, so.printed)
}

func TestJSONKeysAndUnits(t *testing.T) {
	b, err := schemaJSON(map[string]any{
		"exitCode": 3, "oomKilled": true, "totalMs": 1.5, "durationNs": 2500000,
		"nested":  []any{map[string]any{"keptCount": 1}},
		"/a/path": 1, "ANTHROPIC_API_KEY": 1, "NET-LAN": 1, "sha256": "x", "homeTrees": 2,
	})
	assert.NilError(t, err)
	var m map[string]any
	assert.NilError(t, json.Unmarshal(b, &m))
	for _, k := range []string{"exit_code", "oom_killed", "total_ms", "duration_ms", "/a/path", "ANTHROPIC_API_KEY", "NET-LAN", "sha256", "home_trees", "schema"} {
		_, ok := m[k]
		assert.Assert(t, ok, "key %s missing in %s", k, b)
	}
	assert.Equal(t, m["duration_ms"], 2.5, "nanoseconds become milliseconds")
	assert.Equal(t, m["nested"].([]any)[0].(map[string]any)["kept_count"], float64(1))
}

// TestResultFile: --result-file gets the result object on an error path
// too (podman down), replacing what was there, through no link.
func TestResultFile(t *testing.T) {
	e := downEnv(t, "")
	dir := t.TempDir()
	target := filepath.Join(dir, "elsewhere")
	assert.NilError(t, os.WriteFile(target, []byte("keep"), 0o600))
	path := filepath.Join(dir, "result.json")
	assert.NilError(t, os.Symlink(target, path))
	code, stdout, stderr := shroomsCLI("--config", e.Config, "run", "--task", "t1", "--agent", "shell", "--result-file", path)
	assert.Equal(t, code, ExitHostNotReady, stderr)
	assert.Equal(t, stdout, "", "no --json: nothing on stdout")
	b, err := os.ReadFile(path)
	assert.NilError(t, err)
	m := lastObject(t, string(b))
	assert.Equal(t, m["status"], "error")
	assert.Assert(t, is.Contains(m["error"].(string), "podman API unreachable"))
	kept, err := os.ReadFile(target)
	assert.NilError(t, err)
	assert.Equal(t, string(kept), "keep", "the link was replaced, not followed")
}

// TestEmptyListsPrintAsBrackets: a nil slice anywhere in an object shrooms
// prints — a struct field, behind a pointer or an embedded pointer, a map
// value — is [] (docs/json.md), and a nil pointer stays absent or null.
func TestEmptyListsPrintAsBrackets(t *testing.T) {
	type inner struct {
		Changes []string `json:"changes"`
	}
	type outer struct {
		*inner
		List  []int   `json:"list"`
		Ptr   *inner  `json:"ptr"`
		Nil   *inner  `json:"nil,omitempty"`
		Items []inner `json:"items"`
	}
	b, err := schemaJSON(map[string]any{"o": &outer{inner: &inner{}, Ptr: &inner{}, Items: []inner{{}}}, "m": []string(nil)})
	assert.NilError(t, err)
	assert.Equal(t, string(b), `{"m":[],"o":{"changes":[],"items":[{"changes":[]}],"list":[],"ptr":{"changes":[]}},"schema":1}`)
}

// TestLocalCommandsWithPodmanDown: the commands that need no podman connect
// on their first use of it only (podman.Lazy), so with the socket pointing
// at nothing they answer from the state directory and the outbox; gc,
// which lists cages first, is the control that podman is unreachable.
// (With podman up, status and tasks do reach it through the same lazy
// engine: TestPreparedCagesShownAndExpired sees a prepared cage there.)
func TestLocalCommandsWithPodmanDown(t *testing.T) {
	e := downEnv(t, "")
	assert.NilError(t, os.MkdirAll(filepath.Join(e.Dir, "state", "tasks", "t1"), 0o700)) // task t1 exists
	assert.NilError(t, os.MkdirAll(filepath.Join(e.Dir, "outbox"), 0o755))
	code, _, stderr := shroomsCLI("--config", e.Config, "gc")
	assert.Equal(t, code, ExitHostNotReady, stderr)
	assert.Check(t, is.Contains(stderr, "podman"))
	for _, args := range [][]string{
		{"tasks"}, {"status", "--task", "t1"}, {"log", "--task", "t1"},
		{"outbox", "list", "--task", "t1"},
	} {
		code, stdout, stderr := shroomsCLI(append([]string{"--config", e.Config, "--json"}, args...)...)
		assert.Check(t, is.Equal(code, 0), "%v: %s", args, stderr)
		assert.Check(t, is.Equal(stderr, ""), "%v", args)
		lastObject(t, stdout)
	}
}
