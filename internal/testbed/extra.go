package testbed

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Multicast groups the testbed answers on (Multicast), with their ports:
// mDNS, LLMNR and SSDP, IPv4 and IPv6.
var Multicast = []netip.AddrPort{
	netip.MustParseAddrPort("224.0.0.251:5353"),
	netip.MustParseAddrPort("[ff02::fb]:5353"),
	netip.MustParseAddrPort("224.0.0.252:5355"),
	netip.MustParseAddrPort("[ff02::1:3]:5355"),
	netip.MustParseAddrPort("239.255.255.250:1900"),
	netip.MustParseAddrPort("[ff02::c]:1900"),
}

// Canary starts extra TCP and UDP canaries in role's namespace bound to
// bind (an address that exists there, or "" for all), logged like the
// others and closed at teardown. Tests use it for addresses that appear
// after New, such as a cage bridge's gateway.
func (tb *Testbed) Canary(role, bind string, tcp, udp []int) error {
	c, err := startCanaries(tb.NSPath(role), role, &tb.log, bind, tcp, udp, false, false)
	if err != nil {
		return err
	}
	tb.canaries = append(tb.canaries, c)
	return nil
}

// StartMulticast makes role's namespace a discovery responder on interface
// ifname: it joins every group of Multicast there, listens on the mDNS,
// LLMNR and SSDP ports (IPv6 SSDP is the existing dual-stack UDP canary on
// 1900), logs each datagram with Proto "mcast" (or "udp") and answers it by
// unicast, as a real responder does.
func (tb *Testbed) StartMulticast(role, ifname string) error {
	c := &canaries{role: role, log: &tb.log}
	err := inNS(tb.NSPath(role), func() error {
		ifi, err := net.InterfaceByName(ifname)
		if err != nil {
			return fmt.Errorf("%s: %w", role, err)
		}
		for _, network := range []string{"udp4", "udp6"} {
			// One membership socket per family holds every group; the
			// kernel then delivers group traffic to any socket bound to
			// the wildcard address on the group's port.
			member, err := net.ListenPacket(network, ":0")
			if err != nil {
				return err
			}
			c.closers = append(c.closers, func() { member.Close() })
			for _, g := range Multicast {
				if g.Addr().Is4() != (network == "udp4") {
					continue
				}
				if err := join(member, g.Addr(), ifi.Index); err != nil {
					return fmt.Errorf("%s: join %s on %s: %w", role, g.Addr(), ifname, err)
				}
			}
			ports := []int{5353, 5355}
			if network == "udp4" {
				ports = append(ports, 1900) // beside the dual-stack canary
			}
			for _, port := range ports {
				pc, err := reuseAddr().ListenPacket(context.Background(), network, fmt.Sprintf(":%d", port))
				if err != nil {
					return fmt.Errorf("%s %s/%d: %w", role, network, port, err)
				}
				c.closers = append(c.closers, func() { pc.Close() })
				go c.serveMulticast(pc)
			}
		}
		return nil
	})
	if err != nil {
		c.close()
		return err
	}
	tb.canaries = append(tb.canaries, c)
	return nil
}

// reuseAddr sets SO_REUSEADDR, so that several wildcard sockets can share
// a UDP port (multicast is delivered to each of them).
func reuseAddr() *net.ListenConfig {
	return &net.ListenConfig{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		if err := rc.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEADDR, 1) }); err != nil {
			return err
		}
		return serr
	}}
}

func join(pc net.PacketConn, group netip.Addr, ifindex int) error {
	rc, err := pc.(*net.UDPConn).SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	err = rc.Control(func(fd uintptr) {
		if group.Is4() {
			serr = unix.SetsockoptIPMreqn(int(fd), unix.IPPROTO_IP, unix.IP_ADD_MEMBERSHIP, &unix.IPMreqn{Multiaddr: group.As4(), Ifindex: int32(ifindex)})
			return
		}
		serr = unix.SetsockoptIPv6Mreq(int(fd), unix.IPPROTO_IPV6, unix.IPV6_JOIN_GROUP, &unix.IPv6Mreq{Multiaddr: group.As16(), Interface: uint32(ifindex)})
	})
	if err != nil {
		return err
	}
	return serr
}

func (c *canaries) serveMulticast(pc net.PacketConn) {
	b := make([]byte, 1500)
	for {
		n, from, err := pc.ReadFrom(b)
		if err != nil {
			return
		}
		c.log.add(Hit{NS: c.role, Proto: "mcast", Local: local(pc.LocalAddr()), Payload: string(b[:n])})
		pc.WriteTo([]byte("canary "+c.role+" mcast\n"), from)
	}
}

// ListenTCP opens a TCP listener inside role's namespace (the socket stays
// there); the caller closes it.
func (tb *Testbed) ListenTCP(role, addr string) (net.Listener, error) {
	var ln net.Listener
	err := inNS(tb.NSPath(role), func() error {
		var err error
		ln, err = net.Listen("tcp", addr)
		return err
	})
	return ln, err
}

// AwaitHits waits until every nonce has a canary hit or the timeout passes,
// and returns the nonces still without one. Canaries log asynchronously
// (an ICMP copy is read by a polling raw socket, aardvark forwards DNS on
// its own schedule), so a fixed sleep is a race on a loaded machine.
func (tb *Testbed) AwaitHits(timeout time.Duration, nonces ...string) []string {
	deadline := time.Now().Add(timeout)
	for {
		var missing []string
		for _, n := range nonces {
			if len(tb.Hits(n)) == 0 {
				missing = append(missing, n)
			}
		}
		if len(missing) == 0 || time.Now().After(deadline) {
			return missing
		}
		time.Sleep(20 * time.Millisecond)
	}
}
