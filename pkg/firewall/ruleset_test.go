package firewall

import (
	"context"
	"fmt"
	"net/netip"
	"os/exec"
	"strings"
	"testing"

	"gotest.tools/v3/assert"

	"github.com/shrooms-cage/shrooms/internal/itest"
	"github.com/shrooms-cage/shrooms/pkg/config"
)

func testCfg() config.Network {
	return config.Network{Policy: "internet", Name: "shrooms", Bridge: "shrooms0", Subnet4: "10.89.0.0/24", Subnet6: "fd89:5eed:cafe::/64"}
}

func TestBuildRefusesBadInput(t *testing.T) {
	for _, tc := range []struct {
		name string
		mod  func(*config.Network)
		msg  string
	}{
		{"unknown policy", func(c *config.Network) { c.Policy = "open" }, "unknown policy"},
		{"host bits", func(c *config.Network) { c.Policy = "allowlist"; c.Allow = []string{"203.0.113.1/24"} }, "host bits"},
		{"private allow", func(c *config.Network) { c.Policy = "allowlist"; c.Allow = []string{"192.168.0.0/16"} }, "blocked range"},
		{"metadata allow", func(c *config.Network) { c.Policy = "allowlist"; c.Allow = []string{"fd00:ec2::254"} }, "blocked range"},
		{"bad bridge", func(c *config.Network) { c.Bridge = "eth0;drop" }, "network.bridge"},
		{"bad subnet4", func(c *config.Network) { c.Subnet4 = "fd00::/64" }, "network.subnet4"},
		{"bad subnet6", func(c *config.Network) { c.Subnet6 = "10.0.0.0/8" }, "network.subnet6"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testCfg()
			tc.mod(&cfg)
			_, err := buildFor(cfg, nil, nil)
			assert.ErrorContains(t, err, tc.msg)
		})
	}
}

func TestBuildIsDeterministicAndPolicySpecific(t *testing.T) {
	a, err := buildFor(testCfg(), nil, nil)
	assert.NilError(t, err)
	b, err := buildFor(testCfg(), nil, nil)
	assert.NilError(t, err)
	assert.Equal(t, render(a), render(b))

	al := testCfg()
	al.Policy = "allowlist"
	al.Allow = []string{"203.0.113.0/24"}
	c, err := buildFor(al, nil, nil)
	assert.NilError(t, err)
	assert.Assert(t, digest(render(a)) != digest(render(c)))
	// Under allowlist the gateway DNS exception is gone.
	assert.Assert(t, strings.Count(render(a), "data=0035") == 4, "internet: 4 DNS exceptions (udp/tcp, v4/v6)")
	assert.Assert(t, !strings.Contains(render(c), "data=0035"))

	none := testCfg()
	none.Policy = "none"
	p, err := buildFor(none, nil, nil)
	assert.NilError(t, err)
	assert.Equal(t, len(p.tables), 0)
}

func TestPrefixesSetMergesLikeNft(t *testing.T) {
	s, err := prefixSet("t", []string{"10.0.0.0/8", "224.0.0.0/4", "240.0.0.0/4"}, false)
	assert.NilError(t, err)
	var got []string
	for _, e := range s.elems {
		a, _ := netip.AddrFromSlice(e.Key)
		got = append(got, a.String()+map[bool]string{true: "/end", false: ""}[e.IntervalEnd])
	}
	// Leading interval end at 0.0.0.0, merged 224/3 open to the top.
	assert.DeepEqual(t, got, []string{"0.0.0.0/end", "10.0.0.0", "11.0.0.0/end", "224.0.0.0"})
}

func TestBlockedRanges(t *testing.T) {
	for _, a := range []string{"10.1.2.3", "172.20.0.1", "192.168.1.1", "100.100.100.200", "169.254.169.254",
		"127.0.0.1", "224.0.0.251", "255.255.255.255", "::1", "fd00:ec2::254", "fe80::1", "ff02::fb", "::ffff:10.0.0.1", "64:ff9b::a00:1", "2002:a00:1::1",
		"168.63.129.16", "::a00:1", "::ffff:0:a00:1", "100:0:0:1::1", "2001:3::1", "5f00::1", "4000::1", "1::1"} {
		assert.Check(t, isBlocked(netip.MustParseAddr(a)), a)
	}
	for _, a := range []string{"203.0.113.10", "1.1.1.1", "168.63.129.17", "2001:db8::1", "2606:4700::1111", "2a00:1450::1", "3fff::1"} {
		assert.Check(t, !isBlocked(netip.MustParseAddr(a)), a)
	}
}

func TestPolicyNoneVerify(t *testing.T) {
	itest.Require(t, itest.Root, itest.Nftables, itest.Netns)
	ns := itest.UniqueName("stbfw")
	out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput()
	assert.NilError(t, err, string(out))
	t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
	cfg := testCfg()
	cfg.Policy = "none"
	opts := Options{NetNS: "/run/netns/" + ns}
	assert.NilError(t, Apply(context.Background(), cfg, opts))
	st, err := Verify(context.Background(), cfg, opts)
	assert.NilError(t, err)
	assert.Assert(t, st.OK)
	assert.Assert(t, strings.Contains(st.Reason, "no network"), st.Reason)
}

// BenchmarkApply measures `net apply`: one batch replacing both tables,
// plus the verification read-back, in a fresh namespace.
func BenchmarkApply(b *testing.B) {
	itest.Require(b, itest.Root, itest.Nftables, itest.Netns)
	ns := itest.UniqueName("stbbench")
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		b.Fatalf("%v: %s", err, out)
	}
	b.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
	opts := Options{NetNS: "/run/netns/" + ns}
	for i := 0; i < b.N; i++ {
		if err := Apply(context.Background(), testCfg(), opts); err != nil {
			b.Fatal(err)
		}
	}
}

// The routed sets hold what the host routes and network.lan name, minus
// what the fixed lists already block.
func TestRoutedPrefixes(t *testing.T) {
	cfg := testCfg()
	cfg.LAN = []string{"203.0.113.0/28", "2001:db8:5::1"}
	routes := []netip.Prefix{
		netip.MustParsePrefix("198.51.100.0/24"), netip.MustParsePrefix("192.168.1.0/24"),
		netip.MustParsePrefix("10.89.0.0/24"), netip.MustParsePrefix("2001:db8:1::/64"),
		netip.MustParsePrefix("fe80::/64"), netip.MustParsePrefix("fd00:1::/64"),
	}
	v4, v6, err := routedPrefixes(cfg, routes)
	assert.NilError(t, err)
	assert.DeepEqual(t, fmt.Sprint(v4), "[198.51.100.0/24 203.0.113.0/28]")
	assert.DeepEqual(t, fmt.Sprint(v6), "[2001:db8:1::/64 2001:db8:5::1/128]")

	cfg.LAN = []string{"0.0.0.0/0"}
	_, err = buildFor(cfg, nil, nil)
	assert.ErrorContains(t, err, "network.lan[0]")

	// The set holds them, and intervals/covers read it back.
	s, err := prefixesSet("r", v4, false)
	assert.NilError(t, err)
	have := intervals(s.elems)
	for _, p := range v4 {
		assert.Check(t, covers(have, p), p)
	}
	for _, p := range []string{"198.51.101.0/24", "203.0.113.16/32", "198.51.99.255/32"} {
		assert.Check(t, !covers(have, netip.MustParsePrefix(p)), p)
	}
	top, err := prefixesSet("t", []netip.Prefix{netip.MustParsePrefix("255.0.0.0/8")}, false)
	assert.NilError(t, err)
	assert.Check(t, covers(intervals(top.elems), netip.MustParsePrefix("255.255.255.255/32")))
}

// hostRoutes reads a namespace's routes the way the seal needs them.
func TestHostRoutes(t *testing.T) {
	itest.Require(t, itest.Root, itest.Netns)
	ns := itest.UniqueName("stbrt")
	out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput()
	assert.NilError(t, err, string(out))
	t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
	in := func(args ...string) {
		t.Helper()
		out, err := exec.Command("ip", append([]string{"-n", ns}, args...)...).CombinedOutput()
		assert.NilError(t, err, "ip %v: %s", args, out)
	}
	// veth pairs: this kernel may lack the dummy driver.
	for _, l := range []string{"lan1", "vpn0", "shrooms0"} {
		in("link", "add", l, "type", "veth", "peer", "name", l+"p")
		in("link", "set", l, "up")
		in("link", "set", l+"p", "up")
	}
	in("addr", "add", "198.51.100.2/24", "dev", "lan1")
	in("addr", "add", "2001:db8:1::2/64", "dev", "lan1", "nodad")
	in("addr", "add", "10.89.0.1/24", "dev", "shrooms0")
	in("route", "add", "default", "via", "198.51.100.1")
	in("-6", "route", "add", "default", "via", "2001:db8:1::1")
	in("route", "add", "0.0.0.0/1", "dev", "vpn0")                      // a VPN's "default"
	in("route", "add", "192.0.2.0/24", "dev", "vpn0")                   // a VPN's network
	in("route", "add", "203.0.113.0/24", "dev", "vpn0", "table", "100") // policy routing
	in("route", "add", "blackhole", "198.18.5.0/24")
	in("-6", "route", "add", "2001:db8:2::/48", "dev", "vpn0")
	routes, err := hostRoutes("/run/netns/"+ns, "shrooms0")
	assert.NilError(t, err)
	got := map[string]bool{}
	for _, p := range routes {
		got[p.String()] = true
	}
	for _, want := range []string{"198.51.100.0/24", "192.0.2.0/24", "203.0.113.0/24", "2001:db8:1::/64", "2001:db8:2::/48"} {
		assert.Check(t, got[want], "%s missing from %v", want, routes)
	}
	for _, not := range []string{"0.0.0.0/0", "0.0.0.0/1", "::/0", "198.18.5.0/24", "10.89.0.0/24", "198.51.100.2/32", "198.51.100.255/32"} {
		assert.Check(t, !got[not], "%s should not be in %v", not, routes)
	}
}

// routesNS makes a namespace whose host routes 500 IPv4 and 500 IPv6
// public prefixes apart from its default route (none of them adjacent, so
// the seal's sets hold 1000 ranges).
func routesNS(b *testing.B) Options {
	itest.Require(b, itest.Root, itest.Nftables, itest.Netns)
	ns := itest.UniqueName("stbrt")
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		b.Fatalf("%v: %s", err, out)
	}
	b.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
	var batch strings.Builder
	batch.WriteString("link add vpn0 type veth peer name vpn0p\nlink set vpn0 up\nlink set vpn0p up\n")
	for i := 0; i < 500; i++ {
		fmt.Fprintf(&batch, "route add 11.%d.%d.0/24 dev vpn0\n", i/100, 2*(i%100))
		fmt.Fprintf(&batch, "route add 2001:db8:100:%x::/64 dev vpn0\n", 2*i)
	}
	cmd := exec.Command("ip", "-n", ns, "-batch", "-")
	cmd.Stdin = strings.NewReader(batch.String())
	if out, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("ip -batch: %v: %s", err, out)
	}
	opts := Options{NetNS: "/run/netns/" + ns}
	routes, err := hostRoutes(opts.NetNS, "shrooms0")
	assert.NilError(b, err)
	v4, v6, err := routedPrefixes(testCfg(), routes)
	assert.NilError(b, err)
	assert.Equal(b, len(v4)+len(v6), 1000, "routed prefixes the seal must hold")
	return opts
}

// BenchmarkApply1000Routes is `net apply` on a host with 1000 routes
// besides its default route: reading them, one batch with both tables and
// 1000 ranges in the routed sets, and the verification read-back.
func BenchmarkApply1000Routes(b *testing.B) {
	opts := routesNS(b)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := Apply(context.Background(), testCfg(), opts); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkVerify1000Routes is the check before every networked turn on
// the same host.
func BenchmarkVerify1000Routes(b *testing.B) {
	opts := routesNS(b)
	assert.NilError(b, Apply(context.Background(), testCfg(), opts))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		st, err := Verify(context.Background(), testCfg(), opts)
		if err != nil || !st.OK {
			b.Fatalf("%v %s", err, st.Reason)
		}
	}
}

// buildFor is the host seal for cfg with names resolved to addrs and the
// host routing routes.
func buildFor(cfg config.Network, addrs []netip.Addr, routes []netip.Prefix) (*plan, error) {
	var res Resolved
	if len(addrs) > 0 {
		res.Hosts = map[string][]netip.Addr{"name.test": addrs}
	}
	r, err := Describe(cfg, res, routes, nil)
	if err != nil {
		return nil, err
	}
	return build(r)
}
