package probedrive

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"time"

	"github.com/shrooms-cage/shrooms/pkg/config"
	"github.com/shrooms-cage/shrooms/pkg/firewall"
	"github.com/shrooms-cage/shrooms/pkg/probe"
)

// MetadataAddrs are the cloud metadata services the probe aims at when no
// targets file names them: the link-local IMDS of AWS, Azure, GCP,
// OpenStack and most others, AWS's IPv6 IMDS and ECS task endpoint,
// Azure's WireServer, Alibaba's, Tencent's and the CGNAT one some clouds
// use.
var MetadataAddrs = []string{"169.254.169.254", "fd00:ec2::254", "169.254.170.2", "168.63.129.16", "100.100.100.200", "169.254.0.23", "100.80.80.80"}

// Limits on discovered targets: each costs nine attempts.
const (
	maxHost  = 16
	maxLAN   = 32
	maxPeers = 8
)

// Discover fills the targets of p that are empty with what the host tells
// about its own network (in the namespace opts names): its addresses
// (D4); its gateways, neighbours and the first address of every network it
// routes to other than by its default route (D6); the metadata services
// (D7); cages it has talked to on the cage bridge (D8).
func Discover(p *probe.Params, n config.Network, opts firewall.Options) error {
	h, err := firewall.ReadHostNet(opts, n.Bridge)
	if err != nil {
		return err
	}
	var cage []netip.Prefix
	for _, s := range []string{n.Subnet4, n.Subnet6} {
		if pr, err := netip.ParsePrefix(s); err == nil {
			cage = append(cage, pr)
		}
	}
	inCage := func(a netip.Addr) bool {
		return slices.ContainsFunc(cage, func(pr netip.Prefix) bool { return pr.Contains(a) })
	}
	own := map[netip.Addr]bool{}
	for _, a := range h.Addrs {
		own[a] = true
	}
	if len(p.Host) == 0 {
		p.Host = pick(h.Addrs, maxHost, func(a netip.Addr) bool { return !inCage(a) })
	}
	if len(p.LAN) == 0 {
		lan := append(append([]netip.Addr{}, h.Gateways...), h.Neighbours...)
		for _, r := range h.Routed {
			if r.IsSingleIP() {
				lan = append(lan, r.Addr())
			} else if first := r.Masked().Addr().Next(); r.Contains(first) {
				lan = append(lan, first)
			}
		}
		p.LAN = pick(lan, maxLAN, func(a netip.Addr) bool { return !own[a] && !inCage(a) })
	}
	if len(p.Metadata) == 0 {
		p.Metadata = append([]string{}, MetadataAddrs...)
	}
	if len(p.Peers) == 0 {
		p.Peers = pick(h.BridgeNeighbours, maxPeers, func(a netip.Addr) bool { return inCage(a) && !own[a] })
	}
	return nil
}

// pick returns up to max distinct addresses that keep accepts, in order.
func pick(as []netip.Addr, max int, keep func(netip.Addr) bool) []string {
	seen := map[netip.Addr]bool{}
	var out []string
	for _, a := range as {
		if len(out) == max {
			break
		}
		if seen[a] || a.IsLoopback() || a.IsUnspecified() || a.IsMulticast() || a.Is6() && a.IsLinkLocalUnicast() || !keep(a) {
			continue
		}
		seen[a] = true
		out = append(out, a.String())
	}
	return out
}

// PublicResolvers are the resolvers D9b and D9c try when no targets file
// names any, besides the host's own.
var PublicResolvers = []string{"8.8.8.8", "1.1.1.1", "9.9.9.9", "2001:4860:4860::8888", "2606:4700:4700::1111"}

// InternetFor fills p's internet and resolver targets for policy n when
// they are empty: under the internet policy a name any resolver answers
// (example.com, resolved inside the cage); under the allowlist the allowed
// entries themselves; resolvers are the host's (hostResolvers, from its
// resolv.conf) and PublicResolvers.
func InternetFor(p *probe.Params, n config.Network, hostResolvers []string) {
	if len(p.Internet) == 0 && len(p.InternetNames) == 0 {
		switch n.Policy {
		case "internet":
			p.InternetNames = []string{"example.com"}
		case "allowlist":
			for _, a := range n.Allow {
				if ip, err := netip.ParseAddr(a); err == nil {
					p.Internet = append(p.Internet, ip.String())
				} else if pr, err := netip.ParsePrefix(a); err == nil {
					p.Internet = append(p.Internet, pr.Masked().Addr().Next().String())
				} else {
					p.InternetNames = append(p.InternetNames, a)
				}
			}
		}
	}
	if len(p.Resolvers) == 0 {
		for _, r := range append(append([]string{}, hostResolvers...), PublicResolvers...) {
			if a, err := netip.ParseAddr(r); err == nil && !a.IsLoopback() && !slices.Contains(p.Resolvers, a.String()) {
				p.Resolvers = append(p.Resolvers, a.String())
			}
		}
	}
}

// DialInbound is Options.OnInbound for a host without canaries: it tries to
// connect from the host to where the cage listens (D15) and sends the
// nonce; the inside reports whether anything arrived.
func DialInbound(nonce string) func(addr string, port int) {
	return func(addr string, port int) {
		c, err := net.DialTimeout("tcp", net.JoinHostPort(addr, strconv.Itoa(port)), 1500*time.Millisecond)
		if err != nil {
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(time.Second))
		fmt.Fprintf(c, "%s-inbound-host\n", nonce)
	}
}
