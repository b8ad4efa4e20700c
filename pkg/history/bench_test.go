package history

import (
	"bytes"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// cpuTime is the process's user and system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkCheck: the pin's own cost per request of a growing conversation
// (the last request, the answer and a new user message; the cache mark
// moved), on a 1 MiB and a 20 MiB history: split, compare with the
// session's last request, canonicalise the new messages, write the pin.
// "steady" is a request after another of the same turn; "first" a turn's
// first request (a tracker that loads the pin and the last turn's last
// request, kept when its tracker closed: one compare of the bytes);
// "first-hash" the same after a killed turn (no kept request: each
// message's raw digest looked up in the pin); "first-uncached" with a pin
// without raw digests either (every message canonicalised, as before
// they were kept).
func BenchmarkCheck(b *testing.B) {
	line := `line of output \"quoted\" é \u001b[31mred\u001b[0m\n`
	for _, size := range []int{1 << 20, 20 << 20} {
		for _, mode := range []string{"steady", "first", "first-hash", "first-uncached"} {
			b.Run(fmt.Sprintf("%dMiB/%s", size>>20, mode), func(b *testing.B) {
				var msgs [][]byte
				for total := 0; total < size; {
					u := fmt.Sprintf(`{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":"%s"}]}`, strings.Repeat(line, 100))
					a := fmt.Sprintf(`{"role":"assistant","content":[{"type":"text","text":"%s"}]}`, strings.Repeat("word ", 200))
					msgs = append(msgs, []byte(u), []byte(a))
					total += len(u) + len(a)
				}
				msgs = append(msgs, []byte(`{"role":"user","content":[{"type":"text","text":"go","cache_control":{"type":"ephemeral"}}]}`))
				dir := b.TempDir()
				body := func() []byte { return append(append([]byte("["), bytes.Join(msgs, []byte(","))...), ']') }
				if err := pinRaw(dir, "s", body()); err != nil {
					b.Fatal(err)
				}
				tr := NewTracker(dir, Refuse)
				next := func() []byte {
					last := len(msgs) - 1
					msgs[last] = bytes.Replace(msgs[last], []byte(`,"cache_control":{"type":"ephemeral"}`), nil, 1)
					msgs = append(msgs, []byte(`{"role":"user","content":[{"type":"text","text":"more","cache_control":{"type":"ephemeral"}}]}`))
					return body()
				}
				if _, err := tr.Check("s", next(), true); err != nil {
					b.Fatal(err)
				}
				// CPU time, beside wall time: on a shared machine the wall
				// time is mostly waiting for a core.
				var cpu time.Duration
				var wall []time.Duration
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					b.StopTimer()
					m := next()
					if mode != "steady" {
						if mode == "first" {
							_ = tr.Close() // the turn ends: its last request kept
						}
						if mode == "first-uncached" {
							dropRawDigests(b, dir, "s")
						}
						runtime.GC()
					}
					before, start := cpuTime(), time.Now()
					b.StartTimer()
					if mode != "steady" {
						tr = NewTracker(dir, Refuse)
					}
					if _, err := tr.Check("s", m, true); err != nil {
						b.Fatal(err)
					}
					b.StopTimer()
					wall = append(wall, time.Since(start))
					cpu += cpuTime() - before
					b.StartTimer()
				}
				b.ReportMetric(float64(cpu.Microseconds())/1000/float64(b.N), "cpu-ms/op")
				slices.Sort(wall)
				b.ReportMetric(float64(wall[len(wall)/2].Microseconds())/1000, "p50-ms")
			})
		}
	}
}

// dropRawDigests rewrites session's pin as one written before the raw
// digests were kept.
func dropRawDigests(b *testing.B, dir, session string) {
	p, err := loadPin(dir, session)
	if err != nil || p == nil {
		b.Fatal(err)
	}
	p.sums = make([]Digest, len(p.msgs))
	if err := savePin(dir, p); err != nil {
		b.Fatal(err)
	}
}
