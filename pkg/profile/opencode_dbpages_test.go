package profile

import (
	"context"
	"database/sql"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
)

// pagesFixture writes a database like the fixture plus 300 parts, a third of
// them long enough for overflow chains, and returns its bytes.
func pagesFixture(t testing.TB) []byte {
	t.Helper()
	return pagesFixtureN(t, 300)
}

func pagesFixtureN(t testing.TB, parts int) []byte {
	t.Helper()
	p := filepath.Join(t.TempDir(), "seed.db")
	db := newOpencodeDB(t, p, false)
	long := strings.Repeat("lorem ipsum ", 1000)
	for i := 0; i < parts; i++ {
		text := fmt.Sprintf("part %d", i)
		if i%3 == 0 {
			text += long[:5000+i%300*7]
		}
		mustExec(t, db, `INSERT INTO part VALUES (?, 'msg_2', ?, 3, 3, ?)`, fmt.Sprintf("prt_l%03d", i), ocSession, `{"type":"text","text":"`+text+`"}`)
	}
	assert.NilError(t, db.Close())
	data, err := os.ReadFile(p)
	assert.NilError(t, err)
	return data
}

// pagesConn opens trusted as the update does, with turn attached as src.
func pagesConn(t testing.TB, trusted, turn string) *sql.Conn {
	t.Helper()
	c, err := attachTurn(t, trusted, turn)
	assert.NilError(t, err)
	return c
}

func attachTurn(t testing.TB, trusted, turn string) (*sql.Conn, error) {
	db, c, err := openSQLite(context.Background(), trusted)
	assert.NilError(t, err)
	t.Cleanup(func() { c.Close(); db.Close() })
	_, err = c.ExecContext(context.Background(), "ATTACH DATABASE ? AS src", "file:"+turn+"?mode=ro&immutable=1")
	return c, err
}

// differingRows are the rowids whose rows differ between the files, by
// comparing every row through SQLite (the update's fallback).
func differingRows(t testing.TB, trusted, turn string) map[string][]int64 {
	t.Helper()
	ctx := context.Background()
	c := pagesConn(t, trusted, turn)
	out := map[string][]int64{}
	for _, table := range append([]string{"migration"}, tableNames()...) {
		_, err := diffTable(ctx, c, table, nil)
		assert.NilError(t, err)
		for _, k := range []string{"chg_", "del_"} {
			rows, err := c.QueryContext(ctx, `SELECT r FROM temp."`+k+table+`"`)
			assert.NilError(t, err)
			for rows.Next() {
				var r int64
				assert.NilError(t, rows.Scan(&r))
				out[table] = append(out[table], r)
			}
			assert.NilError(t, rows.Close())
		}
	}
	return out
}

func candidateRows(t testing.TB, trusted, turn string) (map[string][]int64, error) {
	t.Helper()
	c := pagesConn(t, trusted, turn)
	return rowsOnChangedPages(context.Background(), c, turn, trusted, append([]string{"migration"}, tableNames()...))
}

// fileBytes addresses a database file's pages for the b-tree walk.
func filePage(data []byte) func(uint32) ([]byte, bool) {
	size := headerPageSize(data)
	return func(n uint32) ([]byte, bool) {
		if n == 0 || int(n)*size > len(data) {
			return nil, false
		}
		return data[int(n-1)*size : int(n)*size], true
	}
}

// longCell finds a part row with an overflow chain: its leaf page and the
// chain.
func longCell(t *testing.T, path string, data []byte) (uint32, leafCell) {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path+"?mode=ro")
	assert.NilError(t, err)
	defer db.Close()
	var root uint32
	assert.NilError(t, db.QueryRow(`SELECT rootpage FROM sqlite_master WHERE name = 'part'`).Scan(&root))
	page := filePage(data)
	var leaf uint32
	var cell leafCell
	err = walkTable(page, root, map[uint32]bool{}, func(pg uint32, p []byte, h int) error {
		cells, err := leafCells(p, h, headerPageSize(data)-int(data[20]), page)
		for _, c := range cells {
			if len(c.ovfl) > 0 && leaf == 0 {
				leaf, cell = pg, c
			}
		}
		return err
	})
	assert.NilError(t, err)
	assert.Assert(t, leaf != 0, "no overflow chain in the fixture")
	return leaf, cell
}

// TestChangedRowsCoverEveryChange: for each way a turn changes the
// database, every row that differs (compared row by row through SQLite) is
// among the rows the page comparison hands to that comparison, and for a
// small change those are few (the fast path is the one taken).
func TestChangedRowsCoverEveryChange(t *testing.T) {
	seed := pagesFixture(t)
	dir := t.TempDir()
	trusted := filepath.Join(dir, "trusted.db")
	assert.NilError(t, os.WriteFile(trusted, seed, 0o600))
	sqlChange := func(qs ...string) func(*testing.T, string) {
		return func(t *testing.T, p string) {
			db, err := sql.Open("sqlite", "file:"+p)
			assert.NilError(t, err)
			defer db.Close()
			for _, q := range qs {
				mustExec(t, db, q)
			}
		}
	}
	for _, tc := range []struct {
		name   string
		change func(*testing.T, string)
		few    bool
	}{
		{"update a short row", sqlChange(`UPDATE todo SET status = 'done'`), true},
		{"update a long row", sqlChange(`UPDATE part SET data = replace(data, 'ipsum', 'IPSUM') WHERE id = 'prt_l030'`), true},
		{"same-size tail of a long row", sqlChange(`UPDATE part SET data = substr(data, 1, length(data) - 6) || 'XYZ"}' || '' WHERE id = 'prt_l090'`), true},
		{"insert and delete", sqlChange(
			`INSERT INTO part VALUES ('prt_new', 'msg_2', '`+ocSession+`', 4, 4, '{"type":"text","text":"new"}')`,
			`DELETE FROM part WHERE id IN ('prt_l010', 'prt_l099', 'prt_1')`,
			`DELETE FROM message WHERE id = 'msg_1'`), true},
		{"rows moved by VACUUM", sqlChange(`DELETE FROM part WHERE id = 'prt_l150'`, `VACUUM`), false},
		{"a byte of an overflow page only", func(t *testing.T, p string) {
			data, err := os.ReadFile(p)
			assert.NilError(t, err)
			leaf, cell := longCell(t, p, data)
			size := headerPageSize(data)
			last := int(cell.ovfl[len(cell.ovfl)-1]-1) * size
			assert.Assert(t, data[last+4] >= 'a' && data[last+4] <= 'z' || data[last+4] == ' ', "not inside the text: %q", data[last+4])
			data[last+4] = 'Q'
			assert.NilError(t, os.WriteFile(p, data, 0o600))
			// Positive control: the leaf holding the row is
			// byte for byte trusted.db's.
			assert.DeepEqual(t, data[int(leaf-1)*size:int(leaf)*size], seed[int(leaf-1)*size:int(leaf)*size])
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			turn := filepath.Join(t.TempDir(), "turn.db")
			assert.NilError(t, os.WriteFile(turn, seed, 0o600))
			tc.change(t, turn)
			want := differingRows(t, trusted, turn)
			assert.Assert(t, len(want) > 0, "positive control: the change changed no row")
			got, err := candidateRows(t, trusted, turn)
			assert.NilError(t, err)
			total := 0
			for table, rows := range want {
				for _, r := range rows {
					assert.Assert(t, slices.Contains(got[table], r), "%s rowid %d differs but was not compared (candidates %v)", table, r, got[table])
				}
			}
			for _, rows := range got {
				total += len(rows)
			}
			if tc.few {
				// Whole leaves are compared: 8-30 short parts to a
				// leaf, and a delete rebalances neighbours.
				assert.Assert(t, total <= 100, "%d of ~310 rows compared for a small change", total)
			}
		})
	}
}

// TestChangedRowsMostlyChanged: a turn that moved most pages (VACUUM
// after deleting an early row), or rewrote most rows, makes the update
// give way to the full rebuild, which costs less then.
func TestChangedRowsMostlyChanged(t *testing.T) {
	seed := pagesFixtureN(t, 1200)
	assert.Assert(t, len(seed)/headerPageSize(seed) > 256, "positive control: past the size the rule applies from")
	dir := t.TempDir()
	trusted := filepath.Join(dir, "trusted.db")
	assert.NilError(t, os.WriteFile(trusted, seed, 0o600))
	turn := filepath.Join(dir, "turn.db")
	assert.NilError(t, os.WriteFile(turn, seed, 0o600))
	db, err := sql.Open("sqlite", "file:"+turn)
	assert.NilError(t, err)
	mustExec(t, db, `DELETE FROM part WHERE id = 'prt_l000'`)
	mustExec(t, db, `VACUUM`)
	assert.NilError(t, db.Close())
	_, err = candidateRows(t, trusted, turn)
	assert.ErrorIs(t, err, errMostlyChanged)

	// Most rows rewritten, their long values' overflow pages left as
	// they were: fewer than half the pages changed, most rows did.
	assert.NilError(t, os.WriteFile(turn, seed, 0o600))
	db, err = sql.Open("sqlite", "file:"+turn)
	assert.NilError(t, err)
	mustExec(t, db, `UPDATE part SET time_updated = 7 WHERE id LIKE 'prt_l%' AND rowid % 5 != 0`)
	assert.NilError(t, db.Close())
	d, err := comparePages(turn, trusted)
	assert.NilError(t, err, "positive control: fewer than half the pages changed")
	assert.Assert(t, len(d.changed) < int(d.nS)/2)
	d.close()
	_, err = candidateRows(t, trusted, turn)
	assert.ErrorIs(t, err, errMostlyChanged)
}

// TestChangedRowsRefusesOddFiles: a file whose page geometry differs, or a
// b-tree the walk does not accept, makes the update compare every row.
func TestChangedRowsRefusesOddFiles(t *testing.T) {
	seed := pagesFixture(t)
	dir := t.TempDir()
	trusted := filepath.Join(dir, "trusted.db")
	assert.NilError(t, os.WriteFile(trusted, seed, 0o600))
	turn := filepath.Join(dir, "turn.db")
	db, err := sql.Open("sqlite", "file:"+turn)
	assert.NilError(t, err)
	assert.NilError(t, os.WriteFile(turn, seed, 0o600))
	mustExec(t, db, "PRAGMA page_size=8192")
	mustExec(t, db, "VACUUM")
	assert.NilError(t, db.Close())
	_, err = candidateRows(t, trusted, turn)
	assert.ErrorContains(t, err, "page size")

	// A cycle: an interior page of part pointing at itself.
	data := slices.Clone(seed)
	var root uint32
	c := pagesConn(t, trusted, trusted)
	assert.NilError(t, c.QueryRowContext(context.Background(), `SELECT rootpage FROM sqlite_master WHERE name = 'part'`).Scan(&root))
	size := headerPageSize(data)
	pg := data[int(root-1)*size:]
	assert.Equal(t, pg[0], byte(pageInteriorTable), "positive control: part's root is an interior page")
	binary.BigEndian.PutUint32(pg[8:], root)
	assert.NilError(t, os.WriteFile(turn, data, 0o600))
	_, err = candidateRows(t, trusted, turn)
	assert.ErrorContains(t, err, "reached twice")
}

// FuzzChangedRows: whatever a turn's file holds, the page comparison never
// panics, and for a file SQLite finds intact it never misses a row that
// differs.
func FuzzChangedRows(f *testing.F) {
	seed := pagesFixture(f)
	dir := f.TempDir()
	trusted := filepath.Join(dir, "trusted.db")
	assert.NilError(f, os.WriteFile(trusted, seed, 0o600))
	f.Add(uint32(0), []byte{})
	f.Add(uint32(len(seed)-100), []byte("Q"))
	f.Add(uint32(4096*3+200), []byte{0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, at uint32, patch []byte) {
		data := slices.Clone(seed)
		if int(at) > len(data) || len(patch) > 4096 {
			return
		}
		data = append(data[:at], append(patch, data[min(len(data), int(at)+len(patch)):]...)...)
		turn := filepath.Join(t.TempDir(), "turn.db")
		assert.NilError(t, os.WriteFile(turn, data, 0o600))
		c, err := attachTurn(t, trusted, turn)
		var check string
		if err != nil || c.QueryRowContext(context.Background(), "PRAGMA src.quick_check(1)").Scan(&check) != nil || check != "ok" {
			// Not intact: only the walk itself is checked (the
			// update compares what SQLite reads of it).
			d, err := comparePages(turn, trusted)
			if err == nil {
				defer d.close()
				_, _ = d.changedRows([]string{"part"}, map[string]uint32{"part": at%40 + 1}, map[string]uint32{"part": at%40 + 1})
			}
			return
		}
		got, err := candidateRows(t, trusted, turn)
		if err != nil {
			return // every row is compared
		}
		for table, rows := range differingRows(t, trusted, turn) {
			for _, r := range rows {
				assert.Assert(t, slices.Contains(got[table], r), "%s rowid %d differs but was not compared", table, r)
			}
		}
	})
}
