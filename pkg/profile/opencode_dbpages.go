package profile

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// Comparing every row of the turn's file with trusted.db through SQLite
// reads and decodes both files in full (a 100 MiB database: ~0.3 s of CPU).
// The turn's file started as a byte-for-byte copy of trusted.db, so the rows
// it changed sit on the pages it changed. changedRows finds them: it
// compares the two files page by page (bytes, not digests the cage could
// collide), then walks each kept table's b-tree in both files (SQLite's
// documented file format: interior and leaf table pages, overflow chains)
// and returns, per table, the rowids of every cell on a leaf that is not
// provably the same in both. A leaf is provably the same when it is a leaf
// of that table in both files, its page is unchanged, and no page of the
// overflow chains of its cells changed: then its rows are trusted.db's,
// value for value (same page size, reserved bytes and text encoding). Only
// the returned rowids are then compared through SQLite (diffTable), and
// only rows that differ are filtered into trusted.db, as before.
//
// This only chooses which rows are compared; it never puts a byte into
// trusted.db. Anything unexpected (another page size or encoding, a page
// type, pointer, cycle or cell the walk does not accept) returns an error,
// and the caller compares every row instead. Changed pages are read again
// from the turn's file when the walk needs them: memory does not grow with
// the change. A file more than half of whose pages or rows changed is
// rebuilt in full instead (errMostlyChanged).

// rowsOnChangedPages returns, per table, the rowids changedRows finds, or
// an error when every row must be compared.
func rowsOnChangedPages(ctx context.Context, c *sql.Conn, src, trusted string, tables []string) (map[string][]int64, error) {
	roots := func(schema string) (map[string]uint32, error) {
		rows, err := c.QueryContext(ctx, `SELECT name, rootpage FROM `+schema+`.sqlite_master WHERE type = 'table'`)
		if err != nil {
			return nil, err
		}
		defer rows.Close()
		m := map[string]uint32{}
		for rows.Next() {
			var name string
			var root int64
			if err := rows.Scan(&name, &root); err != nil {
				return nil, err
			}
			if _, dup := m[name]; dup {
				return nil, fmt.Errorf("table %s twice", name)
			}
			m[name] = 0 // out of range: refused below if kept
			if root > 0 && root <= 1<<32-1 {
				m[name] = uint32(root)
			}
		}
		return m, rows.Err()
	}
	rootT, err := roots("main")
	if err != nil {
		return nil, err
	}
	rootS, err := roots("src")
	if err != nil {
		return nil, err
	}
	for _, t := range tables {
		if rootT[t] == 0 || rootS[t] == 0 {
			return nil, fmt.Errorf("no root page for %s", t)
		}
	}
	d, err := comparePages(src, trusted)
	if err != nil {
		return nil, err
	}
	defer d.close()
	return d.changedRows(tables, rootT, rootS)
}

// errMostlyChanged: more than half the turn's file changed, its pages or
// its rows (past a size where either way is quick). Updating
// trusted.db row by row then costs more than a full rebuild (deleting and
// inserting most rows through its rollback journal), so the update gives
// way to the full rebuild.
var errMostlyChanged = errors.New("most pages changed")

// pageDiff is the turn's file (src) against trusted.db, page by page.
type pageDiff struct {
	size    int      // page size
	usable  int      // page size less the reserved bytes
	trusted []byte   // trusted.db, mapped
	src     *os.File // the turn's file
	nT, nS  uint32   // page counts
	changed map[uint32]bool
}

// srcPage is page n (1-based) of the turn's file.
func (d *pageDiff) srcPage(n uint32) ([]byte, bool) {
	if n == 0 || n > d.nS {
		return nil, false
	}
	if !d.changed[n] {
		return d.trustedPage(n)
	}
	p := make([]byte, d.size)
	if _, err := d.src.ReadAt(p, int64(n-1)*int64(d.size)); err != nil {
		return nil, false
	}
	return p, true
}

func (d *pageDiff) trustedPage(n uint32) ([]byte, bool) {
	if n == 0 || n > d.nT {
		return nil, false
	}
	o := int(n-1) * d.size
	return d.trusted[o : o+d.size], true
}

func (d *pageDiff) close() {
	if d.trusted != nil {
		unix.Munmap(d.trusted)
		d.trusted = nil
	}
	if d.src != nil {
		d.src.Close()
	}
}

// headerPageSize reads a database header's page size.
func headerPageSize(h []byte) int {
	n := int(binary.BigEndian.Uint16(h[16:18]))
	if n == 1 {
		return 65536
	}
	return n
}

// comparePages maps trusted and reads src page by page against it.
func comparePages(src, trusted string) (*pageDiff, error) {
	t, err := os.Open(trusted)
	if err != nil {
		return nil, err
	}
	defer t.Close()
	s, err := os.Open(src)
	if err != nil {
		return nil, err
	}
	d := &pageDiff{src: s, changed: map[uint32]bool{}}
	ok := false
	defer func() {
		if !ok {
			d.close()
		}
	}()
	ts, err := t.Stat()
	if err != nil {
		return nil, err
	}
	ss, err := s.Stat()
	if err != nil {
		return nil, err
	}
	if ts.Size() < 512 || ss.Size() < 512 || ts.Size() > 1<<40 || ss.Size() > 1<<40 {
		return nil, errors.New("size out of range")
	}
	m, err := unix.Mmap(int(t.Fd()), 0, int(ts.Size()), unix.PROT_READ, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return nil, fmt.Errorf("map trusted copy: %w", err)
	}
	d.trusted = m
	var sh [100]byte
	if _, err := s.ReadAt(sh[:], 0); err != nil {
		return nil, err
	}
	th := m[:100]
	d.size = headerPageSize(th)
	// Equal bytes are equal values only in the same page geometry and
	// text encoding.
	if !bytes.Equal(sh[:16], th[:16]) || headerPageSize(sh[:]) != d.size || sh[20] != th[20] ||
		!bytes.Equal(sh[56:60], th[56:60]) || d.size < 512 || d.size&(d.size-1) != 0 {
		return nil, errors.New("another page size, reserved space or encoding")
	}
	d.usable = d.size - int(th[20])
	if d.usable < 480 || ts.Size()%int64(d.size) != 0 || ss.Size()%int64(d.size) != 0 {
		return nil, errors.New("not whole pages")
	}
	d.nT, d.nS = uint32(ts.Size()/int64(d.size)), uint32(ss.Size()/int64(d.size))
	chunk := d.size * max(1, (1<<20)/d.size)
	buf := make([]byte, chunk)
	for off := int64(0); off < ss.Size(); {
		n, err := s.ReadAt(buf, off)
		if err != nil && !(errors.Is(err, io.EOF) && n > 0) {
			return nil, err
		}
		n -= n % d.size
		if n == 0 {
			return nil, errors.New("short read")
		}
		for i := 0; i < n; i += d.size {
			pg := uint32((off+int64(i))/int64(d.size)) + 1
			p := buf[i : i+d.size]
			if t, ok := d.trustedPage(pg); ok && bytes.Equal(p, t) {
				continue
			}
			d.changed[pg] = true
		}
		off += int64(n)
	}
	if d.nS > 256 && len(d.changed) > int(d.nS)/2 {
		return nil, errMostlyChanged
	}
	ok = true
	return d, nil
}

// btree page types (the file format's flag byte).
const (
	pageInteriorTable = 0x05
	pageLeafTable     = 0x0d
)

// leafCell is a table leaf cell: its rowid and, with an overflow chain,
// the chain's pages.
type leafCell struct {
	rowid int64
	ovfl  []uint32
}

// walkTable visits the leaves of the table b-tree rooted at root, each
// once; seen holds every page visited in this file so far (a page in two
// trees or twice in one is refused).
func walkTable(page func(uint32) ([]byte, bool), root uint32, seen map[uint32]bool, leaf func(uint32, []byte, int) error) error {
	type frame struct {
		pg    uint32
		depth int
	}
	stack := []frame{{root, 0}}
	for len(stack) > 0 {
		f := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if f.depth > 40 || seen[f.pg] {
			return fmt.Errorf("page %d: tree too deep or page reached twice", f.pg)
		}
		seen[f.pg] = true
		p, ok := page(f.pg)
		if !ok {
			return fmt.Errorf("page %d out of range", f.pg)
		}
		h := 0
		if f.pg == 1 {
			h = 100
		}
		switch p[h] {
		case pageLeafTable:
			if err := leaf(f.pg, p, h); err != nil {
				return err
			}
		case pageInteriorTable:
			n := int(binary.BigEndian.Uint16(p[h+3:]))
			if h+12+2*n > len(p) {
				return fmt.Errorf("page %d: bad cell count", f.pg)
			}
			stack = append(stack, frame{binary.BigEndian.Uint32(p[h+8:]), f.depth + 1})
			for i := 0; i < n; i++ {
				c := int(binary.BigEndian.Uint16(p[h+12+2*i:]))
				if c+4 > len(p) {
					return fmt.Errorf("page %d: bad cell pointer", f.pg)
				}
				stack = append(stack, frame{binary.BigEndian.Uint32(p[c:]), f.depth + 1})
			}
		default:
			return fmt.Errorf("page %d: not a table b-tree page", f.pg)
		}
	}
	return nil
}

// varint decodes an SQLite varint at b[0:].
func varint(b []byte) (uint64, int, bool) {
	var v uint64
	for i := 0; i < 9; i++ {
		if i >= len(b) {
			return 0, 0, false
		}
		if i == 8 {
			return v<<8 | uint64(b[i]), 9, true
		}
		v = v<<7 | uint64(b[i]&0x7f)
		if b[i]&0x80 == 0 {
			return v, i + 1, true
		}
	}
	return 0, 0, false
}

// leafCells parses a table leaf page's cells (header at h). With chain
// set, each cell's overflow chain is followed through page.
func leafCells(p []byte, h, usable int, chain func(uint32) ([]byte, bool)) ([]leafCell, error) {
	if h+8 > usable {
		return nil, errors.New("bad leaf header")
	}
	n := int(binary.BigEndian.Uint16(p[h+3:]))
	if h+8+2*n > usable {
		return nil, errors.New("bad leaf cell count")
	}
	cells := make([]leafCell, 0, n)
	for i := 0; i < n; i++ {
		c := int(binary.BigEndian.Uint16(p[h+8+2*i:]))
		if c >= usable {
			return nil, errors.New("bad leaf cell pointer")
		}
		size, k, ok := varint(p[c:usable])
		if !ok {
			return nil, errors.New("bad payload size")
		}
		rowid, k2, ok := varint(p[c+k : usable])
		if !ok {
			return nil, errors.New("bad rowid")
		}
		cell := leafCell{rowid: int64(rowid)}
		if x := uint64(usable - 35); size > x {
			m := uint64((usable-12)*32/255 - 23)
			local := m + (size-m)%uint64(usable-4)
			if local > x {
				local = m
			}
			at := uint64(c+k+k2) + local
			if at+4 > uint64(usable) || size > 1<<32 {
				return nil, errors.New("bad overflow pointer")
			}
			if chain != nil {
				pages := (size - local + uint64(usable-5)) / uint64(usable-4)
				next := binary.BigEndian.Uint32(p[at:])
				for j := uint64(0); j < pages; j++ {
					o, ok := chain(next)
					if !ok {
						return nil, errors.New("overflow page out of range")
					}
					cell.ovfl = append(cell.ovfl, next)
					next = binary.BigEndian.Uint32(o)
				}
			}
		}
		cells = append(cells, cell)
	}
	return cells, nil
}

// changedRows returns, per table (roots: the table's root page in trusted.db
// and in the turn's file), the rowids whose rows may differ between the
// two files (see the comment at the top).
func (d *pageDiff) changedRows(tables []string, rootT, rootS map[string]uint32) (map[string][]int64, error) {
	out := map[string][]int64{}
	seenT, seenS := map[uint32]bool{}, map[uint32]bool{}
	rowsT, cand := 0, 0
	for _, table := range tables {
		type tleaf struct {
			cells []leafCell
			dirty bool
		}
		tl := map[uint32]*tleaf{}
		err := walkTable(d.trustedPage, rootT[table], seenT, func(pg uint32, p []byte, h int) error {
			cells, err := leafCells(p, h, d.usable, d.trustedPage)
			if err != nil {
				return fmt.Errorf("trusted page %d: %w", pg, err)
			}
			rowsT += len(cells)
			l := &tleaf{cells: cells}
			l.dirty = d.changed[pg]
			for _, c := range cells {
				for _, o := range c.ovfl {
					l.dirty = l.dirty || d.changed[o]
				}
			}
			tl[pg] = l
			return nil
		})
		if err != nil {
			return nil, err
		}
		var rows []int64
		err = walkTable(d.srcPage, rootS[table], seenS, func(pg uint32, p []byte, h int) error {
			if l, ok := tl[pg]; ok && !l.dirty {
				delete(tl, pg) // the same leaf, row for row, in both
				return nil
			}
			cells, err := leafCells(p, h, d.usable, nil)
			if err != nil {
				return fmt.Errorf("page %d: %w", pg, err)
			}
			for _, c := range cells {
				rows = append(rows, c.rowid)
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
		// trusted.db's leaves the turn's tree does not hold as they were.
		for _, l := range tl {
			for _, c := range l.cells {
				rows = append(rows, c.rowid)
			}
		}
		out[table] = rows
		cand += len(rows)
	}
	if d.nS > 256 && cand > rowsT/2 {
		return nil, errMostlyChanged
	}
	return out, nil
}
