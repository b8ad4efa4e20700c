package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/shrooms-cage/shrooms/internal/itest"
)

// record is what results, records and listings share.
type record struct {
	Task      string `json:"task"`
	Turn      int    `json:"turn"`
	Status    string `json:"status"`
	ExitCode  int    `json:"exit_code"`
	StartedAt string `json:"started_at"`
	EndedAt   string `json:"ended_at"`
	PID       int    `json:"pid"`
	Error     string `json:"error"`
}

// utcTime parses an RFC 3339 UTC time of a result or record.
func utcTime(t *testing.T, what, s string) time.Time {
	t.Helper()
	ts, err := time.Parse(time.RFC3339Nano, s)
	assert.NilError(t, err, "%s: %q", what, s)
	assert.Check(t, strings.HasSuffix(s, "Z"), "%s is not UTC: %q", what, s)
	return ts
}

// noNull fails on a null anywhere in a JSON line (an empty list is [];
// "commit": null is the one documented null).
func noNull(t *testing.T, what, line string) {
	t.Helper()
	var v any
	assert.NilError(t, json.Unmarshal([]byte(line), &v), line)
	var walk func(path string, v any)
	walk = func(path string, v any) {
		switch x := v.(type) {
		case nil:
			if !strings.HasSuffix(path, ".commit") {
				t.Errorf("%s: null at %s", what, path)
			}
		case map[string]any:
			for k, val := range x {
				walk(path+"."+k, val)
			}
		case []any:
			for i, val := range x {
				walk(fmt.Sprintf("%s[%d]", path, i), val)
			}
		}
	}
	walk("", v)
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

func readRecord(t *testing.T, path string) record {
	t.Helper()
	b, err := os.ReadFile(path)
	assert.NilError(t, err)
	var r record
	assert.NilError(t, json.Unmarshal(b, &r), string(b))
	return r
}

// TestKilledTurnResultRecordAndWait: --result-file says "running" from the
// start, so after kill -9 it never shows the previous turn's result; the
// killed turn's record is written (status killed) by the next command that
// takes the task lock; a turn without --worktree runs on the task's
// remembered worktree; a busy task exits 123 at once, or after --wait DUR,
// and `run --wait` takes the task as soon as the running turn ends; every
// result, record and listing carries started_at/ended_at in UTC; forget is
// idempotent.
func TestKilledTurnResultRecordAndWait(t *testing.T) {
	e, client := integration(t, "")
	wt, _, _ := ownedRepo(t)
	task := e.Task("killed")
	resultFile := filepath.Join(e.Dir, "result.json")

	before := time.Now().UTC().Add(-time.Second)
	code, stdout, stderr := e.Shrooms("--json", "run", "--task", task, "--agent", "shell", "--worktree", wt, "--result-file", resultFile, "--", "-c", "echo one > /work/one")
	assert.Equal(t, code, 0, stderr)
	var r1 record
	resultOf(t, stdout, &r1)
	noNull(t, "run", lastLine(stdout))
	assert.Check(t, is.Equal(r1.Status, "exited"))
	start, end := utcTime(t, "started_at", r1.StartedAt), utcTime(t, "ended_at", r1.EndedAt)
	assert.Check(t, !start.Before(before) && !end.Before(start), "%s .. %s", start, end)
	assert.Check(t, is.Equal(readRecord(t, resultFile).Status, "exited"))

	// Turn 2 gives no --worktree: it sees the task's worktree (sticky).
	turn2 := e.Command("run", "--task", task, "--agent", "shell", "--result-file", resultFile, "--", "-c", "cat /work/one && echo up && sleep 600")
	out, err := turn2.StdoutPipe()
	assert.NilError(t, err)
	var stderr2 bytes.Buffer
	turn2.Stderr = &stderr2
	assert.NilError(t, turn2.Start())
	lines := bufio.NewScanner(out)
	var seen []string
	for lines.Scan() {
		seen = append(seen, lines.Text())
		if lines.Text() == "up" {
			break
		}
	}
	assert.DeepEqual(t, seen, []string{"one", "up"})
	running := readRecord(t, resultFile)
	assert.Check(t, is.Equal(running.Status, "running"))
	assert.Check(t, is.Equal(running.PID, turn2.Process.Pid))
	utcTime(t, "running started_at", running.StartedAt)

	// Busy: 123 at once; with --wait 1s, 123 after a second.
	t0 := time.Now()
	code, _, stderr = e.Shrooms("run", "--task", task, "--agent", "shell", "--", "-c", "true")
	assert.Check(t, is.Equal(code, ExitBusy), stderr)
	code, _, stderr = e.Shrooms("run", "--task", task, "--agent", "shell", "--wait", "1s", "--", "-c", "true")
	assert.Check(t, is.Equal(code, ExitBusy), stderr)
	assert.Check(t, is.Contains(stderr, "waited 1s"))
	assert.Check(t, time.Since(t0) >= time.Second)

	// Turn 3 waits for the task; turn 2's shrooms is killed meanwhile.
	turn3 := e.Command("--json", "run", "--task", task, "--agent", "shell", "--wait", "2m", "--", "-c", "echo three")
	var out3, stderr3 bytes.Buffer
	turn3.Stdout, turn3.Stderr = &out3, &stderr3
	assert.NilError(t, turn3.Start())
	time.Sleep(500 * time.Millisecond)
	assert.NilError(t, turn2.Process.Kill())
	_ = turn2.Wait()
	// The result file is not the previous turn's result: it says running.
	assert.Check(t, is.Equal(readRecord(t, resultFile).Status, "running"))
	assert.NilError(t, turn3.Wait(), "turn 3: %s", stderr3.String())
	var r3 record
	resultOf(t, out3.String(), &r3)
	assert.Check(t, is.Equal(r3.Turn, 3))
	assert.Check(t, is.Equal(r3.Status, "exited"))
	e.WaitIdle(task)
	assert.Check(t, is.Equal(cagesOf(e, client, task), 0))

	// The log: turn 2 recorded as killed, by turn 3's taking the lock.
	code, stdout, stderr = e.Shrooms("--json", "log", "--task", task)
	assert.Equal(t, code, 0, stderr)
	noNull(t, "log", stdout)
	var log struct{ Turns []record }
	assert.NilError(t, json.Unmarshal([]byte(stdout), &log))
	var statuses []string
	for _, rec := range log.Turns {
		statuses = append(statuses, rec.Status)
		s, e := utcTime(t, "record started_at", rec.StartedAt), utcTime(t, "record ended_at", rec.EndedAt)
		assert.Check(t, !e.Before(s), "turn %d: %s .. %s", rec.Turn, s, e)
	}
	assert.Check(t, is.DeepEqual(statuses, []string{"exited", "killed", "exited"}))
	assert.Check(t, is.Equal(log.Turns[1].Turn, 2))
	assert.Check(t, is.Contains(log.Turns[1].Error, "killed"))
	killedAt := utcTime(t, "killed started_at", log.Turns[1].StartedAt)
	fileAt := utcTime(t, "result file started_at", running.StartedAt)
	assert.Check(t, !killedAt.Before(fileAt) && killedAt.Sub(fileAt) < time.Minute, "%s vs %s", killedAt, fileAt)

	// Listings carry the last turn's times.
	code, stdout, stderr = e.Shrooms("--json", "status", "--task", task)
	assert.Equal(t, code, 0, stderr)
	noNull(t, "status", stdout)
	var st struct{ Last record }
	assert.NilError(t, json.Unmarshal([]byte(stdout), &st))
	assert.Check(t, is.Equal(st.Last.Turn, 3))
	utcTime(t, "status last.started_at", st.Last.StartedAt)
	utcTime(t, "status last.ended_at", st.Last.EndedAt)

	// With podman down, the commands that do not talk to it still work.
	podmanDown(t, e, task)

	// forget is idempotent.
	code, stdout, stderr = e.Shrooms("--json", "forget", "--task", task)
	assert.Equal(t, code, 0, stderr)
	assert.Check(t, is.Equal(lastObject(t, stdout)["forgotten"], true))
	code, stdout, stderr = e.Shrooms("--json", "forget", "--task", task)
	assert.Equal(t, code, 0, stderr)
	assert.Check(t, is.Equal(lastObject(t, stdout)["forgotten"], false))
}

// podmanDown runs the task commands that never talk to podman under a
// config whose podman socket has nothing listening (the shared service is
// never stopped): outbox list/collect/release, commit, trust, log, status,
// tasks. collect without --to makes its default delivery directory, 0700.
func podmanDown(t *testing.T, e *itest.Env, task string) {
	t.Helper()
	data, err := os.ReadFile(e.Config)
	assert.NilError(t, err)
	down := filepath.Join(e.Dir, "down.toml")
	assert.NilError(t, os.WriteFile(down, bytes.Replace(data, []byte(itest.Socket()), []byte(downSocket), 1), 0o600))
	shrooms := func(args ...string) (int, string, string) {
		return shroomsCLI(append([]string{"--config", down}, args...)...)
	}
	// Control: podman really is unreachable under this config.
	code, _, stderr := shrooms("gc")
	assert.Check(t, is.Equal(code, ExitHostNotReady), stderr)
	assert.Check(t, is.Contains(stderr, "podman"))
	for _, args := range [][]string{
		{"tasks"}, {"status", "--task", task}, {"log", "--task", task},
		{"outbox", "list", "--task", task}, {"outbox", "collect", "--task", task},
		{"trust", "--task", task},
		{"commit", "--task", task, "-m", "turn one", "--allow-agent-config", "one"},
		{"outbox", "release", "--task", task},
	} {
		code, stdout, stderr := shrooms(append([]string{"--json"}, args...)...)
		if args[0] == "commit" {
			// "one" is no agent config: refused as bad input, not as a
			// host without podman.
			assert.Check(t, is.Equal(code, ExitUsage), "%v: %s", args, stderr)
			code, stdout, stderr = shrooms("--json", "commit", "--task", task, "-m", "turn one")
		}
		assert.Check(t, is.Equal(code, 0), "%v: %s", args, stderr)
		lastObject(t, stdout)
		noNull(t, strings.Join(args, " "), lastLine(stdout))
	}
	for _, d := range []string{"deliveries", filepath.Join("deliveries", task)} {
		fi, err := os.Lstat(filepath.Join(e.Dir, "state", d))
		assert.NilError(t, err)
		assert.Check(t, fi.IsDir())
		assert.Check(t, is.Equal(fi.Mode().Perm(), os.FileMode(0o700)), d)
	}
}

// TestPreparedCagesShownAndExpired: a prepared cage shows in tasks and
// status (prepared, its age); after cage.prepared_ttl, gc --dry-run lists
// it and changes nothing, gc removes it, and so does the teardown of any
// task's next turn.
func TestPreparedCagesShownAndExpired(t *testing.T) {
	e, client := integration(t, "")
	data, err := os.ReadFile(e.Config)
	assert.NilError(t, err)
	// The TTL is read by each command: an hour while the cages are made
	// (turns take seconds under load), then one second.
	setTTL := func(ttl string) {
		assert.NilError(t, os.WriteFile(e.Config, bytes.Replace(data, []byte("[cage]\n"), []byte("[cage]\nprepared_ttl = \""+ttl+"\"\n"), 1), 0o600))
	}
	setTTL("1h")
	a, b := e.Task("prep-a"), e.Task("prep-b")
	type listing struct {
		Tasks []struct {
			Task         string  `json:"task"`
			Prepared     bool    `json:"prepared"`
			PreparedAgeS float64 `json:"prepared_age_s"`
			PreparedAt   string  `json:"prepared_at"`
		} `json:"tasks"`
	}
	prepared := func() map[string]bool {
		t.Helper()
		code, stdout, stderr := e.Shrooms("--json", "tasks")
		assert.Equal(t, code, 0, stderr)
		var l listing
		assert.NilError(t, json.Unmarshal([]byte(stdout), &l))
		out := map[string]bool{}
		for _, ts := range l.Tasks {
			out[ts.Task] = ts.Prepared
			if ts.Prepared {
				utcTime(t, "prepared_at", ts.PreparedAt)
				assert.Check(t, ts.PreparedAgeS >= 0 && ts.PreparedAgeS < 60, "%v", ts.PreparedAgeS)
			}
		}
		return out
	}
	for _, task := range []string{a, b} {
		code, _, stderr := e.Shrooms("run", "--prepare-next", "--task", task, "--agent", "shell", "--", "-c", "true")
		assert.Equal(t, code, 0, stderr)
		assert.Equal(t, cagesOf(e, client, task), 1, "the prepared cage waits")
	}
	// tasks and status show prepared cages while podman answers; podman 4.3
	// fails whole listings while another test's container is between netns
	// teardown and removal (podman#16140), so they are asked again.
	seen := prepared()
	for i := 0; i < 20 && !(seen[a] && seen[b]); i++ {
		time.Sleep(time.Second)
		seen = prepared()
	}
	assert.Check(t, is.DeepEqual(seen, map[string]bool{a: true, b: true}))
	var code int
	var stdout, stderr string
	for i := 0; i < 20; i++ {
		code, stdout, stderr = e.Shrooms("status", "--task", a)
		if strings.Contains(stdout, "prepared  -") {
			time.Sleep(time.Second)
			continue
		}
		break
	}
	assert.Equal(t, code, 0, stderr)
	assert.Check(t, is.Regexp(`(?m)^prepared  \d+s$`, stdout))

	// Control: before the TTL nothing expires.
	code, stdout, stderr = gcRetry(e, "--json", "gc", "--dry-run")
	assert.Equal(t, code, 0, stderr)
	assert.Check(t, is.DeepEqual(lastObject(t, stdout)["expired"], []any{}))
	assert.Check(t, is.Equal(cagesOf(e, client, a)+cagesOf(e, client, b), 2), "before the TTL")
	setTTL("1s")
	time.Sleep(1100 * time.Millisecond)

	code, stdout, stderr = gcRetry(e, "--json", "gc", "--dry-run")
	assert.Equal(t, code, 0, stderr)
	dry := lastObject(t, stdout)
	noNull(t, "gc --dry-run", stdout)
	assert.Check(t, is.Equal(dry["dry_run"], true))
	assert.Check(t, is.Len(dry["expired"], 2), "%v", dry)
	assert.Check(t, is.Equal(cagesOf(e, client, a)+cagesOf(e, client, b), 2), "dry run changed nothing")

	// The next turn of another task expires a's cage in its teardown.
	code, _, stderr = e.Shrooms("run", "--prepare-next=false", "--task", e.Task("prep-c"), "--agent", "shell", "--", "-c", "true")
	assert.Equal(t, code, 0, stderr)
	// The teardown expires it after it let its own task go: poll.
	for i := 0; i < 300 && cagesOf(e, client, a) > 0; i++ {
		time.Sleep(100 * time.Millisecond)
	}
	assert.Check(t, is.Equal(cagesOf(e, client, a), 0), "expired by the next turn's teardown")

	// gc expires what is left (nothing here) and releases what they held.
	code, stdout, stderr = gcRetry(e, "--json", "gc")
	assert.Equal(t, code, 0, stderr)
	assert.Check(t, is.Equal(cagesOf(e, client, b), 0))
	assert.Check(t, is.DeepEqual(prepared(), map[string]bool{a: false, b: false, e.Task("prep-c"): false}))
}

// gcRetry runs gc again while podman 4.3 fails its whole listing because a
// container on the host — another test's — is between netns teardown and
// removal (podman#16140: the client retries for seconds; under load on a
// shared host that is not always enough).
func gcRetry(e *itest.Env, args ...string) (code int, stdout, stderr string) {
	for i := 0; i < 10; i++ {
		if code, stdout, stderr = e.Shrooms(args...); code != ExitHostNotReady || !strings.Contains(stderr, "unknown FS magic") {
			return
		}
		time.Sleep(time.Second)
	}
	return
}
