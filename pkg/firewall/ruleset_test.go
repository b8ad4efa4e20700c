package firewall

import (
	"context"
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
			_, err := build(cfg, nil)
			assert.ErrorContains(t, err, tc.msg)
		})
	}
}

func TestBuildIsDeterministicAndPolicySpecific(t *testing.T) {
	a, err := build(testCfg(), nil)
	assert.NilError(t, err)
	b, err := build(testCfg(), nil)
	assert.NilError(t, err)
	assert.Equal(t, render(a), render(b))

	al := testCfg()
	al.Policy = "allowlist"
	al.Allow = []string{"203.0.113.0/24"}
	c, err := build(al, nil)
	assert.NilError(t, err)
	assert.Assert(t, digest(render(a)) != digest(render(c)))
	// Under allowlist the gateway DNS exception is gone.
	assert.Assert(t, strings.Count(render(a), "data=0035") == 4, "internet: 4 DNS exceptions (udp/tcp, v4/v6)")
	assert.Assert(t, !strings.Contains(render(c), "data=0035"))

	none := testCfg()
	none.Policy = "none"
	p, err := build(none, nil)
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
		"127.0.0.1", "224.0.0.251", "255.255.255.255", "::1", "fd00:ec2::254", "fe80::1", "ff02::fb", "::ffff:10.0.0.1", "64:ff9b::a00:1", "2002:a00:1::1"} {
		assert.Check(t, isBlocked(netip.MustParseAddr(a)), a)
	}
	for _, a := range []string{"203.0.113.10", "1.1.1.1", "2001:db8::1", "2606:4700::1111"} {
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
