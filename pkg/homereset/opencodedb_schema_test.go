package homereset

// The pinned opencode.db schema as pkg/profile pins it, for building and
// checking databases in these tests (copies of profile's unexported
// reader; the file is profile's golden file).

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
)

const pinnedOpencode = "opencode 1.18.33"

var opencodeSchemaText = func() string {
	b, err := os.ReadFile("../profile/testdata/golden/opencode-1.18.33.schema")
	if err != nil {
		panic(err)
	}
	return string(b)
}()

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

func readMaster(ctx context.Context, c *sql.Conn) ([]schemaObject, error) {
	rows, err := c.QueryContext(ctx, "SELECT type, name, tbl_name, coalesce(sql, '') FROM sqlite_master ORDER BY rowid")
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

// dumpSchema reads the migrations and sqlite_master of the database at path.
func dumpSchema(t *testing.T, path, agent string) *pinnedSchema {
	t.Helper()
	ctx := context.Background()
	db, c, err := openSQLite(ctx, path)
	assert.NilError(t, err)
	defer db.Close()
	defer c.Close()
	objs, err := readMaster(ctx, c)
	assert.NilError(t, err)
	ids, err := queryStrings(ctx, c, `SELECT id FROM "migration" ORDER BY id`)
	assert.NilError(t, err)
	return &pinnedSchema{agent: agent, migrations: ids, objects: objs}
}
