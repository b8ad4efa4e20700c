package agents_test

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gotest.tools/v3/assert"

	"github.com/shrooms-cage/shrooms/internal/itest"
	"github.com/shrooms-cage/shrooms/internal/modelapi"
)

// compactSummary is the scripted model's answer to a compaction request:
// Claude Code 2.1.332 formats it (drops <analysis>, "Summary:" for the
// <summary> tags, blank lines folded) into the wrapper of the compacted
// history; pkg/history derives the same.
func compactSummary(nonce string) string {
	return "pre text\n<analysis>\nthinking\n\n\nmore\n</analysis>\n\n\n<summary>\n   1. Intent:\n\n\n\n   do X " + nonce + "  \n</summary>\n\npost text  "
}

// TestHistoryCompaction: real Claude Code through the gateway (history =
// "refuse"). Turn 1 calls tools; turn 2 runs `/compact`: the compaction
// request is derived from the pinned history, the summary the gateway
// passed back is recorded (verdict compacted). A forged summary or kept
// message in the compacted transcript is refused (exit 119) before the
// model API sees it; with history = "off" the forged summary reaches the
// API (positive control). The honest compacted transcript resumes
// (verdict compacted), and the turn after it continues.
func TestHistoryCompaction(t *testing.T) {
	itest.Require(t, itest.Root, itest.Podman, itest.Nftables, itest.Netns)
	e := newEnvWith(t, envOptions{gateway: true, policy: "none"})
	nonce := e.Prefix
	e.API.Append(bash("echo tool-"+nonce), modelapi.ToolCall("Read", map[string]any{"file_path": "/etc/hostname"}), modelapi.Text("answer one "+nonce))
	code, out, errb, res := resumeRun(e, "claude", "-p", "--output-format", "json", "first prompt "+nonce)
	assert.Equal(t, code, 0, "%s %s\n%s", out, errb, e.API.Log())
	sid := parseClaude(t, out).SessionID
	assert.Equal(t, res.History[0].Verdict, "new", out)

	before := len(e.API.Requests())
	e.API.Append(modelapi.Text(compactSummary(nonce)))
	code, out, errb, res = resumeRun(e, "claude", "-p", "--output-format", "json", "--resume", sid, "/compact keep the owner's words")
	assert.Equal(t, code, 0, "%s %s\n%s", out, errb, e.API.Log())
	assert.Assert(t, len(res.History) == 1 && res.History[0].Verdict == "compacted", "the compaction turn: %s", out)
	compacting := false
	for _, r := range e.API.Requests()[before:] {
		compacting = compacting || bytes.Contains(r.Body, []byte("CRITICAL: Respond with TEXT ONLY. Do NOT call any tools."))
	}
	assert.Assert(t, compacting, "no compaction request reached the model API:\n%s", e.API.Log())

	transcriptPath := func() string {
		settled(e, "claude")
		return filepath.Join(homeDir(e, "claude"), ".claude", "projects", "-work", sid+".jsonl")
	}
	orig, err := os.ReadFile(transcriptPath())
	assert.NilError(t, err)
	for _, f := range []struct{ kind, old string }{
		{"changed summary", "do X " + nonce},
		{"changed kept message", "answer one " + nonce},
	} {
		marker := "FORGED-" + strings.ReplaceAll(f.kind, " ", "-") + "-" + nonce
		assert.Assert(t, bytes.Contains(orig, []byte(f.old)), "%s: %q is not in the compacted transcript", f.kind, f.old)
		assert.NilError(t, os.WriteFile(transcriptPath(), bytes.ReplaceAll(orig, []byte(f.old), []byte(marker)), 0o600))
		before := len(e.API.Requests())
		code, out, errb, res := resumeRun(e, "claude", "-p", "--output-format", "json", "--resume", sid, "continue "+nonce)
		refusedForgery(e, f.kind, marker, before, code, out, errb, res)
		assert.NilError(t, os.WriteFile(transcriptPath(), orig, 0o600))
	}

	// Positive control: with history = "off" the forged summary reaches the
	// API.
	setHistory(e, "off")
	marker := "FORGED-control-" + nonce
	assert.NilError(t, os.WriteFile(transcriptPath(), bytes.ReplaceAll(orig, []byte("do X "+nonce), []byte(marker)), 0o600))
	before = len(e.API.Requests())
	e.API.Append(modelapi.Text("control " + nonce))
	code, out, errb, _ = resumeRun(e, "claude", "-p", "--output-format", "json", "--resume", sid, "control "+nonce)
	assert.Equal(t, code, 0, "%s %s", out, errb)
	reached := false
	for _, r := range e.API.Requests()[before:] {
		reached = reached || bytes.Contains(r.Body, []byte(marker))
	}
	assert.Assert(t, reached, "positive control: the forged summary did not reach the model API without the pin")

	// The honest compacted transcript resumes: compacted, then continued.
	setHistory(e, "refuse")
	assert.NilError(t, os.WriteFile(transcriptPath(), orig, 0o600))
	e.API.Append(modelapi.Text("after compact " + nonce))
	code, out, errb, res = resumeRun(e, "claude", "-p", "--output-format", "json", "--resume", sid, "after compact "+nonce)
	assert.Equal(t, code, 0, "%s %s\n%s", out, errb, e.API.Log())
	assert.Equal(t, res.History[0].Verdict, "compacted", out)
	e.API.Append(modelapi.Text("next " + nonce))
	code, out, errb, res = resumeRun(e, "claude", "-p", "--output-format", "json", "--resume", sid, "next "+nonce)
	assert.Equal(t, code, 0, "%s %s\n%s", out, errb, e.API.Log())
	assert.Equal(t, res.History[0].Verdict, "continued", out)
}

// TestHistoryAutoCompact: the scripted API reports usage near the context
// window on a tool call, and the real Claude Code compacts by itself
// before its next request. Through the gateway (history = "refuse") the
// auto-compaction is derived from the pin like /compact: the turn is
// accepted as compacted; a forged summary in the kept transcript after it
// is refused before the model API sees it (with history = "off" it
// arrives: the positive control), and the honest one continues.
func TestHistoryAutoCompact(t *testing.T) {
	itest.Require(t, itest.Root, itest.Podman, itest.Nftables, itest.Netns)
	e := newEnvWith(t, envOptions{gateway: true, policy: "none"})
	nonce := e.Prefix
	// Claude Code 2.1.332 sees a 1M window for the model here (its debug
	// log: effectiveWindow=980000) and compacts from 967,000 tokens; the
	// newest messages are kept verbatim, so the summary needs older ones.
	for i := 0; i < 6; i++ {
		e.API.Append(bash(fmt.Sprintf("echo tool-%d-%s", i, nonce)))
	}
	full := bash("echo tool-full-" + nonce)
	full.InputTokens = 970_000
	e.API.Append(full, modelapi.Text(compactSummary(nonce)), modelapi.Text("after auto-compact "+nonce))
	code, out, errb, res := resumeRun(e, "claude", "-p", "--output-format", "json", "first prompt "+nonce)
	assert.Equal(t, code, 0, "%s %s\n%s", out, errb, e.API.Log())
	sid := parseClaude(t, out).SessionID
	compacting := 0
	for _, r := range e.API.Requests() {
		if bytes.Contains(r.Body, []byte("CRITICAL: Respond with TEXT ONLY. Do NOT call any tools.")) {
			compacting++
		}
	}
	assert.Equal(t, compacting, 1, "Claude Code did not auto-compact:\n%s", e.API.Log())
	assert.Assert(t, len(res.History) == 1 && res.History[0].Verdict == "compacted", "the auto-compacted turn: %s", out)

	transcriptPath := func() string {
		settled(e, "claude")
		return filepath.Join(homeDir(e, "claude"), ".claude", "projects", "-work", sid+".jsonl")
	}
	orig, err := os.ReadFile(transcriptPath())
	assert.NilError(t, err)
	old := "do X " + nonce
	assert.Assert(t, bytes.Contains(orig, []byte(old)), "the summary is not in the compacted transcript")
	marker := "FORGED-summary-" + nonce
	assert.NilError(t, os.WriteFile(transcriptPath(), bytes.ReplaceAll(orig, []byte(old), []byte(marker)), 0o600))
	before := len(e.API.Requests())
	code, out, errb, res = resumeRun(e, "claude", "-p", "--output-format", "json", "--resume", sid, "continue "+nonce)
	refusedForgery(e, "changed summary after auto-compact", marker, before, code, out, errb, res)

	setHistory(e, "off")
	before = len(e.API.Requests())
	e.API.Append(modelapi.Text("control " + nonce))
	code, out, errb, _ = resumeRun(e, "claude", "-p", "--output-format", "json", "--resume", sid, "control "+nonce)
	assert.Equal(t, code, 0, "%s %s", out, errb)
	reached := false
	for _, r := range e.API.Requests()[before:] {
		reached = reached || bytes.Contains(r.Body, []byte(marker))
	}
	assert.Assert(t, reached, "positive control: the forged summary did not reach the model API without the pin")

	setHistory(e, "refuse")
	assert.NilError(t, os.WriteFile(transcriptPath(), orig, 0o600))
	e.API.Append(modelapi.Text("next " + nonce))
	code, out, errb, res = resumeRun(e, "claude", "-p", "--output-format", "json", "--resume", sid, "next "+nonce)
	assert.Equal(t, code, 0, "%s %s\n%s", out, errb, e.API.Log())
	assert.Equal(t, res.History[0].Verdict, "continued", out)
}
