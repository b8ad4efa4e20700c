package cagelink

import (
	"context"
	"fmt"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// cpuTime is the process's user+system CPU so far (the kernel's own
// deferred work, such as a dead namespace's teardown, is not in it).
func cpuTime(b *testing.B) time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkEnsureBridge is the per-turn case: everything already right.
func BenchmarkEnsureBridge(b *testing.B) {
	w := newWorld(b, sub4, sub6)
	w.ensure()
	ctx := context.Background()
	b.ResetTimer()
	cpu := cpuTime(b)
	for i := 0; i < b.N; i++ {
		if err := EnsureBridge(ctx, w.n); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(cpuTime(b)-cpu)/float64(b.N), "cpu-ns/op")
}

// BenchmarkAttach is one cage's link and its exit (the namespace deleted;
// the kernel frees the veth later, off the clock). The namespace is made
// off the clock: the runtime makes it, not shrooms.
func BenchmarkAttach(b *testing.B) {
	w := newWorld(b, "10.77.0.0/16", sub6)
	w.ensure()
	ctx := context.Background()
	b.ResetTimer()
	var cpu time.Duration
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		cage, err := makeNS(w.dir, fmt.Sprintf("cage%d", i))
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		c0 := cpuTime(b)
		if _, err := Attach(ctx, w.n, cage); err != nil {
			b.Fatal(err)
		}
		if err := deleteNS(cage); err != nil {
			b.Fatal(err)
		}
		cpu += cpuTime(b) - c0
	}
	b.ReportMetric(float64(cpu)/float64(b.N), "cpu-ns/op")
}

// BenchmarkCheck is a prepared cage's check.
func BenchmarkCheck(b *testing.B) {
	w := newWorld(b, sub4, sub6)
	w.ensure()
	cage := w.newNS("cage")
	w.attach(cage)
	b.ResetTimer()
	cpu := cpuTime(b)
	for i := 0; i < b.N; i++ {
		if _, err := Check(w.n, cage); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(cpuTime(b)-cpu)/float64(b.N), "cpu-ns/op")
}
