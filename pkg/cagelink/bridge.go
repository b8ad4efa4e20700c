package cagelink

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// writes records what an EnsureBridge call changed (nil: not recorded); the
// tests use it to show that the already-right case writes nothing.
type writes struct{ done []string }

func (w *writes) add(what string) {
	if w != nil {
		w.done = append(w.done, what)
	}
}

// EnsureBridge makes the host side right, reading first and writing only
// what differs (it runs before every networked turn): the bridge exists,
// is a bridge and is up, carries Gateway4 (and Gateway6, NODAD), forwarding
// is on in HostNetNS, and the NAT table masquerades the cage subnets.
// An interface of that name that is not a bridge is an error, never touched.
func EnsureBridge(ctx context.Context, n Net) error { return ensureBridge(ctx, n, nil) }

func ensureBridge(ctx context.Context, n Net, w *writes) error {
	h, err := handleAt(n.HostNetNS)
	if err != nil {
		return err
	}
	defer h.Close()
	br, err := h.LinkByName(n.Bridge)
	if isNotFound(err) {
		if err := ctx.Err(); err != nil {
			return err
		}
		attrs := netlink.NewLinkAttrs()
		attrs.Name = n.Bridge
		attrs.Flags = net.FlagUp
		// An address set at creation is kept: a bridge without one takes
		// the lowest MAC of its ports, and the gateway's address would
		// change under running cages whenever a cage joins or leaves.
		attrs.HardwareAddr = bridgeMAC(n.Bridge)
		if err := h.LinkAdd(&netlink.Bridge{LinkAttrs: attrs}); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("create cage bridge %s: %w", n.Bridge, err)
		}
		w.add("create bridge")
		br, err = h.LinkByName(n.Bridge)
	}
	if err != nil {
		return fmt.Errorf("cage bridge %s: %w", n.Bridge, err)
	}
	if br.Type() != "bridge" {
		return fmt.Errorf("cage bridge %s exists but is a %s, not a bridge: left alone", n.Bridge, br.Type())
	}
	if br.Attrs().Flags&net.FlagUp == 0 {
		if err := h.LinkSetUp(br); err != nil {
			return fmt.Errorf("cage bridge %s: up: %w", n.Bridge, err)
		}
		w.add("up")
	}
	// After up: a bridge taken down lost its IPv6 addresses.
	for _, gw := range n.gateways() {
		ok, err := hasAddr(h, br, gw, n.bits(gw))
		if err != nil {
			return err
		}
		if ok {
			continue
		}
		if err := h.AddrAdd(br, nlAddr(gw, n.bits(gw))); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("cage bridge %s: add %s: %w", n.Bridge, gw, err)
		}
		w.add("address " + gw.String())
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := inNetNS(n.HostNetNS, func() error {
		for _, s := range n.forwarding() {
			on, err := sysctlOn(s)
			if err != nil {
				return err
			}
			if on {
				continue
			}
			if err := os.WriteFile(s, []byte("1\n"), 0o644); err != nil {
				return fmt.Errorf("enable forwarding: %w", err)
			}
			w.add(s)
		}
		return nil
	}); err != nil {
		return err
	}
	return ensureNAT(ctx, n, w)
}

// Identify says whether the cage network's bridge exists (false, nil when
// there is no such interface) and whether it is the cage network's: a
// bridge carrying the IPv4 gateway (an error says what it is instead). Purge
// removes only such a bridge, whatever else of it differs.
func Identify(n Net) (exists bool, err error) {
	h, err := handleAt(n.HostNetNS)
	if err != nil {
		return false, err
	}
	defer h.Close()
	_, exists, err = identify(h, n)
	return exists, err
}

// identify is Identify on an open handle, returning the bridge.
func identify(h *netlink.Handle, n Net) (netlink.Link, bool, error) {
	br, err := h.LinkByName(n.Bridge)
	if isNotFound(err) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("cage bridge %s: %w", n.Bridge, err)
	}
	if br.Type() != "bridge" {
		return br, true, fmt.Errorf("cage bridge %s is a %s, not a bridge", n.Bridge, br.Type())
	}
	// IPv4's gateway only: a bridge that is down has lost its IPv6
	// addresses (the kernel drops them), and is still ours.
	gw := n.Gateway4()
	if ok, err := hasAddr(h, br, gw, n.bits(gw)); err != nil {
		return br, true, err
	} else if !ok {
		return br, true, fmt.Errorf("cage bridge %s does not carry gateway %s/%d", n.Bridge, gw, n.bits(gw))
	}
	return br, true, nil
}

// CheckBridge is EnsureBridge's read-only half: exists is false (nil
// error) when there is no such interface; an error says what differs when
// it exists but is not right.
func CheckBridge(n Net) (exists bool, err error) {
	h, err := handleAt(n.HostNetNS)
	if err != nil {
		return false, err
	}
	defer h.Close()
	br, exists, err := identify(h, n)
	if !exists || err != nil {
		return exists, err
	}
	if br.Attrs().Flags&net.FlagUp == 0 {
		return true, fmt.Errorf("cage bridge %s is down", n.Bridge)
	}
	for _, gw := range n.gateways() {
		ok, err := hasAddr(h, br, gw, n.bits(gw))
		if err != nil {
			return true, err
		}
		if !ok {
			return true, fmt.Errorf("cage bridge %s does not carry gateway %s/%d", n.Bridge, gw, n.bits(gw))
		}
	}
	if err := inNetNS(n.HostNetNS, func() error {
		for _, s := range n.forwarding() {
			on, err := sysctlOn(s)
			if err != nil {
				return err
			}
			if !on {
				return fmt.Errorf("%s is not 1", s)
			}
		}
		return nil
	}); err != nil {
		return true, err
	}
	c, done, err := nftConn(n.HostNetNS)
	if err != nil {
		return true, err
	}
	defer done()
	if diff, err := natDiff(c, n); err != nil {
		return true, err
	} else if diff != "" {
		return true, fmt.Errorf("NAT table %s: %s", NATTable(n.Name), diff)
	}
	return true, nil
}

// Remove deletes the bridge (only if it is a bridge) and the NAT table.
func Remove(n Net) error {
	h, err := handleAt(n.HostNetNS)
	if err != nil {
		return err
	}
	defer h.Close()
	br, err := h.LinkByName(n.Bridge)
	switch {
	case isNotFound(err):
	case err != nil:
		return fmt.Errorf("cage bridge %s: %w", n.Bridge, err)
	case br.Type() != "bridge":
		return fmt.Errorf("cage bridge %s is a %s, not a bridge: left alone", n.Bridge, br.Type())
	default:
		if err := h.LinkDel(br); err != nil {
			return fmt.Errorf("delete cage bridge %s: %w", n.Bridge, err)
		}
	}
	c, done, err := nftConn(n.HostNetNS)
	if err != nil {
		return err
	}
	defer done()
	// Adding an existing table is a no-op, deleting a missing one an
	// error: add-then-delete removes it either way, in one batch.
	t := &nftables.Table{Family: nftables.TableFamilyINet, Name: NATTable(n.Name)}
	c.AddTable(t)
	c.DelTable(t)
	if err := c.Flush(); err != nil {
		return fmt.Errorf("delete NAT table %s: %w", NATTable(n.Name), err)
	}
	return nil
}

// gateways are the bridge's addresses, v4 first.
func (n Net) gateways() []netip.Addr {
	if n.Subnet6.IsValid() {
		return []netip.Addr{n.Gateway4(), n.Gateway6()}
	}
	return []netip.Addr{n.Gateway4()}
}

// bits is the prefix length of a's subnet.
func (n Net) bits(a netip.Addr) int {
	if a.Is4() {
		return n.Subnet4.Bits()
	}
	return n.Subnet6.Bits()
}

// forwarding are the sysctls that must read 1.
func (n Net) forwarding() []string {
	s := []string{"/proc/sys/net/ipv4/ip_forward"}
	if n.Subnet6.IsValid() {
		s = append(s, "/proc/sys/net/ipv6/conf/all/forwarding")
	}
	return s
}

func sysctlOn(path string) (bool, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return false, fmt.Errorf("read %s: %w", path, err)
	}
	return strings.TrimSpace(string(b)) == "1", nil
}

// bridgeMAC is a locally administered unicast address derived from the
// bridge name, so a bridge made again has the same one.
func bridgeMAC(bridge string) net.HardwareAddr {
	sum := sha256.Sum256([]byte("shrooms bridge " + bridge))
	mac := net.HardwareAddr(sum[:6])
	mac[0] = mac[0]&^1 | 2
	return mac
}

// nlAddr is a/prefix of its subnet as netlink wants it; v6 without DAD
// (the gateway and a fresh cage must be usable at once).
func nlAddr(a netip.Addr, bits int) *netlink.Addr {
	ad := &netlink.Addr{IPNet: &net.IPNet{IP: net.IP(a.AsSlice()), Mask: net.CIDRMask(bits, a.BitLen())}}
	if a.Is6() {
		ad.Flags = unix.IFA_F_NODAD
		return ad
	}
	// The subnet's broadcast address, as netavark (and `ip addr add …
	// brd +`) sets it: without it a datagram to it is unicast to an
	// address nobody answers ARP for.
	b := ad.IPNet.IP.To4()
	bcast := make(net.IP, 4)
	for i := range bcast {
		bcast[i] = b[i] | ^ad.IPNet.Mask[i]
	}
	ad.Broadcast = bcast
	return ad
}

// hasAddr reports whether link carries gw with its subnet's prefix length
// (and, for v6, not failed DAD).
func hasAddr(h *netlink.Handle, link netlink.Link, gw netip.Addr, bits int) (bool, error) {
	fam := netlink.FAMILY_V4
	if gw.Is6() {
		fam = netlink.FAMILY_V6
	}
	addrs, err := h.AddrList(link, fam)
	if err != nil {
		return false, fmt.Errorf("addresses of %s: %w", link.Attrs().Name, err)
	}
	for _, a := range addrs {
		got, ok := netip.AddrFromSlice(a.IP)
		ones, _ := a.Mask.Size()
		if ok && got.Unmap() == gw && ones == bits && a.Flags&unix.IFA_F_DADFAILED == 0 {
			return true, nil
		}
	}
	return false, nil
}

func isNotFound(err error) bool {
	var nf netlink.LinkNotFoundError
	return errors.As(err, &nf)
}
