package config

import (
	"fmt"
	"net/netip"
)

// Network is the cage network and its seal (the nftables policy).
type Network struct {
	// Policy is "internet" (egress to public addresses only), "allowlist"
	// (only Allow), or "none" (no network at all).
	Policy string `toml:"policy"`
	// Name is the podman network the cages join; Bridge its interface.
	Name   string `toml:"name"`
	Bridge string `toml:"bridge"`
	// Subnet4 and Subnet6 are the cage network's subnets ("" disables v6).
	Subnet4 string `toml:"subnet4"`
	Subnet6 string `toml:"subnet6"`
	// Allow lists CIDRs and host names reachable under the allowlist policy.
	Allow []string `toml:"allow"`
	// LAN lists CIDRs (or addresses) the seal blocks besides the private
	// ranges and the prefixes the host routes other than by its default
	// route: networks of the owner's that sit behind the default route.
	LAN []string `toml:"lan"`
}

func defaultNetwork() Network {
	return Network{
		Policy:  "internet",
		Name:    "shrooms",
		Bridge:  "shrooms0",
		Subnet4: "10.89.0.0/24",
		Subnet6: "fd89:5eed:cafe::/64",
		Allow:   []string{},
		LAN:     []string{},
	}
}

// Networked reports whether cages get a network interface at all.
func (n *Network) Networked() bool { return n.Policy != "none" }

func (n *Network) validate() error {
	switch n.Policy {
	case "internet", "allowlist", "none":
	default:
		return &Error{Key: "network.policy", Msg: fmt.Sprintf("unknown policy %q (use internet, allowlist or none)", n.Policy)}
	}
	if !validIfName(n.Bridge) {
		return &Error{Key: "network.bridge", Msg: fmt.Sprintf("%q is not an interface name (1-15 of a-z 0-9 _ -)", n.Bridge)}
	}
	if !validIfName(n.Name) {
		return &Error{Key: "network.name", Msg: fmt.Sprintf("%q is not a network name (1-15 of a-z 0-9 _ -)", n.Name)}
	}
	p, err := netip.ParsePrefix(n.Subnet4)
	if err != nil || !p.Addr().Is4() || p.Bits() > 29 || p.Masked() != p {
		return &Error{Key: "network.subnet4", Msg: fmt.Sprintf("%q is not an IPv4 network CIDR of /29 or larger", n.Subnet4)}
	}
	if n.Subnet6 != "" {
		p, err := netip.ParsePrefix(n.Subnet6)
		if err != nil || !p.Addr().Is6() || p.Addr().Is4In6() || p.Bits() > 120 || p.Masked() != p {
			return &Error{Key: "network.subnet6", Msg: fmt.Sprintf("%q is not an IPv6 network CIDR of /120 or larger", n.Subnet6)}
		}
	}
	for i, a := range n.Allow {
		if _, err := netip.ParsePrefix(a); err == nil {
			continue
		}
		if _, err := netip.ParseAddr(a); err == nil {
			continue
		}
		if !validHostname(a) {
			return &Error{Key: fmt.Sprintf("network.allow[%d]", i), Msg: fmt.Sprintf("%q is neither a CIDR, an address nor a host name", a)}
		}
	}
	for i, l := range n.LAN {
		if _, err := LANPrefix(l); err != nil {
			return &Error{Key: fmt.Sprintf("network.lan[%d]", i), Msg: err.Error()}
		}
	}
	return nil
}

// LANPrefix parses one network.lan entry: a CIDR without host bits, or a
// single address. A default route (/0) is refused: it would block the
// internet and is never what an owner means by a LAN.
func LANPrefix(s string) (netip.Prefix, error) {
	p, err := netip.ParsePrefix(s)
	if err != nil {
		a, aerr := netip.ParseAddr(s)
		if aerr != nil || a.Zone() != "" {
			return netip.Prefix{}, fmt.Errorf("%q is neither a CIDR nor an address", s)
		}
		p = netip.PrefixFrom(a, a.BitLen())
	}
	if p.Addr().Is4In6() {
		return netip.Prefix{}, fmt.Errorf("%q is an IPv4-mapped IPv6 prefix; write the IPv4 CIDR", s)
	}
	if p.Masked() != p {
		return netip.Prefix{}, fmt.Errorf("%q has host bits set (did you mean %s?)", s, p.Masked())
	}
	if p.Bits() == 0 {
		return netip.Prefix{}, fmt.Errorf("%q covers every address (the internet is not a LAN; use policy none)", s)
	}
	return p, nil
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

func validHostname(s string) bool {
	if s == "" || len(s) > 253 {
		return false
	}
	label := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '.':
			if label == 0 {
				return false
			}
			label = 0
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '-':
			label++
			if label > 63 {
				return false
			}
		default:
			return false
		}
	}
	return label > 0
}
