package perf

import (
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/shrooms-cage/shrooms/internal/itest"
	"github.com/shrooms-cage/shrooms/internal/tbworld"
)

// BenchmarkBurstAB measures the burst of 8 (Goals/burst8) for two builds in
// one run, their rounds alternating, each build on 8 tasks of its own: the
// load other engineers put on the host moves both alike, where builds
// measured one after the other saw loads from 4 to 17. A is the bench's
// binary (SHROOMS_PERF_BINARY, or this tree's build), B is
// SHROOMS_PERF_BINARY_B (this tree's build when unset). -benchtime Nx runs N
// rounds of each, A first in even rounds, B first in odd ones.
func BenchmarkBurstAB(b *testing.B) {
	be := newBench(b)
	binB := os.Getenv("SHROOMS_PERF_BINARY_B")
	if binB == "" {
		binB = itest.ShroomsBinary(b)
	}
	b.Run("burst8", func(b *testing.B) {
		if b.N == 1 {
			return
		}
		const n = 8
		bins := []string{be.Binary, binB}
		tasks := [2][]string{}
		for k := range bins {
			for i := 0; i < n; i++ {
				task := be.Task(fmt.Sprintf("ab%d-%d", k, i))
				if _, _, err := runWith(be, bins[k], task, "shell", "echo x"); err != nil {
					b.Fatal(err)
				}
				tasks[k] = append(tasks[k], task)
			}
		}
		var firsts [2][]time.Duration
		var results [2][]*result
		var unprepared [2]int
		for r := 0; r < b.N; r++ {
			// Which build goes first alternates too.
			for _, k := range [][]int{{0, 1}, {1, 0}}[r%2] {
				for _, ts := range tasks {
					for _, t := range ts {
						be.WaitIdle(t)
					}
				}
				var mu sync.Mutex
				var wg sync.WaitGroup
				errs := make(chan error, n)
				for _, task := range tasks[k] {
					wg.Add(1)
					go func(task string) {
						defer wg.Done()
						t, res, err := runWith(be, bins[k], task, "shell", "echo x")
						if err != nil {
							errs <- err
							return
						}
						mu.Lock()
						defer mu.Unlock()
						firsts[k] = append(firsts[k], t.first)
						results[k] = append(results[k], res)
						if !res.Prepared {
							unprepared[k]++
						}
					}(task)
				}
				wg.Wait()
				close(errs)
				for err := range errs {
					b.Fatal(err)
				}
			}
		}
		for k, name := range []string{"A", "B"} {
			b.ReportMetric(msOf(quantile(firsts[k], 0.5)), name+"-p50-ms")
			b.ReportMetric(msOf(quantile(firsts[k], 0.95)), name+"-p95-ms")
			b.Logf("%s (%s): first output p50 %.0f ms, p95 %.0f ms (%d turns, %d not prepared); phases median: %s; p95: %s",
				name, bins[k], msOf(quantile(firsts[k], 0.5)), msOf(quantile(firsts[k], 0.95)), len(firsts[k]), unprepared[k],
				phaseString(phaseMedians(results[k])), phaseString(phaseQuantiles(results[k], 0.95)))
		}
		b.ReportMetric(0, "ns/op")
	})
}

// runWith is runTurn with another build of shrooms in place of the
// world's.
func runWith(be *tbworld.World, bin, task, agent, script string) (*timing, *result, error) {
	if bin == be.Binary {
		return runTurn(be, task, agent, script)
	}
	cmd := be.Command("--json", "run", "--prepare-next", "--task", task, "--agent", agent, "--", "-c", script)
	for i, a := range cmd.Args {
		if a == be.Binary {
			cmd.Args[i] = bin
		}
	}
	if cmd.Path == be.Binary {
		cmd.Path = bin
	}
	return runCmd(cmd)
}
