//go:build runsc

package turn

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/shrooms-cage/shrooms/internal/itest"
	"github.com/shrooms-cage/shrooms/pkg/podman"
	"github.com/shrooms-cage/shrooms/pkg/taskid"
)

// BenchmarkRunscVsRunc measures, paired in one run, a shell turn under
// runsc against the same turn under the default runtime (runc): the
// whole turn (/bin/true), the first output byte with and without a
// prepared cage, and the host memory an idle prepared cage holds (the
// resident sets of the host processes in its cgroup: runc's init, or
// runsc's sandbox and gofer). docs/gvisor.md has the figures.
func BenchmarkRunscVsRunc(b *testing.B) {
	itest.Require(b, itest.Root, itest.Podman)
	runsc := os.Getenv("SHROOMS_TEST_RUNSC")
	if runsc == "" {
		b.Fatal("SHROOMS_TEST_RUNSC is unset")
	}
	runcEnv, runcRunner := newBenchHarness(b)
	runscEnv, runscRunner := runscBenchHarness(b, runsc)
	runners := map[string]*Runner{"runc": runcRunner, "runsc": runscRunner}
	tasks := map[string]string{"runc": runcEnv.Task("rb"), "runsc": runscEnv.Task("rb")}
	ctx := context.Background()
	for _, runner := range runners {
		runner.Binary = itest.ShroomsBinary(b)
	}
	req := func(rt string, out io.Writer, script string) Request {
		return Request{Task: taskid.Must(tasks[rt]), Agent: "shell", Args: []string{"-c", script}, Streams: podman.Streams{Stdout: out, Stderr: out}}
	}
	for rt, runner := range runners { // warm: bootstrap, id slot
		if _, err := runner.Run(ctx, req(rt, io.Discard, "true")); err != nil {
			b.Fatal(err)
		}
	}
	whole, plain, prep := map[string][]time.Duration{}, map[string][]time.Duration{}, map[string][]time.Duration{}
	mem := map[string][]int64{}
	n := max(b.N, 5)
	for i := 0; i < n; i++ {
		for _, rt := range []string{"runc", "runsc"} {
			runner := runners[rt]
			start := time.Now()
			if _, err := runner.Run(ctx, req(rt, &bytes.Buffer{}, "true")); err != nil {
				b.Fatal(rt, err)
			}
			whole[rt] = append(whole[rt], time.Since(start))

			fb := &firstByte{start: time.Now()}
			if res, err := runner.Run(ctx, req(rt, fb, "echo x")); err != nil || res.Prepared || fb.at == 0 {
				b.Fatalf("%s plain turn: %v", rt, err)
			}
			plain[rt] = append(plain[rt], fb.at)

			id, err := runner.PrepareNext(ctx, req(rt, nil, "echo x"))
			if err != nil || id == "" {
				b.Fatalf("%s prepare: %q %v", rt, id, err)
			}
			time.Sleep(500 * time.Millisecond) // idle
			rss, err := cageRSS(ctx, runner, id)
			if err != nil {
				b.Fatal(rt, err)
			}
			mem[rt] = append(mem[rt], rss)
			fb = &firstByte{start: time.Now()}
			if res, err := runner.Run(ctx, req(rt, fb, "echo x")); err != nil || !res.Prepared || fb.at == 0 {
				b.Fatalf("%s prepared turn: %v", rt, err)
			}
			prep[rt] = append(prep[rt], fb.at)
		}
	}
	ms := func(d []time.Duration) float64 { return float64(median(d).Microseconds()) / 1000 }
	for _, rt := range []string{"runc", "runsc"} {
		b.ReportMetric(ms(whole[rt]), rt+"-turn-ms")
		b.ReportMetric(ms(plain[rt]), rt+"-first-byte-ms")
		b.ReportMetric(ms(prep[rt]), rt+"-prepared-first-byte-ms")
		b.ReportMetric(float64(medianInt(mem[rt]))/(1<<20), rt+"-idle-prepared-MiB")
	}
	b.ReportMetric(ms(whole["runsc"])/ms(whole["runc"]), "turn-ratio")
	b.ReportMetric(ms(plain["runsc"])/ms(plain["runc"]), "first-byte-ratio")
	b.ReportMetric(ms(prep["runsc"])/ms(prep["runc"]), "prepared-first-byte-ratio")
	b.ReportMetric(0, "ns/op")
}

func runscBenchHarness(b *testing.B, runsc string) (*itest.Env, *Runner) {
	// Started first, so it stops after the env's cleanup.
	socket := itest.StartServiceWith(b, runscFlags(runsc)...).URI
	e, runner := newBenchHarness(b)
	cfg := *runner.Cfg
	cfg.Podman.Socket = socket
	cfg.Cage.Runtime = runsc
	client, err := podman.Connect(context.Background(), socket)
	if err != nil {
		b.Fatal(err)
	}
	*runner = *NewRunner(&cfg, client, nil)
	return e, runner
}

func medianInt(v []int64) int64 {
	d := make([]time.Duration, len(v))
	for i, x := range v {
		d[i] = time.Duration(x)
	}
	return int64(median(d))
}

// cageRSS sums VmRSS of every host process in the cage's cgroup (the
// cgroup of the process podman names as the cage's).
func cageRSS(ctx context.Context, runner *Runner, id string) (int64, error) {
	pid, err := runner.Podman.Pid(ctx, id)
	if err != nil {
		return 0, err
	}
	want, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
	if err != nil {
		return 0, err
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/cgroup")
	var sum int64
	for _, p := range procs {
		if cg, err := os.ReadFile(p); err != nil || !bytes.Equal(cg, want) {
			continue
		}
		st, err := os.ReadFile(filepath.Join(filepath.Dir(p), "status"))
		if err != nil {
			continue
		}
		for _, l := range strings.Split(string(st), "\n") {
			if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
				kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
				sum += kb << 10
			}
		}
	}
	return sum, nil
}
