package firewall

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// WallTable is the in-cage wall's table, in the cage's own network
// namespace (where nothing else installs rules).
const WallTable = "shrooms_wall"

// The in-cage wall is the second seal: a table in each cage's network
// namespace, installed from the host (shrooms holds CAP_NET_ADMIN over the
// namespace; the cage, with no capabilities, cannot change it) before the
// cage starts. Its chains drop by default and accept exactly what the host
// seal lets through for the same Rules, so a host-side `nft flush ruleset`
// (a firewall reload, an admin) leaves the cage as sealed as before: it
// does not touch other namespaces.
//
// output (policy drop): loopback (the model gateway listens there);
// packets of connections already accepted; IPv6 neighbour discovery; DNS
// to Rules.DNS only; then explicit drops for the blocked, routed, host,
// cage-network and DNS-port sets; then the policy's accept (internet: any
// other address; allowlist: the allowed and resolved sets).
// input (policy drop): loopback, accepted connections, neighbour discovery.
func cagePlan(r *Rules) (*plan, error) {
	if r.Policy == "none" {
		// No interface but loopback: still, nothing leaves it.
		return &plan{tables: []tableSpec{{family: nftables.TableFamilyINet, name: WallTable, chains: []chainSpec{
			{name: "input", hook: nftables.ChainHookInput, policy: "drop", rules: [][]expr.Any{cat(iif("lo"), accept())}},
			{name: "output", hook: nftables.ChainHookOutput, policy: "drop", rules: [][]expr.Any{cat(oif("lo"), accept())}},
		}}}}, nil
	}
	var sets []setSpec
	add := func(name string, ps []netip.Prefix, v6 bool) error {
		s, err := prefixesSet(name, ps, v6)
		if err != nil {
			return err
		}
		sets = append(sets, s)
		return nil
	}
	no4, err := prefixSet("no4", Blocked4, false)
	if err != nil {
		return nil, err
	}
	no6, err := prefixSet("no6", Blocked6, true)
	if err != nil {
		return nil, err
	}
	sets = append(sets, no4, no6, dnsPortSet(), ndSet())
	var h4, h6 []netip.Prefix
	for _, a := range r.Host {
		if a.Is4() {
			h4 = append(h4, netip.PrefixFrom(a, 32))
		} else {
			h6 = append(h6, netip.PrefixFrom(a, 128))
		}
	}
	cage6 := []netip.Prefix{}
	if r.Subnet6.IsValid() {
		cage6 = append(cage6, r.Subnet6)
	}
	for _, s := range []struct {
		name string
		ps   []netip.Prefix
		v6   bool
	}{
		{"routed4", r.Routed4, false}, {"routed6", r.Routed6, true},
		{"host4", h4, false}, {"host6", h6, true},
		{"cage4", []netip.Prefix{r.Subnet4}, false}, {"cage6", cage6, true},
	} {
		if err := add(s.name, s.ps, s.v6); err != nil {
			return nil, err
		}
	}
	estab := cat(ctState(expr.CtStateBitESTABLISHED | expr.CtStateBitRELATED))
	nd := cat(nfproto(unix.NFPROTO_IPV6), l4proto(unix.IPPROTO_ICMPV6), icmp6Type(), lookup("nd6", false))
	out := chainSpec{name: "output", hook: nftables.ChainHookOutput, policy: "drop", rules: [][]expr.Any{
		cat(oif("lo"), accept()),
		cat(estab, accept()),
		cat(nd, accept()),
	}}
	for _, proto := range []byte{unix.IPPROTO_UDP, unix.IPPROTO_TCP} {
		for _, d := range r.DNS {
			out.rules = append(out.rules, cat(daddrIs(d.Addr()), l4proto(proto), dport(), eq(u16(d.Port())), accept()))
		}
	}
	for _, s := range []string{"no", "routed", "host", "cage"} {
		out.rules = append(out.rules,
			cat(nfproto(unix.NFPROTO_IPV4), daddr4(), lookup(s+"4", false), drop()),
			cat(nfproto(unix.NFPROTO_IPV6), daddr6(), lookup(s+"6", false), drop()))
	}
	out.rules = append(out.rules,
		cat(l4proto(unix.IPPROTO_TCP), dport(), lookup("dnsports", false), drop()),
		cat(l4proto(unix.IPPROTO_UDP), dport(), lookup("dnsports", false), drop()))
	switch r.Policy {
	case "internet":
		out.rules = append(out.rules,
			cat(nfproto(unix.NFPROTO_IPV4), accept()),
			cat(nfproto(unix.NFPROTO_IPV6), accept()))
	case "allowlist":
		n4, n6 := r.names()
		for _, s := range []struct {
			name string
			ps   []netip.Prefix
			v6   bool
		}{{"allow4", r.Allow4, false}, {"allow6", r.Allow6, true}, {"names4", n4, false}, {"names6", n6, true}} {
			if err := add(s.name, s.ps, s.v6); err != nil {
				return nil, err
			}
		}
		out.rules = append(out.rules,
			cat(nfproto(unix.NFPROTO_IPV4), daddr4(), lookup("allow4", false), accept()),
			cat(nfproto(unix.NFPROTO_IPV4), daddr4(), lookup("names4", false), accept()),
			cat(nfproto(unix.NFPROTO_IPV6), daddr6(), lookup("allow6", false), accept()),
			cat(nfproto(unix.NFPROTO_IPV6), daddr6(), lookup("names6", false), accept()))
	default:
		return nil, fmt.Errorf("in-cage wall: unknown policy %q", r.Policy)
	}
	in := chainSpec{name: "input", hook: nftables.ChainHookInput, policy: "drop", rules: [][]expr.Any{
		cat(iif("lo"), accept()),
		cat(estab, accept()),
		cat(nd, accept()),
	}}
	return &plan{tables: []tableSpec{{family: nftables.TableFamilyINet, name: WallTable, sets: sets, chains: []chainSpec{in, out}}}}, nil
}

// WallStatus is what VerifyWall found in one cage's network namespace.
type WallStatus struct {
	// Rules is the digest of the rule set the wall was built from (the
	// host seal's, when both come from the same Describe).
	Rules string `json:"rules"`
	// Expected and Installed are digests of the wall's canonical rendering
	// as built from the rules and as read from the kernel ("" if missing).
	Expected  string `json:"expected"`
	Installed string `json:"installed"`
	OK        bool   `json:"ok"`
	Reason    string `json:"reason,omitempty"`
}

// ApplyWall installs the in-cage wall for r in the network namespace
// opts.NetNS (a cage's: /proc/PID/ns/net) in one netlink batch, then
// verifies it; an error means the wall is not known to be in place and the
// cage must not start. An empty NetNS is refused: the wall never goes into
// shrooms' own namespace.
func ApplyWall(ctx context.Context, r *Rules, opts Options) (WallStatus, error) {
	if opts.NetNS == "" {
		return WallStatus{}, errors.New("in-cage wall: no cage network namespace given")
	}
	if r == nil {
		return WallStatus{}, errors.New("in-cage wall: no rule set (the seal check did not describe one)")
	}
	p, err := cagePlan(r)
	if err != nil {
		return WallStatus{}, err
	}
	c, done, err := conn(opts)
	if err != nil {
		return WallStatus{}, fmt.Errorf("in-cage wall: %w", err)
	}
	defer done()
	if err := ctx.Err(); err != nil {
		return WallStatus{}, err
	}
	t := &nftables.Table{Family: nftables.TableFamilyINet, Name: WallTable}
	c.AddTable(t)
	c.DelTable(t)
	for _, ts := range p.tables {
		if err := queue(c, ts); err != nil {
			return WallStatus{}, fmt.Errorf("in-cage wall: %w", err)
		}
	}
	if err := c.Flush(); err != nil {
		return WallStatus{}, fmt.Errorf("in-cage wall not installed (netlink batch refused): %w", err)
	}
	st, err := verifyWall(c, r, p)
	if err != nil {
		return st, err
	}
	if !st.OK {
		return st, fmt.Errorf("in-cage wall installed but does not verify: %s", st.Reason)
	}
	return st, nil
}

// VerifyWall reports whether the wall in opts.NetNS is exactly the one r
// implies. It errs only when it cannot look.
func VerifyWall(ctx context.Context, r *Rules, opts Options) (WallStatus, error) {
	if opts.NetNS == "" || r == nil {
		return WallStatus{}, errors.New("in-cage wall: no cage network namespace or rule set given")
	}
	p, err := cagePlan(r)
	if err != nil {
		return WallStatus{}, err
	}
	if err := ctx.Err(); err != nil {
		return WallStatus{}, err
	}
	c, done, err := conn(opts)
	if err != nil {
		return WallStatus{}, fmt.Errorf("in-cage wall: %w", err)
	}
	defer done()
	return verifyWall(c, r, p)
}

// WallDigest is the digest VerifyWall expects for r (what `net status`
// shows for the cages' walls).
func WallDigest(r *Rules) (string, error) {
	p, err := cagePlan(r)
	if err != nil {
		return "", err
	}
	return digest(render(p)), nil
}

func verifyWall(c *nftables.Conn, r *Rules, p *plan) (WallStatus, error) {
	want := render(p)
	st := WallStatus{Rules: r.Digest(), Expected: digest(want)}
	var got strings.Builder
	for _, ts := range p.tables {
		txt, found, err := readTable(c, ts)
		if err != nil {
			return st, fmt.Errorf("in-cage wall: read table: %w", err)
		}
		if !found {
			st.Reason = "in-cage wall: table inet " + WallTable + " is missing"
			return st, nil
		}
		got.WriteString(txt)
	}
	st.Installed = digest(got.String())
	if got.String() != want {
		st.Reason = "in-cage wall differs from its rule set: " + firstDiff(want, got.String())
		return st, nil
	}
	st.OK = true
	return st, nil
}

func u16(v uint16) []byte { return []byte{byte(v >> 8), byte(v)} }

// ctState matches packets whose conntrack state has any of bits.
func ctState(bits uint32) []expr.Any {
	mask := make([]byte, 4)
	binary.NativeEndian.PutUint32(mask, bits)
	return []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: make([]byte, 4)},
	}
}
