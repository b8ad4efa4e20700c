package agents_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"gotest.tools/v3/assert"

	"github.com/shrooms-cage/shrooms/internal/itest"
	"github.com/shrooms-cage/shrooms/internal/modelapi"
	"github.com/shrooms-cage/shrooms/internal/tbworld"
	"github.com/shrooms-cage/shrooms/pkg/history"
)

// honestTurns is how many resumed turns agent runs in
// TestHistoryHonestResumes (SHROOMS_HISTORY_TURNS overrides it for both).
func honestTurns(t *testing.T, agent string) int {
	if s := os.Getenv("SHROOMS_HISTORY_TURNS"); s != "" {
		n, err := strconv.Atoi(s)
		assert.NilError(t, err)
		return n
	}
	// 100 in all. An opencode turn costs 10-40 s here, nearly all of it
	// opencode's own start before its first request (measured: the first
	// request 10 s after the cage starts at load 4, 38 s at load 14); a
	// Claude Code turn 3-4 s. The two series run at once.
	if agent == "opencode" {
		return 30
	}
	return 70
}

// TestHistoryHonestResumes: no false positive. Real Claude Code and real
// opencode each run one session through the gateway with history =
// "refuse" for many resumed turns, each with tool calls (every fifth
// turn three deep), one turn stopped (`shrooms stop`) and one killed
// (kill -9 of shrooms) while a tool runs, each then resumed: every turn is
// accepted (verdict continued, never a refusal); Claude Code also compacts
// (/compact) halfway. The two agents' series run at once, each in its own
// testbed with its own scripted API; each turn logs its phases and when
// its requests arrived. The byte-identical rate of the repeated messages
// before the canonical form is logged.
func TestHistoryHonestResumes(t *testing.T) {
	itest.Require(t, itest.Root, itest.Podman, itest.Nftables, itest.Netns)
	bin := buildShrooms(t, t.TempDir())
	for _, agent := range []string{"claude", "opencode"} {
		t.Run(agent, func(t *testing.T) {
			// Most of a turn is waiting (the agent's node start, podman):
			// the two series share the machine well.
			t.Parallel()
			e := newEnvWith(t, envOptions{gateway: true, policy: "none", shrooms: bin})
			n := honestTurns(t, agent)
			wt := filepath.Join(e.Dir, "work-"+agent)
			assert.NilError(t, os.MkdirAll(wt, 0o755))
			git(t, wt, "init", "-q")
			e.Worktree = wt
			tool := bash
			args := func(session, prompt string) []string {
				a := []string{"-p", "--output-format", "json"}
				if session != "" {
					a = append(a, "--resume", session)
				}
				return append(a, prompt)
			}
			if agent == "opencode" {
				tool = ocBash
				args = func(session, prompt string) []string {
					a := []string{"--format", "json"}
					if session != "" {
						a = append(a, "--session", session)
					}
					return append(a, prompt)
				}
			}
			start := time.Now()
			first := len(e.API.Requests())
			e.API.Append(tool("echo turn-0"), modelapi.Text("done 0"))
			code, out, errb, res := resumeRun(e, agent, args("", "start the work")...)
			assert.Equal(t, code, 0, "%s %s\n%s", out, errb, e.API.Log())
			assert.Equal(t, res.History[0].Verdict, "new")
			session := ""
			if agent == "claude" {
				session = parseClaude(t, out).SessionID
			} else {
				session = opencodeSession(t, out)
			}
			refusals := 0
			// Claude Code compacts the session once (/compact) halfway:
			// that turn and the one after it are "compacted".
			compactAt := -1
			if agent == "claude" && n/2 != n/3 && n/2 != 2*n/3 && n/2 > 0 {
				compactAt = n / 2
			}
			want := "continued"
			for i := 1; i <= n; i++ {
				if i == compactAt {
					e.API.Append(modelapi.Text(compactSummary(fmt.Sprintf("turn %d", i))))
					code, out, errb, res := resumeRun(e, agent, args(session, "/compact")...)
					assert.Equal(t, code, 0, "compaction: %s %s\n%s", out, errb, e.API.Log())
					assert.Assert(t, len(res.History) == 1 && res.History[0].Verdict == "compacted", "compaction: %s", out)
					want = "compacted"
					continue
				}
				steps := []modelapi.Step{tool(fmt.Sprintf("echo turn-%d", i))}
				if i%5 == 0 {
					steps = append(steps, tool(fmt.Sprintf("ls /work; echo deep-%d", i)), tool(fmt.Sprintf("cat /work/.git/HEAD; echo deeper-%d", i)))
				}
				switch i {
				case n / 3, 2 * n / 3:
					// A tool call that blocks until the turn is stopped or
					// killed: the script's next steps belong to the turn after.
					marker := fmt.Sprintf(".inside-%d", i)
					e.API.Append(tool(fmt.Sprintf("touch /work/%s; sleep 300", marker)))
					interruptedTurn(e, agent, filepath.Join(wt, marker), i == n/3, args(session, fmt.Sprintf("prompt %d", i))...)
					want = "continued" // it resumed after a compaction, if one
					continue
				}
				e.API.Append(append(steps, modelapi.Text(fmt.Sprintf("done %d", i)))...)
				turnStart := time.Now()
				nreq := len(e.API.Requests())
				code, out, errb, res := resumeRun(e, agent, args(session, fmt.Sprintf("prompt %d", i))...)
				if code == 123 {
					// The last turn's detached teardown still held the task
					// (seen once under load): wait for it, run the turn again.
					settled(e, agent)
					code, out, errb, res = resumeRun(e, agent, args(session, fmt.Sprintf("prompt %d", i))...)
				}
				var at []string
				for _, r := range e.API.Requests()[nreq:] {
					at = append(at, fmt.Sprintf("%s+%.1fs", r.Path, r.At.Sub(turnStart).Seconds()))
				}
				t.Logf("turn %d: exit %d in %v (prepared %v, total %.0f ms: %v) requests %v", i, code, time.Since(turnStart).Round(100*time.Millisecond), res.Prepared, res.TotalMs, res.Phases, at)
				if code == 119 || len(res.History) == 0 || res.History[0].Verdict != want {
					refusals++
				}
				assert.Equal(t, code, 0, "turn %d: %s %s\n%s", i, out, errb, e.API.Log())
				assert.Equal(t, res.History[0].Verdict, want, "turn %d: %s", i, out)
				want = "continued"
			}
			took := time.Since(start)
			assert.Equal(t, refusals, 0)

			// The byte-identical rate of the messages each request repeats
			// from the one before, before and after the canonical form.
			header := map[string]string{"claude": "X-Claude-Code-Session-Id", "opencode": "X-Session-Id"}[agent]
			var prev []byte
			var total, same, canon int
			for _, r := range e.API.Requests()[first:] {
				var body struct {
					Tools    []json.RawMessage `json:"tools"`
					Messages json.RawMessage   `json:"messages"`
				}
				if r.Header.Get(header) == "" || json.Unmarshal(r.Body, &body) != nil || len(body.Tools) == 0 {
					continue
				}
				if bytes.Contains(body.Messages, []byte("CRITICAL: Respond with TEXT ONLY.")) {
					prev = nil // a compaction: the next history is a new one
					continue
				}
				if prev != nil {
					a, b, c, err := history.PrefixStats(prev, body.Messages)
					assert.NilError(t, err)
					total, same, canon = total+a, same+b, canon+c
				}
				prev = body.Messages
			}
			t.Logf("%s: %d resumed turns (2 of them interrupted: stop, kill -9; compaction at turn %d, -1: none), 0 refusals, %v wall (%v per turn); repeated messages byte-identical %d/%d (%.1f%%), canonically equal %d/%d",
				agent, n, compactAt, took.Round(time.Second), (took / time.Duration(n+1)).Round(100*time.Millisecond), same, total, 100*float64(same)/float64(max(total, 1)), canon, total)
		})
	}
}

// interruptedTurn runs a turn whose tool blocks, waits until the tool runs
// (marker exists), then stops the turn (`shrooms stop`) or kills shrooms
// with SIGKILL. The next turn resumes after it.
func interruptedTurn(e *tbworld.World, agent, marker string, stop bool, args ...string) {
	t := e.T
	t.Helper()
	// The last turn's detached teardown may hold the task lock for a while:
	// the wait for the tool starts once the turn can start.
	settled(e, agent)
	cmd := exec.Command("nsenter", append([]string{"--net=" + e.TB.NSPath("host"), "--", e.Binary, "--config", e.Config,
		"--json", "run", "--task", e.Task(agent), "--agent", agent, "--worktree", e.Worktree, "--no-stdin", "--"}, args...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	assert.NilError(t, cmd.Start())
	defer func() {
		// A failed wait must not leave the turn running into the next test.
		if cmd.ProcessState == nil {
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			_ = cmd.Wait()
		}
	}()
	deadline := time.Now().Add(240 * time.Second)
	for {
		if _, err := os.Stat(marker); err == nil {
			break
		}
		assert.Assert(t, time.Now().Before(deadline), "the blocking tool never ran\n%s", e.API.Log())
		time.Sleep(200 * time.Millisecond)
	}
	if stop {
		code, out, errb := e.CLI("stop", "--task", e.Task(agent))
		assert.Equal(t, code, 0, "stop: %s %s", out, errb)
		_ = cmd.Wait()
		t.Logf("turn stopped (shrooms stop) while its tool ran: exit %d", cmd.ProcessState.ExitCode())
		return
	}
	assert.NilError(t, syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL))
	_ = cmd.Wait()
	// The cage the killed shrooms left goes with the task's next turn.
	t.Logf("turn killed (kill -9 of shrooms) while its tool ran")
}
