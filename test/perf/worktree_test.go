package perf

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// BenchmarkWorktreeSize runs the same turn — a prepared cage that prints a
// line, then changes the 100 files of one directory — in a worktree of
// 1 000 entries and in one of 100 000 (directories of 100 files, a git
// work tree), alternating the two tasks turn by turn so that both see the
// same load, and reports first output and whole `run` for each and their
// ratios (issue 28's goal: 100 000 ≤ 1.2× 1 000).
func BenchmarkWorktreeSize(b *testing.B) {
	if b.N == 1 {
		return
	}
	be := newBench(b, "")
	sizes := []int{1_000, 100_000}
	tasks := make([]string, len(sizes))
	wts := make([]string, len(sizes))
	for i, n := range sizes {
		tasks[i] = be.task(fmt.Sprintf("wt%d", n))
		wts[i] = makeWorktree(b, n)
	}
	// Print first, then change ≤ 100 files (the turn's own work).
	const script = `echo x; for f in /work/d0000/*; do echo y >> "$f"; done`
	for i := range sizes { // bootstrap HOME, claim the worktree, prepare the next cage
		if _, _, err := be.runWorktree(tasks[i], wts[i], script); err != nil {
			b.Fatal(err)
		}
	}
	firsts := make([][]time.Duration, len(sizes))
	walls := make([][]time.Duration, len(sizes))
	results := make([][]*result, len(sizes))
	for round := 0; round < b.N; round++ {
		for i := range sizes {
			be.waitIdle(tasks[i])
			t, res, err := be.runWorktree(tasks[i], wts[i], script)
			if err != nil {
				b.Fatal(err)
			}
			if !res.Prepared {
				b.Fatalf("%d entries, round %d: the turn did not run in a prepared cage", sizes[i], round)
			}
			if res.Changes == nil || res.Changes.Modified != 99 {
				b.Fatalf("%d entries, round %d: worktree changes %+v, want 99 modified", sizes[i], round, res.Changes)
			}
			firsts[i] = append(firsts[i], t.first)
			walls[i] = append(walls[i], t.wall)
			results[i] = append(results[i], &res.result)
		}
	}
	for i, n := range sizes {
		b.ReportMetric(msOf(median(firsts[i])), fmt.Sprintf("first-%dk-ms", n/1000))
		b.ReportMetric(msOf(median(walls[i])), fmt.Sprintf("whole-%dk-ms", n/1000))
		b.Logf("%d entries: first output p50 %.0f ms, whole run p50 %.0f ms; phases (median ms): %s",
			n, msOf(median(firsts[i])), msOf(median(walls[i])), phaseString(phaseMedians(results[i])))
	}
	fr := msOf(median(firsts[1])) / msOf(median(firsts[0]))
	wr := msOf(median(walls[1])) / msOf(median(walls[0]))
	b.ReportMetric(fr, "first-ratio")
	b.ReportMetric(wr, "whole-ratio")
	b.ReportMetric(0, "ns/op")
	b.Logf("100 000 ÷ 1 000 entries: first output %.2f×, whole run %.2f× (goal ≤ 1.2×)", fr, wr)
}

// makeWorktree makes a git work tree of n entries: directories d0000… of
// 99 files each (100 entries with the directory).
func makeWorktree(b *testing.B, n int) string {
	wt := b.TempDir()
	for d := 0; d*100 < n; d++ {
		sub := filepath.Join(wt, fmt.Sprintf("d%04d", d))
		if err := os.Mkdir(sub, 0o755); err != nil {
			b.Fatal(err)
		}
		for f := 0; f < 99; f++ {
			if err := os.WriteFile(filepath.Join(sub, fmt.Sprintf("f%02d", f)), []byte("x\n"), 0o644); err != nil {
				b.Fatal(err)
			}
		}
	}
	if out, err := exec.Command("git", "init", "-q", wt).CombinedOutput(); err != nil {
		b.Fatalf("git init: %v: %s", err, out)
	}
	return wt
}

type worktreeResult struct {
	result
	Changes *struct {
		Added    int `json:"added"`
		Modified int `json:"modified"`
		Deleted  int `json:"deleted"`
	} `json:"worktree_changes"`
}

func (b *bench) runWorktree(task, wt, script string) (*timing, *worktreeResult, error) {
	t, err := timed(b.inHost(b.bin, "--config", b.cfgFile, "--json", "run", "--prepare-next", "--task", task, "--agent", "shell", "--worktree", wt, "--", "-c", script))
	if err != nil {
		return t, nil, err
	}
	lines := strings.Split(strings.TrimSpace(t.stdout.String()), "\n")
	var res worktreeResult
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &res); err != nil {
		return t, nil, fmt.Errorf("result: %v: %s", err, t.stdout.String())
	}
	return t, &res, nil
}
