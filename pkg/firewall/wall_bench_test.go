package firewall

import (
	"context"
	"net/netip"
	"os/exec"
	"sort"
	"testing"
	"time"

	"github.com/shrooms-cage/shrooms/internal/itest"
)

// BenchmarkCageWallInstallVsVerify is the per-turn cost of the in-cage
// wall, side by side in one run: ApplyWall (a fresh cage: install and
// verify, on the turn's path) and VerifyWall (a prepared cage: its wall
// went in at preparation, the turn only checks it), in a network namespace
// of the benchmark's own with the internet policy's rule set and 50 host
// routes. Reported: the median ms of each (`make bench`).
func BenchmarkCageWallInstallVsVerify(b *testing.B) {
	itest.Require(b, itest.Root, itest.Netns, itest.Nftables)
	ns := itest.UniqueName("stbw")
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		b.Fatalf("ip netns add: %v: %s", err, out)
	}
	b.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
	var routes []netip.Prefix
	for i := 0; i < 50; i++ {
		routes = append(routes, netip.PrefixFrom(netip.AddrFrom4([4]byte{198, 51, byte(i), 0}), 24))
	}
	r, err := Describe(testCfg(), Resolved{}, routes, []netip.Addr{netip.MustParseAddr("198.51.0.2")})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	opts := Options{NetNS: "/run/netns/" + ns}
	var install, verify []time.Duration
	for i := 0; i < max(b.N, 20); i++ {
		start := time.Now()
		st, err := ApplyWall(ctx, r, opts)
		if err != nil || !st.OK {
			b.Fatalf("ApplyWall: %v %s", err, st.Reason)
		}
		install = append(install, time.Since(start))
		start = time.Now()
		st, err = VerifyWall(ctx, r, opts)
		if err != nil || !st.OK {
			b.Fatalf("VerifyWall: %v %s", err, st.Reason)
		}
		verify = append(verify, time.Since(start))
	}
	med := func(ds []time.Duration) float64 {
		sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
		return float64(ds[len(ds)/2].Microseconds()) / 1000
	}
	b.ReportMetric(med(install), "install-ms")
	b.ReportMetric(med(verify), "verify-ms")
	b.ReportMetric(0, "ns/op")
}
