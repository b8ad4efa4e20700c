package firewall

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sort"

	"github.com/shrooms-cage/shrooms/pkg/config"
)

// Rules is the one description of what a cage may reach under a policy.
// Both walls are built from it — the host seal around the bridge (build)
// and the in-cage wall inside each cage's network namespace (cagePlan) —
// and `shrooms net check` judges a destination against it (Check), so the
// three cannot drift apart. It is plain data: Describe computes it, nothing
// in it is read from the kernel afterwards.
type Rules struct {
	Policy  string `json:"policy"`
	Network string `json:"network"`
	Bridge  string `json:"bridge"`
	// Subnet4/6 are the cage network; Gateway4/6 its bridge addresses.
	Subnet4  netip.Prefix `json:"subnet4"`
	Subnet6  netip.Prefix `json:"subnet6,omitzero"`
	Gateway4 netip.Addr   `json:"gateway4"`
	Gateway6 netip.Addr   `json:"gateway6,omitzero"`
	// Routed4/6 are what the host routes other than by its default route,
	// and network.lan, minus what the fixed blocked ranges already cover.
	Routed4 []netip.Prefix `json:"routed4"`
	Routed6 []netip.Prefix `json:"routed6"`
	// Host are the host's own addresses outside the blocked ranges (the
	// host seal's input chain drops them; the in-cage wall names them,
	// having no input hook of the host).
	Host []netip.Addr `json:"host"`
	// Allow4/6 are the allowlist's addresses and CIDRs; Names its host
	// names as resolved into the seal (allowlist only).
	Allow4 []netip.Prefix          `json:"allow4,omitempty"`
	Allow6 []netip.Prefix          `json:"allow6,omitempty"`
	Names  map[string][]netip.Addr `json:"names,omitempty"`
	// DNS are the resolver endpoints the cage is given (Resolvers): the
	// only place a DNS-ish port may be reached.
	DNS []netip.AddrPort `json:"dns"`
}

// Resolvers are the DNS endpoints a cage under cfg may query, and the only
// ones: the host seal's input chain and the in-cage wall both allow exactly
// these. Under internet that is aardvark-dns on the bridge gateway; under
// allowlist none (the cage resolves the allowlist from /etc/hosts). A
// host-side resolver changes this function and nothing else.
func Resolvers(cfg config.Network) []netip.AddrPort {
	if cfg.Policy != "internet" {
		return nil
	}
	g4, g6, err := gateways(cfg)
	if err != nil {
		return nil
	}
	out := []netip.AddrPort{netip.AddrPortFrom(g4, 53)}
	if g6.IsValid() {
		out = append(out, netip.AddrPortFrom(g6, 53))
	}
	return out
}

// Describe is the rule set for cfg: resolved holds the allowlist's names
// as resolved (ignored outside the allowlist), routes the host's
// non-default routes, host the host's own addresses.
func Describe(cfg config.Network, resolved Resolved, routes []netip.Prefix, host []netip.Addr) (*Rules, error) {
	if err := checkCfg(cfg); err != nil {
		return nil, err
	}
	r := &Rules{Policy: cfg.Policy, Network: cfg.Name, Bridge: cfg.Bridge}
	if cfg.Policy == "none" {
		return r, nil
	}
	var err error
	if r.Gateway4, r.Gateway6, err = gateways(cfg); err != nil {
		return nil, err
	}
	r.Subnet4 = netip.MustParsePrefix(cfg.Subnet4)
	if cfg.Subnet6 != "" {
		r.Subnet6 = netip.MustParsePrefix(cfg.Subnet6)
	}
	if r.Routed4, r.Routed6, err = routedPrefixes(cfg, routes); err != nil {
		return nil, err
	}
	// Only what the fixed ranges do not block already: the rule set stays
	// the same when a bridge, a veth's link-local address or a private
	// LAN address comes and goes.
	var own []netip.Addr
	for _, a := range host {
		if a = a.Unmap(); !isBlocked(a) {
			own = append(own, a)
		}
	}
	r.Host = uniqueAddrs(own)
	r.DNS = Resolvers(cfg)
	if cfg.Policy == "allowlist" {
		if r.Allow4, r.Allow6, err = allowPrefixes(cfg.Allow); err != nil {
			return nil, err
		}
		r.Names = map[string][]netip.Addr{}
		for n, as := range resolved.Hosts {
			r.Names[n] = slices.Clone(as)
		}
	}
	return r, nil
}

// names4 and names6 are the resolved allowlist addresses by family.
func (r *Rules) names() (v4, v6 []netip.Prefix) {
	for _, a := range (Resolved{Hosts: r.Names}).Addrs() {
		if a.Is4() {
			v4 = append(v4, netip.PrefixFrom(a, 32))
		} else {
			v6 = append(v6, netip.PrefixFrom(a, 128))
		}
	}
	return v4, v6
}

// Digest identifies the rule set (sha256 of its canonical JSON): the host
// seal and every in-cage wall built from the same Rules report the same.
func (r *Rules) Digest() string {
	b, _ := json.Marshal(r) // maps marshal with sorted keys
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// DescribeHost is Describe with the routes and addresses of the host
// namespace opts names, as Apply sees them now.
func DescribeHost(cfg config.Network, resolved Resolved, opts Options) (*Rules, error) {
	if err := checkCfg(cfg); err != nil {
		return nil, err
	}
	if cfg.Policy == "none" {
		return Describe(cfg, resolved, nil, nil)
	}
	routes, err := hostRoutes(opts.NetNS, cfg.Bridge)
	if err != nil {
		return nil, err
	}
	host, err := hostAddrs(opts.NetNS)
	if err != nil {
		return nil, err
	}
	return Describe(cfg, resolved, routes, host)
}

// hostAddrs lists every address of the namespace at netns (loopback and
// link-local included: the in-cage wall drops them all).
func hostAddrs(netns string) ([]netip.Addr, error) {
	var out []netip.Addr
	err := inNetNS(netns, func() error {
		as, err := net.InterfaceAddrs()
		if err != nil {
			return fmt.Errorf("read host addresses: %w", err)
		}
		for _, a := range as {
			if ipn, ok := a.(*net.IPNet); ok {
				if ip, ok := netip.AddrFromSlice(ipn.IP); ok {
					out = append(out, ip.Unmap())
				}
			}
		}
		return nil
	})
	return out, err
}

func uniqueAddrs(as []netip.Addr) []netip.Addr {
	out := slices.Clone(as)
	sort.Slice(out, func(i, j int) bool { return out[i].Less(out[j]) })
	return slices.Compact(out)
}

// allowPrefixes splits the allowlist's CIDRs and addresses by family,
// refusing any inside a blocked range (host names are skipped: Resolve).
func allowPrefixes(allow []string) (p4, p6 []netip.Prefix, err error) {
	for i, a := range allow {
		p, perr := netip.ParsePrefix(a)
		if perr != nil {
			addr, aerr := netip.ParseAddr(a)
			if aerr != nil {
				continue // a host name: resolved into names4/names6
			}
			p = netip.PrefixFrom(addr, addr.BitLen())
		}
		if p.Masked() != p {
			return nil, nil, fmt.Errorf("network.allow[%d]: %q has host bits set (did you mean %s?)", i, a, p.Masked())
		}
		if b := blockedOverlap(p); b != "" {
			return nil, nil, fmt.Errorf("network.allow[%d]: %q overlaps blocked range %s; the seal never opens private, local or metadata ranges", i, a, b)
		}
		if p.Addr().Is4() {
			p4 = append(p4, p)
		} else {
			p6 = append(p6, p)
		}
	}
	return p4, p6, nil
}
