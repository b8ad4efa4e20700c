package firewall

import (
	"net/netip"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
)

func rulesFor(t *testing.T, policy string, allow []string, names map[string][]netip.Addr) *Rules {
	t.Helper()
	cfg := testCfg()
	cfg.Policy, cfg.Allow = policy, allow
	r, err := Describe(cfg, Resolved{Hosts: names},
		[]netip.Prefix{netip.MustParsePrefix("198.51.100.0/24"), netip.MustParsePrefix("2001:db8:1::/64")},
		[]netip.Addr{netip.MustParseAddr("198.51.100.2"), netip.MustParseAddr("192.168.1.2"), netip.MustParseAddr("fe80::1")})
	assert.NilError(t, err)
	return r
}

// TestCheckNamesTheDecidingRule: each wall's verdict and rule, per policy,
// for the kinds of destination the seal tells apart.
func TestCheckNamesTheDecidingRule(t *testing.T) {
	a := netip.MustParseAddr
	in := rulesFor(t, "internet", nil, nil)
	al := rulesFor(t, "allowlist", []string{"203.0.113.0/28"}, map[string][]netip.Addr{"api.example": {a("203.0.113.50")}})
	for _, tc := range []struct {
		r          *Rules
		d          Dest
		allowed    bool
		host, cage string
	}{
		{in, Dest{a("203.0.113.10"), "tcp", 443}, true, "no rule drops it", "meta nfproto ipv4 accept"},
		{in, Dest{a("2001:db8:203::10"), "udp", 5000}, true, "no rule drops it", "meta nfproto ipv6 accept"},
		{in, Dest{a("192.168.1.1"), "tcp", 80}, false, "@no4", "@no4"},
		{in, Dest{a("169.254.169.254"), "tcp", 80}, false, "@no4", "@no4"},
		{in, Dest{a("fd00:ec2::254"), "tcp", 80}, false, "@no6", "@no6"},
		{in, Dest{a("198.51.100.1"), "tcp", 80}, false, "@routed4", "@routed4"},
		{in, Dest{a("198.51.100.2"), "tcp", 80}, false, "input", "@routed4"},
		{in, Dest{a("203.0.113.10"), "udp", 53}, false, "@dnsports", "@dnsports"},
		{in, Dest{a("203.0.113.10"), "tcp", 853}, false, "@dnsports", "@dnsports"},
		// No DNS to the gateway: the cage's resolver is on its loopback.
		{in, Dest{a("10.89.0.1"), "udp", 53}, false, "input", "@no4"},
		{in, Dest{a("fd89:5eed:cafe::1"), "tcp", 53}, false, "input", "@no6"},
		{in, Dest{a("10.89.0.1"), "tcp", 22}, false, "input", "@no4"},
		{in, Dest{a("127.0.0.1"), "tcp", 4100}, true, "not involved", "oifname lo accept"},
		{al, Dest{a("203.0.113.5"), "tcp", 443}, true, "allow4", "@allow4 accept"},
		{al, Dest{a("203.0.113.50"), "tcp", 443}, true, "api.example", "@names4 accept"},
		{al, Dest{a("203.0.113.60"), "tcp", 443}, false, "not on the allowlist", "not on the allowlist"},
		{al, Dest{a("2001:db8:203::10"), "tcp", 443}, false, "not on the allowlist", "policy drop"},
		{al, Dest{a("10.89.0.1"), "udp", 53}, false, "input", "@no4"},
		{al, Dest{a("203.0.113.5"), "udp", 53}, false, "@dnsports", "@dnsports"},
	} {
		v, err := Check(tc.r, tc.d)
		assert.NilError(t, err)
		assert.Check(t, v.Allowed == tc.allowed, "%s under %s: allowed=%v %+v", tc.d, tc.r.Policy, v.Allowed, v.Walls)
		assert.Check(t, strings.Contains(v.Walls[0].Rule, tc.host), "%s host: %q", tc.d, v.Walls[0].Rule)
		assert.Check(t, strings.Contains(v.Walls[1].Rule, tc.cage), "%s cage: %q", tc.d, v.Walls[1].Rule)
	}
	_, err := Check(in, Dest{a("203.0.113.10"), "sctp", 1})
	assert.ErrorContains(t, err, "protocol")
}

// TestCagePlanPerPolicy: the wall's chains drop by default; internet
// accepts what no set drops, allowlist only its sets, none only loopback;
// no policy lets DNS reach the bridge gateway (each cage's resolver is on
// its own loopback: Resolvers is empty); and the rule
// set's digest is stable and changes with what it describes.
func TestCagePlanPerPolicy(t *testing.T) {
	in := rulesFor(t, "internet", nil, nil)
	al := rulesFor(t, "allowlist", []string{"203.0.113.0/28"}, nil)
	noneCfg := testCfg()
	noneCfg.Policy = "none"
	none, err := Describe(noneCfg, Resolved{}, nil, nil)
	assert.NilError(t, err)
	for _, tc := range []struct {
		r          *Rules
		want, nope []string
	}{
		{in, []string{"policy=drop", "set no4", "set routed4", "set host4", "set cage6"}, []string{"set allow4", "cmp op=0 reg=1 data=0a590001"}},
		{al, []string{"policy=drop", "set allow4", "set names6"}, []string{"cmp op=0 reg=1 data=0a590001"}},
		{none, []string{"policy=drop"}, []string{"set no4"}},
	} {
		p, err := cagePlan(tc.r)
		assert.NilError(t, err)
		out := render(p)
		for _, w := range tc.want {
			assert.Check(t, strings.Contains(out, w), "%s: no %q in\n%s", tc.r.Policy, w, out)
		}
		for _, n := range tc.nope {
			assert.Check(t, !strings.Contains(out, n), "%s: %q in\n%s", tc.r.Policy, n, out)
		}
		assert.Check(t, !strings.Contains(out, "policy=accept"), "%s: a chain accepts by default", tc.r.Policy)
	}
	alCfg := testCfg()
	alCfg.Policy = "allowlist"
	assert.Equal(t, len(Resolvers(alCfg)), 0)
	assert.Equal(t, len(Resolvers(testCfg())), 0)
	assert.Equal(t, in.Digest(), rulesFor(t, "internet", nil, nil).Digest())
	assert.Assert(t, in.Digest() != al.Digest())
}
