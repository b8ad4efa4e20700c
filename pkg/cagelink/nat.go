package cagelink

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/shrooms-cage/shrooms/pkg/firewall"
)

const natChain = "postrouting"

// nftConn opens an nftables connection in the namespace at path ("" is
// the caller's).
func nftConn(path string) (*nftables.Conn, func(), error) { return firewall.Conn(path) }

// natRules are the chain's rules: from the subnet to anything outside it,
// masquerade; one per family.
func natRules(n Net) [][]expr.Any {
	rules := [][]expr.Any{masqRule(n.Subnet4, multicast4, unix.NFPROTO_IPV4, 12, 16)}
	if n.Subnet6.IsValid() {
		rules = append(rules, masqRule(n.Subnet6, multicast6, unix.NFPROTO_IPV6, 8, 24))
	}
	return rules
}

// Multicast is never masqueraded (as netavark's rules): with br_netfilter
// a group datagram a cage sends is also bridged and passes postrouting,
// and a masquerade there rewrites the flow the host's answer belongs to —
// the answer never reaches the cage (found by the probe battery's
// multicast rows with the seal flushed).
var (
	multicast4 = netip.MustParsePrefix("224.0.0.0/4")
	multicast6 = netip.MustParsePrefix("ff00::/8")
)

// masqRule is `meta nfproto P saddr in p daddr not in p daddr not in mc
// masquerade`, with the address offsets of the family's header.
func masqRule(p, mc netip.Prefix, proto byte, srcOff, dstOff uint32) []expr.Any {
	l := uint32(p.Addr().BitLen() / 8)
	in := func(off uint32, op expr.CmpOp, p netip.Prefix) []expr.Any {
		mask := make([]byte, l)
		for i := 0; i < p.Bits(); i++ {
			mask[i/8] |= 0x80 >> (i % 8)
		}
		return []expr.Any{
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: l},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: l, Mask: mask, Xor: make([]byte, l)},
			&expr.Cmp{Op: op, Register: 1, Data: p.Masked().Addr().AsSlice()},
		}
	}
	r := []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
	}
	r = append(r, in(srcOff, expr.CmpOpEq, p)...)
	r = append(r, in(dstOff, expr.CmpOpNeq, p)...)
	r = append(r, in(dstOff, expr.CmpOpNeq, mc)...)
	return append(r, &expr.Masq{})
}

// renderRules is the comparable text of rules.
func renderRules(rules [][]expr.Any) string {
	var b strings.Builder
	for _, r := range rules {
		for _, e := range r {
			fmt.Fprintf(&b, "%T%+v; ", e, e)
		}
		b.WriteString("\n")
	}
	return b.String()
}

// natDiff says how the kernel's NAT table differs from n's ("" if not).
func natDiff(c *nftables.Conn, n Net) (string, error) {
	t, err := c.ListTableOfFamily(NATTable(n.Name), nftables.TableFamilyINet)
	if errors.Is(err, unix.ENOENT) {
		return "missing", nil
	}
	if err != nil {
		return "", fmt.Errorf("read NAT table %s: %w", NATTable(n.Name), err)
	}
	// Not t.Use: google/nftables reads that counter in host byte order
	// (1 chain reads 16777216 here).
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		return "", fmt.Errorf("read NAT table %s: %w", NATTable(n.Name), err)
	}
	var ch *nftables.Chain
	count := 0
	for _, c := range chains {
		if c.Table.Name == t.Name {
			count++
			if c.Name == natChain {
				ch = c
			}
		}
	}
	if count != 1 || ch == nil {
		return fmt.Sprintf("%d chains, not one named %s", count, natChain), nil
	}
	if ch.Type != nftables.ChainTypeNAT || ch.Hooknum == nil || *ch.Hooknum != *nftables.ChainHookPostrouting ||
		ch.Priority == nil || *ch.Priority != *nftables.ChainPriorityNATSource ||
		(ch.Policy != nil && *ch.Policy != nftables.ChainPolicyAccept) {
		return "chain " + natChain + " is not a nat chain at postrouting, srcnat priority, policy accept", nil
	}
	rules, err := c.GetRules(t, ch)
	if err != nil {
		return "", fmt.Errorf("read NAT rules: %w", err)
	}
	got := make([][]expr.Any, len(rules))
	for i, r := range rules {
		got[i] = r.Exprs
	}
	if want, have := renderRules(natRules(n)), renderRules(got); want != have {
		return fmt.Sprintf("rules differ: want %q, have %q", want, have), nil
	}
	return "", nil
}

// ensureNAT installs or replaces the NAT table in one batch when it is
// missing or differs.
func ensureNAT(ctx context.Context, n Net, w *writes) error {
	c, done, err := nftConn(n.HostNetNS)
	if err != nil {
		return err
	}
	defer done()
	diff, err := natDiff(c, n)
	if err != nil {
		return err
	}
	if diff == "" {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	t := &nftables.Table{Family: nftables.TableFamilyINet, Name: NATTable(n.Name)}
	// Add-then-delete empties it whether it existed or not, and the new
	// one replaces it in the same transaction: no moment without NAT.
	c.AddTable(t)
	c.DelTable(t)
	t = c.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: NATTable(n.Name)})
	accept := nftables.ChainPolicyAccept
	ch := c.AddChain(&nftables.Chain{
		Name: natChain, Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource, Policy: &accept,
	})
	for _, r := range natRules(n) {
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: r})
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("install NAT table %s (%s; nothing changed): %w", NATTable(n.Name), diff, err)
	}
	w.add("nat table (" + diff + ")")
	return nil
}
