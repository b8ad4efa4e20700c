package profile

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
)

// Claude Code's transcripts (projects/<p>/<session>.jsonl and subagent
// transcripts) and ~/.claude/history.jsonl are rebuilt record by record,
// never carried: a transcript line is either a conversation record (what the
// model saw) or a state record that `claude --resume` restores (the
// session's worktree to chdir into, its permission mode, agent, relocated
// cwd, ...). Only conversation records are kept, from a field allowlist,
// with every cwd pinned to the cage's worktree; state records, records of
// an unknown type and lines that do not parse are dropped and counted by
// type (never by value). The record types are Claude Code 2.1.332's, read
// from its transcript loader (docs/kept-state.md has the table).

// cageWork is the cage's worktree: every kept path is pinned to it.
const cageWork = "/work"

// ccMessageTypes are the conversation record types the loader chains by
// uuid/parentUuid (its transcript-message set), plus summary.
var ccMessageTypes = map[string]bool{"user": true, "assistant": true, "system": true, "attachment": true, "summary": true}

// ccStateTypes are the other record types Claude Code 2.1.332 writes or
// restores; they are dropped and reported by name. Any type not here or in
// ccMessageTypes is reported as unknown.
var ccStateTypes = map[string]bool{
	"progress": true, "file-history-snapshot": true, "file-history-delta": true, "last-prompt": true,
	"continued-in": true, "resume-head-vouch": true, "content-replacement": true, "data-flow-records": true,
	"data-flow-incomplete": true, "derived-from": true, "api-request-shape": true, "api-request-blob": true,
	"api-request": true, "api-request-resumed": true, "fork-context-ref": true, "frame-link": true,
	"custom-title": true, "ended-by-model": true, "ai-title": true, "tag": true, "relocated": true,
	"agent-name": true, "agent-color": true, "agent-setting": true, "pr-link": true,
	"artifact-comment-monitor": true, "artifact-autoreact-ledger": true, "bridge-session": true,
	"history-suppression": true, "attribution-snapshot": true, "mode": true, "permission-mode": true,
	"isolation-latch": true, "session-owner": true, "dev-mods": true, "memory-mode": true, "atis-latch": true,
	"tools-used": true, "worktree-state": true, "cost-state": true, "queue-operation": true,
	"observer-ref": true, "repl-mode": true, "hybrid-organization": true, "host-row": true,
}

// ccRecordFields are the fields a kept conversation record keeps. Left out
// on purpose: permissionMode (a user row's mode, which the resume path
// reads back), toolUseResult (tool metadata with paths; the model saw the
// tool_result in message), permissionDecision, sandboxed, wireToolInputs /
// wireIngestContext (wire overrides of the stored content), requestRef
// (points at api-request records, which are dropped).
var ccRecordFields = map[string]bool{
	"type": true, "subtype": true, "uuid": true, "parentUuid": true, "logicalParentUuid": true,
	"isSidechain": true, "sessionId": true, "timestamp": true, "message": true, "attachment": true,
	"rendered": true, "renderedRole": true, "renderedBesideToolResult": true, "content": true,
	"level": true, "isMeta": true, "isCompactSummary": true, "isVisibleInTranscriptOnly": true,
	"compactMetadata": true, "microcompactMetadata": true, "toolUseID": true,
	"sourceToolAssistantUUID": true, "sourceToolUseID": true, "promptId": true, "userType": true,
	"version": true, "gitBranch": true, "cwd": true, "agentId": true, "requestId": true,
	"entrypoint": true, "apiBlockIndex": true, "requestedModel": true, "madeBy": true, "effort": true,
	"perTurnEffort": true, "promptCacheRequested": true, "toolInputStreamMs": true,
	"turnPosition": true, "turnOrigin": true, "promptSource": true, "rowSource": true, "sentAtMs": true,
	"summary": true, "leafUuid": true, "error": true, "isApiErrorMessage": true, "slug": true,
	"thinkingMetadata": true, "durationMs": true, "preventContinuation": true,
}

// ccDroppedFields are fields known to be left out, reported by name; any
// other field is reported as "(other field)".
var ccDroppedFields = map[string]bool{
	"permissionMode": true, "toolUseResult": true, "permissionDecision": true, "sandboxed": true,
	"wireToolInputs": true, "wireIngestContext": true, "requestRef": true, "batchToolUses": true,
	"sentAsUuid": true, "dataFlowOn": true, "worktreeSession": true, "relocatedCwd": true,
}

// ccKeptAttachments are the attachment types kept: context the CLI
// rendered into the conversation (reminders, listings, file and memory
// contents, hook output), which a resume replays as history and does not
// act on. Any other attachment type is dropped.
var ccKeptAttachments = map[string]bool{
	"environment": true, "model": true, "date": true, "session_context": true, "language": true,
	"deferred_tools_delta": true, "agent_listing_delta": true, "skill_listing": true, "mcp_instructions_delta": true,
	"auto_mode": true, "auto_mode_exit": true, "remote_session_change": true, "critical_system_reminder": true,
	"todo_reminder": true, "task_reminder": true, "total_tokens_reminder": true, "token_usage": true,
	"output_limit_note": true, "max_turns_reached": true, "edited_text_file": true, "file": true,
	"changed_files": true, "nested_memory": true, "instructions": true, "output_style_instructions": true,
	"context_sections": true, "structured_output": true, "thinking_stripped": true, "advisor_stripped": true,
	"read_truncation_notice": true, "batching_reminder": true, "batching_reminder_sent": true,
	"secondary_reminder": true, "secondary_reminder_sent": true, "silent_turn_reminder": true,
	"progress_reminder_sent": true, "plugin_note": true, "first_week": true, "claude_app_notice": true,
	"dir_sync_notice": true, "tool_hosts_notice": true, "sandbox_instructions": true,
	"message_pdf_reads": true, "project_doc_reads": true, "workflow_size_guideline_change": true,
	"ultra_effort_enter": true, "ultra_effort_exit": true, "hook_success": true, "hook_additional_context": true,
	"hook_system_message": true, "hook_blocking_error": true, "hook_non_blocking_error": true,
	"hook_error_during_execution": true, "hook_stopped_continuation": true, "hook_cancelled": true,
	"hook_permission_decision": true, "async_hook_response": true, "agent_ask_notice": true,
	"tool_host_result_lines": true,
}

// ccDroppedAttachments are attachment types dropped and reported by name:
// the CLI's own record of what it sent (a system prompt and tool list
// snapshot the resume path reuses, render points, tool offers), and
// attachments that carry state a resume re-arms or a path it acts on
// (scheduled prompts, queued commands, skills to reload from a directory,
// the plan file, a teammate's mailbox, a fork's briefing).
var ccDroppedAttachments = map[string]bool{
	"prompt_snapshot": true, "prompt_render_point": true, "deferred_tools_record": true,
	"tool_offer_record": true, "whole_texts_withdrawn": true, "tool_results_cut": true,
	"credential_org": true, "session_cron_carry": true, "projects_thread_ask": true,
	"queued_command": true, "invoked_skills": true, "dynamic_skill": true, "plan_mode": true,
	"plan_mode_reentry": true, "plan_mode_exit": true, "plan_file_reference": true,
	"teammate_mailbox": true, "fork_briefing": true,
}

// lineDrops accumulates RowDrop counts (Item: a record type, a field or
// "(unparseable line)", never a value) in first-seen order.
type lineDrops struct {
	order []string
	by    map[string]*RowDrop
}

func (d *lineDrops) add(item, reason string) {
	if d.by == nil {
		d.by = map[string]*RowDrop{}
	}
	if x, ok := d.by[item]; ok {
		x.Rows++
		return
	}
	d.by[item] = &RowDrop{Item: item, Reason: reason, Rows: 1}
	d.order = append(d.order, item)
}

func (d *lineDrops) list() []RowDrop {
	out := make([]RowDrop, 0, len(d.order))
	for _, k := range d.order {
		out = append(out, *d.by[k])
	}
	return out
}

// LineFilter rebuilds one parsed JSONL record: it returns the record to
// write, or nil to drop it (having counted why in drops).
type LineFilter interface {
	record(rec map[string]json.RawMessage, drops *lineDrops) map[string]json.RawMessage
}

// RebuildLines reads a JSONL file from r and writes the records filter
// keeps to w, one per line, as it goes. Lines that are not a JSON object
// are dropped and counted. max bounds the bytes read.
func RebuildLines(ctx context.Context, r io.Reader, w io.Writer, max int64, f LineFilter) ([]RowDrop, error) {
	br := bufio.NewReaderSize(io.LimitReader(r, max+1), 1<<16)
	bw := bufio.NewWriterSize(w, 1<<16)
	var drops lineDrops
	var read int64
	for n := 0; ; n++ {
		if n%4096 == 0 {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
		}
		line, used, err := readLine(br, maxLine)
		read += used
		if read > max {
			return nil, fmt.Errorf("larger than %d bytes", max)
		}
		if line == nil && used > 0 {
			drops.add("(line over 64 MiB)", "longer than any record the pinned Claude Code writes")
		} else if len(bytes.TrimSpace(line)) > 0 {
			var rec map[string]json.RawMessage
			if json.Unmarshal(line, &rec) != nil || rec == nil {
				drops.add("(unparseable line)", "not a JSON object")
			} else if out := f.record(rec, &drops); out != nil {
				if _, werr := bw.Write(append(marshalSorted(out), '\n')); werr != nil {
					return nil, werr
				}
			}
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err
		}
	}
	return drops.list(), bw.Flush()
}

// maxLine bounds one JSONL line: the rebuild holds a line in memory.
const maxLine = 64 << 20

// readLine returns the next line of br (with its newline) and the bytes it
// consumed; a line longer than max is skipped without being held (nil
// line, n > 0).
func readLine(br *bufio.Reader, max int) ([]byte, int64, error) {
	var line []byte
	var n int64
	for {
		chunk, err := br.ReadSlice('\n')
		n += int64(len(chunk))
		if line != nil || n <= int64(max) {
			if n > int64(max) {
				line = nil
			} else {
				line = append(line, chunk...)
			}
		}
		if err != bufio.ErrBufferFull {
			if n > int64(max) {
				return nil, n, err
			}
			return line, n, err
		}
	}
}

// marshalSorted writes a record with its keys in sorted order. Its keys
// are allowlisted names (plain ASCII) and its values raw JSON taken from
// one input line, so neither needs escaping or compacting again.
func marshalSorted(rec map[string]json.RawMessage) []byte {
	var b bytes.Buffer
	b.WriteByte('{')
	for i, k := range slices.Sorted(maps.Keys(rec)) {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteByte('"')
		b.WriteString(k)
		b.WriteString(`":`)
		b.Write(bytes.TrimSpace(rec[k]))
	}
	b.WriteByte('}')
	return b.Bytes()
}

var pinnedWork = json.RawMessage(strconv.Quote(cageWork))

// transcriptFilter keeps a session transcript's conversation records. A
// dropped record that sat in the uuid chain is bypassed: its children are
// re-parented to its nearest kept ancestor, so --resume still finds one
// chain from the first message to the last. Claude Code appends a record
// after its parent, so one pass sees every dropped parent first.
type transcriptFilter struct {
	// parentOf maps a dropped record's uuid to its parentUuid (raw JSON:
	// a string or null).
	parentOf map[string]json.RawMessage
	// kept are the uuids of kept records: a dropped record reusing one
	// cannot unlink it from the chain.
	kept map[string]bool
}

func newTranscriptFilter() *transcriptFilter {
	return &transcriptFilter{parentOf: map[string]json.RawMessage{}, kept: map[string]bool{}}
}

func rawString(v json.RawMessage) (string, bool) {
	var s string
	if len(v) == 0 || v[0] != '"' || json.Unmarshal(v, &s) != nil {
		return "", false
	}
	return s, true
}

// dropInChain records a dropped record's place in the chain, if it had one.
func (t *transcriptFilter) dropInChain(rec map[string]json.RawMessage) {
	u, ok := rawString(rec["uuid"])
	if !ok || t.kept[u] {
		return
	}
	if p, ok := rec["parentUuid"]; ok {
		t.parentOf[u] = p
	} else {
		t.parentOf[u] = json.RawMessage("null")
	}
}

func (t *transcriptFilter) record(rec map[string]json.RawMessage, drops *lineDrops) map[string]json.RawMessage {
	typ, ok := rawString(rec["type"])
	switch {
	case !ok:
		drops.add("(record without a type)", "not a Claude Code transcript record")
		t.dropInChain(rec)
		return nil
	case ccStateTypes[typ]:
		drops.add("record type "+typ, "session state that --resume restores or acts on; only conversation records are kept")
		t.dropInChain(rec)
		return nil
	case !ccMessageTypes[typ]:
		drops.add("(record of an unknown type)", "not a conversation record of the pinned Claude Code")
		t.dropInChain(rec)
		return nil
	}
	if why := t.malformed(typ, rec); why != "" {
		drops.add("malformed "+typ+" record", why)
		t.dropInChain(rec)
		return nil
	}
	if typ == "attachment" {
		var a struct {
			Type string `json:"type"`
		}
		_ = json.Unmarshal(rec["attachment"], &a)
		switch {
		case ccDroppedAttachments[a.Type]:
			drops.add("attachment type "+a.Type, "the CLI's own bookkeeping, or state a resume re-arms; not conversation")
			t.dropInChain(rec)
			return nil
		case !ccKeptAttachments[a.Type]:
			drops.add("(attachment of an unknown type)", "not a conversation attachment of the pinned Claude Code")
			t.dropInChain(rec)
			return nil
		}
	}
	out := make(map[string]json.RawMessage, len(rec))
	for _, k := range slices.Sorted(maps.Keys(rec)) {
		v := rec[k]
		switch {
		case k == "cwd":
			if s, _ := rawString(v); s != cageWork {
				drops.add("field cwd (pinned to "+cageWork+")", "a path the next turn would start in")
			}
			out[k] = pinnedWork
		case ccRecordFields[k]:
			out[k] = v
		case ccDroppedFields[k]:
			drops.add("field "+k, "state or metadata a resume reads back; not conversation")
		default:
			drops.add("(other field)", "not on the allowlist of conversation record fields")
		}
	}
	for _, k := range []string{"parentUuid", "logicalParentUuid", "leafUuid"} {
		if v, ok := out[k]; ok && len(t.parentOf) > 0 {
			out[k] = t.resolve(v)
		}
	}
	if u, ok := rawString(out["uuid"]); ok {
		t.kept[u] = true
		delete(t.parentOf, u)
	}
	return out
}

// malformed says why a conversation record cannot be kept, or "".
func (t *transcriptFilter) malformed(typ string, rec map[string]json.RawMessage) string {
	if typ == "summary" {
		if _, ok := rawString(rec["summary"]); !ok {
			return "summary is not a string"
		}
		return ""
	}
	if u, ok := rawString(rec["uuid"]); !ok || u == "" {
		return "no uuid"
	}
	if p, ok := rec["parentUuid"]; ok && string(p) != "null" {
		if _, ok := rawString(p); !ok {
			return "parentUuid is not a string"
		}
	}
	if (typ == "user" || typ == "assistant") && !isRawObject(rec["message"]) {
		return "message is not an object"
	}
	if typ == "attachment" && !isRawObject(rec["attachment"]) {
		return "attachment is not an object"
	}
	return ""
}

func isRawObject(v json.RawMessage) bool {
	v = bytes.TrimSpace(v)
	return len(v) > 0 && v[0] == '{'
}

// resolve follows a uuid through dropped records to the nearest kept one
// (raw JSON: a string or null).
func (t *transcriptFilter) resolve(v json.RawMessage) json.RawMessage {
	for i := 0; i < len(t.parentOf)+1; i++ {
		u, ok := rawString(v)
		if !ok {
			return v
		}
		p, dropped := t.parentOf[u]
		if !dropped {
			return v
		}
		v = p
	}
	return json.RawMessage("null") // a cycle among dropped records
}

// historyFilter rebuilds ~/.claude/history.jsonl (the prompt history the
// interactive CLI offers on the up arrow): the prompt text, its time and
// session, with project pinned to the cage's worktree. pastedContents
// (pasted text and images, by reference) is dropped.
type historyFilter struct{}

func (historyFilter) record(rec map[string]json.RawMessage, drops *lineDrops) map[string]json.RawMessage {
	if _, ok := rawString(rec["display"]); !ok {
		drops.add("(record without a prompt)", "not a prompt history record")
		return nil
	}
	out := map[string]json.RawMessage{}
	for _, k := range slices.Sorted(maps.Keys(rec)) {
		v := rec[k]
		switch k {
		case "display":
			out[k] = v
		case "timestamp":
			if len(v) > 0 && (v[0] == '-' || '0' <= v[0] && v[0] <= '9') {
				out[k] = v
			} else {
				drops.add("field timestamp", "not a number")
			}
		case "sessionId":
			if s, ok := rawString(v); ok && isUUID(s) {
				out[k] = v
			} else {
				drops.add("field sessionId", "not a session id")
			}
		case "project":
			if s, _ := rawString(v); s != cageWork {
				drops.add("field project (pinned to "+cageWork+")", "a path")
			}
			out[k] = pinnedWork
		case "pastedContents":
			if string(v) != "{}" {
				drops.add("field pastedContents", "pasted content by reference; not kept")
			}
		default:
			drops.add("(other field)", "not on the allowlist of prompt history fields")
		}
	}
	return out
}
