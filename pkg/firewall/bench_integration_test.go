package firewall

import (
	"context"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"gotest.tools/v3/assert"

	"github.com/shrooms-cage/shrooms/internal/testbed"
)

// BenchmarkCageThroughput measures TCP throughput from a cage to the
// internet canary with the seal flushed and applied, alternating each
// iteration so both see the same machine: the cage sends benchMiB MiB with
// busybox (dd | nc), a sink in the internet namespace counts the bytes and
// times them from the first to the last. Reported: MiB/s of each and
// their ratio sealed/unsealed (the target is >= 0.95).
func BenchmarkCageThroughput(b *testing.B) {
	const benchMiB = 64
	tb, cfg := newEnv(b)
	opts := hostOpts(tb)
	ctx := context.Background()
	ln, err := tb.ListenTCP("internet", net.JoinHostPort(testbed.InternetAddr4.String(), "0"))
	assert.NilError(b, err)
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port

	transfer := func() float64 {
		type result struct {
			n   int64
			dur time.Duration
			err error
		}
		done := make(chan result, 1)
		go func() {
			c, err := ln.Accept()
			if err != nil {
				done <- result{err: err}
				return
			}
			defer c.Close()
			buf := make([]byte, 1<<20)
			var n int64
			var first time.Time
			for n < benchMiB<<20 {
				k, err := c.Read(buf)
				if k > 0 && first.IsZero() {
					first = time.Now()
				}
				n += int64(k)
				if err == io.EOF {
					break
				}
				if err != nil {
					done <- result{n: n, err: err}
					return
				}
			}
			done <- result{n: n, dur: time.Since(first)}
		}()
		out, err := tb.Podman("exec", "stb"+tb.ID+"-a", "sh", "-c",
			fmt.Sprintf("dd if=/dev/zero bs=1M count=%d 2>/dev/null | nc %s %d", benchMiB, testbed.InternetAddr4, port))
		r := <-done
		assert.NilError(b, r.err)
		assert.Equal(b, r.n, int64(benchMiB<<20), "sink got %d bytes (sender: %v %s)", r.n, err, out)
		return float64(r.n) / (1 << 20) / r.dur.Seconds()
	}

	var sealed, unsealed float64
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		assert.NilError(b, Flush(ctx, cfg, opts))
		b.StartTimer()
		unsealed += transfer()
		b.StopTimer()
		assert.NilError(b, Apply(ctx, cfg, opts))
		b.StartTimer()
		sealed += transfer()
	}
	b.StopTimer()
	b.ReportMetric(unsealed/float64(b.N), "unsealed-MiB/s")
	b.ReportMetric(sealed/float64(b.N), "sealed-MiB/s")
	b.ReportMetric(sealed/unsealed, "sealed/unsealed")
}
