package firewall

import (
	"fmt"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
)

// ForwardDrops names the base chains at the forward hook, in tables other
// than the seal's, whose policy drops: on such a host a cage's packets
// need an accept there too (a drop in any base chain is final). netavark
// (network.driver "podman") adds its own rules to iptables' FORWARD; the
// shrooms driver adds none to tables it does not own. iptables-legacy's
// chains are not in nftables and are not seen. A chain with a rule that
// accepts what comes in on the bridge (iifname BRIDGE … accept) is not
// named.
func ForwardDrops(opts Options, network, bridge string) ([]string, error) {
	c, done, err := conn(opts)
	if err != nil {
		return nil, err
	}
	defer done()
	chains, err := c.ListChains()
	if err != nil {
		return nil, fmt.Errorf("nftables: list chains: %w", err)
	}
	var drops []string
	for _, ch := range chains {
		if ch.Hooknum == nil || *ch.Hooknum != *nftables.ChainHookForward || ch.Policy == nil || *ch.Policy != nftables.ChainPolicyDrop {
			continue
		}
		switch ch.Table.Family {
		case nftables.TableFamilyINet, nftables.TableFamilyIPv4, nftables.TableFamilyIPv6:
		default:
			continue // a bridge table's forward hook sees bridged frames, not routed packets
		}
		if ch.Table.Name == tableName(network) {
			continue
		}
		if ok, err := acceptsFrom(c, ch, bridge); err != nil {
			return nil, err
		} else if ok {
			continue // e.g. the NixOS module's forward rule for the cages
		}
		drops = append(drops, fmt.Sprintf("table %s %s chain %s", familyName(ch.Table.Family), ch.Table.Name, ch.Name))
	}
	return drops, nil
}

// acceptsFrom reports whether chain ch has a rule that matches the input
// interface name bridge and ends in accept.
func acceptsFrom(c *nftables.Conn, ch *nftables.Chain, bridge string) (bool, error) {
	rules, err := c.GetRules(ch.Table, ch)
	if err != nil {
		return false, fmt.Errorf("nftables: rules of %s %s: %w", ch.Table.Name, ch.Name, err)
	}
	for _, r := range rules {
		iif, accept := false, false
		for i, e := range r.Exprs {
			switch e := e.(type) {
			case *expr.Meta:
				if e.Key == expr.MetaKeyIIFNAME && i+1 < len(r.Exprs) {
					if cmp, ok := r.Exprs[i+1].(*expr.Cmp); ok && cmp.Op == expr.CmpOpEq && strings.TrimRight(string(cmp.Data), "\x00") == bridge {
						iif = true
					}
				}
			case *expr.Verdict:
				accept = e.Kind == expr.VerdictAccept
			}
		}
		if iif && accept {
			return true, nil
		}
	}
	return false, nil
}
