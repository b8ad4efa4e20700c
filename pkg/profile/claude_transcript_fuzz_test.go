package profile

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
)

// FuzzTranscriptRebuild: whatever a turn writes, the rebuilt transcript is
// JSON objects of conversation types only, every cwd is /work, and it
// rebuilds to itself with nothing dropped.
func FuzzTranscriptRebuild(f *testing.F) {
	f.Add(ccTranscript)
	f.Add(`{"type":"user","uuid":"u","parentUuid":"u","message":{}}` + "\n")
	f.Add("{\"type\":\"summary\",\"summary\":\"s\",\"leafUuid\":null}\r\n\n\n{")
	f.Fuzz(func(t *testing.T, in string) {
		var once bytes.Buffer
		if _, err := RebuildLines(context.Background(), strings.NewReader(in), &once, 1<<20, newTranscriptFilter()); err != nil {
			t.Fatal(err)
		}
		for _, l := range strings.Split(strings.TrimSuffix(once.String(), "\n"), "\n") {
			if l == "" {
				continue
			}
			var rec map[string]any
			if err := json.Unmarshal([]byte(l), &rec); err != nil {
				t.Fatalf("output line is not JSON: %q", l)
			}
			if typ, _ := rec["type"].(string); !ccMessageTypes[typ] {
				t.Fatalf("kept a %q record", typ)
			}
			if c, ok := rec["cwd"]; ok && c != cageWork {
				t.Fatalf("cwd %v kept", c)
			}
		}
		var twice bytes.Buffer
		drops, err := RebuildLines(context.Background(), bytes.NewReader(once.Bytes()), &twice, 1<<20, newTranscriptFilter())
		if err != nil || len(drops) != 0 || twice.String() != once.String() {
			t.Fatalf("not stable: %v %+v\n%q\n%q", err, drops, once.String(), twice.String())
		}
	})
}
