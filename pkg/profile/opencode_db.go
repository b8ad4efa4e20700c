package profile

import (
	"context"
	"database/sql"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
	_ "modernc.org/sqlite" // pure-Go SQLite (CGO is off)
)

// opencode keeps its sessions in opencode.db, but the same database also
// holds console accounts (whose URL opencode fetches config from at every
// start), credentials, permission grants, workspaces and project commands.
// So the file is never carried over: it is rebuilt every turn into a fresh
// database with the schema of the pinned opencode version, holding only the
// rows and columns a session needs.

// pinnedOpencode is the opencode version whose schema is pinned; it must be
// the one scripts/build-agent-image.sh installs.
const pinnedOpencode = "opencode 1.18.33"

// opencodeSchemaText is sqlite_master and the migration ids of a fresh
// opencode.db made by the pinned opencode (TestPinnedOpencodeSchema checks it
// against the real CLI in the agent image and regenerates it).
//
//go:embed testdata/golden/opencode-1.18.33.schema
var opencodeSchemaText string

// schemaObject is one sqlite_master row.
type schemaObject struct {
	typ, name, table, sql string
}

// pinnedSchema is a parsed schema file.
type pinnedSchema struct {
	agent      string
	migrations []string
	objects    []schemaObject
}

func (p *pinnedSchema) object(typ, name string) *schemaObject {
	for i := range p.objects {
		if p.objects[i].typ == typ && p.objects[i].name == name {
			return &p.objects[i]
		}
	}
	return nil
}

// renderSchema writes the schema file format: a header, one "migration ID"
// line per applied migration in order, then every sqlite_master object as
// "TYPE NAME TABLE" followed by its SQL and a ";;" line.
func renderSchema(p *pinnedSchema) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# %s: migrations and sqlite_master of a fresh opencode.db\n", p.agent)
	for _, m := range p.migrations {
		fmt.Fprintf(&b, "migration %s\n", m)
	}
	for _, o := range p.objects {
		fmt.Fprintf(&b, "%s %s %s\n", o.typ, o.name, o.table)
		if o.sql != "" {
			b.WriteString(o.sql + "\n")
		}
		b.WriteString(";;\n")
	}
	return b.String()
}

func parseSchema(text string) (*pinnedSchema, error) {
	lines := strings.Split(strings.TrimSuffix(text, "\n"), "\n")
	if len(lines) == 0 || !strings.HasPrefix(lines[0], "# ") {
		return nil, errors.New("schema file: no header")
	}
	p := &pinnedSchema{agent: strings.SplitN(strings.TrimPrefix(lines[0], "# "), ":", 2)[0]}
	var cur *schemaObject
	var sqlLines []string
	for _, l := range lines[1:] {
		switch {
		case cur == nil && strings.HasPrefix(l, "migration "):
			p.migrations = append(p.migrations, strings.TrimPrefix(l, "migration "))
		case cur == nil:
			f := strings.Fields(l)
			if len(f) != 3 {
				return nil, fmt.Errorf("schema file: bad object line %q", l)
			}
			cur = &schemaObject{typ: f[0], name: f[1], table: f[2]}
		case l == ";;":
			cur.sql = strings.Join(sqlLines, "\n")
			p.objects = append(p.objects, *cur)
			cur, sqlLines = nil, nil
		default:
			sqlLines = append(sqlLines, l)
		}
	}
	if cur != nil || len(p.migrations) == 0 {
		return nil, errors.New("schema file: truncated")
	}
	return p, nil
}

// tablePlan says how one allowlisted table is copied: every column of the
// pinned table is copied except those in drop (left NULL or at their
// default; the reason is reported when a row held a value) and those in
// fixed (set to an SQL literal).
type tablePlan struct {
	table string
	drop  map[string]string
	fixed map[string][2]string // column → {literal, reason}
	// pin are path-valued columns set to a value of the cage's own paths
	// (an SQL literal); rows that held anything else are reported as
	// pinned, never with the value.
	pin map[string][2]string // column → {literal, reason}
}

// opencodeWork is the cage's worktree: every kept directory pointer is
// pinned to it. Exactly /work, not a path below it: the guard masks
// .opencode/ directories at any depth, but a directory below /work is one
// the turn chose (or made a link out of the worktree), and opencode walks up
// from it for config and instructions; /work is where the cage starts the
// agent anyway (its working directory), so the pin changes nothing else.
const opencodeWork = cageWork

// workLiteral is opencodeWork as an SQL literal.
const workLiteral = "'" + opencodeWork + "'"

// globalRoot starts the SQL test for opencode's project of a directory that
// is not a git repository (a shrooms cage's /work as opencode sees it: git
// refuses the worktree, owned by another uid): its id is "global" and its
// worktree "/", the cage image's read-only root, which holds no config a
// turn can write. That one value is kept; every other worktree is /work.
const globalRoot = `CASE WHEN "id" = 'global' AND "worktree" = '/'`

// opencodeTables are the tables a session needs (checked with the real
// opencode: `opencode run --session ID` continues a session from these alone).
// Every other table is dropped: account, account_state, control_account
// (console accounts whose URL opencode fetches config from), credential,
// permission, workspace, project_directory, session_share (a share URL and
// secret), session_input (queued prompts the next turn would run),
// session_context_epoch, session_message, event, event_sequence and
// data_migration.
var opencodeTables = []tablePlan{
	{table: "project", drop: map[string]string{
		"commands":          "project commands run code",
		"icon_url":          "URL-bearing",
		"icon_url_override": "URL-bearing",
	}, fixed: map[string][2]string{
		"sandboxes": {"'[]'", "sandbox directories are opencode config, not session state"},
	}, pin: map[string][2]string{
		"worktree": {globalRoot + ` THEN '/' ELSE ` + workLiteral + ` END`, "a directory opencode loads project config from"},
	}},
	{table: "session", drop: map[string]string{
		"share_url":     "URL-bearing",
		"workspace_id":  "workspaces are not kept",
		"metadata":      "not session state shrooms can judge",
		"permission":    "only deny rules are kept",
		"summary_diffs": "file paths and patches of the change summary the UI shows",
	}, pin: map[string][2]string{
		"directory": {workLiteral, "the directory the next turn would start in"},
		// path is directory relative to the project's worktree: /work
		// itself ("work" in the global project, "" in any other).
		"path": {`CASE WHEN "project_id" = 'global' AND (SELECT p."worktree" FROM src."project" p WHERE p."id" = 'global') = '/' THEN 'work' ELSE '' END`,
			"the directory the next turn would start in, relative to the project"},
	}},
	{table: "message"},
	{table: "part"},
	{table: "todo"},
}

// rebuildOpencodeDB copies the checked inode fd (and, if walFd >= 0, its
// -wal) into a private directory, folds the WAL in, verifies the schema
// against the pinned one and writes a fresh database holding only the
// allowlisted rows and columns to out (nil: a dry run). A database whose
// migrations or allowlisted tables differ from the pinned version returns an
// *SchemaError; one SQLite cannot read returns another error (the caller drops
// it).
func rebuildOpencodeDB(ctx context.Context, fd, walFd int, max int64, out io.Writer) ([]RowDrop, error) {
	tmp, err := os.MkdirTemp("", "shrooms-opencode-db-")
	if err != nil {
		return nil, fmt.Errorf("private copy: %w", err)
	}
	defer os.RemoveAll(tmp)
	dst, drops, err := rebuildOpencodeDBIn(ctx, fd, walFd, max, tmp)
	if err != nil {
		return nil, err
	}
	if out == nil {
		return drops, nil // a dry run: built anyway, to report what it drops
	}
	f, err := os.Open(dst)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if _, err := io.Copy(out, f); err != nil {
		return nil, err
	}
	return drops, nil
}

// rebuildOpencodeDBIn is rebuildOpencodeDB's work in the private directory
// tmp: it returns the path of the rebuilt database there.
func rebuildOpencodeDBIn(ctx context.Context, fd, walFd int, max int64, tmp string) (string, []RowDrop, error) {
	pinned, err := parseSchema(opencodeSchemaText)
	if err != nil {
		return "", nil, err
	}
	src := filepath.Join(tmp, "src.db")
	if err := copyNode(fd, src, max); err != nil {
		return "", nil, fmt.Errorf("copy: %w", err)
	}
	if walFd >= 0 {
		if err := copyNode(walFd, src+"-wal", max); err != nil {
			return "", nil, fmt.Errorf("copy -wal: %w", err)
		}
	}
	drops, err := foldAndCheck(ctx, src, pinned)
	if err != nil {
		return "", nil, err
	}
	dst := filepath.Join(tmp, "out.db")
	more, err := copyAllowlisted(ctx, src, dst, pinned)
	if err != nil {
		return "", nil, err
	}
	return dst, append(drops, more...), nil
}

// copyNode copies the regular file behind an O_PATH fd (exactly that inode)
// into a new private file.
func copyNode(fd int, dst string, max int64) error {
	f, err := os.OpenFile("/proc/self/fd/"+strconv.Itoa(fd), os.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	var st, pst unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return err
	}
	if err := unix.Fstat(fd, &pst); err != nil {
		return err
	}
	if st.Ino != pst.Ino || st.Dev != pst.Dev || st.Mode&unix.S_IFMT != unix.S_IFREG {
		return errors.New("file changed while being read")
	}
	w, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	n, err := io.Copy(w, io.LimitReader(f, max+1))
	if cerr := w.Close(); err == nil {
		err = cerr
	}
	if err == nil && n > max {
		err = fmt.Errorf("larger than %d bytes", max)
	}
	return err
}

// openSQLite opens a private database file with one connection and the
// schema distrusted (no function with side effects runs from the schema).
func openSQLite(ctx context.Context, path string) (*sql.DB, *sql.Conn, error) {
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		return nil, nil, err
	}
	db.SetMaxOpenConns(1)
	c, err := db.Conn(ctx)
	if err != nil {
		db.Close()
		return nil, nil, err
	}
	for _, p := range []string{"PRAGMA trusted_schema=OFF", "PRAGMA cell_size_check=ON", "PRAGMA foreign_keys=OFF"} {
		if _, err := c.ExecContext(ctx, p); err != nil {
			c.Close()
			db.Close()
			return nil, nil, err
		}
	}
	return db, c, nil
}

// foldAndCheck checkpoints the private copy's WAL into it, checks its
// integrity, and compares its schema with the pinned one. It returns what a
// rebuild leaves out that is not in the pinned schema (triggers, views,
// tables, indexes) and the rows of pinned tables outside the allowlist.
func foldAndCheck(ctx context.Context, path string, pinned *pinnedSchema) ([]RowDrop, error) {
	db, c, err := openSQLite(ctx, path)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	defer c.Close()
	if _, err := c.ExecContext(ctx, "PRAGMA wal_checkpoint(TRUNCATE)"); err != nil {
		return nil, fmt.Errorf("fold in the WAL: %w", err)
	}
	if _, err := c.ExecContext(ctx, "PRAGMA journal_mode=DELETE"); err != nil {
		return nil, fmt.Errorf("leave WAL mode: %w", err)
	}
	var check string
	if err := c.QueryRowContext(ctx, "PRAGMA quick_check(1)").Scan(&check); err != nil {
		return nil, fmt.Errorf("integrity check: %w", err)
	}
	if check != "ok" {
		return nil, fmt.Errorf("integrity check: %s", check)
	}
	return checkSchema(ctx, c, "main", pinned)
}

// checkSchema compares the schema of the attached database schema (main or
// src) with the pinned one; see foldAndCheck.
func checkSchema(ctx context.Context, c *sql.Conn, schema string, pinned *pinnedSchema) ([]RowDrop, error) {
	objs, err := readMasterOf(ctx, c, schema)
	if err != nil {
		return nil, err
	}
	// The version: the migration ids must be exactly the pinned ones.
	mig := pinned.object("table", "migration")
	if got := findObject(objs, "table", "migration"); got == nil || mig == nil || got.sql != mig.sql {
		return nil, &SchemaError{fmt.Sprintf("opencode.db has no migration table of %s's form; shrooms cannot tell its schema version", pinned.agent)}
	}
	ids, err := queryStrings(ctx, c, `SELECT id FROM `+schema+`."migration" ORDER BY id`)
	if err != nil {
		return nil, fmt.Errorf("read migrations: %w", err)
	}
	for _, id := range ids {
		if !slices.Contains(pinned.migrations, id) {
			return nil, &SchemaError{fmt.Sprintf("opencode.db has migration %q, which %s (the version shrooms pins) does not have: a newer opencode or a forged row; refusing to carry it over", id, pinned.agent)}
		}
	}
	for _, id := range pinned.migrations {
		if !slices.Contains(ids, id) {
			return nil, &SchemaError{fmt.Sprintf("opencode.db lacks migration %q of %s (the version shrooms pins): an older opencode; refusing to carry it over", id, pinned.agent)}
		}
	}
	for _, tp := range opencodeTables {
		want := pinned.object("table", tp.table)
		got := findObject(objs, "table", tp.table)
		if want == nil || got == nil || got.sql != want.sql {
			return nil, &SchemaError{fmt.Sprintf("opencode.db table %q does not match %s's schema; refusing to carry it over", tp.table, pinned.agent)}
		}
	}
	var drops []RowDrop
	for _, o := range objs {
		if strings.HasPrefix(o.name, "sqlite_autoindex_") {
			continue
		}
		want := pinned.object(o.typ, o.name)
		switch {
		case want == nil || want.sql != o.sql || want.table != o.table:
			drops = append(drops, RowDrop{Item: o.typ + " " + o.name, Reason: "not in " + pinned.agent + "'s schema"})
		case o.typ == "table" && o.name != "migration" && !slices.ContainsFunc(opencodeTables, func(tp tablePlan) bool { return tp.table == o.name }):
			var n int64
			if err := c.QueryRowContext(ctx, `SELECT count(*) FROM `+schema+`."`+o.name+`"`).Scan(&n); err != nil {
				return nil, fmt.Errorf("count %s: %w", o.name, err)
			}
			if n > 0 {
				drops = append(drops, RowDrop{Item: "table " + o.name, Rows: n, Reason: "not session state"})
			}
		}
	}
	return drops, nil
}

func readMaster(ctx context.Context, c *sql.Conn) ([]schemaObject, error) {
	return readMasterOf(ctx, c, "main")
}

func readMasterOf(ctx context.Context, c *sql.Conn, schema string) ([]schemaObject, error) {
	rows, err := c.QueryContext(ctx, "SELECT type, name, tbl_name, coalesce(sql, '') FROM "+schema+".sqlite_master ORDER BY rowid")
	if err != nil {
		return nil, fmt.Errorf("read schema: %w", err)
	}
	defer rows.Close()
	var objs []schemaObject
	for rows.Next() {
		var o schemaObject
		if err := rows.Scan(&o.typ, &o.name, &o.table, &o.sql); err != nil {
			return nil, fmt.Errorf("read schema: %w", err)
		}
		objs = append(objs, o)
	}
	return objs, rows.Err()
}

func findObject(objs []schemaObject, typ, name string) *schemaObject {
	for i := range objs {
		if objs[i].typ == typ && objs[i].name == name {
			return &objs[i]
		}
	}
	return nil
}

func queryStrings(ctx context.Context, c *sql.Conn, q string, args ...any) ([]string, error) {
	rows, err := c.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, rows.Err()
}

// copyAllowlisted creates dst with the pinned schema and copies the
// allowlisted rows and columns of the (checked) database src into it.
func copyAllowlisted(ctx context.Context, src, dst string, pinned *pinnedSchema) ([]RowDrop, error) {
	db, c, err := openSQLite(ctx, dst)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	defer c.Close()
	// A private file that is discarded on any error: no journal, no fsync,
	// and a cache large enough to write pages in big batches.
	for _, p := range []string{"PRAGMA journal_mode=OFF", "PRAGMA synchronous=OFF", "PRAGMA cache_size=-65536"} {
		if _, err := c.ExecContext(ctx, p); err != nil {
			return nil, err
		}
	}
	for _, o := range pinned.objects {
		if o.sql == "" {
			continue
		}
		if _, err := c.ExecContext(ctx, o.sql); err != nil {
			return nil, fmt.Errorf("create %s %s: %w", o.typ, o.name, err)
		}
	}
	if _, err := c.ExecContext(ctx, "ATTACH DATABASE ? AS src", "file:"+src+"?mode=ro"); err != nil {
		return nil, fmt.Errorf("attach the checked copy: %w", err)
	}
	if _, err := c.ExecContext(ctx, "BEGIN"); err != nil {
		return nil, err
	}
	drops, err := copyRows(ctx, c, nil)
	if err != nil {
		return nil, err
	}
	if _, err := c.ExecContext(ctx, "COMMIT"); err != nil {
		return nil, err
	}
	if _, err := c.ExecContext(ctx, "DETACH DATABASE src"); err != nil {
		return nil, err
	}
	return drops, nil
}

// copyRows copies the allowlisted rows and columns of src into main (both
// attached to c, in a transaction), filtered and pinned. With only nil it
// copies every row (new rowids); otherwise only the rows of src whose rowid
// is in the temp table only[table] (a table of one column r), keeping their
// rowids (opencode_dbupdate.go).
func copyRows(ctx context.Context, c *sql.Conn, only map[string]string) ([]RowDrop, error) {
	where := func(table, op string) string {
		if only == nil {
			return ""
		}
		return op + `rowid IN (SELECT r FROM temp."` + only[table] + `")`
	}
	rowid := func(table string) string {
		if only == nil {
			return ""
		}
		return "rowid, "
	}
	if _, err := c.ExecContext(ctx, `INSERT INTO main."migration" (`+rowid("migration")+`id, time_completed) SELECT `+rowid("migration")+`id, time_completed FROM src."migration"`+where("migration", " WHERE ")); err != nil {
		return nil, fmt.Errorf("copy migrations: %w", err)
	}
	var drops []RowDrop
	for _, tp := range opencodeTables {
		cols, err := queryStrings(ctx, c, "SELECT name FROM pragma_table_info(?, 'main')", tp.table)
		if err != nil {
			return nil, fmt.Errorf("columns of %s: %w", tp.table, err)
		}
		var into, from []string
		if only != nil {
			into, from = []string{"rowid"}, []string{"rowid"}
		}
		for _, col := range cols {
			q := `"` + col + `"`
			if why, ok := tp.drop[col]; ok {
				var n int64
				if err := c.QueryRowContext(ctx, `SELECT count(*) FROM src."`+tp.table+`" WHERE `+q+` IS NOT NULL`+where(tp.table, " AND ")).Scan(&n); err != nil {
					return nil, err
				}
				if n > 0 && col != "permission" {
					drops = append(drops, RowDrop{Item: "column " + tp.table + "." + col, Rows: n, Reason: why})
				}
				continue
			}
			into = append(into, q)
			if f, ok := tp.pin[col]; ok {
				from = append(from, `CASE WHEN `+q+` IS NULL THEN NULL ELSE `+f[0]+` END`)
				var n int64
				if err := c.QueryRowContext(ctx, `SELECT count(*) FROM src."`+tp.table+`" WHERE `+q+` IS NOT NULL AND `+q+` IS NOT `+f[0]+where(tp.table, " AND ")).Scan(&n); err != nil {
					return nil, err
				}
				if n > 0 {
					drops = append(drops, RowDrop{Item: "column " + tp.table + "." + col + " (pinned to " + opencodeWork + ")", Rows: n, Reason: f[1]})
				}
				continue
			}
			if f, ok := tp.fixed[col]; ok {
				from = append(from, f[0])
				var n int64
				if err := c.QueryRowContext(ctx, `SELECT count(*) FROM src."`+tp.table+`" WHERE `+q+` IS NOT `+f[0]+where(tp.table, " AND ")).Scan(&n); err != nil {
					return nil, err
				}
				if n > 0 {
					drops = append(drops, RowDrop{Item: "column " + tp.table + "." + col, Rows: n, Reason: f[1]})
				}
				continue
			}
			from = append(from, q)
		}
		stmt := fmt.Sprintf(`INSERT INTO main."%s" (%s) SELECT %s FROM src."%s"`, tp.table, strings.Join(into, ", "), strings.Join(from, ", "), tp.table) + where(tp.table, " WHERE ")
		if _, err := c.ExecContext(ctx, stmt); err != nil {
			return nil, fmt.Errorf("copy %s: %w", tp.table, err)
		}
	}
	n, err := keepDenyRules(ctx, c, where("session", " AND "))
	if err != nil {
		return nil, err
	}
	if n > 0 {
		drops = append(drops, RowDrop{Item: "column session.permission", Rows: n, Reason: "permission rules other than deny"})
	}
	more, err := pinOpencodeData(ctx, c, only)
	if err != nil {
		return nil, err
	}
	drops = append(drops, more...)
	return drops, nil
}

// keepDenyRules restores each session's permission rules that only deny
// (opencode run adds those itself), and returns how many sessions lost rules.
func keepDenyRules(ctx context.Context, c *sql.Conn, where string) (int64, error) {
	rows, err := c.QueryContext(ctx, `SELECT id, permission FROM src."session" WHERE permission IS NOT NULL`+where)
	if err != nil {
		return 0, err
	}
	type upd struct{ id, perm string }
	var ups []upd
	var lost int64
	for rows.Next() {
		var id string
		var perm any
		if err := rows.Scan(&id, &perm); err != nil {
			rows.Close()
			return 0, err
		}
		s, _ := perm.(string)
		kept, dropped := filterDenyRules(s)
		if dropped || kept == "" && perm != nil {
			lost++
		}
		if kept != "" {
			ups = append(ups, upd{id, kept})
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, err
	}
	for _, u := range ups {
		if _, err := c.ExecContext(ctx, `UPDATE main."session" SET permission = ? WHERE id = ?`, u.perm, u.id); err != nil {
			return 0, err
		}
	}
	return lost, nil
}

// filterDenyRules keeps the rules of a session's permission JSON array that
// are exactly {permission, pattern, action:"deny"} with string values. It
// returns "" when nothing is kept, and whether any rule was dropped.
func filterDenyRules(s string) (string, bool) {
	var rules []map[string]any
	if err := json.Unmarshal([]byte(s), &rules); err != nil {
		return "", true
	}
	var kept []map[string]string
	dropped := false
	for _, r := range rules {
		p, ok1 := r["permission"].(string)
		pat, ok2 := r["pattern"].(string)
		if len(r) != 3 || !ok1 || !ok2 || r["action"] != "deny" {
			dropped = true
			continue
		}
		kept = append(kept, map[string]string{"permission": p, "pattern": pat, "action": "deny"})
	}
	if kept == nil {
		return "", dropped
	}
	b, _ := json.Marshal(kept)
	return string(b), dropped
}
