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
}

func defaultNetwork() Network {
	return Network{
		Policy:  "internet",
		Name:    "shrooms",
		Bridge:  "shrooms0",
		Subnet4: "10.89.0.0/24",
		Subnet6: "fd89:5eed:cafe::/64",
		Allow:   []string{},
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
