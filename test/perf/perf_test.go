package perf

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/shrooms-cage/shrooms/internal/tbworld"
	"github.com/shrooms-cage/shrooms/pkg/taskstate"
)

// BenchmarkGoals measures the round-2 performance goals (README) in one
// testbed, side by side:
//
//   - whole: the wall time of the whole `shrooms run --prepare-next`
//     process (sealed network, prepared cage) against `podman run --rm` on
//     podman's default network and on shrooms' own network, same image and
//     command, paired, medians;
//   - first-output: from the call to the first byte of the command's output
//     with a prepared cage, p50 and p99, and a burst of 8 tasks at once, p95;
//   - idle-memory: what an idle prepared cage holds on the host;
//   - start-flat: first output with 100 000 junk files in HOME, or with a
//     1 GiB transcript on the keep-list, against an empty HOME (ratios).
//
// Run it with -benchtime 10x: the sizes scale with b.N, and the probing
// run with b.N == 1 that the testing package makes first measures nothing.
func BenchmarkGoals(b *testing.B) {
	be := newBench(b)
	b.Run("whole", func(b *testing.B) { benchWhole(b, be) })
	b.Run("first-output", func(b *testing.B) { benchFirstOutput(b, be) })
	b.Run("burst8", func(b *testing.B) { benchBurst(b, be, 8) })
	b.Run("idle-memory", func(b *testing.B) { benchIdleMemory(b, be) })
	b.Run("start-flat", func(b *testing.B) { benchStartFlat(b, be) })
}

func benchWhole(b *testing.B, be *tbworld.World) {
	if b.N == 1 {
		return
	}
	task := be.Task("whole")
	if _, _, err := runTurn(be, task, "shell", "true"); err != nil { // bootstrap, network, first preparation
		b.Fatal(err)
	}
	if _, err := bareRun(be, "podman", "true"); err != nil { // podman's default network exists
		b.Fatal(err)
	}
	var shrooms, bare, bareOwn []time.Duration
	var results []*result
	prepared := 0
	for i := 0; i < b.N; i++ {
		be.WaitIdle(task)
		t, res, err := runTurn(be, task, "shell", "true")
		if err != nil {
			b.Fatal(err)
		}
		shrooms = append(shrooms, t.wall)
		results = append(results, res)
		if res.Prepared {
			prepared++
		}
		be.WaitIdle(task) // podman runs alone, not beside shrooms' teardown
		if t, err = bareRun(be, "podman", "true"); err != nil {
			b.Fatal(err)
		}
		bare = append(bare, t.wall)
		if t, err = bareRun(be, podmanCageNet(b, be), "true"); err != nil {
			b.Fatal(err)
		}
		bareOwn = append(bareOwn, t.wall)
	}
	b.ReportMetric(msOf(median(shrooms)), "shrooms-ms")
	b.ReportMetric(msOf(median(bare)), "podman-run-ms")
	b.ReportMetric(msOf(median(bareOwn)), "podman-run-cage-net-ms")
	b.ReportMetric(msOf(median(shrooms))/msOf(median(bare)), "ratio")
	b.ReportMetric(float64(prepared), "prepared-turns")
	b.ReportMetric(0, "ns/op")
	b.Logf("whole run: shrooms %.0f ms, podman run --rm (default network) %.0f ms, on the cage network %.0f ms; %d/%d turns prepared; phases (median ms): %s",
		msOf(median(shrooms)), msOf(median(bare)), msOf(median(bareOwn)), prepared, len(results), phaseString(phaseMedians(results)))
}

func benchFirstOutput(b *testing.B, be *tbworld.World) {
	if b.N == 1 {
		return
	}
	task := be.Task("fo")
	if _, _, err := runTurn(be, task, "shell", "echo x"); err != nil {
		b.Fatal(err)
	}
	var firsts, bare []time.Duration
	var results []*result
	for i := 0; i < 5*b.N; i++ {
		be.WaitIdle(task) // the next cage is prepared
		t, res, err := runTurn(be, task, "shell", "echo x")
		if err != nil {
			b.Fatal(err)
		}
		if !res.Prepared {
			b.Fatalf("turn %d did not run in a prepared cage", i)
		}
		firsts = append(firsts, t.first)
		results = append(results, res)
		if i%2 == 0 {
			be.WaitIdle(task)
			if t, err = bareRun(be, "podman", "echo x"); err != nil {
				b.Fatal(err)
			}
			bare = append(bare, t.first)
		}
	}
	b.ReportMetric(msOf(quantile(firsts, 0.5)), "p50-ms")
	b.ReportMetric(msOf(quantile(firsts, 0.99)), "p99-ms")
	b.ReportMetric(msOf(median(bare)), "podman-run-p50-ms")
	b.ReportMetric(0, "ns/op")
	b.Logf("first output, prepared: p50 %.0f ms, p99 %.0f ms (%d turns); podman run --rm p50 %.0f ms; phases (median ms): %s",
		msOf(quantile(firsts, 0.5)), msOf(quantile(firsts, 0.99)), len(firsts), msOf(median(bare)), phaseString(phaseMedians(results)))
}

func benchBurst(b *testing.B, be *tbworld.World, n int) {
	if b.N == 1 {
		return
	}
	tasks := make([]string, n)
	for i := range tasks {
		tasks[i] = be.Task(fmt.Sprintf("burst%d", i))
		if _, _, err := runTurn(be, tasks[i], "shell", "echo x"); err != nil {
			b.Fatal(err)
		}
	}
	var firsts, cpus []time.Duration
	var starts []time.Time
	var results []*result
	prepared := 0
	rounds := max(b.N/3, 1)
	for r := 0; r < rounds; r++ {
		for _, t := range tasks {
			be.WaitIdle(t)
		}
		var mu sync.Mutex
		var wg sync.WaitGroup
		errs := make(chan error, n)
		for _, task := range tasks {
			wg.Add(1)
			go func(task string) {
				defer wg.Done()
				t, res, err := runTurn(be, task, "shell", "echo x")
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				results = append(results, res)
				firsts = append(firsts, t.first)
				cpus = append(cpus, t.cpu)
				starts = append(starts, t.at)
				if res.Prepared {
					prepared++
				}
				mu.Unlock()
			}(task)
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			b.Fatal(err)
		}
	}
	b.ReportMetric(msOf(quantile(firsts, 0.5)), "p50-ms")
	b.ReportMetric(msOf(quantile(firsts, 0.95)), "p95-ms")
	b.ReportMetric(float64(prepared), "prepared-turns")
	b.ReportMetric(0, "ns/op")
	b.Logf("burst of %d tasks, first output: p50 %.0f ms, p95 %.0f ms (%d turns, %d prepared); phases (median ms): %s; p95: %s",
		n, msOf(quantile(firsts, 0.5)), msOf(quantile(firsts, 0.95)), len(firsts), prepared, phaseString(phaseMedians(results)), phaseString(phaseQuantiles(results, 0.95)))
	// Before Run: the process's start, its config and its connection to
	// podman (from the call to the turn's startedAt, millisecond stamps).
	var before []time.Duration
	for i, r := range results {
		if at, err := time.Parse(taskstate.TimeFormat, r.StartedAt); err == nil {
			before = append(before, at.Sub(starts[i]))
		}
	}
	if len(before) == len(results) {
		b.Logf("burst of %d: before the turn (process start, config, connect): median %.0f ms, p95 %.0f ms; CPU of a run process (user+sys, median) %.0f ms",
			n, msOf(median(before)), msOf(quantile(before, 0.95)), msOf(median(cpus)))
	} else {
		b.Errorf("%d of %d results had no started_at", len(results)-len(before), len(results))
	}
}

// benchIdleMemory prepares cages for several tasks and reports what one
// idle prepared cage holds: the proportional set size of its conmon and of
// the runtime's process waiting in it, its cgroup's charge, and the change
// of the host's used memory, slab and shmem per cage.
func benchIdleMemory(b *testing.B, be *tbworld.World) {
	if b.N == 1 {
		return
	}
	const n = 6
	tasks := make([]string, n)
	for i := range tasks {
		tasks[i] = be.Task(fmt.Sprintf("mem%d", i))
		// A first turn bootstraps HOME; the cage it prepares is removed so
		// the measurement starts from none.
		if _, _, err := runTurn(be, tasks[i], "shell", "true"); err != nil {
			b.Fatal(err)
		}
		be.WaitIdle(tasks[i])
		removeCages(be, b, tasks[i])
	}
	before := meminfo(b)
	for _, task := range tasks {
		if out, err := shrooms(be, "prepare", "--task", task, "--agent", "shell"); err != nil {
			b.Fatalf("prepare: %v: %s", err, out)
		}
	}
	after := meminfo(b)
	var conmon, initPss, cg float64
	for _, task := range tasks {
		cages, err := be.Client.ListByLabel(context.Background(), "io.shrooms.task", task)
		if err != nil || len(cages) != 1 {
			b.Fatalf("prepared cages of %s: %v %v", task, cages, err)
		}
		out, err := be.TB.Podman("inspect", "--format", "{{.State.ConmonPid}} {{.State.Pid}}", cages[0].ID)
		if err != nil {
			b.Fatalf("inspect: %v: %s", err, out)
		}
		var cpid, ipid int
		if _, err := fmt.Sscan(out, &cpid, &ipid); err != nil {
			b.Fatalf("inspect %q: %v", out, err)
		}
		conmon += pss(b, cpid)
		if ipid > 0 {
			initPss += pss(b, ipid)
			cg += cgroupCharge(ipid)
		}
	}
	perCage := func(k string) float64 { return (after[k] - before[k]) / n / 1024 }
	used := (before["MemAvailable"] - after["MemAvailable"]) / n / 1024
	b.ReportMetric(conmon/n/1024, "conmon-pss-MiB")
	b.ReportMetric(initPss/n/1024, "runtime-init-pss-MiB")
	b.ReportMetric(cg/n/1024/1024, "cgroup-MiB")
	b.ReportMetric(used, "host-used-MiB")
	b.ReportMetric(perCage("Slab"), "slab-MiB")
	b.ReportMetric(perCage("Shmem"), "shmem-MiB")
	b.ReportMetric(0, "ns/op")
	b.Logf("idle prepared cage (mean of %d): conmon PSS %.2f MiB, runtime init PSS %.2f MiB, cgroup charge %.2f MiB; host: MemAvailable -%.2f MiB, Slab +%.2f MiB, Shmem +%.2f MiB per cage (other engineers' load makes the host figures noisy)",
		n, conmon/n/1024, initPss/n/1024, cg/n/1024/1024, used, perCage("Slab"), perCage("Shmem"))
	for _, task := range tasks {
		removeCages(be, b, task)
	}
}

// benchStartFlat measures first output of a prepared turn after a turn
// that left 100 000 junk files in HOME, and with a 1 GiB transcript kept,
// against the same turn with an empty HOME, interleaved.
func benchStartFlat(b *testing.B, be *tbworld.World) {
	if b.N == 1 {
		return
	}
	empty, junk, big := be.Task("flat-empty"), be.Task("flat-junk"), be.Task("flat-big")
	for _, task := range []string{empty, junk, big} {
		if _, _, err := runTurn(be, task, "cl", "echo x"); err != nil {
			b.Fatal(err)
		}
		be.WaitIdle(task)
	}
	// The transcript is planted once and stays: it is on the keep-list.
	removeCages(be, b, big)
	home := homeDir(be, b, big)
	transcript := filepath.Join(home, ".claude/projects/-work/0b9c5e3a-2f4d-4c1e-9a7b-5d6e7f8a9b0c.jsonl")
	writeBig(b, transcript, 1<<30)
	chownLike(b, transcript, home)
	chownLike(b, filepath.Dir(transcript), home)
	chownLike(b, filepath.Dir(filepath.Dir(transcript)), home)
	syscall.Sync() // the test's own writes are not the turn's cost
	if out, err := shrooms(be, "prepare", "--task", big, "--agent", "cl"); err != nil {
		b.Fatalf("prepare: %v: %s", err, out)
	}
	got := map[string][]time.Duration{}
	prepared := map[string]int{}
	for i := 0; i < b.N; i++ {
		// The junk is what a hostile turn leaves; the next cage is prepared
		// after it (as --prepare-next does once the turn ended).
		be.WaitIdle(junk)
		removeCages(be, b, junk)
		plantJunk(b, homeDir(be, b, junk), 100000)
		if out, err := shrooms(be, "prepare", "--task", junk, "--agent", "cl"); err != nil {
			b.Fatalf("prepare: %v: %s", err, out)
		}
		syscall.Sync()
		for _, task := range []string{empty, junk, big} {
			// Each turn starts on a quiet host: no other task's teardown
			// runs beside it.
			for _, t := range []string{empty, junk, big} {
				be.WaitIdle(t)
			}
			t, res, err := runTurn(be, task, "cl", "echo x")
			if err != nil {
				b.Fatal(err)
			}
			got[task] = append(got[task], t.first)
			if res.Prepared {
				prepared[task]++
			}
		}
	}
	base := msOf(median(got[empty]))
	b.ReportMetric(base, "empty-ms")
	b.ReportMetric(msOf(median(got[junk])), "junk100k-ms")
	b.ReportMetric(msOf(median(got[big])), "transcript1GiB-ms")
	b.ReportMetric(msOf(median(got[junk]))/base, "junk100k-ratio")
	b.ReportMetric(msOf(median(got[big]))/base, "transcript1GiB-ratio")
	b.ReportMetric(0, "ns/op")
	b.Logf("turn start (first output, medians): empty HOME %.0f ms, after 100 000 junk files %.0f ms (%.2f), 1 GiB transcript %.0f ms (%.2f); prepared turns %v",
		base, msOf(median(got[junk])), msOf(median(got[junk]))/base, msOf(median(got[big])), msOf(median(got[big]))/base, prepared)
}

// removeCages removes every cage of the task (a prepared one, before the
// test changes HOME behind shrooms' back).
func removeCages(be *tbworld.World, b *testing.B, task string) {
	cages, err := be.Client.ListByLabel(context.Background(), "io.shrooms.task", task)
	if err != nil {
		b.Fatal(err)
	}
	for _, c := range cages {
		if err := be.Client.Remove(context.Background(), c.ID); err != nil {
			b.Fatal(err)
		}
	}
}

// homeDir is the task HOME's directory on the host.
func homeDir(be *tbworld.World, b *testing.B, task string) string {
	v, err := be.Client.InspectVolume(context.Background(), be.Cfg.Home.VolumePrefix+task)
	if err != nil {
		b.Fatal(err)
	}
	return filepath.Join(v.Mountpoint, "home")
}

func chownLike(b *testing.B, path, like string) {
	st, err := os.Stat(like)
	if err != nil {
		b.Fatal(err)
	}
	uid, gid := ownerOf(st)
	if err := os.Lchown(path, uid, gid); err != nil {
		b.Fatal(err)
	}
}

func plantJunk(b *testing.B, home string, n int) {
	st, err := os.Stat(home)
	if err != nil {
		b.Fatal(err)
	}
	uid, gid := ownerOf(st)
	for d := 0; d*1000 < n; d++ {
		dir := filepath.Join(home, fmt.Sprintf("junk%d", d))
		if err := os.Mkdir(dir, 0o755); err != nil {
			b.Fatal(err)
		}
		_ = os.Lchown(dir, uid, gid)
		for f := 0; f < 1000 && d*1000+f < n; f++ {
			p := filepath.Join(dir, "f"+strconv.Itoa(f))
			if err := os.WriteFile(p, nil, 0o644); err != nil {
				b.Fatal(err)
			}
			_ = os.Lchown(p, uid, gid)
		}
	}
}

// writeBig writes size bytes of JSON lines (real blocks, not a sparse file).
func writeBig(b *testing.B, path string, size int64) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		b.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		b.Fatal(err)
	}
	// A conversation record the transcript rebuild keeps (it needs a uuid).
	line := []byte(`{"type":"user","uuid":"u1","parentUuid":null,"message":{"role":"user","content":"` + strings.Repeat("x", 4000) + `"}}` + "\n")
	w := bufio.NewWriterSize(f, 1<<20)
	for written := int64(0); written < size; written += int64(len(line)) {
		if _, err := w.Write(line); err != nil {
			b.Fatal(err)
		}
	}
	if err := w.Flush(); err != nil {
		b.Fatal(err)
	}
	if err := f.Close(); err != nil {
		b.Fatal(err)
	}
}

// meminfo reads /proc/meminfo in KiB.
func meminfo(b *testing.B) map[string]float64 {
	raw, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		b.Fatal(err)
	}
	m := map[string]float64{}
	for _, l := range strings.Split(string(raw), "\n") {
		f := strings.Fields(l)
		if len(f) >= 2 {
			v, _ := strconv.ParseFloat(f[1], 64)
			m[strings.TrimSuffix(f[0], ":")] = v
		}
	}
	return m
}

// pss is a process's proportional set size in KiB.
func pss(b *testing.B, pid int) float64 {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		b.Fatalf("smaps of %d: %v", pid, err)
	}
	for _, l := range strings.Split(string(raw), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "Pss:" {
			v, _ := strconv.ParseFloat(f[1], 64)
			return v
		}
	}
	return 0
}

// cgroupCharge is the memory charged to the process's cgroup, in bytes
// (cgroup v2, or v1's memory controller on a hybrid host).
func cgroupCharge(pid int) float64 {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
		f := strings.SplitN(l, ":", 3)
		if len(f) != 3 {
			continue
		}
		var file string
		switch {
		case f[1] == "memory":
			file = filepath.Join("/sys/fs/cgroup/memory", f[2], "memory.usage_in_bytes")
		case f[0] == "0" && f[1] == "":
			file = filepath.Join("/sys/fs/cgroup/unified", f[2], "memory.current")
			if _, err := os.Stat(file); err != nil {
				file = filepath.Join("/sys/fs/cgroup", f[2], "memory.current")
			}
		default:
			continue
		}
		if v, err := os.ReadFile(file); err == nil {
			n, _ := strconv.ParseFloat(strings.TrimSpace(string(v)), 64)
			if n > 0 {
				return n
			}
		}
	}
	return 0
}

// ownerOf is a file's owner.
func ownerOf(st os.FileInfo) (int, int) {
	sys := st.Sys().(*syscall.Stat_t)
	return int(sys.Uid), int(sys.Gid)
}
