package firewall

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"sort"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/shrooms-cage/shrooms/pkg/config"
)

// Blocked4 and Blocked6 are the destinations no cage packet may reach under
// any policy: private, loopback, link-local, CGNAT, benchmarking, multicast,
// reserved and IPv4-embedding ranges (IANA special-purpose registries,
// RFC 6890 and its updates), cloud metadata services outside those, and on
// IPv6 everything outside global unicast 2000::/3. Documentation ranges
// (TEST-NET, 2001:db8::/32) are not in them: they are not routed on the
// internet, and the testbed's "internet" lives there. What the host routes
// to its own networks is added at Apply (see hostRoutes).
var (
	Blocked4 = []string{
		"0.0.0.0/8",        // "this network"
		"10.0.0.0/8",       // RFC 1918
		"100.64.0.0/10",    // CGNAT (also Alibaba 100.100.100.200 and UCloud metadata)
		"127.0.0.0/8",      // loopback
		"168.63.129.16/32", // Azure WireServer (VM settings, certificates; ports 80, 32526)
		"169.254.0.0/16",   // link-local, cloud metadata 169.254.169.254
		"172.16.0.0/12",    // RFC 1918
		"192.0.0.0/24",     // IETF protocol assignments
		"192.88.99.0/24",   // 6to4 relay anycast
		"192.168.0.0/16",   // RFC 1918
		"198.18.0.0/15",    // benchmarking
		"224.0.0.0/4",      // multicast
		"240.0.0.0/4",      // reserved, broadcast
	}
	Blocked6 = []string{
		"::/127",                       // unspecified, loopback
		"::/96",                        // IPv4-compatible (deprecated; embeds IPv4)
		"::ffff:0:0/96",                // IPv4-mapped
		"::ffff:0:0:0/96",              // IPv4-translated (SIIT)
		"64:ff9b::/96",                 // NAT64
		"64:ff9b:1::/48",               // local NAT64
		"100::/64",                     // discard
		"100:0:0:1::/64",               // dummy prefix
		"2001::/23",                    // IETF protocol assignments: Teredo (embeds IPv4), benchmarking, ORCHID, AMT, anycast services
		"2001::/32",                    // Teredo (embeds IPv4)
		"2001:2::/48",                  // benchmarking
		"2002::/16",                    // 6to4 (embeds IPv4)
		"5f00::/16",                    // SRv6 SIDs
		"fc00::/7",                     // ULA (incl. fd00:ec2::254 metadata)
		"fe80::/10",                    // link-local
		"fec0::/10",                    // deprecated site-local
		"ff00::/8",                     // multicast
		"::/3", "4000::/2", "8000::/1", // not global unicast (covers all of the above outside 2000::/3)
	}
)

// dnsPorts are the DNS-ish ports a cage may not reach anywhere but its own
// resolver: DNS, DoT, mDNS, LLMNR, NetBIOS name/datagram.
var dnsPorts = []uint16{53, 137, 138, 853, 5353, 5355}

const (
	chainPriority = -10 // before netavark/firewalld (0); drops are final anyway
)

// setSpec, chainSpec and tableSpec describe the seal as plain values: built
// from config, installed in one batch, and rendered for the digest.
type setSpec struct {
	name     string
	keyType  nftables.SetDatatype
	interval bool
	elems    []nftables.SetElement
	// resolved marks a set filled from DNS answers: Verify checks its
	// elements are public addresses rather than an exact list.
	resolved bool
	// routed marks a set filled from the host's routes and network.lan:
	// Verify checks it still covers want (routes come and go).
	routed bool
	want   []netip.Prefix
}

// tag is how render names a set whose elements are checked apart.
func (s setSpec) tag() string {
	switch {
	case s.resolved:
		return "resolved"
	case s.routed:
		return "routed"
	}
	return ""
}

type chainSpec struct {
	name string
	hook *nftables.ChainHook
	// policy is "accept" (the host seal's drop-only chains; "" means it)
	// or "drop" (the in-cage wall).
	policy string
	rules  [][]expr.Any
}

func (c chainSpec) policyName() string {
	if c.policy == "" {
		return "accept"
	}
	return c.policy
}

type tableSpec struct {
	family nftables.TableFamily
	name   string
	sets   []setSpec
	chains []chainSpec
}

// plan is everything the seal installs for one config.
type plan struct {
	tables []tableSpec
}

// tableName is the name of both seal tables (inet and bridge) of network n.
func tableName(n string) string { return "shrooms_" + n }

// gateways returns the first host address of each subnet: the address
// podman gives the bridge (and aardvark-dns listens on).
func gateways(cfg config.Network) (g4, g6 netip.Addr, err error) {
	p4, err := netip.ParsePrefix(cfg.Subnet4)
	if err != nil || !p4.Addr().Is4() || p4.Masked() != p4 {
		return g4, g6, fmt.Errorf("network.subnet4 %q is not an IPv4 network CIDR", cfg.Subnet4)
	}
	g4 = p4.Addr().Next()
	if cfg.Subnet6 != "" {
		p6, err := netip.ParsePrefix(cfg.Subnet6)
		if err != nil || !p6.Addr().Is6() || p6.Addr().Is4In6() || p6.Masked() != p6 {
			return g4, g6, fmt.Errorf("network.subnet6 %q is not an IPv6 network CIDR", cfg.Subnet6)
		}
		g6 = p6.Addr().Next()
	}
	return g4, g6, nil
}

// Gateways returns the bridge addresses the seal expects on the cage
// network: podman must create the network with exactly these gateways.
func Gateways(cfg config.Network) (gw4, gw6 netip.Addr, err error) { return gateways(cfg) }

// build computes the host seal from the rule set r (Describe).
func build(r *Rules) (*plan, error) {
	if r.Policy == "none" {
		return &plan{}, nil
	}
	no4, err := prefixSet("no4", Blocked4, false)
	if err != nil {
		return nil, err
	}
	no6, err := prefixSet("no6", Blocked6, true)
	if err != nil {
		return nil, err
	}
	routed4, err := prefixesSet("routed4", r.Routed4, false)
	if err != nil {
		return nil, err
	}
	routed6, err := prefixesSet("routed6", r.Routed6, true)
	if err != nil {
		return nil, err
	}
	routed4.routed, routed4.want = true, r.Routed4
	routed6.routed, routed6.want = true, r.Routed6
	ports := dnsPortSet()
	nd := ndSet()
	sets := []setSpec{no4, no6, routed4, routed6, ports, nd}

	br := r.Bridge
	fwd := chainSpec{name: "forward", hook: nftables.ChainHookForward}
	fwd.rules = append(fwd.rules,
		// No private, local, multicast or embedding destination, ever.
		cat(iif(br), nfproto(unix.NFPROTO_IPV4), daddr4(), lookup("no4", false), drop()),
		cat(iif(br), nfproto(unix.NFPROTO_IPV6), daddr6(), lookup("no6", false), drop()),
		// Nor any network the host routes to other than by its default
		// route, nor the owner's network.lan.
		cat(iif(br), nfproto(unix.NFPROTO_IPV4), daddr4(), lookup("routed4", false), drop()),
		cat(iif(br), nfproto(unix.NFPROTO_IPV6), daddr6(), lookup("routed6", false), drop()),
		// No resolver but the one the cage is given (input chain).
		cat(iif(br), l4proto(unix.IPPROTO_TCP), dport(), lookup("dnsports", false), drop()),
		cat(iif(br), l4proto(unix.IPPROTO_UDP), dport(), lookup("dnsports", false), drop()),
		// Nothing hairpins back onto the bridge (cage to cage, routed).
		cat(iif(br), oif(br), drop()),
	)
	if r.Policy == "allowlist" {
		allow4, err := prefixesSet("allow4", r.Allow4, false)
		if err != nil {
			return nil, err
		}
		allow6, err := prefixesSet("allow6", r.Allow6, true)
		if err != nil {
			return nil, err
		}
		n4, n6 := r.names()
		names4, _ := prefixesSet("names4", n4, false)
		names6, _ := prefixesSet("names6", n6, true)
		names4.resolved, names6.resolved = true, true
		sets = append(sets, allow4, allow6, names4, names6)
		fwd.rules = append(fwd.rules,
			cat(iif(br), nfproto(unix.NFPROTO_IPV4), daddr4(), lookup("allow4", true), lookup("names4", true), drop()),
			cat(iif(br), nfproto(unix.NFPROTO_IPV6), daddr6(), lookup("allow6", true), lookup("names6", true), drop()),
		)
	}
	// Nothing opens a connection into a cage, from anywhere.
	fwd.rules = append(fwd.rules, cat(oif(br), ctNew(), drop()))

	in := chainSpec{name: "input", hook: nftables.ChainHookInput}
	// DNS to the resolvers the cage is given (Resolvers), nothing else.
	for _, proto := range []byte{unix.IPPROTO_UDP, unix.IPPROTO_TCP} {
		for _, d := range r.DNS {
			in.rules = append(in.rules, cat(iif(br), daddrIs(d.Addr()), l4proto(proto), dport(), eq(binaryutil.BigEndian.PutUint16(d.Port())), ret()))
		}
	}
	in.rules = append(in.rules,
		// Neighbour discovery, or IPv6 does not work at all; RAs stay out.
		cat(iif(br), nfproto(unix.NFPROTO_IPV6), l4proto(unix.IPPROTO_ICMPV6), icmp6Type(), lookup("nd6", false), ret()),
		// Everything else addressed to the host: gateway, other host
		// addresses, link-local, multicast, router advertisements.
		cat(iif(br), drop()),
	)
	out := chainSpec{name: "output", hook: nftables.ChainHookOutput, rules: [][]expr.Any{
		cat(oif(br), ctNew(), drop()), // the host opens nothing into a cage
	}}

	// Frames bridged port to port never reach the inet hooks unless
	// br_netfilter passes them there (Apply requires it: that catches all
	// IP between cages on the bridge, link-local included, via the
	// iif=oif=bridge rule above). This bridge-family layer does not depend
	// on br_netfilter: no frame from or to a cage address (IP or ARP) is
	// bridged. (meta ibrname would be simpler, but needs
	// CONFIG_NFT_BRIDGE_META, which Debian cloud kernels lack.)
	cage4, err := prefixesSet("cage4", []netip.Prefix{r.Subnet4}, false)
	if err != nil {
		return nil, err
	}
	l2sets := []setSpec{cage4}
	l2 := chainSpec{name: "forward", hook: nftables.ChainHookForward, rules: [][]expr.Any{
		cat(etherType(0x0800), saddr4(), lookup("cage4", false), drop()),
		cat(etherType(0x0800), daddr4(), lookup("cage4", false), drop()),
		cat(etherType(0x0806), arpAddr(14), lookup("cage4", false), drop()),
		cat(etherType(0x0806), arpAddr(24), lookup("cage4", false), drop()),
	}}
	if r.Subnet6.IsValid() {
		cage6, err := prefixesSet("cage6", []netip.Prefix{r.Subnet6}, true)
		if err != nil {
			return nil, err
		}
		l2sets = append(l2sets, cage6)
		l2.rules = append(l2.rules,
			cat(etherType(0x86dd), saddr6(), lookup("cage6", false), drop()),
			cat(etherType(0x86dd), daddr6(), lookup("cage6", false), drop()),
		)
	}
	return &plan{tables: []tableSpec{
		{family: nftables.TableFamilyINet, name: tableName(r.Network), sets: sets, chains: []chainSpec{fwd, in, out}},
		{family: nftables.TableFamilyBridge, name: tableName(r.Network), sets: l2sets, chains: []chainSpec{l2}},
	}}, nil
}

func dnsPortSet() setSpec {
	ports := setSpec{name: "dnsports", keyType: nftables.TypeInetService}
	for _, p := range dnsPorts {
		ports.elems = append(ports.elems, nftables.SetElement{Key: binaryutil.BigEndian.PutUint16(p)})
	}
	return ports
}

func ndSet() setSpec {
	return setSpec{name: "nd6", keyType: nftables.TypeICMP6Type, elems: []nftables.SetElement{
		{Key: []byte{135}}, {Key: []byte{136}}, // neighbour solicitation, advertisement
	}}
}

func cat(parts ...[]expr.Any) []expr.Any {
	var out []expr.Any
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

func drop() []expr.Any   { return []expr.Any{&expr.Counter{}, &expr.Verdict{Kind: expr.VerdictDrop}} }
func ret() []expr.Any    { return []expr.Any{&expr.Verdict{Kind: expr.VerdictReturn}} }
func accept() []expr.Any { return []expr.Any{&expr.Verdict{Kind: expr.VerdictAccept}} }

// daddrIs matches the destination address a (its family included).
func daddrIs(a netip.Addr) []expr.Any {
	if a.Is4() {
		return cat(nfproto(unix.NFPROTO_IPV4), daddr4(), eq(a.AsSlice()))
	}
	return cat(nfproto(unix.NFPROTO_IPV6), daddr6(), eq(a.AsSlice()))
}

// checkCfg re-validates what the seal depends on, so a Network value that
// did not come through config.Load is refused just the same.
func checkCfg(cfg config.Network) error {
	switch cfg.Policy {
	case "internet", "allowlist", "none":
	default:
		return fmt.Errorf("network.policy: unknown policy %q (use internet, allowlist or none)", cfg.Policy)
	}
	if !validIfName(cfg.Bridge) {
		return fmt.Errorf("network.bridge: %q is not an interface name", cfg.Bridge)
	}
	if !validIfName(cfg.Name) {
		return fmt.Errorf("network.name: %q is not a network name", cfg.Name)
	}
	if _, _, err := gateways(cfg); err != nil {
		return err
	}
	if _, _, err := routedPrefixes(cfg, nil); err != nil {
		return err
	}
	if cfg.Policy == "allowlist" {
		if _, _, err := allowPrefixes(cfg.Allow); err != nil {
			return err
		}
	}
	return nil
}

func validIfName(s string) bool {
	if s == "" || len(s) > 15 {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '_' || r == '-') {
			return false
		}
	}
	return true
}

func blockedOverlap(p netip.Prefix) string {
	list := Blocked4
	if p.Addr().Is6() {
		list = Blocked6
	}
	for _, b := range list {
		if netip.MustParsePrefix(b).Overlaps(p) {
			return b
		}
	}
	return ""
}

// isBlocked reports whether a lies in a blocked range.
func isBlocked(a netip.Addr) bool {
	a = a.Unmap()
	return blockedOverlap(netip.PrefixFrom(a, a.BitLen())) != ""
}

func prefixSet(name string, cidrs []string, v6 bool) (setSpec, error) {
	ps := make([]netip.Prefix, 0, len(cidrs))
	for _, c := range cidrs {
		p, err := netip.ParsePrefix(c)
		if err != nil {
			return setSpec{}, fmt.Errorf("set %s: %w", name, err)
		}
		ps = append(ps, p)
	}
	return prefixesSet(name, ps, v6)
}

// prefixesSet builds an interval set the way nft does: ranges merged, a
// start element and an interval-end element one past the last address (none
// when the range reaches the top of the address space), and a leading
// interval-end at the zero address when the first range does not start there.
func prefixesSet(name string, ps []netip.Prefix, v6 bool) (setSpec, error) {
	s := setSpec{name: name, keyType: nftables.TypeIPAddr, interval: true}
	size := 4
	if v6 {
		s.keyType, size = nftables.TypeIP6Addr, 16
	}
	type rng struct{ lo, hi netip.Addr }
	var rs []rng
	for _, p := range ps {
		if p.Addr().Is6() != v6 {
			return s, fmt.Errorf("set %s: %s has the wrong address family", name, p)
		}
		p = p.Masked()
		rs = append(rs, rng{p.Addr(), lastAddr(p)})
	}
	sort.Slice(rs, func(i, j int) bool { return rs[i].lo.Less(rs[j].lo) })
	var merged []rng
	for _, r := range rs {
		if n := len(merged); n > 0 {
			last := &merged[n-1]
			if next := last.hi.Next(); !next.IsValid() || !next.Less(r.lo) {
				if last.hi.Less(r.hi) {
					last.hi = r.hi
				}
				continue
			}
		}
		merged = append(merged, r)
	}
	zero := make([]byte, size)
	if len(merged) > 0 && !merged[0].lo.IsUnspecified() {
		s.elems = append(s.elems, nftables.SetElement{Key: zero, IntervalEnd: true})
	}
	for _, r := range merged {
		s.elems = append(s.elems, nftables.SetElement{Key: r.lo.AsSlice()})
		if end := r.hi.Next(); end.IsValid() {
			s.elems = append(s.elems, nftables.SetElement{Key: end.AsSlice(), IntervalEnd: true})
		}
	}
	return s, nil
}

func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// Expression helpers; each loads into register 1 and compares.

func ifname(s string) []byte {
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, s)
	return b
}

func iif(name string) []expr.Any {
	return []expr.Any{&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1}, eq(ifname(name))[0]}
}

func oif(name string) []expr.Any {
	return []expr.Any{&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1}, eq(ifname(name))[0]}
}

func etherType(t uint16) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseLLHeader, Offset: 12, Len: 2},
		eq(binaryutil.BigEndian.PutUint16(t))[0],
	}
}

func saddr4() []expr.Any {
	return []expr.Any{&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4}}
}

func saddr6() []expr.Any {
	return []expr.Any{&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 8, Len: 16}}
}

// arpAddr loads the sender (offset 14) or target (24) IPv4 address of an
// Ethernet/IPv4 ARP packet.
func arpAddr(off uint32) []expr.Any {
	return []expr.Any{&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: 4}}
}

func eq(data []byte) []expr.Any {
	return []expr.Any{&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: data}}
}

func nfproto(p byte) []expr.Any {
	return []expr.Any{&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1}, eq([]byte{p})[0]}
}

func l4proto(p byte) []expr.Any {
	return []expr.Any{&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1}, eq([]byte{p})[0]}
}

func daddr4() []expr.Any {
	return []expr.Any{&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4}}
}

func daddr6() []expr.Any {
	return []expr.Any{&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 24, Len: 16}}
}

func dport() []expr.Any {
	return []expr.Any{&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2}}
}

func icmp6Type() []expr.Any {
	return []expr.Any{&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 0, Len: 1}}
}

func lookup(set string, invert bool) []expr.Any {
	return []expr.Any{&expr.Lookup{SourceRegister: 1, SetName: set, Invert: invert}}
}

func ctNew() []expr.Any {
	mask := make([]byte, 4)
	binary.NativeEndian.PutUint32(mask, expr.CtStateBitNEW)
	return []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: make([]byte, 4)},
	}
}
