package homereset

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// writeBenchTranscript writes a transcript of about size bytes shaped like
// what Claude Code 2.1.332 writes in a tool-using session: per exchange a
// user prompt, attachments, an api-request record, an assistant tool call,
// its tool result with toolUseResult metadata, and the small state records
// (last-prompt, atis-latch, tools-used) between them.
func writeBenchTranscript(b *testing.B, path string, size int, session string) {
	b.Helper()
	f, err := os.Create(path)
	must(b, err)
	defer f.Close()
	text := strings.Repeat("The quick brown fox reads /work/main.go and edits it. ", 40)
	enc := json.NewEncoder(f)
	parent := any(nil)
	n := 0
	for i := 0; n < size; i++ {
		u := func(k string) string { return fmt.Sprintf("%08d-0000-4000-8000-%012d", i, len(k)) }
		recs := []map[string]any{
			{"type": "user", "uuid": u("u"), "parentUuid": parent, "sessionId": session, "cwd": "/work", "permissionMode": "bypassPermissions",
				"timestamp": "2026-12-01T21:41:38.341Z", "version": "2.1.332", "gitBranch": "master", "userType": "external", "message": map[string]any{"role": "user", "content": text}},
			{"type": "attachment", "uuid": u("aa"), "parentUuid": u("u"), "sessionId": session, "cwd": "/work", "attachment": map[string]any{"type": "date", "date": "2026-12-01"},
				"rendered": []any{map[string]any{"content": "<system-reminder>Today's date is 2026-12-01.</system-reminder>"}}},
			{"type": "api-request", "sessionId": session, "id": u("r"), "params": map[string]any{"model": "m", "max_tokens": 1000, "system": text}},
			{"type": "assistant", "uuid": u("aaa"), "parentUuid": u("aa"), "sessionId": session, "cwd": "/work", "requestRef": u("r"),
				"message": map[string]any{"role": "assistant", "content": []any{map[string]any{"type": "tool_use", "id": "t" + u("t"), "name": "Read", "input": map[string]any{"file_path": "/work/main.go"}}}}},
			{"type": "last-prompt", "lastPrompt": "go on", "leafUuid": u("aaa"), "sessionId": session},
			{"type": "user", "uuid": u("uuuu"), "parentUuid": u("aaa"), "sessionId": session, "cwd": "/work", "toolUseResult": map[string]any{"file": map[string]any{"filePath": "/work/main.go", "content": text}},
				"message": map[string]any{"role": "user", "content": []any{map[string]any{"type": "tool_result", "tool_use_id": "t" + u("t"), "content": text}}}},
			{"type": "atis-latch", "atis": "", "sessionId": session},
			{"type": "tools-used", "tools": []any{"Read"}, "sessionId": session},
		}
		for _, r := range recs {
			must(b, enc.Encode(r))
		}
		parent = u("uuuu")
		st, err := f.Stat()
		must(b, err)
		n = int(st.Size())
	}
}

// BenchmarkResetTranscripts measures the reset of a Claude HOME holding
// 200 sessions × 5 MiB of transcripts against the same HOME without them,
// side by side in one run (ratio x-vs-none, added-ms/op):
//
//   - fresh: every iteration starts from the transcripts as Claude wrote
//     them (each file hashed against the record, then parsed and rebuilt);
//
//   - unchanged: the transcripts are as the last reset wrote them (each
//     proven by its digest and hard-linked);
//
//   - appended: as unchanged, but the last turn appended 5 MiB to one
//     session (its prefix proven, the appended part rebuilt).
//
//     go test -tags "$TAGS" -run '^$' -bench BenchmarkResetTranscripts -benchtime 3x ./pkg/homereset
func BenchmarkResetTranscripts(b *testing.B) {
	var base time.Duration
	for _, bc := range []struct {
		name           string
		sessions, size int
		mode           string
	}{{"none", 0, 0, ""}, {"fresh/200x5MiB", 200, 5 << 20, "fresh"}, {"unchanged/200x5MiB", 200, 5 << 20, "unchanged"}, {"appended/200x5MiB", 200, 5 << 20, "appended"}} {
		b.Run(bc.name, func(b *testing.B) {
			task := benchTask(b)
			ctx := context.Background()
			src := b.TempDir()
			for i := 0; i < bc.sessions; i++ {
				sess := fmt.Sprintf("%08d-1111-4111-8111-111111111111", i)
				writeBenchTranscript(b, filepath.Join(src, sess+".jsonl"), bc.size, sess)
			}
			dst := filepath.Join(HomeDir(task.Root), ".claude/projects/-work")
			lay := func() {
				must(b, os.MkdirAll(dst, 0o755))
				entries, err := os.ReadDir(src)
				must(b, err)
				for _, en := range entries {
					data, err := os.ReadFile(filepath.Join(src, en.Name()))
					must(b, err)
					must(b, os.WriteFile(filepath.Join(dst, en.Name()), data, 0o600))
				}
			}
			reset := func() *Report {
				rep, err := Reset(ctx, ResetInput{Task: task})
				if err != nil {
					b.Fatal(err)
				}
				if _, err := Cleanup(ctx, task.Root); err != nil {
					b.Fatal(err)
				}
				return rep
			}
			if bc.mode != "fresh" {
				lay()
				reset()
			}
			chunk := filepath.Join(b.TempDir(), "chunk.jsonl")
			if bc.mode == "appended" {
				writeBenchTranscript(b, chunk, bc.size, "00000000-1111-4111-8111-111111111111")
			}
			var total time.Duration
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				switch bc.mode {
				case "fresh":
					lay()
				case "appended":
					data, err := os.ReadFile(chunk)
					must(b, err)
					f, err := os.OpenFile(filepath.Join(dst, "00000000-1111-4111-8111-111111111111.jsonl"), os.O_APPEND|os.O_WRONLY, 0)
					must(b, err)
					_, err = f.Write(data)
					must(b, err)
					must(b, f.Close())
				}
				b.StartTimer()
				t0 := time.Now()
				rep, err := Reset(ctx, ResetInput{Task: task})
				total += time.Since(t0)
				if err != nil {
					b.Fatal(err)
				}
				if len(rep.Rebuilt)+rep.KeptCount < bc.sessions {
					b.Fatalf("%d files rebuilt and %d kept, want %d", len(rep.Rebuilt), rep.KeptCount, bc.sessions)
				}
				b.StopTimer()
				if _, err := Cleanup(ctx, task.Root); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
			per := total / time.Duration(b.N)
			if bc.sessions == 0 {
				base = per
				return
			}
			if base > 0 {
				b.ReportMetric(float64(per)/float64(base), "x-vs-none")
			}
			b.ReportMetric(float64((per - base).Milliseconds()), "added-ms/op")
		})
	}
}
