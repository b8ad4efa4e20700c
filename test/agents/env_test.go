// Package agents_test runs the real agents (Claude Code, opencode, from the
// image scripts/build-agent-image.sh builds) in sealed cages through the
// shrooms CLI, against the scripted model API of internal/modelapi served on
// the testbed's internet host, and checks that what one turn plants in HOME
// never runs in the next turn while the session itself carries over.
package agents_test

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"

	"github.com/shrooms-cage/shrooms/internal/itest"
	"github.com/shrooms-cage/shrooms/internal/modelapi"
	"github.com/shrooms-cage/shrooms/internal/tbworld"
	"github.com/shrooms-cage/shrooms/internal/testbed"
	"github.com/shrooms-cage/shrooms/pkg/config"
	"github.com/shrooms-cage/shrooms/pkg/gateway"
	"github.com/shrooms-cage/shrooms/pkg/home"
	"github.com/shrooms-cage/shrooms/pkg/homereset"
	"github.com/shrooms-cage/shrooms/pkg/podman"
	"github.com/shrooms-cage/shrooms/pkg/taskid"
)

// agentImage is what scripts/build-agent-image.sh (make setup) imports.
const agentImage = "localhost/shrooms-agent:latest"

// apiKey is the fake Anthropic key the cage gets as a token.
const apiKey = "sk-ant-shrooms-test-key"

// opencodeModel is a model opencode knows without fetching its catalogue.
const opencodeModel = "anthropic/claude-sonnet-4-5"

func TestMain(m *testing.M) {
	code := m.Run()
	itest.RemoveShroomsBinary()
	os.Exit(code)
}

// newEnv builds the testbed, starts the model API on its internet host,
// writes a config whose [agents.NAME] tables are config.example.toml's plus
// ANTHROPIC_BASE_URL, seals the network and returns the environment.
func newEnv(t testing.TB) *tbworld.World {
	t.Helper()
	return newEnvWith(t, envOptions{})
}

// envOptions vary the environment's config.
type envOptions struct {
	// gateway routes both agents' model requests through shrooms' gateway
	// ([gateway.anthropic], upstream the model API) instead of handing them
	// the key (token_env).
	gateway bool
	// policy overrides network.policy ("internet").
	policy string
	// gatewayExtra is added to the [gateway.anthropic] table.
	gatewayExtra string
	// signin, when set, is a Claude Code .credentials.json: the gateway
	// signs in with it (auth = "oauth") instead of the API key.
	signin []byte
	// tokenHandler serves the OAuth token endpoint on the internet host.
	tokenHandler http.Handler
	// chatgpt, when set, is a Codex auth.json: the openai gateway signs in
	// with it (auth = "chatgpt", upstream the model API's
	// /backend-api/codex, token_url tokenHandler's) instead of the key.
	chatgpt []byte
	// shrooms, when set, is a shrooms binary already built (else one is).
	shrooms string
	// runtime, when set, is cage.runtime, and service the podman flags
	// the testbed's service runs it with (the gVisor suite).
	runtime string
	service []string
}

func newEnvWith(t testing.TB, o envOptions) *tbworld.World {
	t.Helper()
	itest.Require(t, itest.Root, itest.Podman, itest.Nftables, itest.Netns)
	if out, err := exec.Command("podman", "--url", itest.Socket(), "image", "exists", agentImage).CombinedOutput(); err != nil {
		t.Fatalf("agent image %s is missing (run `make setup`, which runs scripts/build-agent-image.sh): %v %s", agentImage, err, out)
	}
	if o.runtime == "" {
		// The suites' runtime (SHROOMS_TEST_RUNTIME), none by default.
		o.runtime, o.service = itest.CageRuntime(), itest.ServiceArgs()
	}
	e := tbworld.New(t, "ag", tbworld.WithService(o.service...), tbworld.WithCLI(o.shrooms), tbworld.WithModelAPI(), tbworld.WithWorktree(),
		// prepare_next off: the positive controls copy HOME as turn 1 left
		// it, which a cage prepared for turn 2 would already have reset
		// (prepared turns have their own tests, with the reset report
		// carried over: test/demo, cmd/shrooms).
		tbworld.WithCage(map[string]any{"image": agentImage, "memory": "2g", "timeout": "120s", "prepare_next": false, "runtime": cmp.Or(o.runtime, "default")}),
		tbworld.WithNetwork(map[string]any{"policy": cmp.Or(o.policy, "internet")}),
		tbworld.WithExtra(func(e *tbworld.World) string { return agentsConfig(t, e, o) }))
	code, out, errb := e.CLI("net", "apply", "--seal-only")
	assert.Equal(t, code, 0, "net apply: %s %s", out, errb)
	return e
}

// agentsConfig writes the agents' host files (tokens, baselines) into the
// world's directory and returns the config's tables after [cage] and
// [network]: config.example.toml's [agents.NAME] tables pointed at the
// world's model API, directly or through shrooms' gateways.
func agentsConfig(t testing.TB, e *tbworld.World, o envOptions) string {
	t.Helper()
	example, err := config.Load(filepath.Join(repoRoot(t), "config.example.toml"))
	assert.NilError(t, err)
	token := filepath.Join(e.Dir, "anthropic-key")
	assert.NilError(t, os.WriteFile(token, []byte(apiKey+"\n"), 0o600))
	var agents strings.Builder
	for _, name := range []string{"claude", "opencode"} {
		a, err := example.Agent(name)
		assert.NilError(t, err)
		env := map[string]string{}
		for k, v := range a.Env {
			env[k] = v
		}
		if o.gateway && (o.signin == nil || name == "claude") {
			fmt.Fprintf(&agents, "[agents.%s]\ncommand = %s\nhome = %s\nenv = %s\ngateway = \"anthropic\"\n",
				name, tomlList(a.Command), tomlList(a.Home), tomlTable(env))
			continue
		}
		// The weaker mode (the key in the cage's environment), which the
		// persistence tests run under; the gateway tests use the other.
		if name == "claude" {
			env["ANTHROPIC_BASE_URL"] = e.APIURL
		}
		fmt.Fprintf(&agents, "[agents.%s]\ncommand = %s\nhome = %s\nenv = %s\ntoken_env = %s\n",
			name, tomlList(a.Command), tomlList(a.Home), tomlTable(env), tomlTable(map[string]string{"ANTHROPIC_API_KEY": "anthropic"}))
	}
	// A plain shell, for turns of another agent on an agent's task.
	fmt.Fprintf(&agents, "[agents.sh]\ncommand = [\"/bin/sh\"]\nhome = [\"shell\"]\n")
	// More of [tokens] (the agents' tables follow it in the config).
	moreTokens := ""
	gatewayAuth := ""
	if o.signin != nil {
		seedFile := filepath.Join(e.Dir, "claude-signin.json")
		assert.NilError(t, os.WriteFile(seedFile, o.signin, 0o600))
		moreTokens = fmt.Sprintf("claude-signin = %q\n", seedFile)
		gatewayAuth = "auth = \"oauth\"\n"
		if o.tokenHandler != nil {
			ln, err := listenIn(e.TB.NSPath("internet"), net.JoinHostPort(testbed.InternetAddr4.String(), "0"))
			assert.NilError(t, err)
			srv := &http.Server{Handler: o.tokenHandler, ReadHeaderTimeout: 10 * time.Second}
			go func() { _ = srv.Serve(ln) }()
			t.Cleanup(func() { srv.Close() })
			gatewayAuth += fmt.Sprintf("token_url = %q\n", "http://"+ln.Addr().String()+"/v1/oauth/token")
		}
	}
	if o.gateway {
		if o.signin == nil {
			fmt.Fprintf(&agents, "[agents.probe]\ncommand = [\"python3\", \"-c\"]\nhome = [\"shell\"]\ngateway = \"anthropic\"\n")
		}
		token := "anthropic"
		if o.signin != nil {
			token = "claude-signin"
		}
		fmt.Fprintf(&agents, "[gateway.anthropic]\nupstream = %q\ntoken = %q\n%s%s\n", e.APIURL, token, gatewayAuth, o.gatewayExtra)
	}
	// opencode's provider address is its one host-specific setting: the
	// baseline opencode.json points the anthropic provider at the model API.
	// (A host file: inline settings tables nested three deep are refused by
	// the config decoder as unknown keys.)
	ocFile := filepath.Join(e.Dir, "opencode.json")
	ocJSON, err := json.Marshal(map[string]any{"model": opencodeModel, "provider": map[string]any{
		"anthropic": map[string]any{"options": map[string]any{"baseURL": e.APIURL + "/v1"}}}})
	assert.NilError(t, err)
	assert.NilError(t, os.WriteFile(ocFile, ocJSON, 0o644))
	ocSettings := fmt.Sprintf("[home.opencode]\nsettings_file = %q\n", ocFile)

	// Codex always reaches the model API through the openai gateway (its
	// provider is pinned there by the managed config), with the fake key
	// openaiKey; its baseline names the model and owns one profile file.
	openaiToken := filepath.Join(e.Dir, "openai-key")
	assert.NilError(t, os.WriteFile(openaiToken, []byte(openaiKey+"\n"), 0o600))
	cxProfile := filepath.Join(e.Dir, "cw.config.toml")
	assert.NilError(t, os.WriteFile(cxProfile, []byte("model = \""+codexModel+"\"\n"), 0o644))
	cx, err := example.Agent("codex")
	assert.NilError(t, err)
	fmt.Fprintf(&agents, "[agents.codex]\ncommand = %s\nhome = %s\ngateway = \"openai\"\n", tomlList(cx.Command), tomlList(cx.Home))
	if o.chatgpt != nil {
		assert.NilError(t, os.WriteFile(openaiToken, o.chatgpt, 0o600))
		ln, err := listenIn(e.TB.NSPath("internet"), net.JoinHostPort(testbed.InternetAddr4.String(), "0"))
		assert.NilError(t, err)
		srv := &http.Server{Handler: o.tokenHandler, ReadHeaderTimeout: 10 * time.Second}
		go func() { _ = srv.Serve(ln) }()
		t.Cleanup(func() { srv.Close() })
		fmt.Fprintf(&agents, "[gateway.openai]\napi = \"openai\"\nupstream = %q\ntoken = \"openai\"\nauth = \"chatgpt\"\ntoken_url = %q\n",
			e.APIURL+"/backend-api/codex", "http://"+ln.Addr().String()+"/oauth/token")
	} else {
		fmt.Fprintf(&agents, "[gateway.openai]\napi = \"openai\"\nupstream = %q\ntoken = \"openai\"\n", e.APIURL)
	}
	ocSettings += fmt.Sprintf("[home.codex]\nsettings = { model = %q }\nfiles = { \".codex/cw.config.toml\" = %q }\n", codexModel, cxProfile)

	// Gemini CLI reaches the model API through the gemini gateway, with
	// the fake key geminiKey; its baseline names the model (no routing
	// classifier requests).
	geminiToken := filepath.Join(e.Dir, "gemini-key")
	assert.NilError(t, os.WriteFile(geminiToken, []byte(geminiKey+"\n"), 0o600))
	gm, err := example.Agent("gemini")
	assert.NilError(t, err)
	fmt.Fprintf(&agents, "[agents.gemini]\ncommand = %s\nhome = %s\nenv = %s\ngateway = \"gemini\"\n", tomlList(gm.Command), tomlList(gm.Home), tomlTable(gm.Env))
	fmt.Fprintf(&agents, "[gateway.gemini]\napi = \"gemini\"\nupstream = %q\ntoken = \"gemini\"\n", e.APIURL)
	ocSettings += fmt.Sprintf("[home.gemini]\nsettings = { model = { name = %q } }\n", geminiModel)

	return fmt.Sprintf("%s[tokens]\nanthropic = %q\nopenai = %q\ngemini = %q\n%s%s", ocSettings, token, openaiToken, geminiToken, moreTokens, agents.String())
}

// runTurn runs one agent turn on the worktree and returns its stdout and wall time.
func runTurn(e *tbworld.World, agent string, args ...string) (string, time.Duration) {
	e.T.Helper()
	start := time.Now()
	code, out, errb := e.CLI(append([]string{"run", "--task", e.Task(agent), "--agent", agent, "--worktree", e.Worktree, "--no-stdin", "--"}, args...)...)
	took := time.Since(start)
	assert.Equal(e.T, code, 0, "turn of %s failed\nstdout: %s\nstderr: %s\nmodel API log:\n%s", agent, out, errb, e.API.Log())
	return out, took
}

// resetReport is the part of a turn's result JSON ("reset") the tests read.
type resetReport struct {
	Rebuilt  []string `json:"rebuilt"`
	Warnings []string `json:"warnings"`
	Dropped  []struct {
		Path   string `json:"path"`
		Item   string `json:"item"`
		Rows   int64  `json:"rows"`
		Reason string `json:"reason"`
	} `json:"dropped"`
}

// has reports whether the reset dropped item of path (with rows rows, when
// rows > 0), with a reason.
func (r resetReport) has(path, item string, rows int64) bool {
	for _, d := range r.Dropped {
		if d.Path == path && d.Item == item && (rows == 0 || d.Rows == rows) && d.Reason != "" {
			return true
		}
	}
	return false
}

// turnReset is turn with `--json`: it returns the agent's stdout (the result
// line removed), the reset report of the turn's result, and the wall time.
func turnReset(e *tbworld.World, agent string, args ...string) (string, resetReport, time.Duration) {
	e.T.Helper()
	start := time.Now()
	code, out, errb := e.CLI(append([]string{"--json", "run", "--task", e.Task(agent), "--agent", agent, "--worktree", e.Worktree, "--no-stdin", "--"}, args...)...)
	took := time.Since(start)
	assert.Equal(e.T, code, 0, "turn of %s failed\nstdout: %s\nstderr: %s\nmodel API log:\n%s", agent, out, errb, e.API.Log())
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	var res struct {
		Reset *resetReport `json:"reset"`
	}
	assert.NilError(e.T, json.Unmarshal([]byte(lines[len(lines)-1]), &res), "no result JSON on the last line: %s", out)
	assert.Assert(e.T, res.Reset != nil, "the result has no reset report: %s", lines[len(lines)-1])
	return strings.Join(lines[:len(lines)-1], "\n"), *res.Reset, took
}

// checkSealed asserts, from `shrooms spec`, that the agent's turn runs in
// the sealed cage: read-only root, the built-in strict seccomp profile, no
// capabilities, no-new-privileges, the cage user, the sealed network.
func checkSealed(e *tbworld.World, agent string) {
	e.T.Helper()
	code, out, errb := e.CLI("spec", "--task", e.Task(agent), "--agent", agent, "--worktree", e.Worktree, "--no-stdin")
	assert.Equal(e.T, code, 0, errb)
	var spec struct {
		ReadOnly bool           `json:"read_only_filesystem"`
		Seccomp  string         `json:"seccomp_profile_path"`
		User     string         `json:"user"`
		NoNewPr  bool           `json:"no_new_privileges"`
		CapDrop  []string       `json:"cap_drop"`
		Image    string         `json:"image"`
		Networks map[string]any `json:"Networks"`
		NetNS    struct {
			Mode string `json:"nsmode"`
		} `json:"netns"`
		Mounts []struct {
			Destination string `json:"destination"`
			Source      string `json:"source"`
		} `json:"mounts"`
	}
	assert.NilError(e.T, json.Unmarshal([]byte(out), &spec))
	assert.Assert(e.T, spec.ReadOnly)
	assert.Equal(e.T, filepath.Dir(spec.Seccomp), filepath.Join(e.Dir, "state", "seccomp"))
	assert.Assert(e.T, strings.HasPrefix(filepath.Base(spec.Seccomp), "shrooms-"), spec.Seccomp)
	assert.Equal(e.T, spec.User, "1000:1000")
	assert.Assert(e.T, spec.NoNewPr)
	assert.DeepEqual(e.T, spec.CapDrop, []string{"ALL"})
	assert.Equal(e.T, spec.Image, agentImage)
	// The shrooms driver (the default): an empty network namespace that
	// the turn links to the sealed bridge before the cage starts, with
	// the cage's own resolv.conf; no podman network.
	assert.Equal(e.T, e.Cfg.Network.Driver, "shrooms")
	assert.Equal(e.T, spec.NetNS.Mode, "none", "the cage's network namespace: %s", out)
	assert.Equal(e.T, len(spec.Networks), 0, "a podman network in the spec: %s", out)
	resolv := ""
	for _, m := range spec.Mounts {
		if m.Destination == "/etc/resolv.conf" {
			resolv = m.Source
		}
	}
	assert.Equal(e.T, resolv, filepath.Join(e.Dir, "state", "cagenet", "resolv.conf"), "the cage's resolv.conf: %s", out)
}

// homeDir is the host directory of the task's HOME, mounted: shrooms mounts
// HOME only for a turn, so the test mounts it to look (the next turn
// finds it mounted and releases it after).
func homeDir(e *tbworld.World, agent string) string {
	e.T.Helper()
	// The last turn's teardown may still be releasing (unmounting) this
	// HOME: mounted under it, the HOME would vanish mid-read.
	e.WaitIdle(e.Task(agent))
	cfg, err := config.Load(e.Config)
	assert.NilError(e.T, err)
	client, err := podman.Connect(context.Background(), e.TB.PodmanURL)
	assert.NilError(e.T, err)
	root, err := home.NewStore(client, cfg).Mounted(context.Background(), taskid.Must(e.Task(agent)))
	assert.NilError(e.T, err)
	return homereset.HomeDir(root)
}

// markers lists the payload markers present in the worktree.
func markers(t testing.TB, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(dir, ".m"))
	if os.IsNotExist(err) {
		return nil
	}
	assert.NilError(t, err)
	var names []string
	for _, en := range entries {
		names = append(names, en.Name())
	}
	return names
}

// control runs agentArgs in a bare `podman run` of the agent image — no
// shrooms: no reset, no managed policy, no seal — on a copy of the task's
// HOME after turn 1 and a copy of the worktree. It is the positive control
// that the planted payloads are live; it returns the control worktree and
// the wall time of the run.
func control(e *tbworld.World, agent string, envs []string, agentArgs ...string) (string, time.Duration) {
	e.T.Helper()
	home, work := controlCopy(e, agent, "control")
	return work, bare(e, home, work, envs, agentArgs...)
}

// controlCopy copies the task's HOME and the worktree to fresh directories
// named after name, owned by the cage user, for a bare run.
func controlCopy(e *tbworld.World, agent, name string) (string, string) {
	e.T.Helper()
	home := filepath.Join(e.Dir, name+"-home")
	work := filepath.Join(e.Dir, name+"-work")
	for _, c := range [][]string{
		{"cp", "-a", homeDir(e, agent) + "/.", home + "/"},
		{"cp", "-a", e.Worktree + "/.", work + "/"},
		{"chown", "-R", "1000:1000", home, work},
	} {
		if c[0] == "cp" {
			assert.NilError(e.T, os.MkdirAll(c[len(c)-1], 0o755))
		}
		out, err := exec.Command(c[0], c[1:]...).CombinedOutput()
		assert.NilError(e.T, err, "%v: %s", c, out)
	}
	return home, work
}

// bare runs agentArgs as `podman run --rm` of the agent image, uid 1000,
// with home and work bind-mounted and the testbed host's network (so the
// model API is reachable): the agent as it runs without shrooms.
func bare(e *tbworld.World, home, work string, envs []string, agentArgs ...string) time.Duration {
	e.T.Helper()
	return bareRun(e, false, home, work, envs, agentArgs...)
}

// bareRun is bare; with mayFail the agent's exit status is not checked (a
// positive control whose payload makes the agent give up).
func bareRun(e *tbworld.World, mayFail bool, home, work string, envs []string, agentArgs ...string) time.Duration {
	e.T.Helper()
	args := []string{"run", "--rm", "--network", "host", "--user", "1000:1000", "--label", e.TB.Label(),
		"-v", home + ":/home/agent", "-v", work + ":/work", "-w", "/work", "-e", "HOME=/home/agent",
		// No registry in the testbed: fail npm fetches at once (opencode
		// installs its plugin SDK before loading a plugin).
		"--add-host", "registry.npmjs.org:127.0.0.1"}
	for _, kv := range envs {
		args = append(args, "-e", kv)
	}
	args = append(append(args, agentImage), agentArgs...)
	start := time.Now()
	out, err := e.TB.Podman(args...)
	took := time.Since(start)
	if mayFail {
		e.T.Logf("bare podman run (may fail): %v", err)
		return took
	}
	assert.NilError(e.T, err, "bare podman run: %s\nmodel API log:\n%s", out, e.API.Log())
	if os.Getenv("AGENTS_DEBUG") != "" {
		e.T.Logf("bare podman run output:\n%s", out)
	}
	return took
}

// requestsSince returns the scripted requests after the first n.
func requestsSince(s *modelapi.Server, n int) []modelapi.Request {
	all := s.Scripted()
	if n > len(all) {
		return nil
	}
	return all[n:]
}

// listenIn opens a TCP listener inside the network namespace at nsPath
// (the same code that opens the model gateway inside a cage).
func listenIn(nsPath, addr string) (net.Listener, error) {
	return gateway.ListenInNetNS(nsPath, addr)
}

// buildShrooms builds the CLI once per test into dir.
func buildShrooms(t testing.TB, dir string) string {
	t.Helper()
	bin := filepath.Join(dir, "shrooms")
	cmd := exec.Command("go", "build", "-tags", "remote exclude_graphdriver_btrfs containers_image_openpgp exclude_graphdriver_devicemapper",
		"-o", bin, "github.com/shrooms-cage/shrooms/cmd/shrooms")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	out, err := cmd.CombinedOutput()
	assert.NilError(t, err, "go build shrooms: %s", out)
	return bin
}

func repoRoot(t testing.TB) string {
	t.Helper()
	wd, err := os.Getwd()
	assert.NilError(t, err)
	return filepath.Join(wd, "..", "..")
}

func git(t testing.TB, dir string, args ...string) {
	t.Helper()
	out, err := exec.Command("git", append([]string{"-C", dir}, args...)...).CombinedOutput()
	assert.NilError(t, err, "git %v: %s", args, out)
}

func tomlList(v []string) string {
	b, _ := json.Marshal(v)
	return string(b)
}

func tomlTable(m map[string]string) string {
	var parts []string
	for k, v := range m {
		parts = append(parts, fmt.Sprintf("%q = %q", k, v))
	}
	return "{ " + strings.Join(parts, ", ") + " }"
}
