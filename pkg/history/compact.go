package history

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"slices"
	"strings"

	"github.com/shrooms-cage/shrooms/internal/lazyre"
)

// Compaction (Claude Code's /compact and auto-compact) replaces a history
// with a summary the model wrote. The gateway accepts the new history only
// when it is derived, as Claude Code 2.1.332 derives it, from a compaction
// request that extended the pinned history and from the summary the
// gateway itself passed back (measured through the gateway against the
// scripted API, test/agents TestHistoryCompaction; the texts below are the
// captured request's and the binary's):
//
//   - the compaction request is the pinned history up to some message k,
//     its last (user) message with one text block appended: the
//     compaction instruction (compactInstruction opens it);
//   - the first request after it is [the summary wrapper] + empty system
//     messages + the pinned messages after k, verbatim (the harness keeps
//     the newest messages) + new content. The wrapper is one user text:
//     compactLead, an optional reminder naming the tools the summarized
//     history called, the summary as Claude Code formats the answer
//     (formatSummary), the transcript's path, compactContinue and an
//     optional compactKept.
//
// Anything else — a changed summary, a tool name the history never
// called, a path elsewhere, an extra message — is a mismatch.

// compactInstruction opens the text block Claude Code 2.1.332 appends to a
// compaction request.
const compactInstruction = "CRITICAL: Respond with TEXT ONLY. Do NOT call any tools.\n"

// The wrapper texts of Claude Code 2.1.332's compacted history.
const (
	compactLead     = "This session is being continued from a previous conversation that ran out of context. The summary below covers the earlier portion of the conversation.\n\n"
	compactToolsPre = "<system-reminder>\n<tools-used-before-summary>"
	compactToolsEnd = "</tools-used-before-summary>\n</system-reminder>\n"
	compactPath     = "\n\nIf you need specific details from before compaction (like exact code snippets, error messages, or content you generated), read the full transcript at: "
	compactContinue = "\nContinue the conversation from where it left off without asking the user any further questions. Resume directly \u2014 do not acknowledge the summary, do not recap what was happening, do not preface with \"I'll continue\" or similar. Pick up the last task as if the break never happened."
	compactKept     = "\n\nThe messages after this summary are the most recent messages from before compaction, kept verbatim. The summary was written without seeing them, so something it says has not happened yet may already have happened in them."
	// compactUnreadable stands in the tools line for a name Claude Code
	// will not print (its own check: ^[A-Za-z0-9_.:-]{1,256}$).
	compactUnreadable = "unreadable-tools-used-before-summary"
)

// compactTranscript is the path the wrapper names: the session's own
// transcript under a .claude/projects directory (its id is the file name).
var compactTranscript = lazyre.New(`^/[A-Za-z0-9._/-]{0,512}/\.claude/projects/[A-Za-z0-9._-]{1,255}/([0-9A-Za-z-]{1,128})\.jsonl$`)

// emptySystem reports whether a message is a system message Claude Code
// 2.1.332 puts after the wrapper (measured:
// {"role":"system","content":[],"output_config":{"effort":"medium"}} after
// /compact, and {"role":"system","content":"Today's date is 2026-12-06.",
// "output_config":{"effort":"medium"}} after auto-compact): no content or
// the date, at most the turn's effort setting. It carries nothing else.
func emptySystem(raw []byte) bool {
	var m map[string]json.RawMessage
	if json.Unmarshal(raw, &m) != nil || string(m["role"]) != `"system"` {
		return false
	}
	var content []json.RawMessage
	var date string
	switch {
	case json.Unmarshal(m["content"], &date) == nil:
		if !todaysDate().MatchString(date) {
			return false
		}
	case json.Unmarshal(m["content"], &content) != nil || content == nil || len(content) != 0:
		return false
	}
	for k, v := range m {
		switch k {
		case "role", "content":
		case "output_config":
			var oc map[string]string
			if json.Unmarshal(v, &oc) != nil || len(oc) != 1 || !effortLevel().MatchString(oc["effort"]) {
				return false
			}
		default:
			return false
		}
	}
	return true
}

var todaysDate = lazyre.New(`^Today's date is [0-9]{4}-[0-9]{2}-[0-9]{2}\.$`)

var effortLevel = lazyre.New(`^[a-z]{1,16}$`)

// compaction is a summary the gateway passed back for a compaction
// request, and what the compacted history must keep.
type compaction struct {
	summary Digest    // SHA-256 of the summary as formatSummary makes it
	tools   []string  // tool names the summarized history called
	tail    []Message // the pinned messages after the summarized ones
	// context are the digests of the <system-reminder> text blocks that
	// open the summarized history's first message (the harness's context,
	// trailing newlines trimmed): auto-compact puts them again before the
	// wrapper.
	context []Digest
	// opencode says the summary is opencode's (ocCompacted checks the
	// history after it; summary is the SHA-256 of the answer's text).
	opencode bool
}

// compactRequest is a recognised compaction request: the tool names its
// history called and the pinned messages it left out (the tail the
// compacted history keeps).
type compactRequest struct {
	tools   []string
	tail    []Message
	context []Digest
	ref     []Message // the reference history it was checked against
}

// compactionRequest recognises a compaction request derived from the
// session's reference history: its last message is a user message whose
// last block is the compaction instruction, and without that block it is
// the reference history up to some message (or the reference history
// with new content). It returns nil when the request is not one.
func (s *session) compactionRequest(msgs []Message, elems [][]byte, last *canonical) *compactRequest {
	n := len(msgs)
	if !s.pinned || n == 0 || msgs[n-1].Role != "user" || last.index != n-1 {
		return nil
	}
	stripped, ok := withoutInstruction(last)
	if !ok {
		return nil
	}
	base := slices.Clone(msgs[:n-1])
	if stripped != nil {
		base = append(base, *stripped)
	}
	if len(base) == 0 {
		return nil
	}
	req := &compactRequest{tools: toolNames(elems), context: contextBlocks(elems[0]), ref: s.ref}
	switch k := firstDiff(s.ref, base); {
	case k == len(base) && k <= len(s.ref):
		req.tail = slices.Clone(s.ref[k:])
	case k == len(s.ref):
		if newContent(s.id, base, k) != nil {
			return nil
		}
	default:
		return nil
	}
	return req
}

// withoutInstruction returns a compaction request's last message without
// its trailing instruction block (nil when nothing else is left), and
// whether it carried one.
func withoutInstruction(last *canonical) (*Message, bool) {
	role, c, err := last.form()
	if err != nil || role != "user" {
		return nil, false
	}
	// The canonical form of a text block {"type":"text","text":T} is
	// {"text":<T as encoding/json writes it>,"type":"text"}, and a string's
	// encoding starts with its prefix's: a message without these bytes
	// has no instruction block (and most are not parsed again).
	instr, _ := json.Marshal(compactInstruction)
	if !bytes.Contains(c, append([]byte(`{"text":`), instr[:len(instr)-1]...)) {
		return nil, false
	}
	dec := json.NewDecoder(bytes.NewReader(c))
	dec.UseNumber()
	v, err := decodeStrict(dec)
	if err != nil {
		return nil, false
	}
	m, _ := v.(map[string]any)
	blocks, _ := m["content"].([]any)
	if len(blocks) == 0 {
		return nil, false
	}
	blk, _ := blocks[len(blocks)-1].(map[string]any)
	text, _ := blk["text"].(string)
	if blk["type"] != "text" || len(blk) != 2 || !strings.HasPrefix(text, compactInstruction) {
		return nil, false
	}
	if len(blocks) == 1 {
		return nil, true
	}
	m["content"] = blocks[:len(blocks)-1]
	var b bytes.Buffer
	if err := encode(&b, m); err != nil {
		return nil, false
	}
	return &Message{Role: role, Digest: sha256.Sum256(b.Bytes())}, true
}

// toolNames returns the names of the tools the assistant messages of a
// request called, each once.
func toolNames(elems [][]byte) []string {
	var names []string
	for _, e := range elems {
		var m struct {
			Role    string          `json:"role"`
			Content json.RawMessage `json:"content"`
		}
		if json.Unmarshal(e, &m) != nil || m.Role != "assistant" {
			continue
		}
		var blocks []struct {
			Type string `json:"type"`
			Name string `json:"name"`
		}
		if json.Unmarshal(m.Content, &blocks) != nil {
			continue
		}
		for _, b := range blocks {
			if b.Type == "tool_use" && b.Name != "" && !slices.Contains(names, b.Name) {
				names = append(names, b.Name)
			}
		}
	}
	return names
}

// summaryText returns the text of a compaction answer: exactly one text
// block and no tool call (thinking may precede it).
func summaryText(answer []byte) (string, bool) {
	var m struct {
		Content []map[string]any `json:"content"`
	}
	if json.Unmarshal(answer, &m) != nil {
		return "", false
	}
	text, found := "", false
	for _, b := range m.Content {
		switch b["type"] {
		case "text":
			if found {
				return "", false
			}
			text, found = b["text"].(string)
			if !found {
				return "", false
			}
		case "thinking", "redacted_thinking":
		default:
			return "", false
		}
	}
	return text, found
}

var (
	analysisBlock = lazyre.New(`<analysis>[\s\S]*?</analysis>`)
	summaryBlock  = lazyre.New(`<summary>([\s\S]*?)</summary>`)
	blankLines    = lazyre.New(`\n\n+`)
)

// formatSummary formats a compaction answer as Claude Code 2.1.332 puts it
// in the wrapper: the first <analysis> block dropped, the first <summary>
// block replaced by "Summary:\n" and its trimmed text, runs of blank lines
// made one, the whole trimmed (measured: test/agents
// TestHistoryCompaction's summaries, and unit cases in compact_test.go).
func formatSummary(s string) string {
	if loc := analysisBlock().FindStringIndex(s); loc != nil {
		s = s[:loc[0]] + s[loc[1]:]
	}
	if loc := summaryBlock().FindStringSubmatchIndex(s); loc != nil {
		s = s[:loc[0]] + "Summary:\n" + jsTrim(s[loc[2]:loc[3]]) + s[loc[1]:]
	}
	s = blankLines().ReplaceAllString(s, "\n\n")
	return jsTrim(s)
}

// jsTrim is JavaScript's String.prototype.trim: white space and line
// terminators as ECMAScript names them (strings.TrimSpace differs: U+FEFF,
// U+0085).
func jsTrim(s string) string {
	return strings.TrimFunc(s, func(r rune) bool {
		switch r {
		case '\t', '\n', '\v', '\f', '\r', ' ', 0xa0, 0x1680, 0x2028, 0x2029, 0x202f, 0x205f, 0x3000, 0xfeff:
			return true
		}
		return r >= 0x2000 && r <= 0x200a
	})
}

// compacted reports whether msgs is the compacted history the session's
// recorded compaction allows: one user message of text blocks — the
// harness's context blocks the summarized history opened with (auto-
// compact puts them again), then the wrapper of its summary —, the
// harness's system messages, the kept tail verbatim, then new content.
func (s *session) compacted(msgs []Message, elems [][]byte) bool {
	c := s.compaction
	if c != nil && c.opencode {
		return s.ocCompacted(msgs, elems)
	}
	if c == nil || len(msgs) == 0 || msgs[0].Role != "user" {
		return false
	}
	texts, ok := textBlocks(elems[0])
	if !ok || len(texts) == 0 || !c.wrapper(texts[len(texts)-1], strings.TrimPrefix(s.id, "claude:")) {
		return false
	}
	for _, text := range texts[:len(texts)-1] {
		if !slices.Contains(c.context, sha256.Sum256([]byte(strings.TrimRight(text, "\n")))) {
			return false
		}
	}
	i := 1
	for i < len(msgs) && msgs[i].Role == "system" && emptySystem(elems[i]) {
		i++
	}
	if len(msgs)-i < len(c.tail) || firstDiff(c.tail, msgs[i:]) != len(c.tail) {
		return false
	}
	return newContent(s.id, msgs, i+len(c.tail)) == nil
}

// contextBlocks returns the digests of the <system-reminder> text blocks
// that open a history's first message, trailing newlines trimmed.
func contextBlocks(first []byte) []Digest {
	var m struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	}
	if json.Unmarshal(first, &m) != nil || m.Role != "user" {
		return nil
	}
	texts, _ := textBlocks(first)
	var out []Digest
	for _, t := range texts {
		if !strings.HasPrefix(t, "<system-reminder>\n") {
			break
		}
		out = append(out, sha256.Sum256([]byte(strings.TrimRight(t, "\n"))))
	}
	return out
}

// wrapper reports whether text is Claude Code's wrapper of the recorded
// summary for the session whose transcript is named sid.
func (c *compaction) wrapper(text, sid string) bool {
	rest, ok := strings.CutPrefix(text, compactLead)
	if !ok {
		return false
	}
	if r, ok := strings.CutPrefix(rest, compactToolsPre); ok {
		end := strings.Index(r, compactToolsEnd)
		if end < 0 {
			return false
		}
		for _, name := range strings.Split(r[:end], ", ") {
			if name != compactUnreadable && !slices.Contains(c.tools, name) {
				return false
			}
		}
		rest = r[end+len(compactToolsEnd):]
	}
	rest = strings.TrimSuffix(rest, compactKept)
	rest, ok = strings.CutSuffix(rest, compactContinue)
	if !ok {
		return false
	}
	at := strings.LastIndex(rest, compactPath)
	if at < 0 {
		return false
	}
	m := compactTranscript().FindStringSubmatch(rest[at+len(compactPath):])
	if m == nil || m[1] != sid || strings.Contains(m[0]+"/", "/../") || strings.Contains(m[0], "/./") || strings.Contains(m[0], "//") {
		return false
	}
	return sha256.Sum256([]byte(rest[:at])) == c.summary
}

// textBlocks returns the texts of a message whose canonical content is
// text blocks only (no other key in a block, no other key but role and
// content in the message).
func textBlocks(raw []byte) ([]string, bool) {
	_, c, err := Canonical(raw)
	if err != nil {
		return nil, false
	}
	var m map[string]json.RawMessage
	if json.Unmarshal(c, &m) != nil || len(m) != 2 {
		return nil, false
	}
	var blocks []map[string]any
	if json.Unmarshal(m["content"], &blocks) != nil {
		return nil, false
	}
	out := make([]string, len(blocks))
	for i, b := range blocks {
		text, ok := b["text"].(string)
		if len(b) != 2 || b["type"] != "text" || !ok {
			return nil, false
		}
		out[i] = text
	}
	return out, true
}
