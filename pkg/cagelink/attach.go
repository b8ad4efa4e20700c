package cagelink

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// cageIf is the cage's interface name.
const cageIf = "eth0"

// Link is one cage's side of the network.
type Link struct {
	Host  string // host-side veth name (a port of the bridge)
	Index int    // host index in the subnets: Addr4 = Subnet4 + Index
	Addr4 netip.Addr
	Addr6 netip.Addr // invalid without v6
}

// Attach gives the cage whose network namespace is cageNS (e.g.
// /proc/PID/ns/net) its link. The index is claimed by creating the host
// veth VethName(n.Bridge, idx), starting at a random index: EEXIST means
// in use, try the next. Any failure once the veth exists deletes it (and
// with it the peer).
func Attach(ctx context.Context, n Net, cageNS string) (Link, error) {
	ch, err := handleAt(cageNS)
	if err != nil {
		return Link{}, fmt.Errorf("cage link: %w", err)
	}
	defer ch.Close()
	links, err := ch.LinkList()
	if err != nil {
		return Link{}, fmt.Errorf("cage link: interfaces of %s: %w", cageNS, err)
	}
	var lo netlink.Link
	for _, l := range links {
		if l.Attrs().Name != "lo" {
			return Link{}, fmt.Errorf("cage link: %s already has interface %s: refused", cageNS, l.Attrs().Name)
		}
		lo = l
	}
	hh, br, err := hostBridge(n)
	if err != nil {
		return Link{}, err
	}
	defer hh.Close()
	nsf, err := os.Open(cageNS)
	if err != nil {
		return Link{}, fmt.Errorf("cage link: open %s: %w", cageNS, err)
	}
	defer nsf.Close()

	count := n.maxIndex() - 1 // indexes 2..maxIndex
	start := rand.IntN(count)
	for i := 0; i < count; i++ {
		if err := ctx.Err(); err != nil {
			return Link{}, err
		}
		idx := 2 + (start+i)%count
		l := Link{Host: VethName(n.Bridge, idx), Index: idx, Addr4: addrAt(n.Subnet4, idx)}
		if n.Subnet6.IsValid() {
			l.Addr6 = addrAt(n.Subnet6, idx)
		}
		attrs := netlink.NewLinkAttrs()
		attrs.Name = l.Host
		attrs.Flags = net.FlagUp
		veth := &netlink.Veth{LinkAttrs: attrs, PeerName: cageIf, PeerNamespace: netlink.NsFd(nsf.Fd()), PeerTxQLen: -1}
		err := hh.LinkAdd(veth)
		if errors.Is(err, unix.EEXIST) {
			// The host name taken is an index in use; an eth0 that
			// appeared in the cage meanwhile is not.
			if _, lerr := hh.LinkByName(l.Host); isNotFound(lerr) {
				return Link{}, fmt.Errorf("cage link: %s in %s: %w", cageIf, cageNS, err)
			}
			continue
		}
		if err != nil {
			return Link{}, fmt.Errorf("cage link: create veth %s: %w", l.Host, err)
		}
		if err := configure(hh, ch, n, br, lo, veth, l); err != nil {
			// By index when LinkAdd found it, else by name (ours: it
			// exists, so nobody else could create it).
			if veth.Index != 0 {
				_ = hh.LinkDel(veth) // takes the peer with it
			} else if host, lerr := hh.LinkByName(l.Host); lerr == nil {
				_ = hh.LinkDel(host)
			}
			return Link{}, fmt.Errorf("cage link %s (%s): %w", l.Host, l.Addr4, err)
		}
		return l, nil
	}
	return Link{}, fmt.Errorf("cage network %s is full: %d cages", n.Subnet4, count)
}

// configure enslaves the new veth's host end (its index filled in by
// LinkAdd) and sets up the cage end; lo is the cage's loopback as listed
// (nil if the namespace had none).
func configure(hh, ch *netlink.Handle, n Net, br, lo netlink.Link, host *netlink.Veth, l Link) error {
	if host.Index == 0 {
		return fmt.Errorf("host end %s not found after creation", l.Host)
	}
	if err := hh.LinkSetMasterByIndex(host, br.Attrs().Index); err != nil {
		return fmt.Errorf("join bridge %s: %w", n.Bridge, err)
	}
	if lo == nil {
		return fmt.Errorf("cage has no lo")
	}
	// runc brings lo up already; a namespace made otherwise may not.
	if lo.Attrs().Flags&net.FlagUp == 0 {
		if err := ch.LinkSetUp(lo); err != nil {
			return fmt.Errorf("cage lo up: %w", err)
		}
	}
	eth, err := ch.LinkByName(cageIf)
	if err != nil {
		return fmt.Errorf("cage %s: %w", cageIf, err)
	}
	// Up before the addresses: IPv4 adds the subnet's route only on an
	// interface that is up, and the default route needs it.
	if err := ch.LinkSetUp(eth); err != nil {
		return fmt.Errorf("cage %s up: %w", cageIf, err)
	}
	type step struct {
		addr, gw netip.Addr
		bits     int
	}
	steps := []step{{l.Addr4, n.Gateway4(), n.Subnet4.Bits()}}
	if l.Addr6.IsValid() {
		steps = append(steps, step{l.Addr6, n.Gateway6(), n.Subnet6.Bits()})
	}
	for _, s := range steps {
		if err := ch.AddrAdd(eth, nlAddr(s.addr, s.bits)); err != nil {
			return fmt.Errorf("cage address %s/%d: %w", s.addr, s.bits, err)
		}
	}
	for _, s := range steps {
		if err := ch.RouteAdd(&netlink.Route{LinkIndex: eth.Attrs().Index, Gw: net.IP(s.gw.AsSlice())}); err != nil {
			return fmt.Errorf("cage default route via %s: %w", s.gw, err)
		}
	}
	return nil
}

// Check verifies a prepared cage's link: eth0 up in cageNS with an Addr4
// in Subnet4 (and the same index in Subnet6), default routes via the
// gateways, and its peer in HostNetNS a port of the bridge, up, named
// VethName(n.Bridge, index). It says what differs.
func Check(n Net, cageNS string) (Link, error) {
	ch, err := handleAt(cageNS)
	if err != nil {
		return Link{}, fmt.Errorf("cage link: %w", err)
	}
	defer ch.Close()
	eth, err := ch.LinkByName(cageIf)
	if err != nil {
		return Link{}, fmt.Errorf("cage link: no %s in %s: %w", cageIf, cageNS, err)
	}
	if eth.Type() != "veth" {
		return Link{}, fmt.Errorf("cage link: %s is a %s, not a veth", cageIf, eth.Type())
	}
	if eth.Attrs().Flags&net.FlagUp == 0 {
		return Link{}, fmt.Errorf("cage link: %s is down", cageIf)
	}
	var l Link
	addrs, err := ch.AddrList(eth, netlink.FAMILY_V4)
	if err != nil {
		return Link{}, fmt.Errorf("cage link: addresses of %s: %w", cageIf, err)
	}
	for _, a := range addrs {
		got, ok := netip.AddrFromSlice(a.IP)
		ones, _ := a.Mask.Size()
		idx := indexOf(n.Subnet4, got.Unmap())
		if ok && ones == n.Subnet4.Bits() && idx >= 2 && idx <= n.maxIndex() {
			l.Addr4, l.Index = got.Unmap(), idx
			break
		}
	}
	if !l.Addr4.IsValid() {
		return Link{}, fmt.Errorf("cage link: %s has no address in %s", cageIf, n.Subnet4)
	}
	l.Host = VethName(n.Bridge, l.Index)
	if n.Subnet6.IsValid() {
		want := addrAt(n.Subnet6, l.Index)
		ok, err := hasAddr(ch, eth, want, n.Subnet6.Bits())
		if err != nil {
			return Link{}, fmt.Errorf("cage link: %w", err)
		}
		if !ok {
			return Link{}, fmt.Errorf("cage link: %s lacks %s/%d", cageIf, want, n.Subnet6.Bits())
		}
		l.Addr6 = want
	}
	for _, gw := range n.gateways() {
		if err := hasDefault(ch, eth.Attrs().Index, gw); err != nil {
			return Link{}, fmt.Errorf("cage link: %w", err)
		}
	}
	hh, br, err := hostBridge(n)
	if err != nil {
		return Link{}, err
	}
	defer hh.Close()
	host, err := hh.LinkByName(l.Host)
	if err != nil {
		return Link{}, fmt.Errorf("cage link: host end %s of %s: %w", l.Host, l.Addr4, err)
	}
	// The pair: each end's IFLA_LINK is the other's index.
	if host.Type() != "veth" || host.Attrs().ParentIndex != eth.Attrs().Index || eth.Attrs().ParentIndex != host.Attrs().Index {
		return Link{}, fmt.Errorf("cage link: %s is not the peer of the cage's %s", l.Host, cageIf)
	}
	if host.Attrs().MasterIndex != br.Attrs().Index {
		return Link{}, fmt.Errorf("cage link: %s is not a port of bridge %s", l.Host, n.Bridge)
	}
	if host.Attrs().Flags&net.FlagUp == 0 {
		return Link{}, fmt.Errorf("cage link: %s is down", l.Host)
	}
	return l, nil
}

// hasDefault checks for a default route via gw on the interface index.
func hasDefault(h *netlink.Handle, index int, gw netip.Addr) error {
	fam := netlink.FAMILY_V4
	if gw.Is6() {
		fam = netlink.FAMILY_V6
	}
	routes, err := h.RouteListFiltered(fam, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return fmt.Errorf("routes: %w", err)
	}
	for _, r := range routes {
		isDefault := r.Dst == nil || r.Dst.IP.IsUnspecified() && func() bool { o, _ := r.Dst.Mask.Size(); return o == 0 }()
		got, _ := netip.AddrFromSlice(r.Gw)
		if isDefault && r.LinkIndex == index && got.Unmap() == gw {
			return nil
		}
	}
	return fmt.Errorf("no default route via %s on %s", gw, cageIf)
}

// hostBridge opens a handle in HostNetNS and finds the bridge there; the
// caller closes the handle.
func hostBridge(n Net) (*netlink.Handle, netlink.Link, error) {
	hh, err := handleAt(n.HostNetNS)
	if err != nil {
		return nil, nil, fmt.Errorf("cage link: %w", err)
	}
	br, err := hh.LinkByName(n.Bridge)
	if err == nil && br.Type() != "bridge" {
		err = fmt.Errorf("%s is a %s, not a bridge", n.Bridge, br.Type())
	}
	if err != nil {
		hh.Close()
		return nil, nil, fmt.Errorf("cage link: bridge %s: %w", n.Bridge, err)
	}
	return hh, br, nil
}
