package perf

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// BenchmarkBackToBack runs 200 turns of one task back to back, each started
// the moment the previous `run` returned (as an orchestrator's loop does),
// with a small worktree: it reports turns per second and fails on any exit
// 123 ("busy"), which a turn must never see while the previous turn's
// detached teardown holds the lock (it waits for it instead). Before the
// lock's holder mark was atomic, 1 in ~60 such turns failed as busy.
// SHROOMS_PERF_TURNS changes the count.
func BenchmarkBackToBack(b *testing.B) {
	if b.N == 1 {
		return
	}
	turns := 200
	if n, err := strconv.Atoi(os.Getenv("SHROOMS_PERF_TURNS")); err == nil && n > 0 {
		turns = n
	}
	be := newBench(b)
	task := be.Task("b2b")
	wt := b.TempDir()
	if err := os.WriteFile(filepath.Join(wt, "README"), []byte("x\n"), 0o644); err != nil {
		b.Fatal(err)
	}
	if out, err := exec.Command("git", "init", "-q", wt).CombinedOutput(); err != nil {
		b.Fatalf("git init: %v: %s", err, out)
	}
	args := func() []string {
		return []string{be.Binary, "--config", be.Config, "run", "--prepare-next", "--task", task, "--agent", "shell", "--worktree", wt, "--", "-c", "echo x"}
	}
	if out, err := inHost(be, args()...).CombinedOutput(); err != nil {
		b.Fatalf("first turn: %v: %s", err, out)
	}
	busy, failed := 0, 0
	var walls []time.Duration
	start := time.Now()
	for i := 0; i < turns; i++ {
		t, err := timed(inHost(be, args()...))
		switch {
		case err != nil && strings.Contains(err.Error(), ": exit status 123:"): // timed's message
			busy++
			b.Logf("turn %d: busy: %v", i, err)
		case err != nil:
			failed++
			b.Logf("turn %d: %v", i, err)
		}
		walls = append(walls, t.wall)
	}
	elapsed := time.Since(start)
	be.WaitIdle(task)
	b.ReportMetric(float64(turns)/elapsed.Seconds(), "turns/s")
	b.ReportMetric(msOf(median(walls)), "run-p50-ms")
	b.ReportMetric(float64(busy), "busy")
	b.ReportMetric(0, "ns/op")
	b.Logf("%d back-to-back turns of one task in %.1f s: %.2f turns/s, run p50 %.0f ms; %d busy (123), %d failed otherwise",
		turns, elapsed.Seconds(), float64(turns)/elapsed.Seconds(), msOf(median(walls)), busy, failed)
	if busy > 0 || failed > 0 {
		b.Fatalf("%d of %d turns were refused as busy, %d failed", busy, turns, failed)
	}
}
