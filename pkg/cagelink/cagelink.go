// Package cagelink is the network part of the shrooms network driver: it
// keeps the cage bridge and its NAT table right on the host, and gives each
// cage (a network namespace of its own, made by the runtime with
// `--network none`) a veth on that bridge, with its address and default
// routes, over netlink — no netavark, no iptables processes.
//
// There is no allocator state: the kernel is the IPAM. A cage's index in the
// subnets is in the name of its host-side veth, so a name that exists is an
// address in use, creating the veth claims it atomically, and the veth (with
// the address) goes away with the cage's namespace.
package cagelink

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math/big"
	"net/netip"

	"github.com/shrooms-cage/shrooms/pkg/config"
)

// Net is the cage network as the shrooms driver makes it.
type Net struct {
	Name      string       // network.name: names the NAT table
	Bridge    string       // network.bridge
	Subnet4   netip.Prefix // masked
	Subnet6   netip.Prefix // invalid: no IPv6
	HostNetNS string       // path of the network namespace that holds the bridge; "" = the caller's
}

// FromConfig validates the network section and fills a Net.
func FromConfig(n config.Network, hostNetNS string) (Net, error) {
	if !config.ValidIfName(n.Name) {
		return Net{}, fmt.Errorf("network.name: %q is not a network name (1-15 of a-z 0-9 _ -)", n.Name)
	}
	if !config.ValidIfName(n.Bridge) {
		return Net{}, fmt.Errorf("network.bridge: %q is not an interface name (1-15 of a-z 0-9 _ -)", n.Bridge)
	}
	p4, err := netip.ParsePrefix(n.Subnet4)
	if err != nil || !p4.Addr().Is4() || p4.Bits() < 8 || p4.Bits() > 29 || p4.Masked() != p4 {
		return Net{}, fmt.Errorf("network.subnet4: %q is not an IPv4 network CIDR from /8 to /29", n.Subnet4)
	}
	out := Net{Name: n.Name, Bridge: n.Bridge, Subnet4: p4, HostNetNS: hostNetNS}
	if n.Subnet6 != "" {
		p6, err := netip.ParsePrefix(n.Subnet6)
		if err != nil || !p6.Addr().Is6() || p6.Addr().Is4In6() || p6.Bits() > 120 || p6.Masked() != p6 {
			return Net{}, fmt.Errorf("network.subnet6: %q is not an IPv6 network CIDR of /120 or larger", n.Subnet6)
		}
		out.Subnet6 = p6
	}
	return out, nil
}

// Gateway4 is the bridge's IPv4 address: the first of Subnet4.
func (n Net) Gateway4() netip.Addr { return addrAt(n.Subnet4, 1) }

// Gateway6 is the bridge's IPv6 address: the first of Subnet6 (invalid
// without IPv6).
func (n Net) Gateway6() netip.Addr {
	if !n.Subnet6.IsValid() {
		return netip.Addr{}
	}
	return addrAt(n.Subnet6, 1)
}

// NATTable is the name of the inet table that masquerades the cage network.
// Its prefix differs from the seal's ("shrooms_"+name), so the two never
// collide whatever the name.
func NATTable(name string) string { return "shroomsnat_" + name }

// VethName is the host-side name of index idx: "sc", 5 hex digits of a hash
// of the bridge name, "-", idx in hex. At most 2+5+1+6 = 14 bytes for any
// index of a /8 (the largest subnet4), so within IFNAMSIZ-1.
func VethName(bridge string, idx int) string {
	sum := sha256.Sum256([]byte(bridge))
	return fmt.Sprintf("sc%s-%x", hex.EncodeToString(sum[:3])[:5], idx)
}

// maxIndex is the last index Attach hands out: size-2 of the smaller of
// the subnets (size-1 is Subnet4's broadcast; 0 the network; 1 the gateway).
func (n Net) maxIndex() int {
	host := 32 - n.Subnet4.Bits()
	if n.Subnet6.IsValid() && 128-n.Subnet6.Bits() < host {
		host = 128 - n.Subnet6.Bits()
	}
	return 1<<host - 2
}

// addrAt is the address idx places after p's first.
func addrAt(p netip.Prefix, idx int) netip.Addr {
	b := p.Addr().AsSlice()
	v := new(big.Int).SetBytes(b)
	v.Add(v, big.NewInt(int64(idx)))
	out := make([]byte, len(b))
	v.FillBytes(out)
	a, _ := netip.AddrFromSlice(out)
	return a
}

// indexOf is a's index in p (-1 if a is not in p).
func indexOf(p netip.Prefix, a netip.Addr) int {
	if !p.Contains(a) {
		return -1
	}
	v := new(big.Int).SetBytes(a.AsSlice())
	v.Sub(v, new(big.Int).SetBytes(p.Addr().AsSlice()))
	if !v.IsInt64() || v.Int64() > 1<<31 {
		return -1
	}
	return int(v.Int64())
}
