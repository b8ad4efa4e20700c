package profile

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
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

// BenchmarkTranscriptParseVsHash compares the two ways to carry a 5 MiB
// transcript: parse and rebuild it, or prove by SHA-256 that the last reset
// wrote it (MB/s of each).
func BenchmarkTranscriptParseVsHash(b *testing.B) {
	p := filepath.Join(b.TempDir(), "s.jsonl")
	writeBenchTranscript(b, p, 5<<20, "00000000-1111-4111-8111-111111111111")
	data, err := os.ReadFile(p)
	must(b, err)
	b.Run("parse", func(b *testing.B) {
		b.SetBytes(int64(len(data)))
		for i := 0; i < b.N; i++ {
			if _, err := RebuildLines(context.Background(), bytes.NewReader(data), io.Discard, 1<<30, newTranscriptFilter()); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("sha256", func(b *testing.B) {
		b.SetBytes(int64(len(data)))
		for i := 0; i < b.N; i++ {
			sha256.Sum256(data)
		}
	})
}

func must(b *testing.B, err error) {
	b.Helper()
	if err != nil {
		b.Fatal(err)
	}
}
