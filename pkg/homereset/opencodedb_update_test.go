package homereset

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

// The in-place update of a kept opencode.db (pkg/profile
// opencode_dbupdate.go): from the second reset of a task on, the turn's file
// is compared row by row with the trusted copy the last reset kept, and only
// changed rows are filtered into it. These tests plant each way a turn could
// try to carry something through that update, check it is really there
// before the reset (the control), and check the update either rebuilt it
// away or failed closed, and that it was the update (not a full rebuild)
// that ran.

// updateTask returns a task whose HOME holds the fixture's opencode.db as
// the first reset wrote it (so a trusted copy exists), and the trusted
// copy's inode.
func updateTask(t *testing.T) (Task, string, uint64) {
	t.Helper()
	task := newTask(t, "opencode", "shell")
	ctx := context.Background()
	_, err := Bootstrap(ctx, task)
	assert.NilError(t, err)
	home := HomeDir(task.Root)
	db := newOpencodeDB(t, filepath.Join(home, ocDB), false)
	assert.NilError(t, db.Close())
	_, err = Reset(ctx, ResetInput{Task: task})
	assert.NilError(t, err)
	_, err = Cleanup(ctx, task.Root)
	assert.NilError(t, err)
	return task, filepath.Join(home, ocDB), trustedIno(t, task)
}

func trustedIno(t *testing.T, task Task) uint64 {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(task.Root, metaName, dbStateName, "*", "trusted.db"))
	assert.NilError(t, err)
	assert.Equal(t, len(m), 1, "no trusted copy kept")
	st, err := os.Stat(m[0])
	assert.NilError(t, err)
	sys := st.Sys().(*syscall.Stat_t)
	assert.Equal(t, sys.Uid, uint32(0))
	return sys.Ino
}

// assertUpdated asserts the last reset updated the trusted copy in place
// (the same inode) rather than rebuilding it.
func assertUpdated(t *testing.T, task Task, ino uint64) {
	t.Helper()
	assert.Equal(t, trustedIno(t, task), ino, "the reset rebuilt the database in full instead of updating it")
}

func openRW(t *testing.T, path string) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path)
	assert.NilError(t, err)
	db.SetMaxOpenConns(1)
	t.Cleanup(func() { db.Close() })
	return db
}

// dumpRows is every kept table's rows in id order, all columns, with types.
func dumpRows(t *testing.T, path string) string {
	t.Helper()
	db := readDB(t, path)
	var b strings.Builder
	for _, table := range []string{"migration", "project", "session", "message", "part", "todo"} {
		rows, err := db.Query(`SELECT * FROM "` + table + `" ORDER BY 1, 2`)
		assert.NilError(t, err)
		cols, _ := rows.Columns()
		for rows.Next() {
			v := make([]any, len(cols))
			p := make([]any, len(cols))
			for i := range v {
				p[i] = &v[i]
			}
			assert.NilError(t, rows.Scan(p...))
			fmt.Fprintf(&b, "%s:", table)
			for _, x := range v {
				fmt.Fprintf(&b, " %T=%v", x, x)
			}
			b.WriteString("\n")
		}
		assert.NilError(t, rows.Err())
		rows.Close()
	}
	return b.String()
}

// TestOpencodeDBUpdateEqualsRebuild: a turn that edits, adds and deletes
// rows and arms the database (hostileRows: accounts, credentials, allow
// rules, a trigger, a view, an extra table and index, project commands)
// and writes rows whose pointers must be pinned or dropped. The update
// gives exactly the rows a full rebuild of the same file gives (the full
// rebuild of a fresh task), reports the same drops as the dry run (a full
// rebuild), and holds nothing the hostile rows added.
func TestOpencodeDBUpdateEqualsRebuild(t *testing.T) {
	task, path, ino := updateTask(t)
	ctx := context.Background()
	db := openRW(t, path)
	for _, q := range append(append([]string{}, hostileRows...),
		`UPDATE session SET directory = '/tmp/evil', path = 'evil'`,
		`UPDATE part SET data = '{"type":"text","text":"edited","evil":1}' WHERE id = 'prt_3'`,
		`DELETE FROM part WHERE id = 'prt_2'`,
		`INSERT INTO message VALUES ('msg_9', '`+ocSession+`', 9, 9, '{"role":"assistant","path":{"cwd":"/tmp","root":"/tmp"},"agent":"build"}')`,
		`INSERT INTO part VALUES ('prt_9', 'msg_9', '`+ocSession+`', 9, 9, '{"type":"file","mime":"text/plain","url":"http://canary.invalid/x"}')`,
		`INSERT INTO part VALUES ('prt_10', 'msg_9', '`+ocSession+`', 9, 9, '{"type":"text","text":"kept"}')`,
		`INSERT INTO part VALUES ('prt_11', 'msg_gone', '`+ocSession+`', 9, 9, '{"type":"text","text":"orphan"}')`,
		`INSERT INTO message VALUES ('msg_10', '`+ocSession+`', 10, 10, '{"role":"system"}')`,
		`INSERT INTO part VALUES ('prt_12', 'msg_10', '`+ocSession+`', 9, 9, '{"type":"text","text":"of a dropped message"}')`,
	) {
		mustExec(t, db, q)
	}
	assert.NilError(t, db.Close())
	turnFile, err := os.ReadFile(path)
	assert.NilError(t, err)

	dry, err := Reset(ctx, ResetInput{Task: task, DryRun: true})
	assert.NilError(t, err)
	rep, err := Reset(ctx, ResetInput{Task: task})
	assert.NilError(t, err)
	assertUpdated(t, task, ino)
	assert.DeepEqual(t, dry.Dropped, rep.Dropped)
	got := dumpRows(t, path)
	assert.Assert(t, strings.Contains(got, "kept") && !strings.Contains(got, "orphan") && !strings.Contains(got, "of a dropped message") &&
		!strings.Contains(got, "canary") && !strings.Contains(got, "/tmp") && !strings.Contains(got, `"evil"`), got)

	// The same file rebuilt in full, in a task without a trusted copy.
	fresh := newTask(t, "opencode", "shell")
	_, err = Bootstrap(ctx, fresh)
	assert.NilError(t, err)
	fpath := filepath.Join(HomeDir(fresh.Root), ocDB)
	assert.NilError(t, os.MkdirAll(filepath.Dir(fpath), 0o755))
	assert.NilError(t, os.WriteFile(fpath, turnFile, 0o600))
	full, err := Reset(ctx, ResetInput{Task: fresh})
	assert.NilError(t, err)
	assert.DeepEqual(t, full.Dropped, rep.Dropped)
	assert.Equal(t, dumpRows(t, fpath), got)

	// A second update of an untouched file changes nothing.
	before, err := os.ReadFile(path)
	assert.NilError(t, err)
	rep, err = Reset(ctx, ResetInput{Task: task})
	assert.NilError(t, err)
	assert.Equal(t, len(rep.Dropped), 0)
	assert.Assert(t, is.Contains(rep.Kept, ocDB), "an untouched file is carried as it is: %+v", rep)
	after, err := os.ReadFile(path)
	assert.NilError(t, err)
	assert.Assert(t, bytes.Equal(before, after))
	assertUpdated(t, task, ino)
}

// fileHas reports whether the file's bytes hold marker.
func fileHas(t *testing.T, path, marker string) bool {
	t.Helper()
	b, err := os.ReadFile(path)
	assert.NilError(t, err)
	return bytes.Contains(b, []byte(marker))
}

func pragma(t *testing.T, path, p string) string {
	t.Helper()
	var v string
	assert.NilError(t, readDB(t, path).QueryRow("PRAGMA "+p).Scan(&v))
	return v
}

// TestOpencodeDBUpdateSurvivalTricks: each SQLite file-format trick a turn
// could use to carry bytes or SQL past the in-place update, planted in the
// kept file the last reset wrote. Each is checked present before the reset
// and gone after it (or the reset fails closed, naming the file).
func TestOpencodeDBUpdateSurvivalTricks(t *testing.T) {
	const marker = "PLANTED-7f3a9c"
	for _, tc := range []struct {
		name    string
		plant   func(t *testing.T, path string)
		control func(t *testing.T, path string) bool
		check   func(t *testing.T, path string)
		refuse  string // the reset fails with this
		dropped string // the file is dropped with this reason
	}{{
		name: "trigger",
		plant: func(t *testing.T, path string) {
			mustExec(t, openRW(t, path), `CREATE TRIGGER evil AFTER INSERT ON part BEGIN INSERT INTO account_state VALUES (9, '`+marker+`', 'o'); END`)
		},
		control: func(t *testing.T, path string) bool {
			return count(t, readDB(t, path), `SELECT count(*) FROM sqlite_master WHERE type = 'trigger'`) == 1
		},
		check: func(t *testing.T, path string) {
			assert.Equal(t, count(t, readDB(t, path), `SELECT count(*) FROM sqlite_master WHERE type = 'trigger'`), 0)
		},
	}, {
		name: "view",
		plant: func(t *testing.T, path string) {
			mustExec(t, openRW(t, path), `CREATE VIEW evil AS SELECT '`+marker+`' AS x`)
		},
		control: func(t *testing.T, path string) bool {
			return count(t, readDB(t, path), `SELECT count(*) FROM sqlite_master WHERE type = 'view'`) == 1
		},
		check: func(t *testing.T, path string) {
			assert.Equal(t, count(t, readDB(t, path), `SELECT count(*) FROM sqlite_master WHERE type = 'view'`), 0)
		},
	}, {
		name: "extra table and index",
		plant: func(t *testing.T, path string) {
			db := openRW(t, path)
			mustExec(t, db, `CREATE TABLE evil (x)`)
			mustExec(t, db, `INSERT INTO evil VALUES ('`+marker+`')`)
			mustExec(t, db, `CREATE INDEX evil_idx ON part (time_created, data)`)
		},
		control: func(t *testing.T, path string) bool {
			return count(t, readDB(t, path), `SELECT count(*) FROM evil`) == 1
		},
		check: func(t *testing.T, path string) {
			assert.Equal(t, count(t, readDB(t, path), `SELECT count(*) FROM sqlite_master WHERE name LIKE 'evil%'`), 0)
		},
	}, {
		name: "sqlite_master edited",
		plant: func(t *testing.T, path string) {
			db := openRW(t, path)
			mustExec(t, db, `PRAGMA writable_schema=ON`)
			mustExec(t, db, `UPDATE sqlite_master SET sql = replace(sql, 'CREATE TABLE', 'CREATE TABLE /* `+marker+` */') WHERE name = 'session_share'`)
		},
		control: func(t *testing.T, path string) bool {
			return count(t, readDB(t, path), `SELECT count(*) FROM sqlite_master WHERE sql LIKE '%`+marker+`%'`) == 1
		},
		check: func(t *testing.T, path string) {},
	}, {
		name: "a kept table's schema changed",
		plant: func(t *testing.T, path string) {
			mustExec(t, openRW(t, path), `ALTER TABLE part ADD COLUMN evil TEXT DEFAULT '`+marker+`'`)
		},
		control: func(t *testing.T, path string) bool {
			return count(t, readDB(t, path), `SELECT count(*) FROM pragma_table_info('part') WHERE name = 'evil'`) == 1
		},
		refuse: `table "part" does not match`,
	}, {
		name: "free pages",
		plant: func(t *testing.T, path string) {
			db := openRW(t, path)
			mustExec(t, db, `PRAGMA secure_delete=OFF`)
			mustExec(t, db, `CREATE TABLE junk (x)`)
			for i := 0; i < 50; i++ {
				mustExec(t, db, `INSERT INTO junk VALUES (?)`, strings.Repeat(marker, 300))
			}
			mustExec(t, db, `DROP TABLE junk`)
		},
		control: func(t *testing.T, path string) bool {
			return pragma(t, path, "freelist_count") != "0" && fileHas(t, path, marker)
		},
		check: func(t *testing.T, path string) {
			assert.Equal(t, pragma(t, path, "freelist_count"), "0")
		},
	}, {
		name: "unused space in a page",
		plant: func(t *testing.T, path string) {
			db := openRW(t, path)
			mustExec(t, db, `PRAGMA secure_delete=OFF`)
			mustExec(t, db, `INSERT INTO part VALUES ('prt_x', 'msg_2', '`+ocSession+`', 5, 5, '{"type":"text","text":"`+marker+`"}')`)
			mustExec(t, db, `DELETE FROM part WHERE id = 'prt_x'`)
		},
		control: func(t *testing.T, path string) bool {
			return fileHas(t, path, marker) && count(t, readDB(t, path), `SELECT count(*) FROM part WHERE data LIKE '%`+marker+`%'`) == 0
		},
		check: func(t *testing.T, path string) {},
	}, {
		name: "a -wal beside it",
		plant: func(t *testing.T, path string) {
			db := openRW(t, path)
			mustExec(t, db, `PRAGMA journal_mode=WAL`)
			assert.NilError(t, db.Close())
			base, err := os.ReadFile(path)
			assert.NilError(t, err)
			db = openRW(t, path)
			mustExec(t, db, `PRAGMA wal_autocheckpoint=0`)
			mustExec(t, db, `INSERT INTO part VALUES ('prt_w', 'msg_2', '`+ocSession+`', 5, 5, '{"type":"text","text":"from the wal"}')`)
			mustExec(t, db, `CREATE TRIGGER evil AFTER INSERT ON part BEGIN SELECT '`+marker+`'; END`)
			wal, err := os.ReadFile(path + "-wal")
			assert.NilError(t, err)
			assert.NilError(t, db.Close())
			// What a killed opencode leaves: the file and its WAL.
			assert.NilError(t, os.WriteFile(path, base, 0o600))
			assert.NilError(t, os.WriteFile(path+"-wal", wal, 0o600))
		},
		control: func(t *testing.T, path string) bool {
			return fileHas(t, path+"-wal", marker) && !fileHas(t, path, marker)
		},
		check: func(t *testing.T, path string) {
			db := readDB(t, path)
			assert.Equal(t, count(t, db, `SELECT count(*) FROM part WHERE data LIKE '%from the wal%'`), 1)
			assert.Equal(t, count(t, db, `SELECT count(*) FROM sqlite_master WHERE type = 'trigger'`), 0)
			for _, s := range []string{"-wal", "-shm"} {
				_, err := os.Lstat(path + s)
				assert.Assert(t, os.IsNotExist(err), s)
			}
		},
	}, {
		name: "header fields",
		plant: func(t *testing.T, path string) {
			db := openRW(t, path)
			mustExec(t, db, `PRAGMA application_id = 1095782465`)
			mustExec(t, db, `PRAGMA user_version = 77`)
			mustExec(t, db, `PRAGMA page_size = 8192`)
			mustExec(t, db, `VACUUM`)
		},
		control: func(t *testing.T, path string) bool {
			return pragma(t, path, "application_id") != "0" && pragma(t, path, "user_version") == "77" && pragma(t, path, "page_size") == "8192"
		},
		check: func(t *testing.T, path string) {
			assert.Equal(t, pragma(t, path, "application_id"), "0")
			assert.Equal(t, pragma(t, path, "user_version"), "0")
			assert.Equal(t, pragma(t, path, "page_size"), "4096")
		},
	}, {
		// Same size, mtime set back: only the bytes tell it from the
		// file the last reset wrote (so it is not carried as it is).
		name: "header bytes changed in place",
		plant: func(t *testing.T, path string) {
			st, err := os.Stat(path)
			assert.NilError(t, err)
			f, err := os.OpenFile(path, os.O_WRONLY, 0)
			assert.NilError(t, err)
			_, err = f.WriteAt([]byte(marker), 72) // the header's reserved bytes
			assert.NilError(t, err)
			assert.NilError(t, f.Close())
			assert.NilError(t, os.Chtimes(path, st.ModTime(), st.ModTime()))
		},
		control: func(t *testing.T, path string) bool {
			return fileHas(t, path, marker)
		},
		check: func(t *testing.T, path string) {},
	}, {
		name: "text encoding",
		plant: func(t *testing.T, path string) {
			tmp := path + ".utf16"
			db := openRW(t, tmp)
			mustExec(t, db, `PRAGMA encoding = 'UTF-16le'`)
			for _, o := range mustPinned(t).objects {
				if o.sql != "" {
					mustExec(t, db, o.sql)
				}
			}
			// SQLite attaches no database of another encoding: copy the rows.
			old := readDB(t, path)
			for _, table := range []string{"migration", "project", "session", "message", "part", "todo"} {
				rows, err := old.Query(`SELECT * FROM "` + table + `"`)
				assert.NilError(t, err)
				cols, _ := rows.Columns()
				for rows.Next() {
					v := make([]any, len(cols))
					p := make([]any, len(cols))
					for i := range v {
						p[i] = &v[i]
					}
					assert.NilError(t, rows.Scan(p...))
					mustExec(t, db, `INSERT INTO "`+table+`" VALUES (?`+strings.Repeat(", ?", len(cols)-1)+`)`, v...)
				}
				rows.Close()
			}
			mustExec(t, db, `INSERT INTO part VALUES ('prt_u', 'msg_2', '`+ocSession+`', 5, 5, '{"type":"text","text":"`+marker+`"}')`)
			assert.NilError(t, db.Close())
			assert.NilError(t, os.Rename(tmp, path))
		},
		control: func(t *testing.T, path string) bool {
			return pragma(t, path, "encoding") == "UTF-16le"
		},
		// Neither the update nor a full rebuild attaches it: dropped.
		dropped: "cannot be rebuilt",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			task, path, ino := updateTask(t)
			want := dumpRows(t, path)
			tc.plant(t, path)
			assert.Assert(t, tc.control(t, path), "the trick is not in place before the reset")
			rep, err := Reset(context.Background(), ResetInput{Task: task})
			if tc.refuse != "" {
				assert.ErrorContains(t, err, tc.refuse)
				assert.ErrorContains(t, err, ocDB)
				return
			}
			assert.NilError(t, err)
			if tc.dropped != "" {
				assert.Assert(t, hasDropReason(rep, tc.dropped), "%+v", rep.Dropped)
				_, err := os.Lstat(path)
				assert.Assert(t, os.IsNotExist(err))
				assertUpdated(t, task, ino) // the trusted copy is left as it was
				return
			}
			assertUpdated(t, task, ino)
			assert.Assert(t, slices.ContainsFunc(rep.Rebuilt, func(s string) bool { return strings.HasPrefix(s, ocDB) }), "carried as it is: %+v", rep)
			assert.Assert(t, !fileHas(t, path, marker), "the planted bytes survived the reset")
			assert.Equal(t, renderSchema(dumpSchema(t, path, pinnedOpencode)), opencodeSchemaText)
			assert.Equal(t, pragma(t, path, "journal_mode"), "delete")
			assert.Equal(t, pragma(t, path, "freelist_count"), "0")
			assert.Equal(t, pragma(t, path, "integrity_check"), "ok")
			if tc.name != "a -wal beside it" {
				assert.Equal(t, dumpRows(t, path), want, "the kept rows changed")
			}
			tc.check(t, path)
			if tc.name == "sqlite_master edited" {
				assert.Assert(t, hasDrop(rep, "table session_share", 0), "%+v", rep.Dropped)
			}
		})
	}
}

func hasDropReason(rep *Report, reason string) bool {
	for _, d := range rep.Dropped {
		if d.Path == ocDB && strings.Contains(d.Reason, reason) {
			return true
		}
	}
	return false
}

// TestOpencodeDBUpdateTrustedCopyDamaged: a trusted copy SQLite cannot use
// (zeroed, as a crash before its data reached the disk could leave it)
// falls back to the full rebuild, which replaces it; a journal beside it
// (an interrupted update) keeps even an untouched file from being carried
// as it is.
func TestOpencodeDBUpdateTrustedCopyDamaged(t *testing.T) {
	ctx := context.Background()
	t.Run("zeroed", func(t *testing.T) {
		task, path, ino := updateTask(t)
		want := dumpRows(t, path)
		m, _ := filepath.Glob(filepath.Join(task.Root, metaName, dbStateName, "*", "trusted.db"))
		st, err := os.Stat(m[0])
		assert.NilError(t, err)
		assert.NilError(t, os.WriteFile(m[0], make([]byte, st.Size()), 0o644))
		rep, err := Reset(ctx, ResetInput{Task: task})
		assert.NilError(t, err)
		assert.Assert(t, slices.ContainsFunc(rep.Rebuilt, func(s string) bool { return strings.HasPrefix(s, ocDB) }), "%+v", rep)
		assert.Equal(t, dumpRows(t, path), want)
		assert.Assert(t, trustedIno(t, task) != ino, "the damaged trusted copy was kept")
		checkRebuilt(t, HomeDir(task.Root))
	})
	t.Run("journal beside it", func(t *testing.T) {
		task, path, _ := updateTask(t)
		want := dumpRows(t, path)
		m, _ := filepath.Glob(filepath.Join(task.Root, metaName, dbStateName, "*", "trusted.db"))
		assert.NilError(t, os.WriteFile(m[0]+"-journal", []byte("not a journal"), 0o600))
		rep, err := Reset(ctx, ResetInput{Task: task})
		assert.NilError(t, err)
		assert.Assert(t, !slices.Contains(rep.Kept, ocDB), "%+v", rep)
		assert.Equal(t, dumpRows(t, path), want)
	})
}

// TestOpencodeDBUpdateOverflowEdit: the update compares only the rows on
// pages the turn changed (pkg/profile opencode_dbpages.go). A turn that
// edits only a byte of a long row's overflow page — its leaf page stays
// byte for byte the trusted copy's — turns a file part's data: URL into an
// http: one. The update finds the row and drops it as the full rebuild of
// the same file does, with the same rows and drops.
func TestOpencodeDBUpdateOverflowEdit(t *testing.T) {
	task, path, ino := updateTask(t)
	ctx := context.Background()
	const url = "data:text/plain,OVERFLOW-7d1e"
	mustExec(t, openRW(t, path), `INSERT INTO part VALUES ('prt_long', 'msg_2', '`+ocSession+`', 5, 5, ?)`,
		`{"type":"file","mime":"text/plain","filename":"`+strings.Repeat("f", 6000)+`","url":"`+url+`"}`)
	_, err := Reset(ctx, ResetInput{Task: task})
	assert.NilError(t, err)
	_, err = Cleanup(ctx, task.Root)
	assert.NilError(t, err)
	assertUpdated(t, task, ino)
	assert.Assert(t, strings.Contains(dumpRows(t, path), url), "the long file part is kept")

	data, err := os.ReadFile(path)
	assert.NilError(t, err)
	at := bytes.Index(data, []byte(url))
	assert.Assert(t, at > 0)
	pageSize := 4096
	assert.Equal(t, pragma(t, path, "page_size"), "4096")
	page := data[at/pageSize*pageSize:]
	// Positive control: the URL is on an overflow page (a 4-byte pointer
	// to the next one, 0 for the last), not on a b-tree page.
	assert.Assert(t, !slices.Contains([]byte{0x02, 0x05, 0x0a, 0x0d}, page[0]) && bytes.Equal(page[:4], []byte{0, 0, 0, 0}), "% x", page[:8])
	copy(data[at:], "http:")
	assert.NilError(t, os.WriteFile(path, data, 0o600))
	turnFile := slices.Clone(data)

	rep, err := Reset(ctx, ResetInput{Task: task})
	assert.NilError(t, err)
	assertUpdated(t, task, ino)
	got := dumpRows(t, path)
	assert.Assert(t, !strings.Contains(got, "OVERFLOW-7d1e") && !strings.Contains(got, "prt_long"), got)
	assert.Assert(t, hasDropReason(rep, "opencode hands the URL to the model SDK, which fetches it (http:, file:)"), "%+v", rep.Dropped)

	fresh := newTask(t, "opencode", "shell")
	_, err = Bootstrap(ctx, fresh)
	assert.NilError(t, err)
	fpath := filepath.Join(HomeDir(fresh.Root), ocDB)
	assert.NilError(t, os.MkdirAll(filepath.Dir(fpath), 0o755))
	assert.NilError(t, os.WriteFile(fpath, turnFile, 0o600))
	full, err := Reset(ctx, ResetInput{Task: fresh})
	assert.NilError(t, err)
	assert.DeepEqual(t, full.Dropped, rep.Dropped)
	assert.Equal(t, dumpRows(t, fpath), got)
}

// TestOpencodeDBUpdateRewritesInPlace: a changed file is rewritten in its
// own inode to the trusted copy's bytes (no 100 MiB copy); what the cage
// set on that inode besides its bytes — extended attributes, owner, mode —
// does not survive. A file with a second link is never rewritten (the
// other name would change too): the trusted copy is copied as before.
func TestOpencodeDBUpdateRewritesInPlace(t *testing.T) {
	task, path, ino := updateTask(t)
	ctx := context.Background()
	mustExec(t, openRW(t, path), `UPDATE part SET data = '{"type":"text","text":"edited"}' WHERE id = 'prt_3'`)
	assert.NilError(t, unix.Setxattr(path, "user.shrooms-planted", []byte("PLANTED-xattr"), 0))
	assert.NilError(t, os.Chmod(path, 0o666))
	// Positive control: the attribute is there.
	buf := make([]byte, 64)
	n, err := unix.Getxattr(path, "user.shrooms-planted", buf)
	assert.NilError(t, err)
	assert.Equal(t, string(buf[:n]), "PLANTED-xattr")
	turnIno := fileIno(t, path)

	_, err = Reset(ctx, ResetInput{Task: task})
	assert.NilError(t, err)
	assertUpdated(t, task, ino)
	assert.Equal(t, fileIno(t, path), turnIno, "the turn's inode was not rewritten in place")
	trusted, err := filepath.Glob(filepath.Join(task.Root, metaName, dbStateName, "*", "trusted.db"))
	assert.NilError(t, err)
	want, err := os.ReadFile(trusted[0])
	assert.NilError(t, err)
	got, err := os.ReadFile(path)
	assert.NilError(t, err)
	assert.Assert(t, bytes.Equal(got, want), "the rewritten file is not the trusted copy's bytes")
	assert.Assert(t, strings.Contains(dumpRows(t, path), "edited"))
	n, err = unix.Listxattr(path, buf)
	assert.NilError(t, err)
	assert.Equal(t, n, 0, "extended attributes survived: %q", buf[:n])
	st, err := os.Stat(path)
	assert.NilError(t, err)
	assert.Equal(t, st.Mode().Perm(), os.FileMode(0o600))
	_, err = os.Stat(filepath.Join(filepath.Dir(trusted[0]), "patching"))
	assert.Assert(t, os.IsNotExist(err), "the patch mark is left")
	_, err = Cleanup(ctx, task.Root)
	assert.NilError(t, err)

	// A -wal holding the turn's change (opencode leaves one): folded
	// into the same inode, then rewritten in place.
	db := openRW(t, path)
	mustExec(t, db, "PRAGMA journal_mode=WAL")
	mustExec(t, db, "PRAGMA wal_autocheckpoint=0")
	mustExec(t, db, `UPDATE part SET data = '{"type":"text","text":"edited in the wal"}' WHERE id = 'prt_3'`)
	_, err = os.Stat(path + "-wal")
	assert.NilError(t, err, "positive control: the change is in a -wal")
	assert.Assert(t, !fileHas(t, path, "edited in the wal"), "positive control: not in the file itself")
	assert.NilError(t, db.Close())
	// (Closing the last connection checkpoints; plant the -wal again.)
	db = openRW(t, path)
	mustExec(t, db, "PRAGMA wal_autocheckpoint=0")
	mustExec(t, db, `UPDATE part SET data = '{"type":"text","text":"edited in the wal again"}' WHERE id = 'prt_3'`)
	walBytes, err := os.ReadFile(path + "-wal")
	assert.NilError(t, err)
	mainBytes, err := os.ReadFile(path)
	assert.NilError(t, err)
	assert.NilError(t, db.Close())
	assert.NilError(t, os.WriteFile(path, mainBytes, 0o600))
	assert.NilError(t, os.WriteFile(path+"-wal", walBytes, 0o600))
	assert.Assert(t, !fileHas(t, path, "edited in the wal again"), "positive control: only in the -wal")
	turnIno = fileIno(t, path)
	rep, err := Reset(ctx, ResetInput{Task: task})
	assert.NilError(t, err)
	assert.Assert(t, is.Contains(rep.Rebuilt, ocDB+" (with -wal folded in)"), "%+v", rep.Rebuilt)
	assert.Equal(t, fileIno(t, path), turnIno, "the turn's inode was not rewritten in place")
	assert.Assert(t, strings.Contains(dumpRows(t, path), "edited in the wal again"))
	want, err = os.ReadFile(trusted[0])
	assert.NilError(t, err)
	got, err = os.ReadFile(path)
	assert.NilError(t, err)
	assert.Assert(t, bytes.Equal(got, want), "the rewritten file is not the trusted copy's bytes")
	_, err = Cleanup(ctx, task.Root)
	assert.NilError(t, err)

	// A second link: copied, the linked inode left as the turn wrote it.
	mustExec(t, openRW(t, path), `UPDATE part SET data = '{"type":"text","text":"edited again"}' WHERE id = 'prt_3'`)
	assert.NilError(t, os.Link(path, filepath.Join(filepath.Dir(path), "second-link")))
	turn, err := os.ReadFile(path)
	assert.NilError(t, err)
	keep, err := os.Open(path)
	assert.NilError(t, err)
	defer keep.Close()
	_, err = Reset(ctx, ResetInput{Task: task})
	assert.NilError(t, err)
	assert.Assert(t, fileIno(t, path) != turnIno, "a file with two links was rewritten in place")
	still := make([]byte, len(turn)+1)
	n, _ = keep.ReadAt(still, 0)
	assert.Assert(t, bytes.Equal(still[:n], turn), "the other link's bytes changed")
	assert.Assert(t, strings.Contains(dumpRows(t, path), "edited again"))
}

func fileIno(t *testing.T, path string) uint64 {
	t.Helper()
	st, err := os.Stat(path)
	assert.NilError(t, err)
	return st.Sys().(*syscall.Stat_t).Ino
}

// TestOpencodeDBCarriedLosesXattrs: an untouched file is carried as it is
// (its inode linked), but not the extended attributes the cage set on it.
func TestOpencodeDBCarriedLosesXattrs(t *testing.T) {
	task, path, _ := updateTask(t)
	assert.NilError(t, unix.Setxattr(path, "user.shrooms-planted", []byte("PLANTED-xattr"), 0))
	buf := make([]byte, 64)
	n, err := unix.Getxattr(path, "user.shrooms-planted", buf)
	assert.NilError(t, err, "positive control")
	assert.Equal(t, string(buf[:n]), "PLANTED-xattr")
	ino := fileIno(t, path)
	rep, err := Reset(context.Background(), ResetInput{Task: task})
	assert.NilError(t, err)
	assert.Assert(t, is.Contains(rep.Kept, ocDB), "carried as it is: %+v", rep)
	assert.Equal(t, fileIno(t, path), ino)
	n, err = unix.Listxattr(path, buf)
	assert.NilError(t, err)
	assert.Equal(t, n, 0, "extended attributes survived: %q", buf[:n])
}
