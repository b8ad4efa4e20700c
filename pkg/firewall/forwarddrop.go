package firewall

import (
	"fmt"

	"github.com/google/nftables"
)

// ForwardDrops names the base chains at the forward hook, in tables other
// than the seal's, whose policy drops: on such a host a cage's packets
// need an accept there too (a drop in any base chain is final). netavark
// (network.driver "podman") adds its own rules to iptables' FORWARD; the
// shrooms driver adds none to tables it does not own. iptables-legacy's
// chains are not in nftables and are not seen.
func ForwardDrops(opts Options, network string) ([]string, error) {
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
		drops = append(drops, fmt.Sprintf("table %s %s chain %s", familyName(ch.Table.Family), ch.Table.Name, ch.Name))
	}
	return drops, nil
}
