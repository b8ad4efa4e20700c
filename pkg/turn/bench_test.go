package turn

import (
	"bytes"
	"context"
	"os/exec"
	"sort"
	"testing"
	"time"

	"github.com/containers/podman/v5/pkg/specgen"

	"github.com/shrooms-cage/shrooms/internal/itest"
	"github.com/shrooms-cage/shrooms/pkg/podman"
)

// BenchmarkTurnVsBarePodman runs paired turns of /bin/true (no network):
// a full shrooms turn (checks, lock, HOME reset, spec, create, start,
// wait, remove) against the bare API sequence podman run --rm performs with
// the same spec (create, attach, start, wait, remove), and against the
// podman CLI's `run --rm` with the same image, command and limits. It
// reports the medians and their ratios (`make bench`).
func BenchmarkTurnVsBarePodman(b *testing.B) {
	h := newBenchHarness(b)
	ctx := context.Background()
	task := h.task("bench")
	req := Request{Task: task, Agent: "shell", Args: []string{"-c", "true"}, Streams: podman.Streams{Stdout: &bytes.Buffer{}, Stderr: &bytes.Buffer{}}}
	if _, err := h.runner.Run(ctx, req); err != nil { // warm: bootstrap, id slot
		b.Fatal(err)
	}
	var spec *specgen.SpecGenerator
	h.runner.OnSpec = func(s *specgen.SpecGenerator) { spec = s }

	var shrooms, api, cli []time.Duration
	n := max(b.N, 10)
	b.ResetTimer()
	for i := 0; i < n; i++ {
		start := time.Now()
		if _, err := h.runner.Run(ctx, req); err != nil {
			b.Fatal(err)
		}
		shrooms = append(shrooms, time.Since(start))

		s := *spec
		s.Name = itest.UniqueName("bench-bare-")
		start = time.Now()
		id, err := h.client.Create(ctx, &s)
		if err != nil {
			b.Fatal(err)
		}
		done, err := h.client.Start(ctx, id, podman.Streams{Stdout: &bytes.Buffer{}, Stderr: &bytes.Buffer{}})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := h.client.Wait(ctx, id); err != nil {
			b.Fatal(err)
		}
		<-done
		if err := h.client.Remove(ctx, id); err != nil {
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

func newBenchHarness(b *testing.B) *harness {
	itest.Require(b, itest.Root, itest.Podman)
	return newHarnessTB(b, "")
}
