package homereset

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shrooms-cage/shrooms/pkg/config"
)

// benchTask is newTask for benchmarks.
func benchTask(b *testing.B) Task {
	b.Helper()
	if os.Geteuid() != 0 {
		b.Skip("needs root")
	}
	dir := b.TempDir()
	root := filepath.Join(dir, "vol")
	if err := os.Mkdir(root, 0o700); err != nil {
		b.Fatal(err)
	}
	cfgTask := Task{Root: root, UID: testBase + agentUID, GID: testBase + agentUID, Profiles: []string{"claude", "shell"}}
	cfgTask.Config = benchConfig()
	if _, err := Bootstrap(context.Background(), cfgTask); err != nil {
		b.Fatal(err)
	}
	return cfgTask
}

// BenchmarkReset measures the critical path (Reset) against the junk the last
// turn left and the size of kept session transcripts; Cleanup, which deletes
// the old tree off the critical path, is reported as cleanup-ms/op.
func BenchmarkReset(b *testing.B) {
	for _, bc := range []struct {
		name       string
		junk       int
		transcript int64
	}{
		{"junk=0", 0, 0},
		{"junk=10000", 10000, 0},
		{"junk=100000", 100000, 0},
		{"transcript=1MiB", 0, 1 << 20},
		{"transcript=100MiB", 0, 100 << 20},
	} {
		b.Run(bc.name, func(b *testing.B) {
			task := benchTask(b)
			ctx := context.Background()
			var cleanup time.Duration
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				home := HomeDir(task.Root)
				for j := 0; j < bc.junk; j++ {
					if j%1000 == 0 {
						must(b, os.MkdirAll(filepath.Join(home, fmt.Sprintf("junk/d%d", j/1000)), 0o755))
					}
					must(b, os.WriteFile(filepath.Join(home, fmt.Sprintf("junk/d%d/f%d", j/1000, j)), nil, 0o644))
				}
				if bc.transcript > 0 {
					p := filepath.Join(home, ".claude/projects/-work/s.jsonl")
					if _, err := os.Stat(p); err != nil {
						must(b, os.MkdirAll(filepath.Dir(p), 0o755))
						must(b, os.WriteFile(p, make([]byte, bc.transcript), 0o600))
					}
				}
				b.StartTimer()
				if _, err := Reset(ctx, ResetInput{Task: task}); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				t0 := time.Now()
				if _, err := Cleanup(ctx, task.Root); err != nil {
					b.Fatal(err)
				}
				cleanup += time.Since(t0)
				b.StartTimer()
			}
			b.ReportMetric(float64(cleanup.Milliseconds())/float64(b.N), "cleanup-ms/op")
		})
	}
}

func must(b *testing.B, err error) {
	b.Helper()
	if err != nil {
		b.Fatal(err)
	}
}

func benchConfig() *config.Config {
	cfg := config.Default()
	cfg.Home.Profile("claude").Settings = map[string]any{"model": "opus"}
	cfg.Home.Profile("claude").Instructions = "Work in /work.\n"
	return cfg
}

// BenchmarkResetOpencodeDB measures the reset of an opencode HOME whose
// opencode.db holds about 100 MiB of session rows, in the detached child.
// nodb is the same HOME without a database. db=100MiB/unchanged is a reset
// after a turn that left the file as the last reset wrote it (carried as
// it is). db=100MiB/changed=N is a reset after a turn that changed N part
// rows spread over the table (the in-place update, opencode_dbupdate.go
// and opencode_dbpages.go), paired round by round with a full rebuild of
// the same turn's file (no trusted copy: copy, WAL fold, schema and
// integrity check, every allowlisted row copied into a fresh database and
// its JSON checked), which was every reset before the update; full-ms,
// reset-ms (the update) and x-vs-full are reported. /wal leaves the
// turn's change in a -wal beside the file, as opencode does.
func BenchmarkResetOpencodeDB(b *testing.B) {
	for _, bc := range []struct {
		name    string
		size    int
		changed int  // -1: no turn change
		wal     bool // the turn's change left in a -wal, as opencode leaves it
	}{{"nodb", 0, -1, false}, {"db=100MiB/unchanged", 100 << 20, -1, false}, {"db=100MiB/changed=1", 100 << 20, 1, false},
		{"db=100MiB/changed=100", 100 << 20, 100, false}, {"db=100MiB/changed=10000", 100 << 20, 10000, false},
		{"db=100MiB/changed=100/wal", 100 << 20, 100, true}} {
		b.Run(bc.name, func(b *testing.B) {
			task := benchTask(b)
			task.Profiles = []string{"opencode", "shell"}
			ctx := context.Background()
			dst := filepath.Join(HomeDir(task.Root), ".local/share/opencode/opencode.db")
			put := func(data []byte) {
				must(b, os.MkdirAll(filepath.Dir(dst), 0o755))
				must(b, os.WriteFile(dst, data, 0o600))
			}
			var wal []byte
			reset := func(i int, update bool) time.Duration {
				t0 := time.Now()
				rep, err := Reset(ctx, ResetInput{Task: task})
				d := time.Since(t0)
				if err != nil {
					b.Fatal(err)
				}
				if bc.size > 0 && len(rep.Rebuilt) == 0 && (bc.changed >= 0 || len(rep.Kept) == 0) {
					b.Fatal("opencode.db was not rebuilt")
				}
				if len(rep.Dropped) > 1 || len(rep.Dropped) == 1 && rep.Dropped[0].Item != "table event_sequence" { // the fixture's
					b.Fatalf("the rebuild (round %d, update %v) dropped rows of a clean database: %+v", i, update, rep.Dropped)
				}
				_, err = Cleanup(ctx, task.Root)
				must(b, err)
				return d
			}
			if bc.size > 0 {
				src := benchOpencodeDB(b, bc.size)
				data, err := os.ReadFile(src)
				must(b, err)
				put(data)
				reset(0, false) // the first reset: a full rebuild, the trusted copy
			}
			var upd, full time.Duration
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				var turn []byte
				if bc.changed > 0 {
					turn, wal = benchTurnRows(b, dst, bc.changed, i, bc.wal)
				}
				b.StartTimer()
				upd += reset(i, true)
				if turn != nil {
					// The same turn's file, rebuilt in full.
					b.StopTimer()
					put(turn)
					if wal != nil {
						must(b, os.WriteFile(dst+"-wal", wal, 0o600))
					}
					must(b, os.RemoveAll(filepath.Join(task.Root, metaName, dbStateName)))
					b.StartTimer()
					full += reset(i, false)
				}
			}
			n := time.Duration(b.N)
			b.ReportMetric(float64((upd/n).Microseconds())/1000, "reset-ms")
			if full > 0 {
				b.ReportMetric(float64((full/n).Microseconds())/1000, "full-ms")
				b.ReportMetric(float64(upd)/float64(full), "x-vs-full")
			}
		})
	}
}

// benchTurnRows changes n part rows of the kept database at path as a turn
// of opencode does (a part's JSON rewritten: a tool call's end time, a text
// part's times; the fixture's other parts are left alone), spread evenly
// over the table; round i picks other rows and other values. It returns
// the file and, with wal, the -wal opencode leaves beside it holding the
// change (the file itself is then as the last reset wrote it).
func benchTurnRows(b *testing.B, path string, n, i int, wal bool) ([]byte, []byte) {
	db, err := sql.Open("sqlite", "file:"+path)
	must(b, err)
	defer db.Close()
	db.SetMaxOpenConns(1)
	if wal {
		for _, p := range []string{"PRAGMA journal_mode=WAL", "PRAGMA wal_autocheckpoint=0"} {
			_, err := db.Exec(p)
			must(b, err)
		}
	}
	var rows int
	must(b, db.QueryRow(`SELECT count(*) FROM part WHERE data->>'$.type' IN ('tool', 'text')`).Scan(&rows))
	step := max(1, rows/n)
	res, err := db.Exec(`UPDATE part SET data = CASE WHEN data->>'$.type' = 'tool' THEN json_set(data, '$.state.time.end', ?1)
		ELSE json_set(data, '$.time', json_object('start', 1, 'end', ?1)) END
		WHERE rowid IN (SELECT r FROM (SELECT rowid AS r, row_number() OVER (ORDER BY rowid) AS k FROM part WHERE data->>'$.type' IN ('tool', 'text')) WHERE k % ?2 = ?3 LIMIT ?4)`, 1000+i, step, i%step, n)
	must(b, err)
	if k, _ := res.RowsAffected(); k != int64(min(n, rows)) {
		b.Fatalf("changed %d rows, not %d", k, n)
	}
	// Read while open: closing the last connection checkpoints the WAL.
	main, err := os.ReadFile(path)
	must(b, err)
	if !wal {
		return main, nil
	}
	w, err := os.ReadFile(path + "-wal")
	must(b, err)
	must(b, db.Close())
	must(b, os.WriteFile(path, main, 0o600))
	must(b, os.WriteFile(path+"-wal", w, 0o600))
	return main, w
}

// benchOpencodeDB writes an opencode.db of about size bytes of session rows
// as opencode writes them: an assistant message per ten parts (text, tool
// calls), every row valid JSON that the row-by-row check parses and keeps.
func benchOpencodeDB(b *testing.B, size int) string {
	src := filepath.Join(b.TempDir(), "opencode.db")
	db := newOpencodeDB(b, src, false)
	text, _ := json.Marshal(strings.Repeat("lorem ipsum ", 8<<10/12))
	tool := `{"type":"tool","callID":"c","tool":"bash","state":{"status":"completed","input":{"command":"go test ./..."},"output":` + string(text) + `,"title":"t","metadata":{},"time":{"start":1,"end":2}}}`
	tx, err := db.Begin()
	must(b, err)
	for i := 0; i < size/len(text); i++ {
		msg := fmt.Sprintf("msg_%06d", i/10)
		if i%10 == 0 {
			_, err := tx.Exec(`INSERT INTO message VALUES (?, ?, 1, 1, ?)`, msg, ocSession, ocAssistantMsg)
			must(b, err)
		}
		data := `{"type":"text","text":` + string(text) + `}`
		if i%3 == 0 {
			data = tool
		}
		_, err := tx.Exec(`INSERT INTO part VALUES (?, ?, ?, 1, 1, ?)`, fmt.Sprintf("prt_%06d", i), msg, ocSession, data)
		must(b, err)
	}
	must(b, tx.Commit())
	must(b, db.Close())
	return src
}

// BenchmarkPreparedMatchOpencodeDB measures what a prepared turn checks
// HOME with, in front of the caller, with a kept 100 MiB opencode.db: the
// dry-run reset it ran before (which rebuilds the db in full) against the
// HOME's fingerprint it checks now, on the same reset HOME, side by side;
// x-vs-dryrun is the ratio.
func BenchmarkPreparedMatchOpencodeDB(b *testing.B) {
	task := benchTask(b)
	task.Profiles = []string{"opencode", "shell"}
	ctx := context.Background()
	src := benchOpencodeDB(b, 100<<20)
	dst := filepath.Join(HomeDir(task.Root), ".local/share/opencode/opencode.db")
	must(b, os.MkdirAll(filepath.Dir(dst), 0o755))
	data, err := os.ReadFile(src)
	must(b, err)
	must(b, os.WriteFile(dst, data, 0o600))
	if _, err := Reset(ctx, ResetInput{Task: task}); err != nil {
		b.Fatal(err)
	}
	if _, err := Cleanup(ctx, task.Root); err != nil {
		b.Fatal(err)
	}
	time.Sleep(racyWindow)
	var dry, fp time.Duration
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		rep, err := Reset(ctx, ResetInput{Task: task, DryRun: true})
		dry += time.Since(t0)
		if err != nil || rep.RemovedCount != 0 {
			b.Fatalf("dry run: %v %+v", err, rep)
		}
		t0 = time.Now()
		f, err := Fingerprint(ctx, task)
		fp += time.Since(t0)
		if err != nil || f == "" {
			b.Fatalf("fingerprint %q: %v", f, err)
		}
	}
	b.ReportMetric(float64(dry.Microseconds())/1000/float64(b.N), "dryrun-ms")
	b.ReportMetric(float64(fp.Microseconds())/1000/float64(b.N), "fingerprint-ms")
	b.ReportMetric(float64(fp)/float64(dry), "x-vs-dryrun")
	b.ReportMetric(0, "ns/op")
}
