package profile

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Rebuilding a kept 100 MiB opencode.db in full (copy, integrity check,
// every row copied into a fresh database and every JSON row checked) takes
// seconds, every turn. updateOpencodeDB does the same job in place:
//
// The reset keeps, in a root-only directory of its own on the HOME's
// filesystem that no cage sees (state), the database the last rebuild
// produced ("trusted.db"), every byte of which shrooms wrote. The HOME gets
// a copy of it, which the turn may change at will. At the next reset the
// turn's file is only read: its schema is checked as in a full rebuild, and
// each kept table's rows are compared with trusted.db's by rowid, every
// column value and type. A row that differs or is new is filtered exactly
// as a full rebuild filters it (copyRows: the same SQL, the same JSON
// checks and pins) and written into trusted.db in its place; a row
// trusted.db holds and the turn's file does not is deleted. Then
// trusted.db is copied into the new HOME — or, usually, the turn's own
// inode is rewritten to trusted.db's bytes (opencode_dbpatch.go).
//
// Nothing of the turn's file but row values reaching that filter gets into
// trusted.db: not its header (page size, encoding, application_id,
// user_version, journal mode), not its schema objects (extra tables,
// indexes, triggers, views: its schema is checked; a changed pinned table
// fails the reset), not its free pages or the unused space in its pages,
// not a -wal or -journal beside it. trusted.db is changed only by SQLite
// statements shrooms runs, with secure_delete on (deleted cells and freed
// pages are zeroed), in one transaction (its rollback journal lives in
// state; a crash leaves a hot journal SQLite rolls back at the next open).
// A trusted.db that is missing, or whose schema is not the pinned one (a
// newer shrooms), and any error in the update other than the turn's file
// being of another schema, fall back to the full rebuild, whose output
// becomes trusted.db.

const trustedDB = "trusted.db"

// updateOpencodeDB is opencode.db's Rule.Update.
func updateOpencodeDB(ctx context.Context, fd, walFd int, max int64, state string, out io.Writer) ([]RowDrop, error) {
	var drops []RowDrop
	if mine, err := patchMarked(fd, state); err != nil {
		return nil, err
	} else if !mine {
		// (A file an interrupted in-place update half rewrote: its
		// changes are in trusted.db already.)
		if drops, err = refreshTrusted(ctx, fd, walFd, max, state); err != nil {
			return nil, err
		}
	}
	f, err := os.Open(filepath.Join(state, trustedDB))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if _, err := io.Copy(out, f); err != nil {
		return nil, err
	}
	return drops, nil
}

// refreshTrusted brings trusted.db up to date with the turn's file: the
// in-place update, or the full rebuild (whose output becomes trusted.db).
func refreshTrusted(ctx context.Context, fd, walFd int, max int64, state string) ([]RowDrop, error) {
	pinned, err := parseSchema(opencodeSchemaText)
	if err != nil {
		return nil, err
	}
	trusted := filepath.Join(state, trustedDB)
	work := filepath.Join(state, "work")
	if err := os.RemoveAll(work); err != nil {
		return nil, err
	}
	if err := os.Mkdir(work, 0o700); err != nil {
		return nil, err
	}
	defer os.RemoveAll(work)
	drops, err := updateTrusted(ctx, fd, walFd, max, trusted, work, pinned)
	var se *SchemaError
	switch {
	case errors.As(err, &se) || ctx.Err() != nil:
		return nil, err
	case err != nil:
		// No usable trusted.db (or the update failed): rebuild in
		// full; the result is the next trusted.db (in a
		// directory of its own: the update's files are still in work).
		dir := filepath.Join(work, "full")
		if err := os.Mkdir(dir, 0o700); err != nil {
			return nil, err
		}
		dst, full, err := rebuildOpencodeDBIn(ctx, fd, walFd, max, dir)
		if err != nil {
			return nil, err
		}
		// A hot journal of the old trusted.db must never be rolled
		// back into the new one.
		if err := os.Remove(trusted + "-journal"); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, err
		}
		if err := syncFile(dst); err != nil {
			return nil, err
		}
		if err := os.Rename(dst, trusted); err != nil {
			return nil, err
		}
		drops = full
	}
	return drops, nil
}

// errNoTrusted: there is no trusted.db to update (a full rebuild makes one).
var errNoTrusted = errors.New("no trusted copy")

// updateTrusted brings trusted.db up to date with the turn's file (fd, its
// -wal walFd) as described above.
func updateTrusted(ctx context.Context, fd, walFd int, max int64, trusted, work string, pinned *pinnedSchema) ([]RowDrop, error) {
	if st, err := os.Lstat(trusted); err != nil || !st.Mode().IsRegular() {
		return nil, errNoTrusted
	}
	src := filepath.Join(work, "src.db")
	attach := "file:" + src + "?mode=ro&immutable=1"
	if walFd >= 0 {
		// Fold the WAL into a private copy (the turn's file stays as
		// it is: a crash leaves the old HOME intact).
		if err := copyNode(fd, src, max); err != nil {
			return nil, fmt.Errorf("copy: %w", err)
		}
		if err := copyNode(walFd, src+"-wal", max); err != nil {
			return nil, fmt.Errorf("copy -wal: %w", err)
		}
		if err := foldWAL(ctx, src); err != nil {
			return nil, err
		}
		attach = "file:" + src + "?mode=ro"
	} else if err := unix.Linkat(fd, "", unix.AT_FDCWD, src, unix.AT_EMPTY_PATH); err != nil {
		// Read in place: exactly the checked inode, linked into the
		// private directory (immutable: no lock, no journal, no -wal).
		return nil, fmt.Errorf("link: %w", err)
	}
	db, c, err := openSQLite(ctx, trusted)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	defer c.Close()
	// mmap only for the trusted copy (main): the turn's file is read
	// with plain reads, as SQLite advises for files one does not trust.
	for _, p := range []string{"PRAGMA secure_delete=ON", "PRAGMA temp_store=MEMORY", "PRAGMA cache_size=-65536", "PRAGMA main.mmap_size=1073741824"} {
		if _, err := c.ExecContext(ctx, p); err != nil {
			return nil, err
		}
	}
	// trusted.db is shrooms' own, but of the pinned schema only if the
	// pinned version has not changed since it was written.
	if d, err := checkSchema(ctx, c, "main", pinned); err != nil || len(d) > 0 {
		return nil, fmt.Errorf("trusted copy of another schema: %v", err)
	}
	if _, err := c.ExecContext(ctx, "ATTACH DATABASE ? AS src", attach); err != nil {
		return nil, fmt.Errorf("attach the turn's file: %w", err)
	}
	drops, err := checkSchema(ctx, c, "src", pinned)
	if err != nil {
		return nil, err
	}
	tables := append([]string{"migration"}, tableNames()...)
	// Which rows to compare: those on the pages the turn changed, or
	// (nil) every row when the pages cannot tell (opencode_dbpages.go).
	cand, err := rowsOnChangedPages(ctx, c, src, trusted, tables)
	if errors.Is(err, errMostlyChanged) {
		return nil, err
	}
	only := map[string]string{}
	changed := map[string]bool{}
	for _, table := range tables {
		var rows []int64
		if cand != nil {
			rows = append([]int64{}, cand[table]...) // non-nil: compare only these
		}
		n, err := diffTable(ctx, c, table, rows)
		if err != nil {
			return nil, err
		}
		only[table] = "chg_" + table
		changed[table] = n > 0
	}
	if _, err := c.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		return nil, err
	}
	commit := false
	defer func() {
		if !commit {
			c.ExecContext(context.WithoutCancel(ctx), "ROLLBACK")
		}
	}()
	if changed["project"] {
		// session.path is pinned by the global project's worktree.
		if _, err := c.ExecContext(ctx, `INSERT OR IGNORE INTO temp."chg_session" (r) SELECT rowid FROM src."session"`); err != nil {
			return nil, err
		}
	}
	// The ids of messages about to be deleted or replaced: their parts
	// may be left without one (pinOpencodeData sweeps them).
	if _, err := c.ExecContext(ctx, `CREATE TEMP TABLE gone_msg AS SELECT id FROM main."message" WHERE rowid IN (SELECT r FROM temp."chg_message" UNION ALL SELECT r FROM temp."del_message")`); err != nil {
		return nil, err
	}
	for table := range only {
		if _, err := c.ExecContext(ctx, `DELETE FROM main."`+table+`" WHERE rowid IN (SELECT r FROM temp."chg_`+table+`" UNION ALL SELECT r FROM temp."del_`+table+`")`); err != nil {
			return nil, fmt.Errorf("delete changed rows of %s: %w", table, err)
		}
	}
	more, err := copyRows(ctx, c, only)
	if err != nil {
		return nil, err
	}
	if _, err := c.ExecContext(ctx, "COMMIT"); err != nil {
		return nil, err
	}
	commit = true
	if _, err := c.ExecContext(ctx, "DETACH DATABASE src"); err != nil {
		return nil, err
	}
	return append(drops, more...), nil
}

func tableNames() []string {
	var out []string
	for _, tp := range opencodeTables {
		out = append(out, tp.table)
	}
	return out
}

// diffTable fills temp.chg_TABLE with the rowids of src.TABLE whose row is
// new or differs from main.TABLE's in any column's value or type, and
// temp.del_TABLE with those main holds and src does not. It returns how
// many rows differ in all. With cand non-nil only the rows with those
// rowids are compared (in either file).
func diffTable(ctx context.Context, c *sql.Conn, table string, cand []int64) (int64, error) {
	cols, err := queryStrings(ctx, c, "SELECT name FROM pragma_table_info(?, 'main')", table)
	if err != nil || len(cols) == 0 {
		return 0, fmt.Errorf("columns of %s: %v", table, err)
	}
	var differ []string
	for _, col := range cols {
		q := `"` + col + `"`
		differ = append(differ, fmt.Sprintf(`NOT (f.%s IS t.%s COLLATE BINARY AND typeof(f.%s) = typeof(t.%s))`, q, q, q, q))
	}
	stmts := []string{
		`CREATE TEMP TABLE "chg_` + table + `" (r INTEGER PRIMARY KEY)`,
		`CREATE TEMP TABLE "del_` + table + `" (r INTEGER PRIMARY KEY)`,
		`INSERT INTO temp."chg_` + table + `" (r) SELECT f.rowid FROM src."` + table + `" f LEFT JOIN main."` + table + `" t ON t.rowid = f.rowid WHERE t.rowid IS NULL OR ` + strings.Join(differ, " OR "),
		`INSERT INTO temp."del_` + table + `" (r) SELECT rowid FROM main."` + table + `" EXCEPT SELECT rowid FROM src."` + table + `"`,
	}
	var args []any
	if cand != nil {
		ids, err := json.Marshal(cand)
		if err != nil {
			return 0, err
		}
		args = []any{string(ids)}
		stmts = []string{
			stmts[0], stmts[1],
			`CREATE TEMP TABLE "cand_` + table + `" (r INTEGER PRIMARY KEY)`,
			`INSERT OR IGNORE INTO temp."cand_` + table + `" (r) SELECT value FROM json_each(?)`,
			`INSERT INTO temp."chg_` + table + `" (r) SELECT f.rowid FROM temp."cand_` + table + `" k CROSS JOIN src."` + table + `" f ON f.rowid = k.r LEFT JOIN main."` + table + `" t ON t.rowid = f.rowid WHERE t.rowid IS NULL OR ` + strings.Join(differ, " OR "),
			`INSERT INTO temp."del_` + table + `" (r) SELECT k.r FROM temp."cand_` + table + `" k WHERE EXISTS (SELECT 1 FROM main."` + table + `" t WHERE t.rowid = k.r) AND NOT EXISTS (SELECT 1 FROM src."` + table + `" f WHERE f.rowid = k.r)`,
		}
	}
	var n int64
	for _, s := range stmts {
		var a []any
		if strings.Contains(s, "json_each(?)") {
			a = args
		}
		res, err := c.ExecContext(ctx, s, a...)
		if err != nil {
			return 0, fmt.Errorf("compare %s: %w", table, err)
		}
		if strings.HasPrefix(s, `INSERT INTO temp."chg_`) || strings.HasPrefix(s, `INSERT INTO temp."del_`) {
			k, _ := res.RowsAffected()
			n += k
		}
	}
	return n, nil
}

// foldWAL checkpoints a private copy's WAL into it and leaves WAL mode.
func foldWAL(ctx context.Context, path string) error {
	db, c, err := openSQLite(ctx, path)
	if err != nil {
		return err
	}
	defer db.Close()
	defer c.Close()
	if _, err := c.ExecContext(ctx, "PRAGMA wal_checkpoint(TRUNCATE)"); err != nil {
		return fmt.Errorf("fold in the WAL: %w", err)
	}
	if _, err := c.ExecContext(ctx, "PRAGMA journal_mode=DELETE"); err != nil {
		return fmt.Errorf("leave WAL mode: %w", err)
	}
	return nil
}

// sameAsTrusted is opencode.db's Rule.Unchanged: whether the turn's file
// (with no -wal beside it) is byte for byte the trusted copy the last
// reset wrote, so that it can be carried as it is (the proof is the bytes,
// not metadata the cage controls).
func sameAsTrusted(fd, walFd int, state string) bool {
	if walFd >= 0 {
		return false
	}
	// A hot journal: an update was interrupted, and SQLite rolls it
	// back when the update opens the trusted copy. A patch mark: an
	// in-place update was (opencode_dbpatch.go).
	for _, n := range []string{trustedDB + "-journal", patchMark} {
		if _, err := os.Lstat(filepath.Join(state, n)); !errors.Is(err, os.ErrNotExist) {
			return false
		}
	}
	t, err := os.Open(filepath.Join(state, trustedDB))
	if err != nil {
		return false
	}
	defer t.Close()
	f, err := os.OpenFile("/proc/self/fd/"+strconv.Itoa(fd), os.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY, 0)
	if err != nil {
		return false
	}
	defer f.Close()
	var fst, pst, tst unix.Stat_t
	if unix.Fstat(int(f.Fd()), &fst) != nil || unix.Fstat(fd, &pst) != nil || unix.Fstat(int(t.Fd()), &tst) != nil ||
		fst.Ino != pst.Ino || fst.Dev != pst.Dev || fst.Mode&unix.S_IFMT != unix.S_IFREG || tst.Mode&unix.S_IFMT != unix.S_IFREG ||
		fst.Size != tst.Size {
		return false
	}
	a, b := make([]byte, 1<<20), make([]byte, 1<<20)
	for {
		n, err := io.ReadFull(f, a)
		m, err2 := io.ReadFull(t, b[:n])
		if m != n || !bytes.Equal(a[:n], b[:n]) {
			return false
		}
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			// Both at their end: the sizes were equal.
			_, err3 := t.Read(b[:1])
			return err2 == nil && err3 == io.EOF
		}
		if err != nil || err2 != nil {
			return false
		}
	}
}

func syncFile(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}
