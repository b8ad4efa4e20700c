package turn

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containers/podman/v5/pkg/specgen"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/shrooms-cage/shrooms/internal/itest"
	"github.com/shrooms-cage/shrooms/pkg/podman"
	"github.com/shrooms-cage/shrooms/pkg/taskid"
)

// BenchmarkTurnVsBarePodman runs paired turns of /bin/true (no network):
// a full shrooms turn (checks, lock, HOME reset, spec, create, start,
// wait, remove) against the bare API sequence podman run --rm performs with
// the same spec (create, attach, start, wait, remove; HOME an empty
// directory, as the turn released its own), and against the podman CLI's
// `run --rm` with the same image, command and limits. It reports the
// medians and their ratios (`make bench`).
func BenchmarkTurnVsBarePodman(b *testing.B) {
	e, runner := newBenchHarness(b)
	ctx := context.Background()
	task := e.Task("bench")
	req := Request{Task: taskid.Must(task), Agent: "shell", Args: []string{"-c", "true"}, Streams: podman.Streams{Stdout: &bytes.Buffer{}, Stderr: &bytes.Buffer{}}}
	if _, err := runner.Run(ctx, req); err != nil { // warm: bootstrap, id slot
		b.Fatal(err)
	}
	var spec *specgen.SpecGenerator
	runner.OnSpec = func(s *specgen.SpecGenerator) { spec = s }

	var shrooms, api, cli []time.Duration
	n := max(b.N, 10)
	b.ResetTimer()
	for i := 0; i < n; i++ {
		start := time.Now()
		if _, err := runner.Run(ctx, req); err != nil {
			b.Fatal(err)
		}
		shrooms = append(shrooms, time.Since(start))

		s := bareSpec(b, spec, "bench-bare-")
		start = time.Now()
		id, err := runner.Podman.Create(ctx, s)
		if err != nil {
			b.Fatal(err)
		}
		done, err := runner.Podman.Start(ctx, id, podman.Streams{Stdout: &bytes.Buffer{}, Stderr: &bytes.Buffer{}})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := runner.Podman.Wait(ctx, id); err != nil {
			b.Fatal(err)
		}
		<-done
		if err := runner.Podman.Remove(ctx, id); err != nil {
			b.Fatal(err)
		}
		api = append(api, time.Since(start))

		start = time.Now()
		out, err := exec.Command("podman", "--url", itest.Socket(), "run", "--rm", "--network", "none",
			"--read-only", "--cap-drop", "all", "--security-opt", "no-new-privileges", "--user", "1000:1000",
			"--memory", "256m", "--pids-limit", "128", "--ulimit", "nofile=512:512", "--ulimit", "nproc=256:256",
			itest.TestImage, "/bin/sh", "-c", "true").CombinedOutput()
		if err != nil {
			b.Fatalf("podman run: %v: %s", err, out)
		}
		cli = append(cli, time.Since(start))
	}
	b.StopTimer()
	ms := func(d []time.Duration) float64 { return float64(median(d).Microseconds()) / 1000 }
	b.ReportMetric(ms(shrooms), "shrooms-ms")
	b.ReportMetric(ms(api), "bare-api-ms")
	b.ReportMetric(ms(cli), "podman-run-cli-ms")
	b.ReportMetric(ms(shrooms)/ms(api), "ratio-vs-api")
	b.ReportMetric(ms(shrooms)/ms(cli), "ratio-vs-cli")
	b.ReportMetric(0, "ns/op")
}

func median(d []time.Duration) time.Duration {
	s := append([]time.Duration{}, d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}

func newBenchHarness(b *testing.B, opts ...itest.Option) (*itest.Env, *Runner) {
	itest.Require(b, itest.Root, itest.Podman)
	return newHarnessTB(b, "", opts...)
}

// bareSpec copies a turn's spec for a bare podman run named with prefix.
// The turn released its HOME (the volume's image is unmounted after a
// turn), so the copy binds an empty directory wherever a bind's source is
// gone.
func bareSpec(b *testing.B, spec *specgen.SpecGenerator, prefix string) *specgen.SpecGenerator {
	s := *spec
	s.Name = itest.UniqueName(prefix)
	s.Mounts = append([]specs.Mount(nil), spec.Mounts...)
	for i, m := range s.Mounts {
		if _, err := os.Stat(m.Source); m.Type == "bind" && errors.Is(err, fs.ErrNotExist) {
			s.Mounts[i].Source = b.TempDir()
		}
	}
	return &s
}

// firstByte records when the first byte of output arrives.
type firstByte struct {
	start time.Time
	at    time.Duration
}

func (f *firstByte) Write(p []byte) (int, error) {
	if f.at == 0 && len(p) > 0 {
		f.at = time.Since(f.start)
	}
	return len(p), nil
}

// BenchmarkFirstByte measures, paired, the time from asking for a turn to
// the agent's first output byte: a shrooms turn in a prepared cage, a
// shrooms turn without one, the bare podman API sequence (create, attach,
// start) with the turn's spec (HOME an empty directory, see bareSpec) and
// the podman CLI's `run --rm` (`make bench`).
func BenchmarkFirstByte(b *testing.B) {
	e, runner := newBenchHarness(b)
	runner.Binary = itest.ShroomsBinary(b)
	ctx := context.Background()
	task := e.Task("fb")
	req := func(out io.Writer) Request {
		return Request{Task: taskid.Must(task), Agent: "shell", Args: []string{"-c", "echo x"}, Streams: podman.Streams{Stdout: out, Stderr: out}}
	}
	if _, err := runner.Run(ctx, req(io.Discard)); err != nil {
		b.Fatal(err)
	}
	var spec *specgen.SpecGenerator
	runner.OnSpec = func(s *specgen.SpecGenerator) { spec = s }
	var prepared, plain, api, cli []time.Duration
	n := max(b.N, 10)
	for i := 0; i < n; i++ {
		if _, err := runner.PrepareNext(ctx, req(nil)); err != nil {
			b.Fatal(err)
		}
		fb := &firstByte{start: time.Now()}
		res, err := runner.Run(ctx, req(fb))
		if err != nil || !res.Prepared || fb.at == 0 {
			b.Fatalf("prepared turn: %v prepared=%v", err, res != nil && res.Prepared)
		}
		prepared = append(prepared, fb.at)

		fb = &firstByte{start: time.Now()}
		if res, err = runner.Run(ctx, req(fb)); err != nil || res.Prepared || fb.at == 0 {
			b.Fatalf("plain turn: %v", err)
		}
		plain = append(plain, fb.at)

		s := bareSpec(b, spec, "bench-fb-")
		s.Command = []string{"/bin/sh", "-c", "echo x"}
		fb = &firstByte{start: time.Now()}
		id, err := runner.Podman.Create(ctx, s)
		if err != nil {
			b.Fatal(err)
		}
		done, err := runner.Podman.Start(ctx, id, podman.Streams{Stdout: fb, Stderr: fb})
		if err != nil {
			b.Fatal(err)
		}
		<-done
		api = append(api, fb.at)
		if err := runner.Podman.Remove(ctx, id); err != nil {
			b.Fatal(err)
		}

		cmd := exec.Command("podman", "--url", itest.Socket(), "run", "--rm", "--network", "none",
			"--read-only", "--cap-drop", "all", "--security-opt", "no-new-privileges", "--user", "1000:1000",
			"--memory", "256m", "--pids-limit", "128", "--ulimit", "nofile=512:512", "--ulimit", "nproc=256:256",
			itest.TestImage, "/bin/sh", "-c", "echo x")
		fb = &firstByte{start: time.Now()}
		cmd.Stdout = fb
		if err := cmd.Run(); err != nil {
			b.Fatalf("podman run: %v", err)
		}
		cli = append(cli, fb.at)
	}
	ms := func(d []time.Duration) float64 { return float64(median(d).Microseconds()) / 1000 }
	b.ReportMetric(ms(prepared), "prepared-ms")
	b.ReportMetric(ms(plain), "shrooms-ms")
	b.ReportMetric(ms(api), "bare-api-ms")
	b.ReportMetric(ms(cli), "podman-run-cli-ms")
	b.ReportMetric(ms(prepared)/ms(cli), "prepared-vs-cli")
	b.ReportMetric(ms(prepared)/ms(api), "prepared-vs-api")
	b.ReportMetric(0, "ns/op")
}

// BenchmarkConcurrentTasks runs turns of 1, 2, 4 and 8 tasks at once (each
// task's turns in sequence, as turns of one task never overlap) and reports
// turns per second and the p50 / p95 turn latency (`make bench`).
func BenchmarkConcurrentTasks(b *testing.B) {
	e, runner := newBenchHarness(b)
	ctx := context.Background()
	const turnsEach = 3
	for _, n := range []int{1, 2, 4, 8} {
		b.Run(fmt.Sprintf("tasks=%d", n), func(b *testing.B) {
			var mu sync.Mutex
			var lat []time.Duration
			start := time.Now()
			var wg sync.WaitGroup
			errs := make(chan error, n)
			for i := 0; i < n; i++ {
				wg.Add(1)
				go func(i int) {
					defer wg.Done()
					task := e.Task(fmt.Sprintf("c%d-%d", n, i))
					for k := 0; k < turnsEach; k++ {
						t0 := time.Now()
						_, err := runner.Run(ctx, Request{Task: taskid.Must(task), Agent: "shell", Args: []string{"-c", "true"},
							Streams: podman.Streams{Stdout: io.Discard, Stderr: io.Discard}})
						if err != nil {
							errs <- err
							return
						}
						mu.Lock()
						lat = append(lat, time.Since(t0))
						mu.Unlock()
					}
				}(i)
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				b.Fatal(err)
			}
			elapsed := time.Since(start)
			sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
			b.ReportMetric(float64(len(lat))/elapsed.Seconds(), "turns/s")
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
			b.ReportMetric(float64(lat[(len(lat)*95)/100].Microseconds())/1000, "p95-ms")
			b.ReportMetric(0, "ns/op")
		})
	}
}

// BenchmarkPeakRSS runs one turn with the real shrooms binary and reports
// its peak resident set size (`make bench`). The CLI prepares the task's
// next cage after the turn (cage.prepare_next, in a detached child whose
// memory is not counted): the world expects it.
func BenchmarkPeakRSS(b *testing.B) {
	e, runner := newBenchHarness(b, itest.WithPrepared())
	bin := itest.ShroomsBinary(b)
	cfgFile := filepath.Join(b.TempDir(), "config.toml")
	if err := os.WriteFile(cfgFile, []byte(fmt.Sprintf(`
[podman]
socket = %q
[state]
dir = %q
[cage]
image = %q
[network]
policy = "none"
[worktree]
uncapped = "allow"
[home]
volume_prefix = %q
[outbox]
root = %q
`, runner.Cfg.Podman.Socket, runner.Cfg.State.Dir, runner.Cfg.Cage.Image, runner.Cfg.Home.VolumePrefix, runner.Cfg.Outbox.Root)), 0o600); err != nil {
		b.Fatal(err)
	}
	var peak int64
	for i := 0; i < max(b.N, 3); i++ {
		cmd := exec.Command(bin, "--config", cfgFile, "run", "--task", e.Task("rss"), "--agent", "shell", "--no-stdin", "--", "-c", "true")
		if out, err := cmd.CombinedOutput(); err != nil {
			b.Fatalf("%v: %s", err, out)
		}
		if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok && ru.Maxrss > peak {
			peak = ru.Maxrss
		}
	}
	b.ReportMetric(float64(peak)/1024, "peak-rss-MiB")
	b.ReportMetric(0, "ns/op")
}

// BenchmarkTurnStartWithJunk plants 0, 10 000 and 100 000 junk files in
// HOME (as a hostile turn would leave them) and measures, paired, the time
// to the next turn's first output byte: the reset swaps the tree out in
// constant time and deletes it while the agent works (`make bench`).
func BenchmarkTurnStartWithJunk(b *testing.B) {
	e, runner := newBenchHarness(b)
	ctx := context.Background()
	task := e.Task("junk")
	run := func() time.Duration {
		fb := &firstByte{start: time.Now()}
		if _, err := runner.Run(ctx, Request{Task: taskid.Must(task), Agent: "shell", Args: []string{"-c", "echo x"}, Streams: podman.Streams{Stdout: fb, Stderr: io.Discard}}); err != nil {
			b.Fatal(err)
		}
		return fb.at
	}
	run()
	v, err := runner.Podman.InspectVolume(ctx, runner.Cfg.Home.VolumePrefix+task)
	if err != nil {
		b.Fatal(err)
	}
	ids, err := runner.Store.TaskIDs(taskid.Must(task), runner.IDFiles, false)
	if err != nil {
		b.Fatal(err)
	}
	plant := func(n int) {
		// HOME is mounted for turns only: mount it to plant.
		if _, err := runner.homes().Mounted(ctx, taskid.Must(task)); err != nil {
			b.Fatal(err)
		}
		home := filepath.Join(v.Mountpoint, "home")
		for d := 0; d < n/1000+1 && n > 0; d++ {
			dir := filepath.Join(home, fmt.Sprintf("junk%d", d))
			if err := os.MkdirAll(dir, 0o755); err != nil {
				b.Fatal(err)
			}
			for f := 0; f < 1000 && d*1000+f < n; f++ {
				p := filepath.Join(dir, fmt.Sprintf("f%d", f))
				if err := os.WriteFile(p, nil, 0o644); err != nil {
					b.Fatal(err)
				}
				_ = os.Lchown(p, int(ids.UID)+1000, int(ids.GID)+1000)
			}
		}
	}
	sizes := []int{0, 10000, 100000}
	got := map[int][]time.Duration{}
	for i := 0; i < max(b.N, 5); i++ {
		for _, n := range sizes {
			plant(n)
			got[n] = append(got[n], run())
		}
	}
	base := float64(median(got[0]).Microseconds()) / 1000
	for _, n := range sizes {
		ms := float64(median(got[n]).Microseconds()) / 1000
		b.ReportMetric(ms, fmt.Sprintf("junk%d-ms", n))
		b.ReportMetric(ms/base, fmt.Sprintf("junk%d-ratio", n))
	}
	b.ReportMetric(0, "ns/op")
}
