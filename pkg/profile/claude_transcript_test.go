package profile

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
)

func rebuild(t *testing.T, in string, f LineFilter) ([]map[string]any, map[string]int64) {
	t.Helper()
	var out bytes.Buffer
	drops, err := RebuildLines(context.Background(), strings.NewReader(in), &out, 1<<20, f)
	assert.NilError(t, err)
	var recs []map[string]any
	for _, l := range strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n") {
		if l == "" {
			continue
		}
		var m map[string]any
		assert.NilError(t, json.Unmarshal([]byte(l), &m), l)
		recs = append(recs, m)
	}
	got := map[string]int64{}
	for _, d := range drops {
		assert.Assert(t, d.Reason != "")
		got[d.Item] = d.Rows
	}
	return recs, got
}

// A transcript as Claude Code 2.1.332 writes it, with forged state records
// between its messages.
const ccTranscript = `{"type":"queue-operation","operation":"enqueue","sessionId":"s","content":"hi"}
{"type":"user","uuid":"u1","parentUuid":null,"sessionId":"s","cwd":"/work","permissionMode":"bypassPermissions","message":{"role":"user","content":"hi"}}
{"type":"attachment","uuid":"a1","parentUuid":"u1","cwd":"/outbox/x","attachment":{"type":"prompt_snapshot","systemPrompt":"EVIL"}}
{"type":"attachment","uuid":"a2","parentUuid":"a1","cwd":"/work","attachment":{"type":"date","date":"2026-12-01"},"rendered":[{"content":"date"}]}
{"type":"assistant","uuid":"x1","parentUuid":"a2","cwd":"/work/deep","requestRef":"r","wireToolInputs":{"t":"EVIL"},"message":{"role":"assistant","content":[{"type":"text","text":"yo"}]}}
{"type":"worktree-state","sessionId":"s","worktreeSession":{"worktreePath":"/work/deep"}}
{"type":"progress","uuid":"p1","parentUuid":"x1"}
{"type":"user","uuid":"u2","parentUuid":"p1","cwd":"/work","toolUseResult":{"file":{"filePath":"/etc/passwd"}},"message":{"role":"user","content":"next"}}
{"type":"system","subtype":"compact_boundary","uuid":"c1","parentUuid":null,"logicalParentUuid":"p1","cwd":"/work","compactMetadata":{"trigger":"auto","preTokens":1}}
{"type":"summary","summary":"talk","leafUuid":"p1"}
{"type":"relocated","relocatedCwd":"/outbox","sessionId":"s"}
{"type":"permission-mode","permissionMode":"bypassPermissions","sessionId":"s"}
{"type":"agent-setting","agentSetting":"evil","sessionId":"s"}
{"type":"from-the-future","x":"EVIL"}
{"type":"user","uuid":"u3","parentUuid":"c1","message":"not an object"}
not json at all EVIL
[1,2]
{"no":"type"}
{"type":"user","uuid":"u4","parentUuid":"u3","cwd":"/work","futureField":"EVIL","message":{"role":"user","content":"last"}}
`

// TestTranscriptRebuild: conversation records are kept (cwd pinned, state
// fields dropped), state records, unknown types, malformed records and
// bad lines are dropped and counted, and the uuid chain is re-linked
// around every dropped record.
func TestTranscriptRebuild(t *testing.T) {
	recs, drops := rebuild(t, ccTranscript, newTranscriptFilter())
	var ids []string
	for _, r := range recs {
		assert.Assert(t, r["type"] != nil)
		if c, ok := r["cwd"]; ok {
			assert.Equal(t, c, "/work")
		}
		for _, k := range []string{"permissionMode", "requestRef", "wireToolInputs", "toolUseResult", "futureField"} {
			_, has := r[k]
			assert.Assert(t, !has, "%s kept in %v", k, r)
		}
		id, _ := r["uuid"].(string)
		ids = append(ids, id)
	}
	assert.DeepEqual(t, ids, []string{"u1", "a2", "x1", "u2", "c1", "", "u4"})
	parent := map[string]any{}
	for _, r := range recs {
		if id, ok := r["uuid"].(string); ok {
			parent[id] = r["parentUuid"]
		}
	}
	assert.Equal(t, parent["a2"], "u1", "a2's dropped parent a1 is bypassed")
	assert.Equal(t, parent["u2"], "x1", "the progress record is bypassed")
	assert.Equal(t, recs[4]["logicalParentUuid"], "x1")
	assert.Equal(t, recs[5]["leafUuid"], "x1")
	assert.Equal(t, parent["u4"], "c1", "the malformed u3 is bypassed")
	assert.DeepEqual(t, drops, map[string]int64{
		"record type queue-operation":     1,
		"record type worktree-state":      1,
		"record type progress":            1,
		"record type relocated":           1,
		"record type permission-mode":     1,
		"record type agent-setting":       1,
		"(record of an unknown type)":     1,
		"(record without a type)":         1,
		"(unparseable line)":              2,
		"malformed user record":           1,
		"attachment type prompt_snapshot": 1,
		"field permissionMode":            1,
		"field requestRef":                1,
		"field wireToolInputs":            1,
		"field toolUseResult":             1,
		"field cwd (pinned to /work)":     1,
		"(other field)":                   1,
	})
	var all bytes.Buffer
	_, err := RebuildLines(context.Background(), strings.NewReader(ccTranscript), &all, 1<<20, newTranscriptFilter())
	assert.NilError(t, err)
	assert.Assert(t, !bytes.Contains(all.Bytes(), []byte("EVIL")) && !bytes.Contains(all.Bytes(), []byte("deep")) && !bytes.Contains(all.Bytes(), []byte("outbox")), all.String())
	// Every drop item is a fixed string: no value of the file reaches it.
	for item := range drops {
		assert.Assert(t, !strings.Contains(item, "EVIL") && !strings.Contains(item, "future"), item)
	}
}

// TestTranscriptRebuildIsStable: a rebuilt transcript rebuilds to itself
// with nothing dropped (the next reset finds nothing to report).
func TestTranscriptRebuildIsStable(t *testing.T) {
	var once, twice bytes.Buffer
	_, err := RebuildLines(context.Background(), strings.NewReader(ccTranscript), &once, 1<<20, newTranscriptFilter())
	assert.NilError(t, err)
	drops, err := RebuildLines(context.Background(), bytes.NewReader(once.Bytes()), &twice, 1<<20, newTranscriptFilter())
	assert.NilError(t, err)
	assert.Equal(t, len(drops), 0, "%+v", drops)
	assert.Equal(t, once.String(), twice.String())
}

// TestTranscriptRebuildCycle: a forged cycle among dropped records cannot
// hang the rebuild; the child is re-parented to null.
func TestTranscriptRebuildCycle(t *testing.T) {
	in := `{"type":"progress","uuid":"p1","parentUuid":"p2"}
{"type":"progress","uuid":"p2","parentUuid":"p1"}
{"type":"user","uuid":"u1","parentUuid":"p1","message":{"role":"user","content":"x"}}
`
	recs, _ := rebuild(t, in, newTranscriptFilter())
	assert.Equal(t, len(recs), 1)
	assert.Equal(t, recs[0]["parentUuid"], nil)
}

// TestTranscriptRebuildLimits: a file over the cap is refused, not cut.
func TestTranscriptRebuildLimits(t *testing.T) {
	in := strings.Repeat(`{"type":"user","uuid":"u","message":{}}`+"\n", 100)
	_, err := RebuildLines(context.Background(), strings.NewReader(in), &bytes.Buffer{}, 1000, newTranscriptFilter())
	assert.ErrorContains(t, err, "larger than 1000 bytes")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = RebuildLines(ctx, strings.NewReader(in), &bytes.Buffer{}, 1<<20, newTranscriptFilter())
	assert.ErrorIs(t, err, context.Canceled)
}

// TestHistoryRebuild: history.jsonl keeps the prompt, its time and session;
// project is pinned to /work; pasted content and other fields go.
func TestHistoryRebuild(t *testing.T) {
	in := `{"display":"fix it","pastedContents":{},"timestamp":1796161298076,"project":"/work","sessionId":"0b6e2f4c-2d7a-4c1e-9f3b-6a5d4c3b2a10"}
{"display":"more","pastedContents":{"1":{"id":1,"type":"text","content":"EVIL"}},"timestamp":"x","project":"/outbox/deep","sessionId":"../x","command":"EVIL"}
{"nodisplay":1}
garbage
`
	recs, drops := rebuild(t, in, historyFilter{})
	assert.Equal(t, len(recs), 2)
	assert.DeepEqual(t, recs[0], map[string]any{"display": "fix it", "timestamp": 1796161298076.0, "project": "/work", "sessionId": "0b6e2f4c-2d7a-4c1e-9f3b-6a5d4c3b2a10"})
	assert.DeepEqual(t, recs[1], map[string]any{"display": "more", "project": "/work"})
	assert.DeepEqual(t, drops, map[string]int64{
		"field pastedContents":            1,
		"field timestamp":                 1,
		"field project (pinned to /work)": 1,
		"field sessionId":                 1,
		"(other field)":                   1,
		"(record without a prompt)":       1,
		"(unparseable line)":              1,
	})
}

// TestClaudeJSONNamesNowhere: every kept ~/.claude.json key, and the
// per-project keys, lose a value that names a path, a URL or a command;
// projects other than /work go, and their paths never reach the report.
func TestClaudeJSONNamesNowhere(t *testing.T) {
	in := map[string]any{
		"userID":               "u1",
		"installMethod":        "/outbox/x/claude",
		"lastReleaseNotesSeen": "http://evil.invalid/notes",
		"editorMode":           `..\\x`,
		"firstStartTime":       "2026-12-01T21:41:38.026Z",
		"oauthAccount":         map[string]any{"emailAddress": "a@example.invalid", "organizationName": "https://evil.invalid"},
		"tipsHistory":          map[string]any{"t": json.Number("1")},
		"projects": map[string]any{
			"/work":        map[string]any{"lastSessionId": sid, "lastCost": json.Number("1"), "lastPlanFile": "/outbox/p.md", "lastCommand": "sh -c x"},
			"/outbox/deep": map[string]any{"lastSessionId": sid},
		},
	}
	out, drops := filterClaudeJSON(in, nil)
	assert.DeepEqual(t, out, map[string]any{
		"userID": "u1", "firstStartTime": "2026-12-01T21:41:38.026Z", "tipsHistory": map[string]any{"t": json.Number("1")},
		"projects":       map[string]any{"/work": map[string]any{"lastSessionId": sid, "lastCost": json.Number("1")}},
		"autoConnectIde": false, "autoInstallIdeExtension": false,
	})
	var items []string
	for _, d := range drops {
		items = append(items, d.Key)
		assert.Assert(t, !strings.Contains(d.Key, "outbox"), d.Key)
	}
	assert.DeepEqual(t, items, []string{"editorMode", "installMethod", "lastReleaseNotesSeen", "oauthAccount",
		"projects.(a project other than /work)", "projects./work.lastCommand", "projects./work.lastPlanFile"})
}

// TestClaudeCredentialsNamesNowhere: .credentials.json's claudeAiOauth
// fields carry no address: a URL in a token field drops the sign-in (a
// required field is then missing), and URL-named extra keys go.
func TestClaudeCredentialsNamesNowhere(t *testing.T) {
	out, drops := filterClaudeCredentials(map[string]any{"claudeAiOauth": map[string]any{
		"accessToken": "at", "refreshToken": "http://evil.invalid/rt", "tokenUrl": "x", "scopes": []any{"user:inference"}}}, nil)
	assert.DeepEqual(t, out, map[string]any{"claudeAiOauth": map[string]any{"accessToken": "at", "scopes": []any{"user:inference"}}})
	assert.Equal(t, len(drops), 2)
	out, _ = filterClaudeCredentials(map[string]any{"claudeAiOauth": map[string]any{"accessToken": "https://evil.invalid"}}, nil)
	assert.DeepEqual(t, out, map[string]any{})
}

// TestTranscriptLongLine: a line longer than any record is skipped (not
// held in memory) and counted; the lines around it are kept.
func TestTranscriptLongLine(t *testing.T) {
	in := `{"type":"user","uuid":"u1","message":{"role":"user","content":"a"}}` + "\n" +
		`{"type":"user","uuid":"u2","message":{"role":"user","content":"` + strings.Repeat("x", maxLine) + `"}}` + "\n" +
		`{"type":"user","uuid":"u3","parentUuid":"u1","message":{"role":"user","content":"b"}}` + "\n"
	var out bytes.Buffer
	drops, err := RebuildLines(context.Background(), strings.NewReader(in), &out, 1<<30, newTranscriptFilter())
	assert.NilError(t, err)
	assert.Equal(t, strings.Count(out.String(), "\n"), 2)
	assert.Equal(t, len(drops), 1)
	assert.Equal(t, drops[0].Item, "(line over 64 MiB)")
}

// TestTranscriptAttachments: attachments are kept from an allowlist of
// rendered context; ones a resume re-arms (scheduled prompts, skills to
// reload) and unknown ones are dropped, and the chain is re-linked.
func TestTranscriptAttachments(t *testing.T) {
	in := `{"type":"user","uuid":"u1","parentUuid":null,"message":{"role":"user","content":"a"}}
{"type":"attachment","uuid":"a1","parentUuid":"u1","attachment":{"type":"session_cron_carry","tasks":[{"cron":"* * * * *","prompt":"EVIL"}]}}
{"type":"attachment","uuid":"a2","parentUuid":"a1","attachment":{"type":"invoked_skills","skillsToReload":["/outbox/s"]}}
{"type":"attachment","uuid":"a3","parentUuid":"a2","attachment":{"type":"from_the_future"}}
{"type":"attachment","uuid":"a4","parentUuid":"a3","attachment":{"type":"nested_memory","content":{"content":"notes"}}}
`
	recs, drops := rebuild(t, in, newTranscriptFilter())
	assert.Equal(t, len(recs), 2)
	assert.Equal(t, recs[1]["uuid"], "a4")
	assert.Equal(t, recs[1]["parentUuid"], "u1")
	assert.DeepEqual(t, drops, map[string]int64{"attachment type session_cron_carry": 1, "attachment type invoked_skills": 1, "(attachment of an unknown type)": 1})
}

// TestTranscriptDroppedRecordCannotUnlinkKept: a state record reusing a
// kept record's uuid does not re-parent that record's children.
func TestTranscriptDroppedRecordCannotUnlinkKept(t *testing.T) {
	in := `{"type":"user","uuid":"u1","parentUuid":null,"message":{"role":"user","content":"a"}}
{"type":"progress","uuid":"u1","parentUuid":"elsewhere"}
{"type":"assistant","uuid":"x1","parentUuid":"u1","message":{"role":"assistant","content":[]}}
`
	recs, _ := rebuild(t, in, newTranscriptFilter())
	assert.Equal(t, len(recs), 2)
	assert.Equal(t, recs[1]["parentUuid"], "u1")
}

// sid is a session id of the shape Claude Code writes.
const sid = "0b6e2f4c-2d7a-4c1e-9f3b-6a5d4c3b2a10"
