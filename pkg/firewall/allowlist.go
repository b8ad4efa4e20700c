package firewall

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"sort"

	"github.com/google/nftables"

	"github.com/shrooms-cage/shrooms/pkg/config"
)

// Resolved holds the allowlist's host names as resolved on the host.
//
// Under the allowlist policy the cage gets no DNS at all (the seal drops DNS
// to the gateway too): the names are resolved here, installed into the
// seal's names4/names6 sets, and handed to the cage as /etc/hosts entries
// (HostEntries, for specgen's HostAdd). So the cage can resolve exactly the
// listed names and DNS cannot carry data out. Refresh is Apply before each
// turn: it re-resolves and swaps the sets atomically; within a turn the
// addresses stay pinned, so a name that moves mid-turn fails closed.
type Resolved struct {
	// Hosts maps each allowlisted host name to its public addresses.
	Hosts map[string][]netip.Addr
}

// Addrs is every resolved address, sorted and without duplicates.
func (r Resolved) Addrs() []netip.Addr {
	seen := map[netip.Addr]bool{}
	var out []netip.Addr
	for _, as := range r.Hosts {
		for _, a := range as {
			if !seen[a] {
				seen[a] = true
				out = append(out, a)
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Less(out[j]) })
	return out
}

// HostEntries is Hosts as "name:address" strings, the form podman's
// --add-host and specgen.ContainerBasicConfig.HostAdd take.
func (r Resolved) HostEntries() []string {
	names := make([]string, 0, len(r.Hosts))
	for n := range r.Hosts {
		names = append(names, n)
	}
	sort.Strings(names)
	var out []string
	for _, n := range names {
		for _, a := range r.Hosts[n] {
			out = append(out, n+":"+a.String())
		}
	}
	return out
}

// Resolve looks up the host names of cfg.Allow (policy allowlist; other
// policies resolve nothing). Addresses in blocked ranges are discarded — a
// name cannot open the LAN by resolving to it — and a name left with no
// address, or that does not resolve, is an error: the seal is not applied.
func Resolve(ctx context.Context, cfg config.Network, opts Options) (Resolved, error) {
	r := Resolved{Hosts: map[string][]netip.Addr{}}
	if cfg.Policy != "allowlist" {
		return r, nil
	}
	res := opts.Resolver
	if res == nil {
		res = net.DefaultResolver
	}
	for i, a := range cfg.Allow {
		if _, err := netip.ParsePrefix(a); err == nil {
			continue
		}
		if _, err := netip.ParseAddr(a); err == nil {
			continue
		}
		addrs, err := res.LookupNetIP(ctx, "ip", a)
		if err != nil {
			return r, fmt.Errorf("network.allow[%d]: resolve %q: %w", i, a, err)
		}
		var ok []netip.Addr
		for _, ad := range addrs {
			ad = ad.Unmap()
			if !isBlocked(ad) {
				ok = append(ok, ad)
			}
		}
		if len(ok) == 0 {
			return r, fmt.Errorf("network.allow[%d]: %q resolves only to blocked addresses %v", i, a, addrs)
		}
		sort.Slice(ok, func(i, j int) bool { return ok[i].Less(ok[j]) })
		r.Hosts[a] = append(r.Hosts[a], ok...)
	}
	return r, nil
}

// checkResolved checks the kernel's resolved-name sets: single public
// addresses only, so tampering cannot widen them to a range or the LAN.
func checkResolved(c *nftables.Conn, p *plan) error {
	for _, ts := range p.tables {
		for _, s := range ts.sets {
			if !s.resolved && !s.pinned {
				continue
			}
			set, err := c.GetSetByName(&nftables.Table{Family: ts.family, Name: ts.name}, s.name)
			if err != nil {
				return fmt.Errorf("set %s is missing: run `shrooms net apply`", s.name)
			}
			elems, err := c.GetSetElements(set)
			if err != nil {
				return fmt.Errorf("set %s unreadable: %v", s.name, err)
			}
			ends := map[netip.Addr]bool{}
			var starts []netip.Addr
			for _, e := range elems {
				a, ok := netip.AddrFromSlice(e.Key)
				if !ok {
					return fmt.Errorf("set %s holds a malformed element %x", s.name, e.Key)
				}
				if e.IntervalEnd {
					ends[a] = true
				} else {
					starts = append(starts, a)
				}
			}
			for _, a := range starts {
				if isBlocked(a) {
					return fmt.Errorf("set %s holds blocked address %s (tampered): run `shrooms net apply`", s.name, a)
				}
				if n := a.Next(); !s.pinned && n.IsValid() && !ends[n] {
					return fmt.Errorf("set %s holds a range starting at %s, not a single address (tampered): run `shrooms net apply`", s.name, a)
				}
			}
		}
	}
	return nil
}

// IsBlocked reports whether a lies in a range no cage packet may reach
// (Blocked4/Blocked6; an IPv4-mapped address counts as its IPv4 address).
func IsBlocked(a netip.Addr) bool { return isBlocked(a) }
