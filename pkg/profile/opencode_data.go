package profile

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
	"sync"
)

// The JSON columns of the kept tables (message.data, part.data,
// session.revert) are checked row by row against opencode 1.18.33's
// message schema (packages/opencode MessageV2, read from the pinned
// binary): keys it does not know are dropped (its decoder ignores them),
// every directory pointer is pinned to /work, every URL it would fetch and
// every path or snapshot id it would act on is dropped, and a row that is
// not a JSON object of a known message role or part type is dropped. What
// stays is the conversation as the model saw it (tool inputs and outputs
// included): opencode replays it to the model and never runs, opens or
// fetches it. docs/kept-state.md lists every field and its treatment.

// messageKeys are the keys of a stored message per role. id and sessionID
// are columns, which opencode never writes into data: in data they could
// only make a row claim another message's identity.
var messageKeys = map[string][]string{
	"user": {"role", "time", "format", "summary", "agent", "model", "system", "tools"},
	"assistant": {"role", "time", "error", "parentID", "modelID", "providerID", "mode", "agent",
		"path", "summary", "cost", "tokens", "structured", "variant", "finish"},
}

// partKeys are the keys of a stored part per type. Types missing here
// (subtask, snapshot, patch, and any unknown one) drop the row: see
// droppedParts.
var partKeys = map[string][]string{
	"text":        {"text", "synthetic", "ignored", "time", "metadata"},
	"reasoning":   {"text", "metadata", "time"},
	"file":        {"mime", "filename", "url", "source"},
	"agent":       {"name", "source"},
	"compaction":  {"auto", "overflow", "tail_start_id"},
	"retry":       {"attempt", "error", "time"},
	"step-start":  {"snapshot"},
	"step-finish": {"reason", "snapshot", "cost", "tokens"},
	"tool":        {"callID", "tool", "state", "metadata"},
}

// droppedParts are the part types never kept, and why.
var droppedParts = map[string]string{
	"subtask":  "a subagent run (prompt, agent, command) the next prompt would start while it is pending",
	"patch":    "file paths and a snapshot id that revert acts on (the snapshot store is not kept)",
	"snapshot": "a snapshot id that revert acts on (the snapshot store is not kept)",
}

// snapshotID is a git object id, the only thing opencode's snapshot fields
// hold (anything else would reach git's command line).
var snapshotID = lazyRegexp(`^(?:[0-9a-f]{40}|[0-9a-f]{64})$`)

// lazyRegexp compiles expr on its first use, not at process start: a
// package-level regexp.MustCompile runs in every shrooms command's init,
// and counted repetitions cost a millisecond or more to compile. (The same
// as internal/lazyre, kept here so pkg/profile imports nothing of shrooms.)
func lazyRegexp(expr string) func() *regexp.Regexp {
	return sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(expr) })
}

var (
	messageID = lazyRegexp(`^msg_[0-9A-Za-z]{1,64}$`)
	partID    = lazyRegexp(`^prt_[0-9A-Za-z]{1,64}$`)
)

// tally counts rows per reported item, in first-seen order.
type tally struct {
	order []string
	by    map[string]*RowDrop
}

func (t *tally) add(item, reason string) {
	if t.by == nil {
		t.by = map[string]*RowDrop{}
	}
	if d, ok := t.by[item]; ok {
		d.Rows++
		return
	}
	t.by[item] = &RowDrop{Item: item, Rows: 1, Reason: reason}
	t.order = append(t.order, item)
}

func (t *tally) list() []RowDrop {
	var out []RowDrop
	for _, k := range t.order {
		out = append(out, *t.by[k])
	}
	return out
}

// pinOpencodeData rewrites the JSON columns of the copied tables in main
// (see above) and returns what it pinned and dropped. With only set, just
// the rows whose rowid is in the temp table only[table] (see copyRows).
func pinOpencodeData(ctx context.Context, c *sql.Conn, only map[string]string) ([]RowDrop, error) {
	var t tally
	where := func(table string) string {
		if only == nil {
			return ""
		}
		return ` AND rowid IN (SELECT r FROM temp."` + only[table] + `")`
	}
	if err := rewriteRows(ctx, c, "session", "revert", where("session"), func(v any, _ *tally) (any, bool) { return checkRevert(v, &t) }, &t); err != nil {
		return nil, err
	}
	if err := rewriteRows(ctx, c, "message", "data", where("message"), pinMessage, &t); err != nil {
		return nil, err
	}
	if err := rewriteRows(ctx, c, "part", "data", where("part"), pinPart, &t); err != nil {
		return nil, err
	}
	// Parts of a dropped message would be orphans opencode never loads.
	// Updating in place (only set), a part can only lose its message
	// when the part is new or changed or its message was deleted or
	// changed (temp.gone_msg): trusted.db had no orphans.
	sweep := ""
	if only != nil {
		sweep = ` AND (rowid IN (SELECT r FROM temp."` + only["part"] + `") OR message_id IN (SELECT id FROM temp.gone_msg))`
	}
	res, err := c.ExecContext(ctx, `DELETE FROM main."part" WHERE message_id NOT IN (SELECT id FROM main."message")`+sweep)
	if err != nil {
		return nil, fmt.Errorf("drop orphaned parts: %w", err)
	}
	if n, _ := res.RowsAffected(); n > 0 {
		d := RowDrop{Item: "rows of part whose message is not kept", Rows: n, Reason: "their message was dropped or never existed"}
		return append(t.list(), d), nil
	}
	return t.list(), nil
}

// rowFix checks one decoded JSON value; it returns the value to store
// (nil: drop the row, or for a nullable column set NULL) and whether it
// differs from the input.
type rowFix func(v any, t *tally) (any, bool)

// rewriteRows runs fix over column col of every row of main.table (that
// also meets the SQL condition and, "" or " AND …"), in batches by rowid,
// and writes back only what changed (unchanged rows keep their exact bytes).
func rewriteRows(ctx context.Context, c *sql.Conn, table, col, and string, fix rowFix, t *tally) error {
	nullable := table == "session"
	var last int64 = -1 << 62
	for {
		type change struct {
			rowid int64
			data  *string // nil: delete (or NULL)
		}
		var changes []change
		rows, err := c.QueryContext(ctx, fmt.Sprintf(`SELECT rowid, %q FROM main.%q WHERE rowid > ? AND %q IS NOT NULL%s ORDER BY rowid LIMIT 2000`, col, table, col, and), last)
		if err != nil {
			return fmt.Errorf("read %s.%s: %w", table, col, err)
		}
		n := 0
		for rows.Next() {
			n++
			var rowid int64
			var raw any
			if err := rows.Scan(&rowid, &raw); err != nil {
				rows.Close()
				return fmt.Errorf("read %s.%s: %w", table, col, err)
			}
			last = rowid
			v, ok := decodeJSON(raw)
			if !ok {
				t.add("rows of "+table+" whose "+col+" is not JSON", "shrooms cannot judge it")
				changes = append(changes, change{rowid, nil})
				continue
			}
			out, changed := fix(v, t)
			switch {
			case out == nil:
				changes = append(changes, change{rowid, nil})
			case changed:
				b, err := json.Marshal(out)
				if err != nil {
					rows.Close()
					return err
				}
				s := string(b)
				changes = append(changes, change{rowid, &s})
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return fmt.Errorf("read %s.%s: %w", table, col, err)
		}
		for _, ch := range changes {
			var err error
			switch {
			case ch.data != nil:
				_, err = c.ExecContext(ctx, fmt.Sprintf(`UPDATE main.%q SET %q = ? WHERE rowid = ?`, table, col), *ch.data, ch.rowid)
			case nullable:
				_, err = c.ExecContext(ctx, fmt.Sprintf(`UPDATE main.%q SET %q = NULL WHERE rowid = ?`, table, col), ch.rowid)
			default:
				_, err = c.ExecContext(ctx, fmt.Sprintf(`DELETE FROM main.%q WHERE rowid = ?`, table), ch.rowid)
			}
			if err != nil {
				return fmt.Errorf("rewrite %s.%s: %w", table, col, err)
			}
		}
		if n < 2000 {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return err
		}
	}
}

// decodeJSON decodes a TEXT value holding exactly one JSON value, numbers
// kept as written (deeper than encoding/json's nesting limit: an error).
func decodeJSON(raw any) (any, bool) {
	// Only TEXT: opencode writes JSON as text, and a BLOB or number
	// would be read by its driver in ways shrooms does not check.
	x, ok := raw.(string)
	if !ok {
		return nil, false
	}
	dec := json.NewDecoder(strings.NewReader(x))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil || dec.More() {
		return nil, false
	}
	return v, true
}

// keepKeys deletes the keys of m not in allowed; it reports whether any went.
func keepKeys(m map[string]any, allowed []string, what string, t *tally) bool {
	changed := false
	for _, k := range slices.Sorted(maps.Keys(m)) {
		if k != "type" && !slices.Contains(allowed, k) {
			delete(m, k)
			changed = true
		}
	}
	if changed {
		t.add(what+" (keys not in "+pinnedOpencode+"'s schema)", "opencode ignores them; shrooms does not carry what it cannot judge")
	}
	return changed
}

// pinMessage checks one message.data object.
func pinMessage(v any, t *tally) (any, bool) {
	m, ok := v.(map[string]any)
	role, _ := m["role"].(string)
	if !ok || messageKeys[role] == nil {
		t.add("rows of message that are not a user or assistant message", "not a message of "+pinnedOpencode+"'s schema")
		return nil, false
	}
	changed := keepKeys(m, messageKeys[role], "message.data", t)
	if role == "assistant" {
		// root is the project's worktree: "/" in the global project
		// (see globalRoot).
		p, _ := m["path"].(map[string]any)
		if len(p) != 2 || p["cwd"] != opencodeWork || p["root"] != opencodeWork && p["root"] != "/" {
			root := opencodeWork
			if p["root"] == "/" {
				root = "/"
			}
			m["path"] = map[string]any{"cwd": opencodeWork, "root": root}
			t.add("message.data path.cwd, path.root (pinned to "+opencodeWork+")", "the directories the agent worked in")
			changed = true
		}
		return m, changed
	}
	if _, ok := m["system"]; ok {
		delete(m, "system")
		t.add("message.data system", "a system prompt of the caller's (instructions) the model may be given again")
		changed = true
	}
	if s, ok := m["summary"].(map[string]any); ok {
		if d, _ := s["diffs"].([]any); len(d) > 0 || s["diffs"] == nil {
			s["diffs"] = []any{}
			t.add("message.data summary.diffs", "file paths and patches of the change summary the UI shows")
			changed = true
		}
	}
	return m, changed
}

// pinPart checks one part.data object.
func pinPart(v any, t *tally) (any, bool) {
	m, ok := v.(map[string]any)
	typ, _ := m["type"].(string)
	if !ok {
		t.add("rows of part that are not a JSON object", "not a part of "+pinnedOpencode+"'s schema")
		return nil, false
	}
	if why, ok := droppedParts[typ]; ok {
		t.add("rows of part of type "+typ, why)
		return nil, false
	}
	keys, ok := partKeys[typ]
	if !ok {
		t.add("rows of part of an unknown type", "not a part of "+pinnedOpencode+"'s schema")
		return nil, false
	}
	changed := keepKeys(m, keys, "part.data", t)
	switch typ {
	case "file":
		if u, _ := m["url"].(string); !strings.HasPrefix(u, "data:") {
			t.add("rows of part of type file whose url is not a data: URL", "opencode hands the URL to the model SDK, which fetches it (http:, file:)")
			return nil, false
		}
		if _, ok := m["source"]; ok {
			delete(m, "source")
			t.add("part.data source (of file parts)", "a path or resource URI the attachment came from")
			changed = true
		}
	case "step-start", "step-finish":
		if s, ok := m["snapshot"]; ok {
			if str, _ := s.(string); !snapshotID().MatchString(str) {
				delete(m, "snapshot")
				t.add("part.data snapshot (not a git object id)", "opencode hands snapshot ids to git")
				changed = true
			}
		}
	case "tool":
		st, _ := m["state"].(map[string]any)
		switch st["status"] {
		case "pending", "running", "completed", "error":
		default:
			t.add("rows of part of type tool without a known state", "not a part of "+pinnedOpencode+"'s schema")
			return nil, false
		}
		if a, ok := st["attachments"].([]any); ok {
			var kept []any
			for _, x := range a {
				f, _ := x.(map[string]any)
				if u, _ := f["url"].(string); f != nil && strings.HasPrefix(u, "data:") {
					delete(f, "source")
					kept = append(kept, f)
				}
			}
			if len(kept) != len(a) {
				t.add("part.data state.attachments that are not data: URLs", "opencode hands the URL to the model SDK, which fetches it (http:, file:)")
				changed = true
			}
			if kept == nil {
				kept = []any{}
			}
			st["attachments"] = kept
		} else if _, ok := st["attachments"]; ok {
			delete(st, "attachments")
			t.add("part.data state.attachments that are not data: URLs", "opencode hands the URL to the model SDK, which fetches it (http:, file:)")
			changed = true
		}
	}
	return m, changed
}

// checkRevert keeps a session's pending revert only when it is exactly
// {messageID, partID?, snapshot?, diff?} with ids of opencode's forms and a
// git object id (the next prompt deletes the messages after messageID;
// unrevert hands snapshot to git).
func checkRevert(v any, t *tally) (any, bool) {
	m, ok := v.(map[string]any)
	good := ok
	for k, x := range m {
		s, isStr := x.(string)
		switch {
		case !isStr:
			good = false
		case k == "messageID":
			good = good && messageID().MatchString(s)
		case k == "partID":
			good = good && partID().MatchString(s)
		case k == "snapshot":
			good = good && snapshotID().MatchString(s)
		case k == "diff":
		default:
			good = false
		}
	}
	if _, has := m["messageID"]; good && has {
		return m, false
	}
	t.add("column session.revert", "not a revert point of "+pinnedOpencode+"'s form (ids and a git object id)")
	return nil, true
}
