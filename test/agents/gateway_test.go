package agents_test

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/shrooms-cage/shrooms/internal/itest"
	"github.com/shrooms-cage/shrooms/internal/modelapi"
)

// usageResult is the part of `run --json`'s result the gateway tests read.
type usageResult struct {
	ExitCode int    `json:"exit_code"`
	Status   string `json:"status"`
	Error    string `json:"error"`
	Usage    *struct {
		Requests     int64    `json:"requests"`
		Refused      int64    `json:"refused"`
		InputTokens  int64    `json:"input_tokens"`
		OutputTokens int64    `json:"output_tokens"`
		Models       []string `json:"models"`
		Limit        string   `json:"limit"`
	} `json:"usage"`
}

func lastJSON(t *testing.T, stdout string, v any) {
	t.Helper()
	lines := strings.Split(strings.TrimRight(stdout, "\n"), "\n")
	assert.NilError(t, json.Unmarshal([]byte(lines[len(lines)-1]), v), "last stdout line: %s", lines[len(lines)-1])
}

// dumpScript is what a hostile turn runs to find the key: the whole
// environment of every process it can see, its HOME, /run (podman secrets),
// /tmp, /etc and /dev/shm, copied into the worktree for the test to search.
const dumpScript = `for p in /proc/[0-9]*; do cat $p/environ $p/cmdline 2>/dev/null; echo; done > /work/.procdump; ` +
	`env > /work/.env; tar -cf /work/.dump.tar /home /run /tmp /etc /dev/shm /var/tmp /work/.env 2>/dev/null; ls /run/secrets > /work/.secrets 2>&1; echo dumped`

// searchKey counts occurrences of needle in the files a dump produced and
// in the whole worktree.
func searchKey(t *testing.T, worktree, needle string) int {
	t.Helper()
	n := 0
	err := filepath.Walk(worktree, func(p string, fi os.FileInfo, err error) error {
		if err != nil || !fi.Mode().IsRegular() {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return nil
		}
		n += bytes.Count(b, []byte(needle))
		if strings.HasSuffix(p, ".tar") {
			tr := tar.NewReader(bytes.NewReader(b))
			for {
				if _, err := tr.Next(); err != nil {
					break
				}
				c, _ := io.ReadAll(tr)
				n += bytes.Count(c, []byte(needle))
			}
		}
		return nil
	})
	assert.NilError(t, err)
	return n
}

// TestGatewayKeepsTheKeyOutsideTheCage: with the gateway, Claude Code runs
// under network policy "none" (a cage that reaches its model and nothing
// else) and works: turn 1 and a resumed turn 2, streamed. A hostile turn
// dumps every process environment, HOME, /run (secrets), /tmp and /etc: the
// real key appears nowhere, the placeholder does (positive control that the
// dump sees the environment). The upstream sees the real key on every
// request and never the placeholder. In turn 2, turn 1's placeholder is
// refused, a path outside the API is refused, and the usage is reported.
func TestGatewayKeepsTheKeyOutsideTheCage(t *testing.T) {
	itest.Require(t, itest.Root, itest.Podman, itest.Nftables, itest.Netns)
	e := newEnvWith(t, envOptions{gateway: true, policy: "none"})
	nonce := e.Prefix
	e.API.Append(bash(dumpScript), modelapi.Text("dumped "+nonce))
	code, out, errb := e.CLI("--json", "run", "--task", e.Task("claude"), "--agent", "claude", "--worktree", e.Worktree, "--no-stdin", "--",
		"-p", "--output-format", "json", "dump everything "+nonce)
	assert.Equal(t, code, 0, "turn 1: %s %s\n%s", out, errb, e.API.Log())
	r1 := parseClaude(t, out)
	assert.Assert(t, !r1.IsError, out)
	assert.Equal(t, r1.Result, "dumped "+nonce)
	var u1 usageResult
	lastJSON(t, out, &u1)
	assert.Assert(t, u1.Usage != nil && u1.Usage.Requests >= 2, "%+v", u1)
	assert.Assert(t, u1.Usage.OutputTokens > 0 && u1.Usage.InputTokens > 0)

	reqs := e.API.Requests()
	assert.Assert(t, len(reqs) >= 2)
	var placeholder string
	for _, r := range reqs {
		assert.Equal(t, r.Header.Get("X-Api-Key"), apiKey, "the upstream gets the real key on every request")
	}
	env, err := os.ReadFile(filepath.Join(e.Worktree, ".env"))
	assert.NilError(t, err)
	for _, l := range strings.Split(string(env), "\n") {
		if v, ok := strings.CutPrefix(l, "ANTHROPIC_API_KEY="); ok {
			placeholder = v
		}
	}
	assert.Assert(t, strings.HasPrefix(placeholder, "sk-ant-shrooms-placeholder-"), "the cage's key is a placeholder: %q", placeholder)
	for _, r := range reqs {
		for k, vs := range r.Header {
			for _, v := range vs {
				assert.Assert(t, !strings.Contains(v, placeholder), "the placeholder reached the upstream (%s)", k)
			}
		}
	}
	assert.Equal(t, searchKey(t, e.Worktree, apiKey), 0, "the real key is readable in the cage")
	assert.Assert(t, searchKey(t, e.Worktree, placeholder) >= 2, "positive control: the dump holds the cage's environment")
	secrets, err := os.ReadFile(filepath.Join(e.Worktree, ".secrets"))
	assert.NilError(t, err)
	assert.Assert(t, !strings.Contains(string(secrets), "anthropic"), "a token secret is mounted: %s", secrets)

	// Turn 2, resumed: the old placeholder and a non-API path are refused
	// from inside the cage; the model still answers.
	probe := `import json,os,urllib.request as u
def call(path, key, method="POST"):
    r = u.Request("http://127.0.0.1:4180" + path, data=b"{}" if method == "POST" else None, method=method, headers={"x-api-key": key, "content-type": "application/json"})
    try:
        return u.urlopen(r, timeout=10).status
    except u.HTTPError as e:
        return e.code
res = {"old": call("/v1/messages", "` + placeholder + `"), "path": call("/v1/files", os.environ["ANTHROPIC_API_KEY"]), "models": call("/v1/models", os.environ["ANTHROPIC_API_KEY"], "GET")}
open("/work/.gwprobe", "w").write(json.dumps(res))`
	e.API.Append(bash(`python3 - <<'EOF'`+"\n"+probe+"\nEOF"), modelapi.Text("resumed "+nonce))
	code, out, errb = e.CLI("--json", "run", "--task", e.Task("claude"), "--agent", "claude", "--worktree", e.Worktree, "--no-stdin", "--",
		"-p", "--output-format", "json", "--resume", r1.SessionID, "continue "+nonce)
	assert.Equal(t, code, 0, "turn 2: %s %s\n%s", out, errb, e.API.Log())
	r2 := parseClaude(t, out)
	assert.Equal(t, r2.Result, "resumed "+nonce)
	var got map[string]int
	b, err := os.ReadFile(filepath.Join(e.Worktree, ".gwprobe"))
	assert.NilError(t, err)
	assert.NilError(t, json.Unmarshal(b, &got))
	assert.DeepEqual(t, got, map[string]int{"old": 401, "path": 403, "models": 200})
	var u2 usageResult
	lastJSON(t, out, &u2)
	assert.Assert(t, u2.Usage != nil && u2.Usage.Refused == 2, "%+v", u2.Usage)
	last := e.API.Requests()[len(e.API.Requests())-1]
	assert.Assert(t, is.Contains(string(last.Body), "dump everything "+nonce), "the session resumed through the gateway")
}

// TestGatewayOpencode: real opencode works through the gateway (its
// provider base URL pinned by the managed policy), streaming, and the
// upstream sees the real key.
func TestGatewayOpencode(t *testing.T) {
	itest.Require(t, itest.Root, itest.Podman, itest.Nftables, itest.Netns)
	e := newEnvWith(t, envOptions{gateway: true, policy: "none"})
	nonce := e.Prefix
	e.API.Append(ocBash(`echo "$ANTHROPIC_API_KEY" | cut -c1-27 > /work/.ockey`), modelapi.Text("done "+nonce))
	code, out, errb := e.CLI("--json", "run", "--task", e.Task("opencode"), "--agent", "opencode", "--worktree", e.Worktree, "--no-stdin", "--",
		"--format", "json", "hello "+nonce)
	assert.Equal(t, code, 0, "%s %s\n%s", out, errb, e.API.Log())
	assert.Equal(t, e.API.Remaining(), 0, e.API.Log())
	b, err := os.ReadFile(filepath.Join(e.Worktree, ".ockey"))
	assert.NilError(t, err)
	assert.Equal(t, string(b), "sk-ant-shrooms-placeholder-\n")
	streamed := false
	for _, r := range e.API.Scripted() {
		assert.Equal(t, r.Header.Get("X-Api-Key"), apiKey)
		streamed = streamed || r.Stream
	}
	assert.Assert(t, streamed, "opencode streamed through the gateway")
	var u usageResult
	lastJSON(t, out, &u)
	assert.Assert(t, u.Usage != nil && u.Usage.Requests >= 2, "%+v", u)
}

// TestGatewayLimitEndsTheTurn: max_requests = 1; the agent's second model
// request is refused, the cage is stopped and the turn ends with status
// "limit" and exit 120.
func TestGatewayLimitEndsTheTurn(t *testing.T) {
	itest.Require(t, itest.Root, itest.Podman, itest.Nftables, itest.Netns)
	e := newEnvWith(t, envOptions{gateway: true, policy: "none", gatewayExtra: "max_requests = 1"})
	e.API.Append(bash(`echo one`), bash(`echo two`), modelapi.Text("never"))
	start := time.Now()
	code, out, errb := e.CLI("--json", "run", "--task", e.Task("claude"), "--agent", "claude", "--worktree", e.Worktree, "--no-stdin", "--",
		"-p", "--output-format", "json", "go")
	assert.Equal(t, code, 120, "%s %s", out, errb)
	var u usageResult
	lastJSON(t, out, &u)
	assert.Equal(t, u.Status, "limit")
	assert.Assert(t, is.Contains(u.Error, "limit of 1 model requests"))
	assert.Equal(t, u.Usage.Requests, int64(1))
	assert.Assert(t, time.Since(start) < 60*time.Second)
	assert.Equal(t, len(e.API.Scripted()), 1, "only one request reached the upstream")
}

// TestGatewayBadInput: a missing token file is bad input (121) and an
// unreachable upstream a host that is not ready (122); no cage is created.
func TestGatewayBadInput(t *testing.T) {
	itest.Require(t, itest.Root, itest.Podman, itest.Nftables, itest.Netns)
	e := newEnvWith(t, envOptions{gateway: true, policy: "none"})
	cfg, err := os.ReadFile(e.Config)
	assert.NilError(t, err)
	token := filepath.Join(e.Dir, "anthropic-key")

	assert.NilError(t, os.Rename(token, token+".away"))
	code, _, errb := e.CLI("run", "--task", e.Task("claude"), "--agent", "claude", "--no-stdin", "--", "-p", "x")
	assert.Equal(t, code, 121, errb)
	assert.Assert(t, is.Contains(errb, "tokens.anthropic"))
	assert.NilError(t, os.WriteFile(token, nil, 0o600))
	code, _, errb = e.CLI("run", "--task", e.Task("claude"), "--agent", "claude", "--no-stdin", "--", "-p", "x")
	assert.Equal(t, code, 121, errb)
	assert.NilError(t, os.Rename(token+".away", token))

	// The upstream's port closed: the model API listens elsewhere.
	bad := strings.Replace(string(cfg), e.APIURL, "http://203.0.113.10:9", 1)
	assert.NilError(t, os.WriteFile(e.Config, []byte(bad), 0o600))
	code, _, errb = e.CLI("run", "--task", e.Task("claude"), "--agent", "claude", "--no-stdin", "--", "-p", "x")
	assert.Equal(t, code, 122, errb)
	assert.Assert(t, is.Contains(errb, "is unreachable"))
	assert.Equal(t, strings.Count(strings.TrimSpace(errb), "\n"), 0, "one line: %s", errb)
	cages := e.TB.MustPodman("ps", "-a", "--filter", "label=io.shrooms.task="+e.Task("claude"), "--format", "{{.Names}}")
	assert.Equal(t, strings.TrimSpace(cages), "", "a cage was created")
}

// TestGatewayGoneWithShrooms: the listener belongs to the shrooms process;
// after `kill -9` of shrooms mid-turn the still running cage can no longer
// reach it (and the upstream sees nothing more).
func TestGatewayGoneWithShrooms(t *testing.T) {
	itest.Require(t, itest.Root, itest.Podman, itest.Nftables, itest.Netns)
	e := newEnvWith(t, envOptions{gateway: true, policy: "none"})
	script := `import socket,time
def up():
    s = socket.socket()
    s.settimeout(1)
    try:
        s.connect(("127.0.0.1", 4180)); return True
    except OSError:
        return False
    finally:
        s.close()
open("/work/.gw-before", "w").write(str(up()))
for i in range(600):
    if not up():
        open("/work/.gw-after", "w").write("gone after %d" % i); break
    time.sleep(0.1)`
	cmd := exec.Command("nsenter", "--net="+e.TB.NSPath("host"), "--", e.Binary, "--config", e.Config,
		"run", "--task", e.Task("probe"), "--agent", "probe", "--worktree", e.Worktree, "--no-stdin", "--", script)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	assert.NilError(t, cmd.Start())
	before := filepath.Join(e.Worktree, ".gw-before")
	deadline := time.Now().Add(60 * time.Second)
	var b []byte
	var err error
	for {
		// Until written, not only created: on a loaded machine the file
		// can be seen empty between the script's open and its write.
		if b, err = os.ReadFile(before); (err == nil && len(b) > 0) || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	assert.NilError(t, err, "the cage never started")
	assert.Equal(t, string(b), "True", "positive control: the gateway is reachable during the turn")
	assert.NilError(t, syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL))
	_ = cmd.Wait()
	after := filepath.Join(e.Worktree, ".gw-after")
	deadline = time.Now().Add(30 * time.Second)
	for {
		if b, err = os.ReadFile(after); (err == nil && len(b) > 0) || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	assert.NilError(t, err, "the cage could still reach the gateway 30 s after shrooms was killed")
	assert.Assert(t, is.Contains(string(b), "gone after"))
	// The leftover cage goes with the task's next command.
	_, _ = e.TB.Podman("rm", "-f", "--filter", "label=io.shrooms.task="+e.Task("probe"))
}

// tokenEndpoint is an OAuth token endpoint that rotates refresh tokens, as
// the provider's does: each refresh token works once.
type tokenEndpoint struct {
	mu        sync.Mutex
	valid     map[string]bool
	n         int
	refreshes int
	refused   int
}

func (s *tokenEndpoint) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var req map[string]string
	_ = json.NewDecoder(r.Body).Decode(&req)
	s.mu.Lock()
	defer s.mu.Unlock()
	if req["grant_type"] != "refresh_token" || !s.valid[req["refresh_token"]] {
		s.refused++
		http.Error(w, `{"error":"invalid_grant"}`, http.StatusBadRequest)
		return
	}
	delete(s.valid, req["refresh_token"])
	s.n++
	s.refreshes++
	s.valid[fmt.Sprintf("real-refresh-%d", s.n)] = true
	_ = json.NewEncoder(w).Encode(map[string]any{"access_token": fmt.Sprintf("real-access-%d", s.n), "refresh_token": fmt.Sprintf("real-refresh-%d", s.n), "expires_in": 3600})
}

// TestGatewaySubscriptionSignIn: a Claude subscription sign-in through the
// gateway. The owner's .credentials.json (expired access token) seeds the
// account on the host; two tasks of that account run real Claude Code at
// once: the token endpoint sees exactly one refresh and no reuse of a
// rotated refresh token (no forced re-login), the upstream gets the real
// bearer token on every request, and each cage's .credentials.json holds
// the placeholder and no real token.
func TestGatewaySubscriptionSignIn(t *testing.T) {
	itest.Require(t, itest.Root, itest.Podman, itest.Nftables, itest.Netns)
	signin, _ := json.Marshal(map[string]any{"claudeAiOauth": map[string]any{
		"accessToken": "real-access-0", "refreshToken": "real-refresh-0", "expiresAt": time.Now().Add(-time.Hour).UnixMilli(),
		"scopes": []string{"user:inference", "user:profile"}, "subscriptionType": "max"}})
	tokens := &tokenEndpoint{valid: map[string]bool{"real-refresh-0": true}}
	// The token endpoint is on the testbed's internet host; newEnvWith
	// writes its URL into the gateway table.
	e := newEnvWith(t, envOptions{gateway: true, policy: "none", signin: signin, tokenHandler: tokens})
	e.API.Append(modelapi.Text("done"), modelapi.Text("done"))

	var wg sync.WaitGroup
	results := make([][3]string, 2)
	for i, task := range []string{e.Task("claude"), e.Task("claude2")} {
		wg.Add(1)
		go func(i int, task string) {
			defer wg.Done()
			code, out, errb := e.CLI("--json", "run", "--task", task, "--agent", "claude", "--no-stdin", "--",
				"-p", "--output-format", "json", "hello")
			results[i] = [3]string{fmt.Sprint(code), out, errb}
		}(i, task)
	}
	wg.Wait()
	for _, r := range results {
		assert.Equal(t, r[0], "0", "turn: %s %s\n%s", r[1], r[2], e.API.Log())
	}
	tokens.mu.Lock()
	assert.Equal(t, tokens.refreshes, 1, "one refresh chain for the account")
	assert.Equal(t, tokens.refused, 0, "a rotated refresh token was reused")
	tokens.mu.Unlock()
	reqs := e.API.Scripted()
	assert.Equal(t, len(reqs), 2)
	for _, r := range e.API.Requests() {
		assert.Equal(t, r.Header.Get("Authorization"), "Bearer real-access-1", "the upstream gets the real bearer token")
		assert.Equal(t, r.Header.Get("X-Api-Key"), "")
	}
	for _, task := range []string{"claude", "claude2"} {
		b, err := os.ReadFile(filepath.Join(homeDir(e, task), ".claude", ".credentials.json"))
		assert.NilError(t, err)
		assert.Assert(t, is.Contains(string(b), "sk-ant-shrooms-placeholder-"), "%s", b)
		assert.Assert(t, !strings.Contains(string(b), "real-"), "a real token in the cage's credentials: %s", b)
	}
}
