package firewall

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"sort"
	"strings"
	"syscall"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"

	"github.com/shrooms-cage/shrooms/pkg/config"
)

// hostRoutes lists the prefixes the host (the namespace at netns, "" for
// ours) reaches other than by a default route: connected subnets, on-link
// IPv6 prefixes, static, VPN and policy-routing routes, from every routing
// table but the local one. A LAN can sit on public addresses (a public IPv4
// subnet, a global IPv6 prefix, a network behind a VPN), where no fixed
// list of ranges finds it; the host's routes do. Left out: default routes
// (and the two /1 halves some VPNs install instead), routes that carry no
// traffic (blackhole, unreachable, prohibit), local and broadcast entries
// (the input chain covers the host's own addresses), and routes through the
// cage bridge itself (the seal already drops cage-to-cage traffic).
func hostRoutes(netns, bridge string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	err := inNetNS(netns, func() error {
		brIndex := -1
		if ifc, err := net.InterfaceByName(bridge); err == nil {
			brIndex = ifc.Index
		}
		for _, fam := range []int{unix.AF_INET, unix.AF_INET6} {
			rib, err := syscall.NetlinkRIB(unix.RTM_GETROUTE, fam)
			if err != nil {
				return fmt.Errorf("read host routes: %w", err)
			}
			msgs, err := syscall.ParseNetlinkMessage(rib)
			if err != nil {
				return fmt.Errorf("parse host routes: %w", err)
			}
			for _, m := range msgs {
				if m.Header.Type != unix.RTM_NEWROUTE {
					continue
				}
				if p, ok := routePrefix(m, brIndex); ok {
					out = append(out, p)
				}
			}
		}
		return nil
	})
	return out, err
}

// routePrefix is the destination of one RTM_NEWROUTE message, if it is a
// route the seal must cover.
func routePrefix(m syscall.NetlinkMessage, brIndex int) (netip.Prefix, bool) {
	// struct rtmsg: family, dst_len, src_len, tos, table, protocol, scope,
	// type, flags (u32).
	if len(m.Data) < unix.SizeofRtMsg {
		return netip.Prefix{}, false
	}
	dstLen, table, typ := int(m.Data[1]), uint32(m.Data[4]), m.Data[7]
	flags := binary.NativeEndian.Uint32(m.Data[8:12])
	if typ != unix.RTN_UNICAST || dstLen <= 1 || flags&unix.RTM_F_CLONED != 0 {
		return netip.Prefix{}, false
	}
	attrs, err := syscall.ParseNetlinkRouteAttr(&m)
	if err != nil {
		return netip.Prefix{}, false
	}
	var dst netip.Addr
	oif := -1
	for _, a := range attrs {
		switch a.Attr.Type {
		case unix.RTA_DST:
			dst, _ = netip.AddrFromSlice(a.Value)
		case unix.RTA_TABLE:
			if len(a.Value) == 4 {
				table = binary.NativeEndian.Uint32(a.Value)
			}
		case unix.RTA_OIF:
			if len(a.Value) == 4 {
				oif = int(binary.NativeEndian.Uint32(a.Value))
			}
		}
	}
	if table == unix.RT_TABLE_LOCAL || !dst.IsValid() || (brIndex > 0 && oif == brIndex) {
		return netip.Prefix{}, false
	}
	p, err := dst.Unmap().Prefix(dstLen)
	if err != nil {
		return netip.Prefix{}, false
	}
	return p, true
}

// routedPrefixes is what the seal's routed sets must cover: the host's
// routes and the owner's network.lan, minus what Blocked4/Blocked6 already
// block (private LANs, the cage networks podman adds), so that a podman
// network coming up does not make the seal stale.
func routedPrefixes(cfg config.Network, routes []netip.Prefix) (v4, v6 []netip.Prefix, err error) {
	all := append([]netip.Prefix(nil), routes...)
	for i, l := range cfg.LAN {
		p, err := config.LANPrefix(l)
		if err != nil {
			return nil, nil, fmt.Errorf("network.lan[%d]: %w", i, err)
		}
		all = append(all, p)
	}
	for _, p := range all {
		if coveredByBlocked(p) {
			continue
		}
		if p.Addr().Is4() {
			v4 = append(v4, p)
		} else {
			v6 = append(v6, p)
		}
	}
	return v4, v6, nil
}

// coveredByBlocked reports whether p lies entirely inside one blocked range.
func coveredByBlocked(p netip.Prefix) bool {
	list := Blocked4
	if p.Addr().Is6() {
		list = Blocked6
	}
	for _, b := range list {
		bp := netip.MustParsePrefix(b)
		if bp.Bits() <= p.Bits() && bp.Contains(p.Addr()) {
			return true
		}
	}
	return false
}

// checkRouted checks that the kernel's routed sets still cover every
// prefix the host routes now (and network.lan): a route that appeared after
// the seal was applied (a VPN coming up, a new LAN) is a network the cages
// could reach. Extra elements only block more and are left alone.
func checkRouted(c *nftables.Conn, p *plan) error {
	for _, ts := range p.tables {
		for _, s := range ts.sets {
			if !s.routed {
				continue
			}
			set, err := c.GetSetByName(&nftables.Table{Family: ts.family, Name: ts.name}, s.name)
			if err != nil {
				return fmt.Errorf("set %s is missing: run `shrooms net apply`", s.name)
			}
			elems, err := c.GetSetElements(set)
			if err != nil {
				return fmt.Errorf("set %s unreadable: %v", s.name, err)
			}
			have := intervals(elems)
			var missing []string
			for _, w := range s.want {
				if !covers(have, w) {
					missing = append(missing, w.String())
				}
			}
			if len(missing) > 0 {
				sort.Strings(missing)
				return fmt.Errorf("the host routes to %s, which the seal does not block (a route that appeared after `shrooms net apply`, or an altered set %s): run `shrooms net apply`", strings.Join(missing, ", "), s.name)
			}
		}
	}
	return nil
}

type interval struct{ lo, hi netip.Addr }

// intervals turns an nftables interval set's elements back into ranges.
func intervals(elems []nftables.SetElement) []interval {
	type el struct {
		a   netip.Addr
		end bool
	}
	var es []el
	for _, e := range elems {
		if a, ok := netip.AddrFromSlice(e.Key); ok {
			es = append(es, el{a, e.IntervalEnd})
		}
	}
	sort.Slice(es, func(i, j int) bool { return es[i].a.Less(es[j].a) })
	var out []interval
	for i, e := range es {
		if e.end {
			continue
		}
		hi := lastAddr(netip.PrefixFrom(e.a, 0)) // open to the top
		if i+1 < len(es) && es[i+1].end {
			hi = es[i+1].a.Prev()
		}
		out = append(out, interval{e.a, hi})
	}
	return out
}

func covers(have []interval, p netip.Prefix) bool {
	lo, hi := p.Masked().Addr(), lastAddr(p)
	for _, r := range have {
		if !lo.Less(r.lo) && !r.hi.Less(hi) {
			return true
		}
	}
	return false
}

// HostNet is what the host's network looks like from its own namespace:
// what the probe aims at when no targets file names it.
type HostNet struct {
	// Addrs are the host's addresses on interfaces other than loopback and
	// the cage bridge (IPv6 link-local left out: a cage cannot name them).
	Addrs []netip.Addr
	// Gateways are the next hops of every route, default routes included.
	Gateways []netip.Addr
	// Neighbours are the neighbour-table entries off the cage bridge;
	// BridgeNeighbours those on it (other cages).
	Neighbours, BridgeNeighbours []netip.Addr
	// Routed are the prefixes of hostRoutes (non-default routes).
	Routed []netip.Prefix
}

// ReadHostNet reads the host network of the namespace opts names, with
// bridge as the cage bridge.
func ReadHostNet(opts Options, bridge string) (HostNet, error) {
	var h HostNet
	routes, err := hostRoutes(opts.NetNS, bridge)
	if err != nil {
		return h, err
	}
	h.Routed = routes
	err = inNetNS(opts.NetNS, func() error {
		brIndex := -1
		ifs, err := net.Interfaces()
		if err != nil {
			return err
		}
		for _, i := range ifs {
			if i.Name == bridge {
				brIndex = i.Index
			}
			if i.Name == bridge || i.Flags&net.FlagLoopback != 0 {
				continue
			}
			as, _ := i.Addrs()
			for _, a := range as {
				if ipn, ok := a.(*net.IPNet); ok {
					if ip, ok := netip.AddrFromSlice(ipn.IP); ok && !v6LinkLocal(ip) {
						h.Addrs = append(h.Addrs, ip.Unmap())
					}
				}
			}
		}
		for _, fam := range []int{unix.AF_INET, unix.AF_INET6} {
			rib, err := syscall.NetlinkRIB(unix.RTM_GETROUTE, fam)
			if err != nil {
				return fmt.Errorf("read host routes: %w", err)
			}
			msgs, err := syscall.ParseNetlinkMessage(rib)
			if err != nil {
				return err
			}
			for _, m := range msgs {
				if m.Header.Type != unix.RTM_NEWROUTE || len(m.Data) < unix.SizeofRtMsg || m.Data[7] != unix.RTN_UNICAST {
					continue
				}
				attrs, err := syscall.ParseNetlinkRouteAttr(&m)
				if err != nil {
					continue
				}
				for _, a := range attrs {
					if a.Attr.Type == unix.RTA_GATEWAY {
						if gw, ok := netip.AddrFromSlice(a.Value); ok && !v6LinkLocal(gw) {
							h.Gateways = append(h.Gateways, gw.Unmap())
						}
					}
				}
			}
			rib, err = syscall.NetlinkRIB(unix.RTM_GETNEIGH, fam)
			if err != nil {
				return fmt.Errorf("read neighbours: %w", err)
			}
			if msgs, err = syscall.ParseNetlinkMessage(rib); err != nil {
				return err
			}
			for _, m := range msgs {
				// struct ndmsg: family, pad[3], ifindex (s32), state (u16), flags, type.
				if m.Header.Type != unix.RTM_NEWNEIGH || len(m.Data) < unix.SizeofNdMsg {
					continue
				}
				ifindex := int(int32(binary.NativeEndian.Uint32(m.Data[4:8])))
				state := binary.NativeEndian.Uint16(m.Data[8:10])
				if state&(unix.NUD_INCOMPLETE|unix.NUD_FAILED|unix.NUD_NOARP) != 0 {
					continue
				}
				attrs, err := syscall.ParseNetlinkRouteAttr(&m)
				if err != nil {
					continue
				}
				for _, a := range attrs {
					if a.Attr.Type != unix.NDA_DST {
						continue
					}
					ip, ok := netip.AddrFromSlice(a.Value)
					if !ok || v6LinkLocal(ip) || ip.IsMulticast() {
						continue
					}
					if ifindex == brIndex {
						h.BridgeNeighbours = append(h.BridgeNeighbours, ip.Unmap())
					} else {
						h.Neighbours = append(h.Neighbours, ip.Unmap())
					}
				}
			}
		}
		return nil
	})
	return h, err
}

// v6LinkLocal: an fe80::/10 address means nothing without its link.
func v6LinkLocal(a netip.Addr) bool { return a.Is6() && !a.Is4In6() && a.IsLinkLocalUnicast() }
