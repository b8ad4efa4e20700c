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
// opencode.db holds about 100 MiB of session rows against the same HOME
// without a database, side by side; the ratio is reported as x-vs-nodb.
// db=100MiB/full rebuilds it in full every time (no trusted copy: the
// first reset of a task, and every reset before the in-place update):
// copy, WAL fold, schema and integrity check, the allowlisted rows copied
// into a fresh database, every message and part row's JSON checked.
// db=100MiB/unchanged is a reset after a turn that left the file as the
// last reset wrote it, db=100MiB/changed one after a turn that changed,
// added and deleted a few rows (the in-place update, opencode_dbupdate.go).
func BenchmarkResetOpencodeDB(b *testing.B) {
	var base time.Duration
	for _, bc := range []struct {
		name string
		size int
		mode string
	}{{"nodb", 0, ""}, {"db=100MiB/full", 100 << 20, "full"}, {"db=100MiB/unchanged", 100 << 20, "unchanged"}, {"db=100MiB/changed", 100 << 20, "changed"}} {
		b.Run(bc.name, func(b *testing.B) {
			task := benchTask(b)
			task.Profiles = []string{"opencode", "shell"}
			ctx := context.Background()
			var src string
			if bc.size > 0 {
				src = benchOpencodeDB(b, bc.size)
			}
			dst := filepath.Join(HomeDir(task.Root), ".local/share/opencode/opencode.db")
			put := func() {
				must(b, os.MkdirAll(filepath.Dir(dst), 0o755))
				data, err := os.ReadFile(src)
				must(b, err)
				must(b, os.WriteFile(dst, data, 0o600))
			}
			if bc.mode != "" && bc.mode != "full" {
				put()
				_, err := Reset(ctx, ResetInput{Task: task})
				must(b, err)
				_, err = Cleanup(ctx, task.Root)
				must(b, err)
			}
			var total time.Duration
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				switch bc.mode {
				case "full":
					put()
					must(b, os.RemoveAll(filepath.Join(task.Root, metaName, dbStateName)))
				case "changed":
					benchTurnChanges(b, dst, i)
				}
				b.StartTimer()
				t0 := time.Now()
				rep, err := Reset(ctx, ResetInput{Task: task})
				total += time.Since(t0)
				if err != nil {
					b.Fatal(err)
				}
				if src != "" && len(rep.Rebuilt) == 0 && (bc.mode != "unchanged" || len(rep.Kept) == 0) {
					b.Fatal("opencode.db was not rebuilt")
				}
				if len(rep.Dropped) > 1 || len(rep.Dropped) == 1 && rep.Dropped[0].Item != "table event_sequence" { // the fixture's
					b.Fatalf("the rebuild dropped rows of a clean database: %+v", rep.Dropped)
				}
				b.StopTimer()
				if _, err := Cleanup(ctx, task.Root); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
			per := total / time.Duration(b.N)
			if bc.size == 0 {
				base = per
			} else if base > 0 {
				b.ReportMetric(float64(per)/float64(base), "x-vs-nodb")
			}
			b.ReportMetric(float64(per.Microseconds())/1000, "reset-ms")
		})
	}
}

// benchTurnChanges changes the kept database at path as a turn of opencode
// does: a few parts rewritten, a message with two parts added, one part
// deleted (round i: new ids each time).
func benchTurnChanges(b *testing.B, path string, i int) {
	db, err := sql.Open("sqlite", "file:"+path)
	must(b, err)
	defer db.Close()
	for _, q := range []string{
		`UPDATE part SET data = '{"type":"text","text":"edited"}' WHERE rowid IN (SELECT rowid FROM part ORDER BY rowid LIMIT 3 OFFSET ` + fmt.Sprint(100+i*3) + `)`,
		`DELETE FROM part WHERE rowid = (SELECT max(rowid) FROM part)`,
		fmt.Sprintf(`INSERT INTO message VALUES ('msg_t%d', '%s', 9, 9, '%s')`, i, ocSession, ocAssistantMsg),
		fmt.Sprintf(`INSERT INTO part VALUES ('prt_t%da', 'msg_t%d', '%s', 9, 9, '{"type":"text","text":"new"}')`, i, i, ocSession),
		fmt.Sprintf(`INSERT INTO part VALUES ('prt_t%db', 'msg_t%d', '%s', 9, 9, '{"type":"text","text":"newer"}')`, i, i, ocSession),
	} {
		_, err := db.Exec(q)
		must(b, err)
	}
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
