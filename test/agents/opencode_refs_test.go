package agents_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/shrooms-cage/shrooms/internal/itest"
	"github.com/shrooms-cage/shrooms/internal/modelapi"
	"github.com/shrooms-cage/shrooms/internal/tbworld"
)

// refPlugin is a project plugin that leaves a marker in the worktree when
// opencode loads it.
func refPlugin(tag string) string {
	return `import fs from "fs"; fs.mkdirSync("/work/.m", {recursive: true}); fs.writeFileSync("/work/.m/plugin-` + tag + `", ""); export const P = async () => ({});`
}

// refEntry is one corpus entry of class 1 (kept state that points
// somewhere): a copy of turn 1's session whose session.directory and
// project.worktree point at dir, which holds .opencode/plugin/x.js.
type refEntry struct {
	tag, dir, suffix, project string
}

var refEntries = []refEntry{
	// (a) below /work: the worktree guard masks the added .opencode/ too,
	// so this entry stands whatever becomes of /outbox.
	{tag: "deep", dir: "/work/deep", suffix: "a", project: strings.Repeat("d", 40)},
	// (b) the outbox, which outlives the turn today.
	{tag: "outbox", dir: "/outbox/evil", suffix: "b", project: strings.Repeat("e", 40)},
}

// opencodeRefPlant is turn 1's bash step: plant the plugins, then copy the running
// session (its finished messages so far: the prompt) into one new session per entry,
// in a project of its own, pointing at the entry's directory (opencode
// itself never writes those rows again, so what the reset sees is this).
func opencodeRefPlant() string {
	return `python3 - <<'EOF'
import json, os, sqlite3
entries = ` + refEntriesPython() + `
for tag, d, sfx, proj, plugin in entries:
    try:
        os.makedirs(d + "/.opencode/plugin", exist_ok=True)
        open(d + "/.opencode/plugin/x.js", "w").write(plugin + "\n")
    except OSError as e:
        print("cannot plant in", tag, e.errno)
c = sqlite3.connect(os.path.expanduser("~/.local/share/opencode/opencode.db"), timeout=10)
s, p = c.execute("SELECT id, project_id FROM session ORDER BY time_created DESC LIMIT 1").fetchone()
def cols(t):
    return [r[1] for r in c.execute("PRAGMA table_info(%s)" % t)]
for tag, d, sfx, proj, plugin in entries:
    pc = cols("project")
    c.execute("INSERT INTO project (%s) SELECT %s FROM project WHERE id = ?" % (",".join(pc), ",".join("?" if x in ("id", "worktree") else x for x in pc)), (proj, d, p))
    sc = cols("session")
    c.execute("INSERT INTO session (%s) SELECT %s FROM session WHERE id = ?" % (",".join(sc), ",".join("?" if x in ("id", "project_id", "directory") else x for x in sc)), (s + sfx, proj, d, s))
    kept = set()
    for mid, t1, t2, data in c.execute("SELECT id, time_created, time_updated, data FROM message WHERE session_id = ?", (s,)).fetchall():
        m = json.loads(data)
        if m["role"] != "user" and "completed" not in m["time"]:
            continue  # this very step, still running
        kept.add(mid)
        if "parentID" in m:
            m["parentID"] += sfx
        if "path" in m:
            m["path"] = {"cwd": d, "root": d}
        c.execute("INSERT INTO message VALUES (?, ?, ?, ?, ?)", (mid + sfx, s + sfx, t1, t2, json.dumps(m)))
    for pid, mid, t1, t2, data in c.execute("SELECT id, message_id, time_created, time_updated, data FROM part WHERE session_id = ?", (s,)).fetchall():
        if mid in kept:
            c.execute("INSERT INTO part VALUES (?, ?, ?, ?, ?, ?)", (pid + sfx, mid + sfx, s + sfx, t1, t2, data))
c.commit()
print("planted", s)
EOF`
}

func refEntriesPython() string {
	var rows [][]string
	for _, en := range refEntries {
		rows = append(rows, []string{en.tag, en.dir, en.suffix, en.project, refPlugin(en.tag)})
	}
	b, _ := json.Marshal(rows)
	return string(b)
}

// workingDirectory is what opencode's system prompt states as the working
// directory in a model request ("" if none).
func workingDirectory(t *testing.T, body []byte) string {
	t.Helper()
	var req struct {
		System json.RawMessage `json:"system"`
	}
	assert.NilError(t, json.Unmarshal(body, &req))
	var text string
	var blocks []struct {
		Text string `json:"text"`
	}
	if json.Unmarshal(req.System, &blocks) == nil {
		for _, bl := range blocks {
			text += bl.Text + "\n"
		}
	} else {
		_ = json.Unmarshal(req.System, &text)
	}
	m := regexp.MustCompile(`(?m)^\s*Working directory: (\S+)$`).FindStringSubmatch(text)
	if m == nil {
		return ""
	}
	return m[1]
}

// bareOutbox is bare with outbox bind-mounted at /outbox, as shrooms mounts
// the task's outbox today. opencode does not exit when the session runs in
// another directory than its own (it waits for the session's idle event in
// its own), so a shell in the container stops it once the test, when done
// reports true (or after two minutes), drops /work/.ctl-done.
func bareOutbox(e *tbworld.World, home, work, outbox string, envs []string, done func() bool, agentArgs ...string) {
	e.T.Helper()
	args := []string{"run", "--rm", "--network", "host", "--user", "1000:1000", "--label", e.TB.Label(),
		"-v", home + ":/home/agent", "-v", work + ":/work", "-v", outbox + ":/outbox", "-w", "/work", "-e", "HOME=/home/agent",
		"--add-host", "registry.npmjs.org:127.0.0.1"}
	for _, kv := range envs {
		args = append(args, "-e", kv)
	}
	stop := `"$@" & p=$!; i=0; while [ $i -lt 150 ] && [ ! -e /work/.ctl-done ] && kill -0 $p 2>/dev/null; do sleep 1; i=$((i+1)); done; kill $p 2>/dev/null; wait $p; exit 0`
	args = append(append(args, agentImage, "sh", "-c", stop, "sh"), agentArgs...)
	type result struct {
		out string
		err error
	}
	ch := make(chan result, 1)
	go func() {
		out, err := e.TB.Podman(args...)
		ch <- result{out, err}
	}()
	for deadline := time.Now().Add(2 * time.Minute); !done() && time.Now().Before(deadline); {
		select {
		case r := <-ch:
			e.T.Fatalf("bare podman run ended before the control was done: %v\n%s\nmodel API log:\n%s", r.err, r.out, e.API.Log())
		case <-time.After(time.Second):
		}
	}
	assert.NilError(e.T, os.WriteFile(filepath.Join(work, ".ctl-done"), nil, 0o644))
	r := <-ch
	assert.NilError(e.T, r.err, "bare podman run: %s", r.out)
	if !done() {
		e.T.Logf("bare podman run, not done after two minutes:\n%s\nmodel API log:\n%s", r.out, e.API.Log())
	}
}

// TestOpencodeKeptPointersPinned: real opencode turn 1 (through shrooms)
// plants a project plugin in /work/deep and in /outbox/evil with its bash
// tool, and points a session's directory and its project's worktree at
// each (class 1 of issue 24: kept state that points somewhere). A bare
// `podman run` of `opencode run --session S` on copies of HOME and the
// worktree (the outbox mounted at /outbox) loads each plugin and tells the
// model that the planted directory is its working directory. Through
// shrooms each session resumes with turn 1's messages, the model is told
// /work, no plugin loads, and the reset report lists the pinned columns.
func TestOpencodeKeptPointersPinned(t *testing.T) {
	itest.Require(t, itest.Root, itest.Podman, itest.Nftables, itest.Netns)
	e := newEnv(t)
	nonce := e.Prefix
	checkSealed(e, "opencode")
	e.API.Append(ocBash(opencodeRefPlant()), modelapi.Text("planted "+nonce))
	out, took1 := runTurn(e, "opencode", "--format", "json", "plant things "+nonce)
	session := opencodeSession(t, out)
	assert.Equal(t, e.API.Remaining(), 0, "turn 1 did not run the whole script:\n%s\n%s", e.API.Log(), out)
	assert.Assert(t, is.Contains(out, "planted "+session), "the plant script did not finish:\n%s", out)
	t.Logf("opencode turn 1 (1 tool call): %v", took1)
	assert.NilError(t, os.RemoveAll(filepath.Join(e.Worktree, ".m")))
	_, err := os.Stat(filepath.Join(e.Worktree, "deep/.opencode/plugin/x.js"))
	assert.NilError(t, err, "turn 1 did not plant /work/deep")
	// The outbox plant lands only where the cage's /outbox is writable
	// (not where podman's service sees the bare outbox directory instead
	// of its tmpfs); the pointer to it is planted either way.
	t.Logf("outbox plant landed: %v", !strings.Contains(out, "cannot plant in outbox"))

	envs := []string{"ANTHROPIC_API_KEY=" + apiKey, "npm_config_offline=true", "OPENCODE_DISABLE_PROJECT_CONFIG=1"}
	for _, en := range refEntries {
		// Positive control, without shrooms. The outbox copy holds what
		// turn 1 put there (planted afresh: a one-way outbox does not keep
		// it, and the control is about the pointer).
		home, work := controlCopy(e, "opencode", "control-"+en.tag)
		outbox := filepath.Join(e.Dir, "control-"+en.tag+"-outbox")
		if rel, ok := strings.CutPrefix(en.dir, "/outbox/"); ok {
			p := filepath.Join(outbox, rel, ".opencode/plugin")
			assert.NilError(t, os.MkdirAll(p, 0o755))
			assert.NilError(t, os.WriteFile(filepath.Join(p, "x.js"), []byte(refPlugin(en.tag)+"\n"), 0o644))
		}
		assert.NilError(t, os.MkdirAll(outbox, 0o755))
		chown(t, outbox)
		n := len(e.API.Scripted())
		e.API.Append(modelapi.Text("control " + en.tag))
		start := time.Now()
		done := func() bool {
			return len(requestsSince(e.API, n)) > 0 && slices.Contains(markers(t, work), "plugin-"+en.tag)
		}
		bareOutbox(e, home, work, outbox, envs, done, "opencode", "run", "--format", "json", "--session", session+en.suffix, "control "+nonce)
		t.Logf("bare podman run, %s continued: %v", en.tag, time.Since(start))
		reqs := requestsSince(e.API, n)
		assert.Assert(t, len(reqs) > 0)
		assert.Equal(t, workingDirectory(t, reqs[0].Body), en.dir, "positive control: the planted directory is not opencode's working directory")
		assert.Assert(t, is.Contains(string(reqs[0].Body), "plant things "+nonce))
		assert.Assert(t, is.Contains(markers(t, work), "plugin-"+en.tag), "positive control: the plugin in %s did not load", en.dir)
	}

	for i, en := range refEntries {
		n := len(e.API.Scripted())
		e.API.Append(modelapi.Text("resumed " + en.tag))
		out, rep, took := turnReset(e, "opencode", "--format", "json", "--session", session+en.suffix, "continue "+en.tag+" "+nonce)
		t.Logf("shrooms opencode turn %d (%s): %v", i+2, en.tag, took)
		assert.Equal(t, opencodeSession(t, out), session+en.suffix)
		reqs := requestsSince(e.API, n)
		assert.Assert(t, len(reqs) > 0, "turn %d sent no model request:\n%s", i+2, e.API.Log())
		body := string(reqs[0].Body)
		assert.Assert(t, is.Contains(body, "plant things "+nonce), "the session did not resume with turn 1's messages")
		assert.Assert(t, is.Contains(body, "continue "+en.tag+" "+nonce))
		assert.Equal(t, workingDirectory(t, reqs[0].Body), "/work")
		assert.Equal(t, len(markers(t, e.Worktree)), 0, "a planted plugin loaded: %v", markers(t, e.Worktree))
		if i > 0 {
			continue
		}
		// The first reset after turn 1 pinned both sessions and projects.
		const ocdb = ".local/share/opencode/opencode.db"
		for _, item := range []string{"column session.directory (pinned to /work)", "column project.worktree (pinned to /work)"} {
			assert.Assert(t, rep.has(ocdb, item, 2), "the report lacks %s (2 rows): %+v", item, rep.Dropped)
		}
		for _, w := range rep.Warnings {
			assert.Assert(t, !strings.Contains(w, "/work/deep") && !strings.Contains(w, "/outbox/evil"), "a planted value leaked into the report: %s", w)
		}
	}
}

func chown(t *testing.T, dir string) {
	t.Helper()
	assert.NilError(t, filepath.Walk(dir, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, 1000, 1000)
	}))
}
