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

	"github.com/shrooms-cage/shrooms/internal/tbworld"
)

// BenchmarkWorktreeSize runs the same turn — a prepared cage that prints a
// line, then changes the 99 files of one directory — in a worktree of
// 1 000 entries and in one of 100 000 (directories of 100 entries, a git
// work tree), alternating the tasks turn by turn so that all see the same
// load, and reports first output and whole `run` for each and their ratios
// (issue 28's goal: 100 000 ≤ 1.2× 1 000). With
// SHROOMS_PERF_BASELINE_BINARY=FILE the same turns also run with that
// build (its own tasks and worktrees), interleaved: before and after in
// one run.
func BenchmarkWorktreeSize(b *testing.B) {
	if b.N == 1 {
		return
	}
	be := newBench(b)
	bins := []string{be.Binary}
	if base := os.Getenv("SHROOMS_PERF_BASELINE_BINARY"); base != "" {
		bins = append(bins, base)
	}
	sizes := []int{1_000, 100_000}
	type arm struct {
		bin, task, wt, name string
		firsts, walls, cpus []time.Duration // cpus: the run process's own CPU
		results             []*result
		scans               map[string]int // how the scan after read the tree
		befores             map[string]int // how the scan before read it
		relisted            []int          // directories the namespace listed again
		statted, shared     []int          // directories the namespace stat-ed itself, and took from the guard's scan
		guardCached         []int          // directories the guard took from its cache
	}
	var arms []*arm
	for bi, bin := range bins {
		for _, n := range sizes {
			name := fmt.Sprintf("%dk", n/1000)
			if bi > 0 {
				name = "baseline-" + name
			}
			arms = append(arms, &arm{bin: bin, name: name, task: be.Task(fmt.Sprintf("wt%d-%d", bi, n)), wt: makeWorktree(b, n)})
		}
	}
	// Print first, then change ≤ 100 files (the turn's own work).
	const script = `echo x; for f in /work/d0000/*; do echo y >> "$f"; done`
	for _, a := range arms { // bootstrap HOME, claim the worktree, prepare the next cage
		if _, _, err := runWorktree(be, a.bin, a.task, a.wt, script); err != nil {
			b.Fatal(err)
		}
	}
	// Each turn starts with every arm's background work done (the other
	// arms' teardowns would land on whichever arm runs next), and the
	// arms' order turns by one each round, so that no arm always runs in
	// the slot after the same other arm (a fixed order biased the
	// baseline's ratio in round 8).
	for round := 0; round < b.N; round++ {
		for k := range arms {
			a := arms[(round+k)%len(arms)]
			for _, o := range arms {
				be.WaitIdle(o.task)
			}
			t, res, err := runWorktree(be, a.bin, a.task, a.wt, script)
			if err != nil {
				b.Fatal(err)
			}
			if !res.Prepared {
				b.Fatalf("%s, round %d: the turn did not run in a prepared cage (passed over: %q)", a.name, round, res.Skipped)
			}
			if res.Changes == nil || res.Changes.Modified != 99 || res.Changes.Added != 0 || res.Changes.Deleted != 0 {
				b.Fatalf("%s, round %d: worktree changes %+v, want 99 modified", a.name, round, res.Changes)
			}
			a.firsts = append(a.firsts, t.first)
			a.walls = append(a.walls, t.wall)
			a.cpus = append(a.cpus, t.cpu)
			a.results = append(a.results, &res.result)
			if a.scans == nil {
				a.scans = map[string]int{}
			}
			a.scans[res.Changes.ScanAfter]++
			if a.befores == nil {
				a.befores = map[string]int{}
			}
			a.befores[res.Changes.ScanBefore]++
			a.relisted = append(a.relisted, res.Changes.DirsRelisted)
			a.statted = append(a.statted, res.Changes.DirsStatted)
			a.shared = append(a.shared, res.Changes.DirsStatShared)
			if res.Guard != nil {
				a.guardCached = append(a.guardCached, res.Guard.DirsCached)
			}
		}
	}
	for _, a := range arms {
		b.ReportMetric(msOf(median(a.firsts)), "first-"+a.name+"-ms")
		b.ReportMetric(msOf(median(a.walls)), "whole-"+a.name+"-ms")
		b.ReportMetric(msOf(median(a.cpus)), "cpu-"+a.name+"-ms")
		b.Logf("%s entries: first output p50 %.0f ms, whole run p50 %.0f ms, the run process's CPU p50 %.1f ms; phases (median ms): %s; scan before: %v, directories listed again by round %v, stat-ed by the namespace itself by round %v, their stat from the guard's scan by round %v; scan after: %v; guard's directories from its cache, by round: %v",
			a.name, msOf(median(a.firsts)), msOf(median(a.walls)), msOf(median(a.cpus)), phaseString(phaseMedians(a.results)), a.befores, a.relisted, a.statted, a.shared, a.scans, a.guardCached)
	}
	for i := 0; i+1 < len(arms); i += 2 {
		small, big := arms[i], arms[i+1]
		fr := msOf(median(big.firsts)) / msOf(median(small.firsts))
		wr := msOf(median(big.walls)) / msOf(median(small.walls))
		prefix := ""
		if i > 0 {
			prefix = "baseline-"
		}
		b.ReportMetric(fr, prefix+"first-ratio")
		b.ReportMetric(wr, prefix+"whole-ratio")
		b.Logf("%s100 000 ÷ 1 000 entries: first output %.2f×, whole run %.2f× (goal ≤ 1.2×)", prefix, fr, wr)
	}
	b.ReportMetric(0, "ns/op")
}

// worktreeOwner owns the benchmark's worktrees, as a developer's checkout
// is owned by its developer (a worktree owned by root never gets the
// idmapped mount).
const worktreeOwner = 4242

// makeWorktree makes a git work tree of n entries: directories d0000… of
// 99 files each (100 entries with the directory), owned by worktreeOwner,
// in a directory only root may enter.
func makeWorktree(b *testing.B, n int) string {
	wt := filepath.Join(b.TempDir(), "wt")
	if err := os.Mkdir(wt, 0o755); err != nil {
		b.Fatal(err)
	}
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
	if err := filepath.WalkDir(wt, func(p string, _ os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, worktreeOwner, worktreeOwner)
	}); err != nil {
		b.Fatal(err)
	}
	return wt
}

type worktreeResult struct {
	result
	Changes *struct {
		Added    int `json:"added"`
		Modified int `json:"modified"`
		Deleted  int `json:"deleted"`
		// ScanAfter: "events" or "walk: why" (builds before it: "").
		ScanAfter string `json:"scan_after"`
		// ScanBefore: "namespace…" or "walk…" (builds before it: "");
		// DirsRelisted: directories the namespace listed again.
		ScanBefore   string `json:"scan_before"`
		DirsRelisted int    `json:"dirs_relisted"`
		// DirsStatted, DirsStatShared: directories the namespace stat-ed
		// itself, and those whose stat it took from the guard's scan
		// (builds before it: absent, 0 both).
		DirsStatted    int `json:"dirs_statted"`
		DirsStatShared int `json:"dirs_stat_shared"`
	} `json:"worktree_changes"`
	// Guard: the guard's directory cache (builds before it: 0, 0).
	Guard *struct {
		DirsCached int `json:"dirs_cached"`
		DirsRead   int `json:"dirs_read"`
	} `json:"worktree_guard"`
}

func runWorktree(b *tbworld.World, bin, task, wt, script string) (*timing, *worktreeResult, error) {
	t, err := timed(inHost(b, bin, "--config", b.Config, "--json", "run", "--prepare-next", "--task", task, "--agent", "shell", "--worktree", wt, "--", "-c", script))
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
