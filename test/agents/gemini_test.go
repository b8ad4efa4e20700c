package agents_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/shrooms-cage/shrooms/internal/itest"
	"github.com/shrooms-cage/shrooms/internal/modelapi"
)

// geminiKey is the fake Gemini API key the gemini gateway holds.
const geminiKey = "AIzaSy-shrooms-test-REAL-gemini-key"

// geminiModel is the model the gemini baseline names (no routing
// classifier; the scripted API answers any).
const geminiModel = "gemini-2.5-pro"

// gmShell is a scripted call of Gemini CLI's shell tool.
func gmShell(command string) modelapi.Step {
	return modelapi.ToolCall("run_shell_command", map[string]string{"command": command})
}

// TestGeminiToolResumeAndKey: the real Gemini CLI, through the gemini
// gateway under network policy "none", runs its shell tool from the
// scripted Gemini API (streamed), and `--resume latest` continues the
// session in turn 2 with turn 1's prompt, tool call and answer in its
// request. Turn 1 also dumps every process environment, HOME, /run, /tmp
// and /etc: the real key is nowhere, the placeholder is (positive
// control). The upstream gets the real key in x-goog-api-key on every
// request; in turn 2 turn 1's placeholder gets 401 and a path outside the
// API 403.
func TestGeminiToolResumeAndKey(t *testing.T) {
	itest.Require(t, itest.Root, itest.Podman, itest.Nftables, itest.Netns)
	e := newEnvWith(t, envOptions{policy: "none"})
	nonce := e.Prefix
	e.API.Append(gmShell("echo gemini-tool-"+nonce+" > /work/tool.txt && "+dumpScript), modelapi.Text("dumped "+nonce))
	code, out, errb := e.CLI("--json", "run", "--task", e.Task("gemini"), "--agent", "gemini", "--worktree", e.Worktree, "--no-stdin", "--",
		"-p", "first turn "+nonce)
	assert.Equal(t, code, 0, "turn 1: %s %s\n%s", out, errb, e.API.Log())
	assert.Check(t, is.Contains(out, "dumped "+nonce))
	b, err := os.ReadFile(filepath.Join(e.Worktree, "tool.txt"))
	assert.NilError(t, err, "the shell tool ran in the cage: %s %s", out, errb)
	assert.Equal(t, string(b), "gemini-tool-"+nonce+"\n")
	var u1 usageResult
	lastJSON(t, out, &u1)
	assert.Assert(t, u1.Usage != nil && u1.Usage.Requests >= 2 && u1.Usage.OutputTokens > 0, "%+v", u1.Usage)

	reqs := e.API.Requests()
	assert.Assert(t, len(reqs) >= 2, e.API.Log())
	for _, r := range reqs {
		assert.Equal(t, r.Header.Get("X-Goog-Api-Key"), geminiKey, "the upstream gets the real key on every request (%s %s)", r.Method, r.Path)
		assert.Assert(t, strings.HasPrefix(r.Path, "/v1beta/models/"), r.Path)
	}
	env, err := os.ReadFile(filepath.Join(e.Worktree, ".env"))
	assert.NilError(t, err)
	var placeholder string
	for _, l := range strings.Split(string(env), "\n") {
		if v, ok := strings.CutPrefix(l, "GEMINI_API_KEY="); ok {
			placeholder = v
		}
	}
	assert.Assert(t, len(placeholder) >= 32, "the cage's key is a placeholder: %q", placeholder)
	for _, r := range reqs {
		for k, vs := range r.Header {
			for _, v := range vs {
				assert.Assert(t, !strings.Contains(v, placeholder), "the placeholder reached the upstream (%s)", k)
			}
		}
	}
	assert.Equal(t, searchKey(t, e.Worktree, geminiKey), 0, "the real key is readable in the cage")
	assert.Assert(t, searchKey(t, e.Worktree, placeholder) >= 2, "positive control: the dump holds the cage's environment")
	for _, f := range []string{".procdump", ".env", ".dump.tar", ".secrets", "tool.txt"} {
		_ = os.Remove(filepath.Join(e.Worktree, f))
	}

	probe := `import json,os,urllib.request as u
def call(path, key, method="POST"):
    r = u.Request("http://127.0.0.1:4180" + path, data=b"{}" if method == "POST" else None, method=method, headers={"x-goog-api-key": key, "content-type": "application/json"})
    try:
        return u.urlopen(r, timeout=10).status
    except u.HTTPError as e:
        return e.code
k = os.environ["GEMINI_API_KEY"]
res = {"old": call("/v1beta/models/m:generateContent", "` + placeholder + `"), "path": call("/v1beta/files", k), "models": call("/v1beta/models", k, "GET")}
open("/work/.gwprobe", "w").write(json.dumps(res))`
	e.API.Append(gmShell("python3 - <<'EOF'\n"+probe+"\nEOF"), modelapi.Text("resumed "+nonce))
	before := len(e.API.Requests())
	code, out, errb = e.CLI("--json", "run", "--task", e.Task("gemini"), "--agent", "gemini", "--worktree", e.Worktree, "--no-stdin", "--",
		"--resume", "latest", "-p", "second turn "+nonce)
	assert.Equal(t, code, 0, "turn 2: %s %s\n%s", out, errb, e.API.Log())
	assert.Check(t, is.Contains(out, "resumed "+nonce))
	first := e.API.Requests()[before]
	assert.Assert(t, is.Contains(string(first.Body), "first turn "+nonce), "turn 2's request carries turn 1's prompt")
	assert.Assert(t, is.Contains(string(first.Body), "dumped "+nonce), "turn 2's request carries turn 1's answer")
	assert.Assert(t, is.Contains(string(first.Body), "gemini-tool-"+nonce), "turn 2's request carries turn 1's tool call")
	var got map[string]int
	b, err = os.ReadFile(filepath.Join(e.Worktree, ".gwprobe"))
	assert.NilError(t, err)
	assert.NilError(t, json.Unmarshal(b, &got))
	assert.DeepEqual(t, got, map[string]int{"old": 401, "path": 403, "models": 200})
}
