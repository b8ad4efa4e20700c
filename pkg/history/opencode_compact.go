package history

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"io"
	"slices"
	"strings"
	"unicode/utf16"

	"github.com/shrooms-cage/shrooms/internal/lazyre"
)

// opencode 1.18.33 compacts a session by itself inside `opencode run` when
// the last answer's reported usage reaches the model's window
// (SessionCompaction.isOverflow). Measured through the gateway against the
// scripted API (captures in testdata/compact/opencode-autocompact-*.json,
// test/agents TestHistoryOpencodeAutoCompact) and read in the binary's
// bundle (SessionCompaction.process and its serializer):
//
//   - the compaction request offers no tools and holds one user message
//     of one text: ocLead, the head of the conversation rendered as text
//     (one entry per message joined by a blank line; a user message as
//     "[User]: " and its text parts joined by newlines; an assistant
//     message's parts joined by newlines: "[Assistant]: t",
//     "[Assistant reasoning]: t", "[Assistant tool call]:
//     name(JSON.stringify(input))" then "[Tool result]: output", the output
//     cut at 2,000 UTF-16 units and "\n[truncated]" added), ocTail and
//     ocInstruction;
//   - the history after it is [user ocAsk, assistant <the summary>, user
//     ocContinue].
//
// The gateway accepts the compaction request only when its rendered text
// is the pinned history rendered so, followed by the pinned answer's own
// tool calls with their results (the only new content: the tool outputs
// the agent produced after the answer, which no pinned request held). It
// renders from the raw messages it forwarded in this turn (kept in
// memory), so a compaction that opens a resumed turn is refused. Anything
// it does not render exactly — an attachment, a tool error, a reasoning
// block without its text, a number JavaScript would print otherwise, a
// kept tail, a prior summary — is a mismatch.
const (
	ocLead     = "Here is the conversation so far:\n\n<conversation>\n"
	ocTail     = "\n</conversation>\n\n"
	ocAsk      = "What did we do so far?"
	ocContinue = "Continue if you have next steps, or stop and ask for clarification if you are unsure how to proceed."
	// ocOutputMax is opencode's TOOL_OUTPUT_MAX_CHARS for the rendering.
	ocOutputMax = 2000
)

const ocInstruction = "Create a new anchored summary from the conversation history in the <conversation> tags above so another coding agent can continue the work.\n\nOutput exactly the Markdown structure shown inside <template> and keep the section order unchanged. Do not include the <template> tags in your response.\n<template>\n## Objective\n- [one or two brief sentences describing what the user is trying to accomplish]\n\n## Important Details\n- [constraints/preferences, decisions and why, important facts/assumptions, exact context needed to continue, or \"(none)\"]\n\n## Work State\n### Completed\n- [finished work, verified facts, or changes made; otherwise \"(none)\"]\n\n### Active\n- [current work, partial changes, or investigation state; otherwise \"(none)\"]\n\n### Blocked\n- [blockers, failing commands, or unknowns; otherwise \"(none)\"]\n\n## Next Move\n1. [immediate concrete action, or \"(none)\"]\n2. [next action if known, or \"(none)\"]\n\n## Relevant Files\n- [file or directory path: why it matters, or \"(none)\"]\n</template>\n\nRules:\n- Keep every section, even when empty.\n- Use terse bullets, not prose paragraphs.\n- Preserve exact file paths, symbols, commands, error strings, URLs, and identifiers when known.\n- Do not mention the summary process or that context was compacted."

// ocCompactionText returns the text of an opencode compaction request:
// exactly one user message of one text block that opens with ocLead.
func ocCompactionText(messages []byte) (string, bool) {
	if !bytes.Contains(messages, []byte("Here is the conversation so far:")) {
		return "", false
	}
	var elems []json.RawMessage
	if json.Unmarshal(messages, &elems) != nil || len(elems) != 1 {
		return "", false
	}
	role, _, err := Canonical(elems[0])
	if err != nil || role != "user" {
		return "", false
	}
	texts, ok := textBlocks(elems[0])
	if !ok || len(texts) != 1 || !strings.HasPrefix(texts[0], ocLead) {
		return "", false
	}
	return texts[0], true
}

// ocDerived reports whether text, an opencode compaction request's, is
// the session's pinned history (the last request forwarded in this turn
// and its answer) as opencode 1.18.33 renders it.
func (s *session) ocDerived(text string) bool {
	n := len(s.lastMsgs)
	if !s.pinned || !s.answered || s.answerRaw == nil || n == 0 || len(s.lastRaw) != n || len(s.ref) != n+1 {
		return false
	}
	if firstDiff(s.ref, s.lastMsgs) != n {
		return false
	}
	if m, err := Sum(s.answerRaw); err != nil || m != s.ref[n] {
		return false
	}
	body, ok := strings.CutPrefix(text, ocLead)
	if !ok {
		return false
	}
	body, ok = strings.CutSuffix(body, ocTail+ocInstruction)
	if !ok {
		return false
	}
	results := map[string]string{}
	for _, raw := range s.lastRaw {
		if !ocToolResults(raw, results) {
			return false
		}
	}
	var entries []string
	for _, raw := range s.lastRaw {
		parts, ok := ocRender(raw, results, false)
		if !ok {
			return false
		}
		if e := ocJoin(parts); e != "" {
			entries = append(entries, e)
		}
	}
	prefix := strings.Join(entries, "\n\n")
	parts, ok := ocRender(s.answerRaw, nil, true)
	if !ok || len(parts) == 0 {
		return false
	}
	if prefix != "" {
		prefix += "\n\n"
	}
	rest, ok := strings.CutPrefix(body, prefix)
	if !ok {
		return false
	}
	return ocMatch(rest, parts)
}

// ocPart is one rendered part of an assistant message; result is set for
// a tool call whose result is new content (any text).
type ocPart struct {
	text   string
	result bool
}

func ocJoin(parts []ocPart) string {
	var out []string
	for _, p := range parts {
		out = append(out, p.text)
	}
	return strings.Join(out, "\n")
}

// ocMatch matches rest against the answer's parts, each tool call's
// result any text up to the next part (or the end).
func ocMatch(rest string, parts []ocPart) bool {
	for i, p := range parts {
		if i > 0 {
			var ok bool
			if rest, ok = strings.CutPrefix(rest, "\n"); !ok {
				return false
			}
		}
		var ok bool
		if rest, ok = strings.CutPrefix(rest, p.text); !ok {
			return false
		}
		if !p.result {
			continue
		}
		if rest, ok = strings.CutPrefix(rest, "\n[Tool result]: "); !ok {
			return false
		}
		if i == len(parts)-1 {
			return true
		}
		next := strings.Index(rest, "\n"+parts[i+1].text)
		if next < 0 {
			return false
		}
		rest = rest[next:]
	}
	return rest == ""
}

// ocBlocks returns a message's role and content blocks (a string content
// as one text block), each block's keys checked by the caller.
func ocBlocks(raw []byte) (string, []map[string]json.RawMessage, bool) {
	var m map[string]json.RawMessage
	if json.Unmarshal(raw, &m) != nil {
		return "", nil, false
	}
	for k := range m {
		if k != "role" && k != "content" {
			return "", nil, false
		}
	}
	var role string
	if json.Unmarshal(m["role"], &role) != nil {
		return "", nil, false
	}
	var s string
	if json.Unmarshal(m["content"], &s) == nil {
		t, _ := json.Marshal(s)
		return role, []map[string]json.RawMessage{{"type": json.RawMessage(`"text"`), "text": t}}, true
	}
	var blocks []map[string]json.RawMessage
	if json.Unmarshal(m["content"], &blocks) != nil {
		return "", nil, false
	}
	return role, blocks, true
}

// ocKeys reports whether a block has only the keys named (cache_control
// always allowed) and the ones it must.
func ocKeys(b map[string]json.RawMessage, keys ...string) bool {
	for k := range b {
		if k != "cache_control" && !contains(keys, k) {
			return false
		}
	}
	return true
}

func contains(keys []string, k string) bool {
	for _, x := range keys {
		if x == k {
			return true
		}
	}
	return false
}

func ocString(v json.RawMessage) (string, bool) {
	var s string
	if v == nil || json.Unmarshal(v, &s) != nil || strings.ContainsRune(s, '\uFFFD') {
		return "", false
	}
	return s, true
}

// ocToolResults collects a user message's tool results by call id.
func ocToolResults(raw []byte, results map[string]string) bool {
	role, blocks, ok := ocBlocks(raw)
	if !ok {
		return false
	}
	if role != "user" {
		return true
	}
	for _, b := range blocks {
		if string(b["type"]) != `"tool_result"` {
			continue
		}
		if !ocKeys(b, "type", "tool_use_id", "content", "is_error") {
			return false
		}
		if e, ok := b["is_error"]; ok && string(e) != "false" {
			return false
		}
		id, ok := ocString(b["tool_use_id"])
		if !ok {
			return false
		}
		out, ok := ocString(b["content"])
		if !ok {
			var inner []map[string]json.RawMessage
			if json.Unmarshal(b["content"], &inner) != nil || len(inner) != 1 || string(inner[0]["type"]) != `"text"` || !ocKeys(inner[0], "type", "text") {
				return false
			}
			if out, ok = ocString(inner[0]["text"]); !ok {
				return false
			}
		}
		if _, dup := results[id]; dup {
			return false
		}
		results[id] = out
	}
	return true
}

// ocRender renders one message's parts as opencode does. A user message
// of tool results renders nothing (they belong to the assistant message
// that called them); answer says the message is the pinned answer, whose
// tool results are new content.
func ocRender(raw []byte, results map[string]string, answer bool) ([]ocPart, bool) {
	role, blocks, ok := ocBlocks(raw)
	if !ok {
		return nil, false
	}
	switch role {
	case "user":
		if answer {
			return nil, false
		}
		var texts []string
		kinds := 0
		for _, b := range blocks {
			switch string(b["type"]) {
			case `"text"`:
				t, ok := ocString(b["text"])
				if !ok || !ocKeys(b, "type", "text") {
					return nil, false
				}
				if t != "" {
					texts = append(texts, t)
				}
				kinds |= 1
			case `"tool_result"`:
				kinds |= 2
			default:
				return nil, false
			}
		}
		if kinds == 3 {
			return nil, false // mixed: not a form measured
		}
		if len(texts) == 0 {
			return nil, true
		}
		return []ocPart{{text: "[User]: " + strings.Join(texts, "\n")}}, true
	case "assistant":
		var parts []ocPart
		for _, b := range blocks {
			switch string(b["type"]) {
			case `"text"`:
				t, ok := ocString(b["text"])
				if !ok || !ocKeys(b, "type", "text") {
					return nil, false
				}
				if t != "" {
					parts = append(parts, ocPart{text: "[Assistant]: " + t})
				}
			case `"thinking"`:
				t, ok := ocString(b["thinking"])
				if !ok || !ocKeys(b, "type", "thinking", "signature") {
					return nil, false
				}
				if t != "" {
					parts = append(parts, ocPart{text: "[Assistant reasoning]: " + t})
				}
			case `"tool_use"`:
				if !ocKeys(b, "type", "id", "name", "input") {
					return nil, false
				}
				id, ok1 := ocString(b["id"])
				name, ok2 := ocString(b["name"])
				input, err := jsStringify(b["input"])
				if !ok1 || !ok2 || err != nil {
					return nil, false
				}
				call := "[Assistant tool call]: " + name + "(" + input + ")"
				if answer {
					parts = append(parts, ocPart{text: call, result: true})
					continue
				}
				out, ok := results[id]
				if !ok {
					return nil, false
				}
				out, ok = jsTruncate(out, ocOutputMax)
				if !ok {
					return nil, false
				}
				parts = append(parts, ocPart{text: call + "\n[Tool result]: " + out})
			default:
				return nil, false
			}
		}
		return parts, true
	}
	return nil, false
}

// jsTruncate is opencode's cut of a tool output: at most n UTF-16 units,
// then "\n[truncated]"; a cut inside a surrogate pair is refused.
func jsTruncate(s string, n int) (string, bool) {
	u := utf16.Encode([]rune(s))
	if len(u) <= n {
		return s, true
	}
	if utf16.IsSurrogate(rune(u[n-1])) && u[n-1] < 0xdc00 {
		return "", false
	}
	return string(utf16.Decode(u[:n])) + "\n[truncated]", true
}

var jsSafeInt = lazyre.New(`^(0|-?[1-9][0-9]{0,14})$`)
var jsIndexKey = lazyre.New(`^(0|[1-9][0-9]*)$`)

// jsStringify is JavaScript's JSON.stringify of a parsed JSON value, keys
// in their order. What it cannot be sure to print as JavaScript does (a
// non-integer or large number, an array-index key JavaScript would move
// first, a key given twice, an unpaired surrogate) is an error.
func jsStringify(raw json.RawMessage) (string, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var b strings.Builder
	if err := jsValue(dec, &b); err != nil {
		return "", err
	}
	if _, err := dec.Token(); err != io.EOF {
		return "", errors.New("trailing data")
	}
	return b.String(), nil
}

var errJS = errors.New("a value opencode's rendering is not measured for")

func jsValue(dec *json.Decoder, b *strings.Builder) error {
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	switch v := tok.(type) {
	case json.Delim:
		switch v {
		case '{':
			b.WriteByte('{')
			seen := map[string]bool{}
			for i := 0; dec.More(); i++ {
				kt, err := dec.Token()
				if err != nil {
					return err
				}
				k, _ := kt.(string)
				if seen[k] || jsIndexKey().MatchString(k) || strings.ContainsRune(k, '\uFFFD') {
					return errJS
				}
				seen[k] = true
				if i > 0 {
					b.WriteByte(',')
				}
				jsQuote(b, k)
				b.WriteByte(':')
				if err := jsValue(dec, b); err != nil {
					return err
				}
			}
			b.WriteByte('}')
		case '[':
			b.WriteByte('[')
			for i := 0; dec.More(); i++ {
				if i > 0 {
					b.WriteByte(',')
				}
				if err := jsValue(dec, b); err != nil {
					return err
				}
			}
			b.WriteByte(']')
		}
		_, err := dec.Token() // the closing delimiter
		return err
	case string:
		if strings.ContainsRune(v, '\uFFFD') {
			return errJS
		}
		jsQuote(b, v)
	case json.Number:
		if !jsSafeInt().MatchString(string(v)) {
			return errJS
		}
		b.WriteString(string(v))
	case bool:
		if v {
			b.WriteString("true")
		} else {
			b.WriteString("false")
		}
	case nil:
		b.WriteString("null")
	}
	return nil
}

// jsQuote writes s as JSON.stringify quotes a string.
func jsQuote(b *strings.Builder, s string) {
	const hex = "0123456789abcdef"
	b.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		case '\b':
			b.WriteString(`\b`)
		case '\f':
			b.WriteString(`\f`)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case '\t':
			b.WriteString(`\t`)
		default:
			if r < 0x20 {
				b.WriteString(`\u00`)
				b.WriteByte(hex[r>>4])
				b.WriteByte(hex[r&0xf])
			} else {
				b.WriteRune(r)
			}
		}
	}
	b.WriteByte('"')
}

// ocCompacted reports whether msgs is exactly the history opencode makes
// after the recorded compaction: [user ocAsk, assistant <the summary>,
// user ocContinue].
func (s *session) ocCompacted(msgs []Message, elems [][]byte) bool {
	c := s.compaction
	if c == nil || !c.opencode || len(msgs) != 3 || msgs[0].Role != "user" || msgs[1].Role != "assistant" || msgs[2].Role != "user" {
		return false
	}
	ask, ok1 := textBlocks(elems[0])
	sum, ok2 := textBlocks(elems[1])
	cont, ok3 := textBlocks(elems[2])
	if !ok1 || !ok2 || !ok3 || len(ask) != 1 || len(sum) != 1 || len(cont) != 1 {
		return false
	}
	return ask[0] == ocAsk && cont[0] == ocContinue && sha256.Sum256([]byte(sum[0])) == c.summary
}

// ocCheck checks an opencode compaction request of session. Derived from
// the pin, it is forwarded and its answer recorded as the summary (Done);
// otherwise it is a mismatch (forwarded only under Report, unrecorded).
func (t *Tracker) ocCheck(sessionID, text string) (*Exchange, error) {
	if !validSession(sessionID) {
		return nil, &Mismatch{Session: printable(sessionID), Index: 0, Role: "-", Why: "the session id is not one the gateway can pin"}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	s, err := t.session(sessionID)
	if err != nil {
		return nil, err
	}
	if s.ocDerived(text) {
		if s.verdict == "" {
			s.verdict = VerdictContinued
		}
		return &Exchange{t: t, s: s, tracked: true, ocCompact: s.ref}, nil
	}
	mm := &Mismatch{Session: sessionID, Index: 0, Role: "user", Why: "an opencode compaction request whose conversation is not the pinned history as opencode renders it"}
	s.verdict, s.index, s.role = VerdictMismatch, mm.Index, mm.Role
	if t.mode != Report {
		return nil, mm
	}
	return &Exchange{t: t}, mm
}

// ocDone records an opencode compaction's summary: one text block and
// nothing else, its text as opencode puts it back in the next history.
func (ex *Exchange) ocDone(answer []byte) error {
	var m struct {
		Content []map[string]json.RawMessage `json:"content"`
	}
	if json.Unmarshal(answer, &m) != nil || len(m.Content) != 1 || string(m.Content[0]["type"]) != `"text"` {
		return nil // not a summary opencode's form is measured for
	}
	text, ok := ocString(m.Content[0]["text"])
	if !ok {
		return nil
	}
	t := ex.t
	t.mu.Lock()
	defer t.mu.Unlock()
	s := ex.s
	if !slices.Equal(s.ref, ex.ocCompact) {
		return nil // the session moved on meanwhile
	}
	s.compaction = &compaction{summary: sha256.Sum256([]byte(text)), opencode: true}
	if s.verdict != VerdictMismatch {
		s.verdict = VerdictCompacted
	}
	return s.store.save(s.pin())
}
