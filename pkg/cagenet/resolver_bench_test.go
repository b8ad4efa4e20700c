package cagenet

import (
	"context"
	"net"
	"net/netip"
	"os/exec"
	"testing"
	"time"

	"github.com/miekg/dns"
	"gotest.tools/v3/assert"

	"github.com/shrooms-cage/shrooms/internal/itest"
	"github.com/shrooms-cage/shrooms/pkg/config"
	"github.com/shrooms-cage/shrooms/pkg/dnsseal"
	"github.com/shrooms-cage/shrooms/pkg/firewall"
)

// BenchmarkResolverAnswer is a cage resolver's answer latency for an
// allowlisted name with the real pin (a netlink batch into the allowlist
// seal, in a network namespace the benchmark makes), uncached (an upstream
// query on loopback, then the pin) and cached (the pin only), beside the
// pin alone (`make bench`).
func BenchmarkResolverAnswer(b *testing.B) {
	itest.Require(b, itest.Root, itest.Nftables, itest.Netns)
	ns := itest.UniqueName("rb")
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		b.Fatalf("ip netns add: %v: %s", err, out)
	}
	b.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
	opts := firewall.Options{NetNS: "/run/netns/" + ns}
	cfg := config.Network{Policy: "allowlist", Name: "rb", Bridge: "rb0", Subnet4: "10.89.77.0/24", Allow: []string{"203.0.113.0/28"}}
	assert.NilError(b, firewall.Apply(context.Background(), cfg, opts))

	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	assert.NilError(b, err)
	up := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(r)
		m.Answer = []dns.RR{&dns.A{Hdr: dns.RR_Header{Name: r.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60}, A: net.IPv4(203, 0, 113, 77)}}
		_ = w.WriteMsg(m)
	})}
	go func() { _ = up.ActivateAndServe() }()
	b.Cleanup(func() { _ = up.Shutdown() })
	newServer := func() *dnsseal.Server {
		s, err := dnsseal.New(dnsseal.Config{Policy: dnsseal.Allowlist, Names: []string{"api.example"}, Upstream: []string{pc.LocalAddr().String()},
			Pin: Pinner(cfg, opts), PinTimeout: firewall.PinTimeout, Blocked: firewall.IsBlocked})
		assert.NilError(b, err)
		return s
	}
	q := new(dns.Msg)
	q.SetQuestion("api.example.", dns.TypeA)
	ctx := context.Background()
	b.Run("pin", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			if err := firewall.Pin(ctx, cfg, opts, []netip.Addr{netip.MustParseAddr("203.0.113.77")}, time.Minute); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("uncached", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			b.StopTimer()
			s := newServer()
			b.StartTimer()
			if m := s.Answer(ctx, q); m.Rcode != dns.RcodeSuccess {
				b.Fatal(m.Rcode)
			}
		}
	})
	b.Run("cached", func(b *testing.B) {
		s := newServer()
		s.Answer(ctx, q)
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			if m := s.Answer(ctx, q); m.Rcode != dns.RcodeSuccess {
				b.Fatal(m.Rcode)
			}
		}
	})
	pins, err := firewall.Pinned(cfg, opts)
	assert.NilError(b, err)
	_, ok := pins[netip.MustParseAddr("203.0.113.77")]
	assert.Assert(b, ok, "the answer's address is pinned in the seal: %v", pins)
}
