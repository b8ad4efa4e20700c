package turn

import (
	"context"
	"github.com/shrooms-cage/shrooms/pkg/taskid"
	"io"
	"testing"
	"time"

	"github.com/shrooms-cage/shrooms/pkg/homestore"
	"github.com/shrooms-cage/shrooms/pkg/podman"
)

// BenchmarkHomeMountPerTurn measures what releasing HOME after every turn
// costs (README, Reliability): the wall time of a turn whose HOME is
// mounted fresh (as every turn now is: mount, reset, cage, unmount) against
// one whose HOME is already mounted when it starts, and the mount and the
// release on their own. The "held" figure is a turn as it was when HOME
// stayed mounted between turns: already mounted, and no release.
func BenchmarkHomeMountPerTurn(b *testing.B) {
	e, runner := newHarnessTB(b, "") // the default HOME size (8g)
	ctx := context.Background()
	task := e.Task("mountcost")
	run := func() time.Duration {
		start := time.Now()
		if _, err := runner.Run(ctx, Request{Task: taskid.Must(task), Agent: "shell", Args: []string{"-c", "true"}, Streams: podman.Streams{Stdout: io.Discard, Stderr: io.Discard}}); err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}
	mount := func() time.Duration {
		start := time.Now()
		if _, err := runner.homes().Mounted(ctx, taskid.Must(task)); err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}
	release := func() time.Duration {
		start := time.Now()
		if err := runner.releaseHome(ctx, taskid.Must(task)); err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}
	// The kernel frees an autoclear loop device a moment after its last
	// close (asynchronously), so the count is read until it settles.
	attached := func() int {
		deadline := time.Now().Add(5 * time.Second)
		for {
			atts, err := homestore.Attachments(runner.Cfg.State.Dir + "/homes")
			if err != nil {
				b.Fatal(err)
			}
			if len(atts) == 0 || time.Now().After(deadline) {
				return len(atts)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	run()
	var fresh, premounted, mounts, releases []time.Duration
	for i := 0; i < max(b.N, 10); i++ {
		if attached() != 0 {
			atts, _ := homestore.Attachments(runner.Cfg.State.Dir + "/homes")
			for _, a := range atts {
				b.Logf("attached: %v %+v", a, a.Mounts)
			}
			b.Fatal("HOME still attached after a turn")
		}
		fresh = append(fresh, run())
		mounts = append(mounts, mount())
		releases = append(releases, release())
		mount()
		premounted = append(premounted, run())
	}
	msOf := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	f, p, m, r := msOf(median(fresh)), msOf(median(premounted)), msOf(median(mounts)), msOf(median(releases))
	held := p - r
	b.ReportMetric(f, "fresh-ms")
	b.ReportMetric(p, "premounted-ms")
	b.ReportMetric(held, "held-ms")
	b.ReportMetric(m, "mount-ms")
	b.ReportMetric(r, "release-ms")
	b.ReportMetric(f/held, "fresh/held")
	b.ReportMetric(0, "ns/op")
}
