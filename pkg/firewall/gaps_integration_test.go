package firewall

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"

	"github.com/shrooms-cage/shrooms/internal/itest"
	"github.com/shrooms-cage/shrooms/internal/testbed"
)

// pair is one probe asked over IPv4 and over IPv6.
type pair struct {
	name     string
	proto    string
	v4, v6   netip.Addr
	port     int
	open     bool
	where    string
	loopback bool // the target is the host's loopback-only service port
}

// TestSealGaps covers what the main battery does not: discovery multicast
// gets no answer, host services bound to loopback stay out of reach, new
// connections into a cage are dropped, and every verdict is the same over
// IPv4 and IPv6. Each blocked result is paired with the same probe
// landing with the seal flushed.
func TestSealGaps(t *testing.T) {
	tb, cfg := newEnv(t)
	opts := hostOpts(tb)
	gw4, gw6 := cageGateways(t, cfg)
	peer := cageAddrs(t, tb, "peer")
	ctx := context.Background()
	// Discovery responders on the host side of the cage bridge. Multicast
	// does not leave the bridge's link (no multicast routing anywhere in
	// the testbed, and the seal's forward chain drops 224/4 and ff00::/8
	// regardless), so the host is the one responder a cage can reach.
	assert.NilError(t, tb.StartMulticast("host", cfg.Bridge))
	// The twin of the loopback-only service (127.0.0.1/::1 port
	// LoopbackPort), bound on the gateway addresses: it shows that a probe
	// to that port would be seen if it got to the host.
	lp := testbed.LoopbackPort
	assert.NilError(t, tb.Canary("host", gw4.String(), []int{lp}, []int{lp}))
	assert.NilError(t, tb.Canary("host", gw6.String(), []int{lp}, []int{lp}))

	in4, in6 := testbed.InternetAddr4, testbed.InternetAddr6
	pairs := []pair{
		{"internet tcp", "tcp", in4, in6, 80, true, "tb", false},
		{"internet udp", "udp", in4, in6, 5000, true, "tb", false},
		{"internet icmp", "icmp", in4, in6, 0, true, "tb", false},
		{"dns via gateway", "dns", gw4, gw6, 53, false, "tb", false}, // shut: the resolver is on the cage loopback
		{"dns direct udp", "dns", in4, in6, 53, false, "tb", false},
		{"dns direct tcp", "dnstcp", in4, in6, 53, false, "tb", false},
		{"router tcp", "tcp", testbed.RouterAddr4, testbed.RouterAddr6, 80, false, "tb", false},
		{"router udp", "udp", testbed.RouterAddr4, testbed.RouterAddr6, 5000, false, "tb", false},
		{"router icmp", "icmp", testbed.RouterAddr4, testbed.RouterAddr6, 0, false, "tb", false},
		{"metadata tcp", "tcp", testbed.Metadata4, testbed.Metadata6, 80, false, "tb", false},
		{"metadata udp", "udp", testbed.Metadata4, testbed.Metadata6, 5000, false, "tb", false},
		{"metadata icmp", "icmp", testbed.Metadata4, testbed.Metadata6, 0, false, "tb", false},
		{"private tcp", "tcp", testbed.Private[0], testbed.Private[4], 80, false, "tb", false},
		{"host lan tcp", "tcp", testbed.HostAddr4, testbed.HostAddr6, 22, false, "tb", false},
		{"host lan udp", "udp", testbed.HostAddr4, testbed.HostAddr6, 123, false, "tb", false},
		{"host lan icmp", "icmp", testbed.HostAddr4, testbed.HostAddr6, 0, false, "tb", false},
		{"gateway tcp", "tcp", gw4, gw6, 2375, false, "tb", false},
		{"gateway udp", "udp", gw4, gw6, 1900, false, "tb", false},
		{"gateway icmp", "icmp", gw4, gw6, 0, false, "tb", false},
		{"gateway loopback-service port tcp", "tcp", gw4, gw6, lp, false, "tb", true},
		{"gateway loopback-service port udp", "udp", gw4, gw6, lp, false, "tb", true},
		{"peer cage tcp", "tcp", peer[0], peer[len(peer)-1], 8080, false, "peer", false},
		{"peer cage udp", "udp", peer[0], peer[len(peer)-1], 5000, false, "peer", false},
	}
	for _, g := range testbed.Multicast {
		if g.Addr().Is4() {
			for _, g6 := range testbed.Multicast {
				if g6.Addr().Is6() && g6.Port() == g.Port() {
					pairs = append(pairs, pair{fmt.Sprintf("multicast udp/%d", g.Port()), "mcast", g.Addr(), g6.Addr(), int(g.Port()), false, "tb", false})
				}
			}
		}
	}
	assert.Assert(t, len(peer) == 2, "peer cage has no IPv6 address: %v", peer)
	if itest.Runtime() == "runsc" {
		// No ICMP leaves a runsc cage (runtimeProbes).
		pairs = slices.DeleteFunc(pairs, func(p pair) bool { return p.proto == "icmp" })
	}
	probes := func() []probe {
		var ps []probe
		for _, p := range pairs {
			ps = append(ps, probe{p.name + " v4", p.proto, p.v4, p.port, p.open, p.where},
				probe{p.name + " v6", p.proto, p.v6, p.port, p.open, p.where})
		}
		return ps
	}
	// loopbackHits are hits on the loopback-only service: never, in any state.
	loopbackHits := func() []testbed.Hit {
		var out []testbed.Hit
		for _, h := range tb.Hits("") {
			if h.Local.Port() == uint16(lp) && h.Local.Addr().IsLoopback() {
				out = append(out, h)
			}
		}
		return out
	}

	t.Run("route_localnet stays off in the host namespace", func(t *testing.T) {
		// With route_localnet=1 the host accepts packets to 127/8 from the
		// bridge (CVE-2020-8558): the loopback-only service would be one
		// crafted packet away.
		for _, dev := range []string{"all", "default", cfg.Bridge} {
			out, err := tb.Exec("host", "cat", "/proc/sys/net/ipv4/conf/"+dev+"/route_localnet")
			assert.NilError(t, err, string(out))
			assert.Equal(t, strings.TrimSpace(string(out)), "0", "route_localnet on %s", dev)
		}
	})

	t.Run("positive control: flushed, every probe lands in both families", func(t *testing.T) {
		assert.NilError(t, Flush(ctx, cfg, opts))
		ps := probes()
		hit := fireControl(t, tb, "a", ps)
		for _, p := range ps {
			assert.Check(t, hit[p.name], "%s: no hit even without the seal: the test could not see a hole", p.name)
		}
		for _, h := range tb.Hits("") {
			if h.Proto == "mcast" {
				t.Logf("multicast responder hit: %s %s", h.Local, strings.TrimSpace(h.Payload))
			}
		}
		assert.Equal(t, len(loopbackHits()), 0, "a service bound to loopback was reached from a cage: %+v", loopbackHits())
	})

	t.Run("sealed: no multicast, no loopback service, IPv6 verdicts equal IPv4's", func(t *testing.T) {
		assert.NilError(t, Apply(ctx, cfg, opts))
		ps := probes()
		hit := fire(t, tb, "a", ps, allowed)
		for _, p := range pairs {
			h4, h6 := hit[p.name+" v4"], hit[p.name+" v6"]
			assert.Check(t, h4 == h6, "%s: IPv4 %v, IPv6 %v: the families differ", p.name, h4, h6)
			assert.Check(t, h4 == p.open, "%s v4: landed=%v, want %v", p.name, h4, p.open)
			assert.Check(t, h6 == p.open, "%s v6: landed=%v, want %v", p.name, h6, p.open)
		}
		assert.Equal(t, len(loopbackHits()), 0, "a service bound to loopback was reached from a cage: %+v", loopbackHits())
		if t.Failed() {
			logState(t, tb, cfg, "a")
		}
	})

	t.Run("no new connection into a cage from the host, the LAN or the internet", func(t *testing.T) {
		// Routes to the cage subnets, as a LAN that knew them would have:
		// without them the test could not tell the seal from a missing route.
		tb.Route(netip.MustParsePrefix(cfg.Subnet4))
		tb.Route(netip.MustParsePrefix(cfg.Subnet6))
		dial := func(role string, addr netip.Addr, nonce string) error {
			d := tb.DialContext(role)
			dctx, cancel := context.WithTimeout(ctx, 1500*time.Millisecond)
			defer cancel()
			c, err := d(dctx, "tcp", net.JoinHostPort(addr.String(), "8080"))
			if err != nil {
				return err
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(2 * time.Second))
			fmt.Fprintf(c, "%s\n", nonce)
			b := make([]byte, 64)
			_, err = c.Read(b)
			return err
		}
		try := func(t *testing.T, run string, wantOpen bool) {
			logs := func() string { return tb.MustPodman("logs", "stb"+tb.ID+"-peer") }
			for _, role := range []string{"host", "router", "internet"} {
				for _, a := range peer {
					nonce := fmt.Sprintf("in%s-%s-%s-%s", tb.ID, run, role, strings.ReplaceAll(a.String(), ":", "_"))
					err := dial(role, a, nonce)
					if wantOpen {
						assert.Check(t, err == nil, "%s -> cage %s: %v (positive control: the connection should work unsealed)", role, a, err)
						assert.Check(t, strings.Contains(logs(), nonce+"\n"), "%s -> cage %s: the cage did not log the nonce", role, a)
					} else {
						assert.Check(t, err != nil, "%s -> cage %s: SEAL BREACHED, connected into the cage", role, a)
						assert.Check(t, !strings.Contains(logs(), nonce+"\n"), "%s -> cage %s: SEAL BREACHED, the cage logged the nonce", role, a)
					}
				}
			}
		}
		assert.NilError(t, Flush(ctx, cfg, opts))
		try(t, "flushed", true)
		assert.NilError(t, Apply(ctx, cfg, opts))
		try(t, "sealed", false)
	})

	// Leave the seal applied for the cleanup order of the other subtests.
	assert.NilError(t, Apply(ctx, cfg, opts))
}
