package firewall

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// Dest is one destination a cage might try: an address, a transport
// protocol ("tcp", "udp" or "icmp") and a port (ignored for icmp).
type Dest struct {
	Addr  netip.Addr `json:"addr"`
	Proto string     `json:"proto"`
	Port  uint16     `json:"port,omitempty"`
}

func (d Dest) String() string {
	if d.Proto == "icmp" {
		return "icmp " + d.Addr.String()
	}
	return d.Proto + " " + netip.AddrPortFrom(d.Addr, d.Port).String()
}

// Decision is one wall's verdict on a destination and the rule that made it.
type Decision struct {
	Wall    string `json:"wall"` // "host" or "cage"
	Allowed bool   `json:"allowed"`
	// Rule names the deciding rule as `nft list` would show its place
	// (chain and set), and says why in words.
	Rule string `json:"rule"`
}

// Verdict is what both walls do with a destination: it gets through only
// when both let it.
type Verdict struct {
	Dest    Dest       `json:"dest"`
	Allowed bool       `json:"allowed"`
	Walls   []Decision `json:"walls"`
}

// Check judges d against r the way the kernel will: the host seal's chains
// (forward, or input for the host's own addresses) and the in-cage wall's
// output chain, rule by rule in their order. It reads nothing: the
// answer is r's, so it agrees with both walls as long as they were built
// from the same Rules (which Apply and ApplyWall verify).
func Check(r *Rules, d Dest) (Verdict, error) {
	switch d.Proto {
	case "tcp", "udp", "icmp":
	default:
		return Verdict{}, fmt.Errorf("protocol %q: use tcp, udp or icmp", d.Proto)
	}
	if !d.Addr.IsValid() {
		return Verdict{}, fmt.Errorf("no destination address")
	}
	d.Addr = d.Addr.Unmap()
	if d.Addr.Zone() != "" {
		return Verdict{}, fmt.Errorf("%s: a scoped address names a link, not a destination", d.Addr)
	}
	v := Verdict{Dest: d, Walls: []Decision{checkHost(r, d), checkCage(r, d)}}
	v.Allowed = v.Walls[0].Allowed && v.Walls[1].Allowed
	return v, nil
}

func inPrefixes(a netip.Addr, ps []netip.Prefix) (netip.Prefix, bool) {
	for _, p := range ps {
		if p.Contains(a) {
			return p, true
		}
	}
	return netip.Prefix{}, false
}

func blockedPrefixes(a netip.Addr) []netip.Prefix {
	list := Blocked4
	if a.Is6() {
		list = Blocked6
	}
	out := make([]netip.Prefix, 0, len(list))
	for _, b := range list {
		out = append(out, netip.MustParsePrefix(b))
	}
	return out
}

func (r *Rules) routed(a netip.Addr) []netip.Prefix {
	if a.Is4() {
		return r.Routed4
	}
	return r.Routed6
}

func (r *Rules) cageNet(a netip.Addr) []netip.Prefix {
	if a.Is4() {
		return []netip.Prefix{r.Subnet4}
	}
	if r.Subnet6.IsValid() {
		return []netip.Prefix{r.Subnet6}
	}
	return nil
}

func (r *Rules) isDNS(d Dest) bool {
	return d.Proto != "icmp" && slices.Contains(r.DNS, netip.AddrPortFrom(d.Addr, d.Port))
}

func (r *Rules) allowed(a netip.Addr) (string, bool) {
	allow, names := r.Allow4, []netip.Prefix(nil)
	n4, n6 := r.names()
	names = n4
	if a.Is6() {
		allow, names = r.Allow6, n6
	}
	if p, ok := inPrefixes(a, allow); ok {
		return "allow" + fam(a) + " (network.allow " + p.String() + ")", true
	}
	if _, ok := inPrefixes(a, names); ok {
		var ns []string
		for n, as := range r.Names {
			if slices.Contains(as, a) {
				ns = append(ns, n)
			}
		}
		slices.Sort(ns)
		return "names" + fam(a) + " (" + strings.Join(ns, ", ") + " as resolved into the seal)", true
	}
	return "", false
}

func fam(a netip.Addr) string {
	if a.Is4() {
		return "4"
	}
	return "6"
}

func isDNSPort(d Dest) bool {
	return d.Proto != "icmp" && slices.Contains(dnsPorts, d.Port)
}

func checkHost(r *Rules, d Dest) Decision {
	dec := Decision{Wall: "host"}
	a := d.Addr
	if r.Policy == "none" {
		dec.Rule = "policy none: the cage has no network interface"
		return dec
	}
	if a.IsLoopback() {
		dec.Allowed = true
		dec.Rule = "not involved: loopback stays inside the cage (the model gateway listens there)"
		return dec
	}
	if slices.Contains(r.Host, a) || a == r.Gateway4 || a == r.Gateway6 {
		if r.isDNS(d) {
			dec.Allowed = true
			dec.Rule = "input: DNS to the resolver the cage is given (return, then accepted)"
			return dec
		}
		dec.Rule = "input: iifname " + r.Bridge + " drop (everything addressed to the host)"
		return dec
	}
	if p, ok := inPrefixes(a, blockedPrefixes(a)); ok {
		dec.Rule = "forward: daddr @no" + fam(a) + " drop (" + p.String() + ": private, local, metadata or reserved)"
		return dec
	}
	if p, ok := inPrefixes(a, r.routed(a)); ok {
		dec.Rule = "forward: daddr @routed" + fam(a) + " drop (" + p.String() + ": the host routes it, or network.lan)"
		return dec
	}
	if isDNSPort(d) {
		dec.Rule = fmt.Sprintf("forward: %s dport @dnsports drop (port %d: only the given resolver)", d.Proto, d.Port)
		return dec
	}
	if _, ok := inPrefixes(a, r.cageNet(a)); ok {
		dec.Rule = "forward: iifname " + r.Bridge + " oifname " + r.Bridge + " drop (another cage)"
		return dec
	}
	if r.Policy == "allowlist" {
		if why, ok := r.allowed(a); ok {
			dec.Allowed = true
			dec.Rule = "forward: in " + why + "; no rule drops it"
			return dec
		}
		dec.Rule = "forward: daddr != @allow" + fam(a) + " and != @names" + fam(a) + " drop (not on the allowlist)"
		return dec
	}
	dec.Allowed = true
	dec.Rule = "forward: no rule drops it (policy internet: the public internet)"
	return dec
}

func checkCage(r *Rules, d Dest) Decision {
	dec := Decision{Wall: "cage"}
	a := d.Addr
	if a.IsLoopback() {
		dec.Allowed = true
		dec.Rule = "output: oifname lo accept"
		return dec
	}
	if r.Policy == "none" {
		dec.Rule = "output: policy drop (policy none: loopback only)"
		return dec
	}
	if r.isDNS(d) {
		dec.Allowed = true
		dec.Rule = "output: DNS to the resolver the cage is given accept"
		return dec
	}
	for _, s := range []struct {
		name string
		ps   []netip.Prefix
		why  string
	}{
		{"no", blockedPrefixes(a), "private, local, metadata or reserved"},
		{"routed", r.routed(a), "the host routes it, or network.lan"},
		{"host", hostPrefixes(r.Host), "the host's own address"},
		{"cage", r.cageNet(a), "the cage network: the gateway and other cages"},
	} {
		if p, ok := inPrefixes(a, s.ps); ok {
			dec.Rule = "output: daddr @" + s.name + fam(a) + " drop (" + p.String() + ": " + s.why + ")"
			return dec
		}
	}
	if isDNSPort(d) {
		dec.Rule = fmt.Sprintf("output: %s dport @dnsports drop (port %d: only the given resolver)", d.Proto, d.Port)
		return dec
	}
	if r.Policy == "allowlist" {
		if why, ok := r.allowed(a); ok {
			dec.Allowed = true
			dec.Rule = "output: daddr @" + strings.SplitN(why, " ", 2)[0] + " accept"
			return dec
		}
		dec.Rule = "output: policy drop (not on the allowlist)"
		return dec
	}
	dec.Allowed = true
	dec.Rule = "output: meta nfproto ipv" + fam(a) + " accept (policy internet)"
	return dec
}

func hostPrefixes(as []netip.Addr) []netip.Prefix {
	out := make([]netip.Prefix, 0, len(as))
	for _, a := range as {
		out = append(out, netip.PrefixFrom(a, a.BitLen()))
	}
	return out
}
