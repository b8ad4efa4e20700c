package config

import (
	"fmt"
	"net/netip"
	"strings"
)

// Network is the cage network and its seal (the nftables policy).
type Network struct {
	// Policy is "internet" (egress to public addresses only), "allowlist"
	// (only Allow), or "none" (no network at all).
	Policy string `toml:"policy"`
	// Driver is who links a cage to the bridge: "shrooms" (shrooms
	// itself over netlink, before the cage starts: no netavark, no
	// iptables) or "podman" (a podman network, netavark).
	Driver string `toml:"driver"`
	// Name is the cage network's name (the podman network under driver
	// podman; it names the seal's and the NAT's tables); Bridge its
	// interface.
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
	// DNSUpstream are the resolvers the cage's resolver asks (addresses,
	// optionally with :port); empty is the host's /etc/resolv.conf.
	DNSUpstream []string `toml:"dns_upstream"`
	// DNSRate and DNSBurst bound, per cage, the queries per second the
	// resolver sends upstream under the internet policy (a token bucket;
	// repeated names are answered from its cache for free). DNSRate 0 is
	// no limit.
	DNSRate  float64 `toml:"dns_rate"`
	DNSBurst int     `toml:"dns_burst"`
}

func defaultNetwork() Network {
	return Network{
		Policy:  "none",
		Driver:  DriverShrooms,
		Name:    "shrooms",
		Bridge:  "shrooms0",
		Subnet4: "10.89.0.0/24",
		Subnet6: "fd89:5eed:cafe::/64",
		Allow:   []string{},
		LAN:     []string{},
		// 20 new names a second, 200 at once: more than a package manager
		// resolving its mirrors needs, and it caps what names can carry out.
		DNSUpstream: []string{},
		DNSRate:     20,
		DNSBurst:    200,
	}
}

// The network drivers (Network.Driver).
const (
	DriverShrooms = "shrooms"
	DriverPodman  = "podman"
)

// Networked reports whether cages get a network interface at all.
func (n *Network) Networked() bool { return n.Policy != "none" }

func (n *Network) validate() error {
	switch n.Policy {
	case "internet", "allowlist", "none":
	default:
		return &Error{Key: "network.policy", Msg: fmt.Sprintf("unknown policy %q (use internet, allowlist or none)", n.Policy)}
	}
	switch n.Driver {
	case DriverShrooms, DriverPodman:
	default:
		return &Error{Key: "network.driver", Msg: fmt.Sprintf("unknown driver %q (use shrooms or podman)", n.Driver)}
	}
	if !ValidIfName(n.Bridge) {
		return &Error{Key: "network.bridge", Msg: fmt.Sprintf("%q is not an interface name (1-15 of a-z 0-9 _ -)", n.Bridge)}
	}
	if !ValidIfName(n.Name) {
		return &Error{Key: "network.name", Msg: fmt.Sprintf("%q is not a network name (1-15 of a-z 0-9 _ -)", n.Name)}
	}
	p, err := netip.ParsePrefix(n.Subnet4)
	if err != nil || !p.Addr().Is4() || p.Bits() > 29 || p.Masked() != p {
		return &Error{Key: "network.subnet4", Msg: fmt.Sprintf("%q is not an IPv4 network CIDR of /29 or larger", n.Subnet4)}
	}
	if n.Driver == DriverShrooms && p.Bits() < 8 {
		// A cage's host-side veth is named after its address's index.
		return &Error{Key: "network.subnet4", Msg: fmt.Sprintf("%q is larger than the shrooms driver allows (/8 at most)", n.Subnet4)}
	}
	if n.Subnet6 != "" {
		p, err := netip.ParsePrefix(n.Subnet6)
		if err != nil || !p.Addr().Is6() || p.Addr().Is4In6() || p.Bits() > 120 || p.Masked() != p {
			return &Error{Key: "network.subnet6", Msg: fmt.Sprintf("%q is not an IPv6 network CIDR of /120 or larger", n.Subnet6)}
		}
	}
	for i, a := range n.Allow {
		if msg := allowEntry(a); msg != "" {
			return &Error{Key: fmt.Sprintf("network.allow[%d]", i), Msg: msg}
		}
	}
	for i, u := range n.DNSUpstream {
		if _, err := netip.ParseAddrPort(u); err != nil {
			if _, aerr := netip.ParseAddr(u); aerr != nil {
				return &Error{Key: fmt.Sprintf("network.dns_upstream[%d]", i), Msg: fmt.Sprintf("%q is not an address or address:port", u)}
			}
		}
	}
	if n.DNSRate < 0 || n.DNSBurst < 1 {
		return &Error{Key: "network.dns_rate", Msg: "dns_rate must be >= 0 (0: no limit) and dns_burst >= 1"}
	}
	for i, l := range n.LAN {
		if _, err := LANPrefix(l); err != nil {
			return &Error{Key: fmt.Sprintf("network.lan[%d]", i), Msg: err.Error()}
		}
	}
	return nil
}

// allowEntry checks one allowlist entry and says what is wrong with it ("" if
// nothing). The seal never opens the ranges in blocked4/blocked6 whatever the
// list says; refusing them here makes the mistake an error at load time, not
// a silent drop. An empty list is valid: it blocks all egress.
func allowEntry(a string) string {
	p, err := netip.ParsePrefix(a)
	if err != nil {
		addr, aerr := netip.ParseAddr(a)
		if aerr != nil {
			switch {
			case !validHostname(a):
				return fmt.Sprintf("%q is neither a CIDR, an address nor a host name", a)
			case !strings.Contains(a, "."), strings.EqualFold(a, "localhost") || strings.HasSuffix(strings.ToLower(a), ".localhost"):
				return fmt.Sprintf("%q is not a fully qualified public host name", a)
			}
			return ""
		}
		if addr.Zone() != "" {
			return fmt.Sprintf("%q has a zone; use a global address", a)
		}
		p = netip.PrefixFrom(addr, addr.BitLen())
	}
	if p.Masked() != p {
		return fmt.Sprintf("%q has host bits set (did you mean %s?)", a, p.Masked())
	}
	list := blocked4
	if p.Addr().Is6() {
		list = blocked6
	}
	for _, b := range list {
		if netip.MustParsePrefix(b).Overlaps(p) {
			return fmt.Sprintf("%q overlaps blocked range %s; the seal never opens private, local or metadata ranges", a, b)
		}
	}
	return ""
}

// blocked4 and blocked6 mirror firewall.Blocked4 and Blocked6 (a test keeps
// them equal; config cannot import the firewall package).
var (
	blocked4 = []string{"0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "168.63.129.16/32", "169.254.0.0/16", "172.16.0.0/12", "192.0.0.0/24", "192.88.99.0/24", "192.168.0.0/16", "198.18.0.0/15", "224.0.0.0/4", "240.0.0.0/4"}
	blocked6 = []string{"::/127", "::/96", "::ffff:0:0/96", "::ffff:0:0:0/96", "64:ff9b::/96", "64:ff9b:1::/48", "100::/64", "100:0:0:1::/64", "2001::/23", "2001::/32", "2001:2::/48", "2002::/16", "5f00::/16", "fc00::/7", "fe80::/10", "fec0::/10", "ff00::/8", "::/3", "4000::/2", "8000::/1"}
)

// BlockedRanges returns the ranges the allowlist may not name (for tests
// that keep the two copies equal).
func BlockedRanges() (v4, v6 []string) {
	return append([]string{}, blocked4...), append([]string{}, blocked6...)
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

// ValidIfName reports whether s is an interface name shrooms accepts: 1–15
// of a-z 0-9 _ -.
func ValidIfName(s string) bool {
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
