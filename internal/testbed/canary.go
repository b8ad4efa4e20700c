package testbed

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shrooms-cage/shrooms/pkg/innetns"
)

// Hit is one packet a canary received.
type Hit struct {
	NS      string         // testbed namespace role: host, router, internet
	Proto   string         // tcp, udp, icmp, dns
	Local   netip.AddrPort // the address and port that was hit
	Remote  netip.AddrPort // where it came from (tcp only; zero elsewhere)
	Payload string         // what was sent (the nonce, or the DNS name)
	At      time.Time      // when the canary logged it
}

// log collects every canary hit.
type log struct {
	mu   sync.Mutex
	hits []Hit
	// names are the DNS canary's answers set by SetName (lower-case name
	// without the trailing dot), instead of the internet canary's address.
	names map[string][]netip.Addr
}

// SetName makes the internet's DNS canary (an authoritative server for
// every name) answer name with addrs from now on, e.g. to rotate a name's
// address between turns. No addrs restores the default answer.
func (tb *Testbed) SetName(name string, addrs ...netip.Addr) {
	tb.log.mu.Lock()
	defer tb.log.mu.Unlock()
	if tb.log.names == nil {
		tb.log.names = map[string][]netip.Addr{}
	}
	tb.log.names[strings.ToLower(strings.TrimSuffix(name, "."))] = addrs
}

func (l *log) override(name string) ([]netip.Addr, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	a, ok := l.names[name]
	return a, ok && len(a) > 0
}

func (l *log) add(h Hit) {
	h.At = time.Now()
	l.mu.Lock()
	l.hits = append(l.hits, h)
	l.mu.Unlock()
}

// Hits returns the hits whose payload contains nonce.
func (tb *Testbed) Hits(nonce string) []Hit {
	tb.log.mu.Lock()
	defer tb.log.mu.Unlock()
	var out []Hit
	for _, h := range tb.log.hits {
		if strings.Contains(h.Payload, nonce) {
			out = append(out, h)
		}
	}
	return out
}

// inNS runs fn on a thread inside the namespace at path; sockets created
// there stay in that namespace after the thread leaves it.
func inNS(path string, fn func() error) error { return innetns.Run(path, fn) }

// canaries listens in one namespace on tcp and udp ports (all addresses,
// both families) and optionally ICMP echo and DNS, logging every hit.
type canaries struct {
	role    string
	closers []func()
	log     *log
}

func (c *canaries) close() {
	for _, f := range c.closers {
		f()
	}
}

func startCanaries(nsPath, role string, l *log, bind string, tcp, udp []int, icmp, dns bool) (*canaries, error) {
	c := &canaries{role: role, log: l}
	err := inNS(nsPath, func() error {
		for _, p := range tcp {
			ln, err := net.Listen("tcp", net.JoinHostPort(bind, fmt.Sprint(p)))
			if err != nil {
				return fmt.Errorf("%s tcp/%d: %w", role, p, err)
			}
			c.closers = append(c.closers, func() { ln.Close() })
			go c.serveTCP(ln, p == 53 && dns)
		}
		for _, p := range udp {
			// SO_REUSEADDR lets StartMulticast add an IPv4 socket on the
			// same port: IPv4 multicast is not delivered to this dual-stack
			// socket unless it joined the group itself.
			pc, err := reuseAddr().ListenPacket(context.Background(), "udp", net.JoinHostPort(bind, fmt.Sprint(p)))
			if err != nil {
				return fmt.Errorf("%s udp/%d: %w", role, p, err)
			}
			c.closers = append(c.closers, func() { pc.Close() })
			go c.serveUDP(pc, p == 53 && dns)
		}
		if icmp {
			for _, fam := range []int{unix.AF_INET, unix.AF_INET6} {
				proto := unix.IPPROTO_ICMP
				if fam == unix.AF_INET6 {
					proto = unix.IPPROTO_ICMPV6
				}
				fd, err := unix.Socket(fam, unix.SOCK_RAW|unix.SOCK_CLOEXEC, proto)
				if err != nil {
					return fmt.Errorf("%s icmp: %w", role, err)
				}
				tv := unix.NsecToTimeval(int64(200 * time.Millisecond))
				unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
				done := make(chan struct{})
				c.closers = append(c.closers, func() { close(done); unix.Close(fd) })
				go c.serveICMP(fd, fam == unix.AF_INET6, done)
			}
		}
		return nil
	})
	if err != nil {
		c.close()
		return nil, err
	}
	return c, nil
}

func local(a net.Addr) netip.AddrPort {
	switch a := a.(type) {
	case *net.TCPAddr:
		return netip.AddrPortFrom(a.AddrPort().Addr().Unmap(), a.AddrPort().Port())
	case *net.UDPAddr:
		return netip.AddrPortFrom(a.AddrPort().Addr().Unmap(), a.AddrPort().Port())
	}
	return netip.AddrPort{}
}

func (c *canaries) serveTCP(ln net.Listener, dns bool) {
	for {
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer conn.Close()
			conn.SetDeadline(time.Now().Add(3 * time.Second))
			if dns {
				var n uint16
				if binary.Read(conn, binary.BigEndian, &n) != nil {
					return
				}
				q := make([]byte, n)
				if _, err := conn.Read(q); err != nil {
					return
				}
				c.log.add(Hit{NS: c.role, Proto: "dns", Local: local(conn.LocalAddr()), Payload: qname(q)})
				if r := c.log.dnsAnswer(q); r != nil {
					conn.Write(append(binary.BigEndian.AppendUint16(nil, uint16(len(r))), r...))
				}
				return
			}
			b := make([]byte, 256)
			n, _ := conn.Read(b)
			c.log.add(Hit{NS: c.role, Proto: "tcp", Local: local(conn.LocalAddr()), Remote: local(conn.RemoteAddr()), Payload: string(b[:n])})
			fmt.Fprintf(conn, "canary %s\n", c.role)
		}()
	}
}

func (c *canaries) serveUDP(pc net.PacketConn, dns bool) {
	b := make([]byte, 1500)
	for {
		n, from, err := pc.ReadFrom(b)
		if err != nil {
			return
		}
		if dns {
			q := append([]byte(nil), b[:n]...)
			c.log.add(Hit{NS: c.role, Proto: "dns", Local: local(pc.LocalAddr()), Payload: qname(q)})
			if r := c.log.dnsAnswer(q); r != nil {
				pc.WriteTo(r, from)
			}
			continue
		}
		c.log.add(Hit{NS: c.role, Proto: "udp", Local: local(pc.LocalAddr()), Payload: string(b[:n])})
		pc.WriteTo([]byte("canary "+c.role+"\n"), from)
	}
}

// serveICMP logs echo requests seen by a raw socket (a copy; the kernel
// still answers the echo itself).
func (c *canaries) serveICMP(fd int, v6 bool, done chan struct{}) {
	b := make([]byte, 1500)
	for {
		select {
		case <-done:
			return
		default:
		}
		n, from, err := unix.Recvfrom(fd, b, 0)
		if err != nil || n < 8 {
			continue
		}
		msg := b[:n]
		if !v6 {
			ihl := int(msg[0]&0x0f) * 4
			if len(msg) < ihl+8 {
				continue
			}
			msg = msg[ihl:]
		}
		if (!v6 && msg[0] != 8) || (v6 && msg[0] != 128) {
			continue
		}
		var src netip.Addr
		switch s := from.(type) {
		case *unix.SockaddrInet4:
			src = netip.AddrFrom4(s.Addr)
		case *unix.SockaddrInet6:
			src = netip.AddrFrom16(s.Addr)
		}
		c.log.add(Hit{NS: c.role, Proto: "icmp", Local: netip.AddrPortFrom(src, 0), Payload: string(msg[8:])})
	}
}

// qname extracts the question name of a DNS query ("" if malformed).
func qname(q []byte) string {
	if len(q) < 13 {
		return ""
	}
	var labels []string
	i := 12
	for i < len(q) && q[i] != 0 {
		l := int(q[i])
		if l > 63 || i+1+l > len(q) {
			return ""
		}
		labels = append(labels, string(q[i+1:i+1+l]))
		i += 1 + l
	}
	return strings.Join(labels, ".")
}

// dnsAnswer answers an A or AAAA question with the internet canary's
// address (203.0.113.10 / 2001:db8:203::10), except AAAA for names under
// "v4only."; anything else gets an empty NOERROR answer.
func (l *log) dnsAnswer(q []byte) []byte {
	if len(q) < 12 {
		return nil
	}
	end := 12
	for end < len(q) && q[end] != 0 {
		end += int(q[end]) + 1
	}
	end += 5 // root label, qtype, qclass
	if end > len(q) {
		return nil
	}
	qtype := binary.BigEndian.Uint16(q[end-4:])
	r := append([]byte(nil), q[:end]...)
	r[2] = 0x84 | (q[2] & 0x01) // response, authoritative, keep RD
	r[3] = 0x00
	binary.BigEndian.PutUint16(r[6:], 0) // ancount
	binary.BigEndian.PutUint16(r[8:], 0)
	binary.BigEndian.PutUint16(r[10:], 0)
	name := strings.ToLower(qname(q))
	var rdatas [][]byte
	if set, ok := l.override(name); ok {
		for _, a := range set {
			if (qtype == 1 && a.Is4()) || (qtype == 28 && a.Is6()) {
				rdatas = append(rdatas, a.AsSlice())
			}
		}
	} else {
		if strings.HasPrefix(name, "v4only.") && qtype == 28 {
			qtype = 0 // v4only.* names have no AAAA record
		}
		switch qtype {
		case 1:
			rdatas = [][]byte{InternetAddr4.AsSlice()}
		case 28:
			rdatas = [][]byte{InternetAddr6.AsSlice()}
		}
	}
	binary.BigEndian.PutUint16(r[6:], uint16(len(rdatas)))
	for _, rdata := range rdatas {
		r = append(r, 0xc0, 0x0c)
		r = binary.BigEndian.AppendUint16(r, qtype)
		r = binary.BigEndian.AppendUint16(r, 1)
		r = binary.BigEndian.AppendUint32(r, 30)
		r = binary.BigEndian.AppendUint16(r, uint16(len(rdata)))
		r = append(r, rdata...)
	}
	return r
}

// DialContext dials from inside role's namespace (for a net.Resolver that
// must reach the testbed's DNS canary from the test process).
func (tb *Testbed) DialContext(role string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		var c net.Conn
		err := inNS(tb.NSPath(role), func() error {
			var err error
			c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
			return err
		})
		return c, err
	}
}
