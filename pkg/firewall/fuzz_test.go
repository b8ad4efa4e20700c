package firewall

import (
	"net/netip"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
)

func splitList(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ",")
}

// FuzzBuildRender builds and renders the seal for arbitrary network
// settings, resolved names and host routes: it never panics, a plan it
// accepts renders the same twice, always carries the blocked ranges, and an
// allowlist it accepts never opens a blocked range.
func FuzzBuildRender(f *testing.F) {
	f.Add("internet", "10.89.0.0/24", "fd89:5eed:cafe::/64", "", "", "", "")
	f.Add("allowlist", "10.89.0.0/24", "fd89:5eed:cafe::/64", "203.0.113.0/24,2001:db8::/32,example.com", "198.51.100.0/24", "203.0.113.7,2001:db8::1", "100.64.0.0/10,172.20.0.0/16")
	f.Add("allowlist", "10.89.0.0/24", "", "192.168.0.0/16", "", "", "")
	f.Add("none", "10.89.0.0/24", "", "", "", "", "")
	f.Add("internet", "10.89.0.0/31", "fd00::/127", "", "0.0.0.0/0", "", "::/0")
	f.Fuzz(func(t *testing.T, policy, sub4, sub6, allow, lan, names, routes string) {
		cfg := testCfg()
		cfg.Policy, cfg.Subnet4, cfg.Subnet6 = policy, sub4, sub6
		cfg.Allow, cfg.LAN = splitList(allow), splitList(lan)
		var addrs []netip.Addr
		for _, n := range splitList(names) {
			if a, err := netip.ParseAddr(n); err == nil {
				addrs = append(addrs, a)
			}
		}
		var rs []netip.Prefix
		for _, r := range splitList(routes) {
			if p, err := netip.ParsePrefix(r); err == nil {
				rs = append(rs, p)
			}
		}
		p, err := buildFor(cfg, addrs, rs)
		if err != nil {
			assert.Assert(t, !strings.Contains(err.Error(), "\n"), "error is not one line: %q", err)
			return
		}
		out := render(p)
		again, err := buildFor(cfg, addrs, rs)
		assert.NilError(t, err)
		assert.Equal(t, render(again), out, "render is not deterministic")
		if policy == "none" {
			return
		}
		assert.Assert(t, strings.Contains(out, " set no4 ") || strings.Contains(out, "set no4"), "no blocked v4 set:\n%s", out)
		if policy == "allowlist" {
			for _, a := range cfg.Allow {
				pa, err := netip.ParsePrefix(strings.TrimSpace(a))
				if err != nil {
					if ad, err := netip.ParseAddr(strings.TrimSpace(a)); err == nil {
						pa = netip.PrefixFrom(ad, ad.BitLen())
					} else {
						continue // a host name
					}
				}
				for _, bs := range append(append([]string(nil), Blocked4...), Blocked6...) {
					b := netip.MustParsePrefix(bs)
					assert.Assert(t, !pa.Overlaps(b), "allowlist entry %s opens blocked range %s", pa, b)
				}
			}
		}
	})
}
