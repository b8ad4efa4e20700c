package probe

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// attemptTimeout bounds one network attempt.
const attemptTimeout = 1500 * time.Millisecond

// netState is shared by the network rows of one run (parity, inbound).
type netState struct {
	mu       sync.Mutex
	seq      int
	byCheck  map[string][]Attempt
	inbound  []string
	listener net.Listener
	started  time.Time
}

func networkChecks() []check {
	s := &netState{byCheck: map[string][]Attempt{}}
	return []check{
		{"D1", "network inventory", "interfaces, addresses, routes, resolv.conf", s.inventory},
		{"D2", "positive control: internet as policy says", "TCP, UDP and ICMP to the internet canaries, v4 and v6", s.internet},
		{"D3", "host via gateway", "TCP, UDP, ICMP to the gateway addresses (DNS 53 excepted)", s.group("gateway", func(p Params) []string { return p.Gateway })},
		{"D4", "host via other host addresses", "TCP, UDP, ICMP to the host's other addresses and loopback services", s.group("host", func(p Params) []string { return p.Host })},
		{"D5", "host over IPv6 link-local", "ICMPv6 echo to ff02::1 on every interface", s.linkLocal},
		{"D6", "LAN and private ranges", "TCP, UDP, ICMP to the LAN router and private, CGNAT, ULA addresses", s.group("lan", func(p Params) []string { return p.LAN })},
		{"D7", "cloud metadata", "HTTP and UDP to metadata addresses", s.group("metadata", func(p Params) []string { return p.Metadata })},
		{"D8", "other containers", "TCP, UDP, ICMP to other cages", s.group("peers", func(p Params) []string { return p.Peers })},
		{"D9a", "DNS: the given resolver works", "resolve a canary name through resolv.conf", s.dnsGiven},
		{"D9b", "DNS: direct resolvers", "queries straight to other resolvers over UDP and TCP 53", s.dnsDirect},
		{"D9c", "DNS over TLS", "TCP 853 to resolvers and internet canaries", s.dot},
		{"D9d", "DNS over HTTPS", "TCP 443 to internet canaries", s.doh},
		{"D9e", "DNS exfiltration via the resolver", "a unique label under the canary zone through the given resolver", s.dnsExfil},
		{"D9f", "LLMNR and NetBIOS", "LLMNR 224.0.0.252:5355 / ff02::1:3, NetBIOS broadcast 137", s.llmnr},
		{"D10", "raw sockets", "socket(AF_PACKET, SOCK_RAW), socket(AF_INET/AF_INET6, SOCK_RAW)", rawSockets},
		{"D11", "ARP spoofing", "open and bind an ARP packet socket (nothing is sent)", arpSocket},
		{"D12", "rogue IPv6 RA", "open a raw ICMPv6 socket able to send router advertisements (nothing is sent)", raSocket},
		{"D13", "discovery multicast", "mDNS 224.0.0.251 / ff02::fb, SSDP 239.255.255.250:1900; wait for replies", s.discovery},
		{"D14", "IPv4/IPv6 parity", "compare D3–D9 verdicts per family", s.parity},
		{"D15", "inbound", "listen on a port while the host side connects to the cage", s.inboundCheck},
	}
}

func ifaces() []net.Interface {
	all, _ := net.Interfaces()
	var out []net.Interface
	for _, i := range all {
		if i.Flags&net.FlagLoopback == 0 {
			out = append(out, i)
		}
	}
	return out
}

func (s *netState) inventory(_ context.Context, p Params, c *Check) {
	var names []string
	for _, i := range ifaces() {
		addrs, _ := i.Addrs()
		var as []string
		for _, a := range addrs {
			as = append(as, a.String())
		}
		names = append(names, i.Name)
		c.ev("%s %s", i.Name, strings.Join(as, " "))
	}
	c.Observed = "interfaces besides lo: " + strings.Join(names, " ")
	for _, f := range []string{"/proc/net/route", "/proc/net/ipv6_route"} {
		if b, err := os.ReadFile(f); err == nil {
			c.ev("%s: %d lines", f, strings.Count(string(b), "\n"))
		}
	}
	if b, err := os.ReadFile("/etc/resolv.conf"); err == nil {
		c.ev("resolv.conf: %s", strings.Join(strings.Fields(string(b)), " "))
	}
	switch {
	case p.Policy == "none" && len(names) > 0:
		c.escape("policy none, yet the cage has interfaces %v", names)
	case len(names) > 1:
		c.escape("more than one network interface: %v", names)
	}
	if p.InboundPort > 0 && len(names) > 0 {
		s.listen(p)
	}
	c.settle(Sealed, "")
}

// try sends one tagged attempt and records it.
func (s *netState) try(id, proto, addr string, port int, allowed bool, p Params) Attempt {
	s.mu.Lock()
	s.seq++
	// Fixed width, so no nonce is a prefix of another ("-d3-1" of
	// "-d3-12"): canary logs are matched by substring.
	nonce := fmt.Sprintf("%s-%s-%04d", p.Nonce, strings.ToLower(id), s.seq)
	s.mu.Unlock()
	reached := send(proto, addr, port, nonce)
	a := Attempt{Nonce: nonce, Target: fmt.Sprintf("%s:%s:%d", proto, addr, port), Reached: reached, Allowed: allowed}
	s.mu.Lock()
	s.byCheck[id] = append(s.byCheck[id], a)
	s.mu.Unlock()
	return a
}

// fire runs attempts in parallel and returns them in order.
func (s *netState) fire(id string, p Params, targets [][3]string, allowed bool) []Attempt {
	out := make([]Attempt, len(targets))
	var wg sync.WaitGroup
	var mu sync.Mutex
	var panicked any
	for i, t := range targets {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// A panic here would kill the whole battery: hand it to the
			// check's goroutine, where Inside turns it into an error row.
			defer func() {
				if v := recover(); v != nil {
					mu.Lock()
					panicked = fmt.Sprintf("%s %s: %v", t[0], t[1], v)
					mu.Unlock()
				}
			}()
			port, _ := strconv.Atoi(t[2])
			out[i] = s.try(id, t[0], t[1], port, allowed, p)
		}()
	}
	wg.Wait()
	if panicked != nil {
		panic(panicked)
	}
	return out
}

func portsOr(ports []int, def ...int) []int {
	if len(ports) == 0 {
		return def
	}
	return ports
}

func targetsFor(addrs []string, p Params) [][3]string {
	var t [][3]string
	for _, a := range addrs {
		for _, port := range portsOr(p.TCPPorts, 22, 80, 443, 2375, 8080) {
			t = append(t, [3]string{"tcp", a, strconv.Itoa(port)})
		}
		for _, port := range portsOr(p.UDPPorts, 123, 1900, 5000) {
			if port != 53 {
				t = append(t, [3]string{"udp", a, strconv.Itoa(port)})
			}
		}
		t = append(t, [3]string{"icmp", a, "0"})
	}
	return t
}

// judge turns attempts that must not get through into a verdict.
func judge(c *Check, as []Attempt, what string) {
	reached := 0
	for _, a := range as {
		if a.Reached {
			reached++
			c.escape("%s reached (%s)", a.Target, a.Nonce)
		}
	}
	c.Nonces = append(c.Nonces, as...)
	c.Observed = fmt.Sprintf("%d/%d attempts to %s got an answer", reached, len(as), what)
	c.settle(Sealed, "")
}

func (s *netState) group(what string, addrs func(Params) []string) func(context.Context, Params, *Check) {
	return func(_ context.Context, p Params, c *Check) {
		list := addrs(p)
		if len(list) == 0 {
			noTargets(c, p, what)
			return
		}
		judge(c, s.fire(c.ID, p, targetsFor(list, p), false), what)
	}
}

// noTargets decides a row that was given nothing to aim at.
func noTargets(c *Check, p Params, what string) {
	if len(ifaces()) == 0 {
		c.Observed = "no network interface: nothing can be sent"
		c.settle(Sealed, "")
		return
	}
	c.Verdict, c.Reason = Error, "no "+what+" targets given (shrooms probe --targets FILE)"
}

func (s *netState) internet(_ context.Context, p Params, c *Check) {
	if len(p.Internet) == 0 {
		noTargets(c, p, "internet")
		return
	}
	open := p.Policy == "internet" || p.Policy == "allowlist"
	var ts [][3]string
	for _, a := range p.Internet {
		ts = append(ts, [3]string{"tcp", a, strconv.Itoa(portsOr(p.TCPPorts, 80)[len(portsOr(p.TCPPorts, 80))/2])}, [3]string{"udp", a, strconv.Itoa(portsOr(p.UDPPorts, 5000)[len(portsOr(p.UDPPorts, 5000))-1])})
		// ICMP echo needs an unprivileged ICMP socket, which the cage's
		// net.ipv4.ping_group_range may deny the agent (podman's default
		// is "0 0"): then there is no ICMP to expect an answer to.
		if ip, err := netip.ParseAddr(a); err == nil {
			if err := pingSocket(ip); err != nil {
				c.ev("icmp to %s not attempted: echo socket: %s (ping_group_range)", a, errnoName(err))
				continue
			}
		}
		ts = append(ts, [3]string{"icmp", a, "0"})
	}
	as := s.fire(c.ID, p, ts, open)
	c.Nonces = as
	n := 0
	for _, a := range as {
		if a.Reached {
			n++
		}
	}
	c.Observed = fmt.Sprintf("%d/%d internet attempts answered (policy %s)", n, len(as), p.Policy)
	switch {
	case !open && n > 0:
		c.escape("policy %s, yet the internet answered", p.Policy)
	case open && n < len(as):
		for _, a := range as {
			if !a.Reached {
				c.ev("positive control failed: %s got no answer", a.Target)
			}
		}
		c.Verdict, c.Reason = Error, "positive control failed: the internet the policy allows is not reachable, so blocked results prove nothing"
	default:
		c.settle(Sealed, "")
	}
}

func (s *netState) linkLocal(_ context.Context, p Params, c *Check) {
	ifs := ifaces()
	if len(ifs) == 0 || !p.Multicast {
		noTargets(c, p, "multicast (targets.multicast)")
		return
	}
	var replies []string
	for _, i := range ifs {
		own := map[string]bool{}
		addrs, _ := i.Addrs()
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok {
				own[ipn.IP.String()] = true
			}
		}
		for _, from := range pingMulticast6(i) {
			if !own[from] {
				replies = append(replies, from+"%"+i.Name)
			}
		}
	}
	c.Observed = fmt.Sprintf("%d echo replies to ff02::1 from others", len(replies))
	for _, r := range replies {
		c.escape("%s answered an echo to ff02::1", r)
	}
	c.settle(Sealed, "")
}

func pingMulticast6(i net.Interface) []string {
	fd, err := unix.Socket(unix.AF_INET6, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.IPPROTO_ICMPV6)
	if err != nil {
		return nil
	}
	defer unix.Close(fd)
	tv := unix.NsecToTimeval(int64(attemptTimeout))
	unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	dst := &unix.SockaddrInet6{Addr: netip.MustParseAddr("ff02::1").As16(), ZoneId: uint32(i.Index)}
	if err := unix.Sendto(fd, []byte{128, 0, 0, 0, 0, 0, 0, 1, 'p', 'r', 'o', 'b', 'e'}, 0, dst); err != nil {
		return nil
	}
	var out []string
	b := make([]byte, 512)
	for {
		_, from, err := unix.Recvfrom(fd, b, 0)
		if err != nil {
			return out
		}
		if sa, ok := from.(*unix.SockaddrInet6); ok {
			out = append(out, netip.AddrFrom16(sa.Addr).String())
		}
	}
}

func (s *netState) resolve(name string) ([]string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	r := &net.Resolver{PreferGo: true}
	return r.LookupHost(ctx, name)
}

func (s *netState) dnsName(p Params, label string) string {
	zone := p.DNSZone
	if zone == "" {
		zone = "canary.test"
	}
	return fmt.Sprintf("%s-%s.%s", p.Nonce, label, zone)
}

func (s *netState) dnsGiven(_ context.Context, p Params, c *Check) {
	if len(ifaces()) == 0 {
		noTargets(c, p, "dns")
		return
	}
	name := s.dnsName(p, "d9a")
	addrs, err := s.resolve(name)
	open := p.Policy == "internet"
	a := Attempt{Nonce: name, Target: "dns:resolv.conf:53", Reached: err == nil, Allowed: open}
	c.Nonces = []Attempt{a}
	c.Observed = fmt.Sprintf("%s → %v %v", name, addrs, errText(err))
	switch {
	case open && err != nil:
		c.Verdict, c.Reason = Error, "positive control failed: the resolver the cage is given does not answer"
	case !open && err == nil:
		c.escape("policy %s, yet names resolve through the given resolver", p.Policy)
	default:
		c.settle(Sealed, "")
	}
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func (s *netState) dnsExfil(_ context.Context, p Params, c *Check) {
	if len(ifaces()) == 0 {
		noTargets(c, p, "dns")
		return
	}
	name := s.dnsName(p, "d9e-exfil")
	_, err := s.resolve(name)
	c.Nonces = []Attempt{{Nonce: name, Target: "dns:resolv.conf:53", Reached: err == nil, Allowed: p.Policy == "internet"}}
	c.Observed = fmt.Sprintf("unique label %s: %s", name, map[bool]string{true: "answered", false: "no answer"}[err == nil])
	if err == nil {
		if p.Policy != "internet" {
			c.escape("policy %s, yet a unique label left through the resolver", p.Policy)
			return
		}
		c.settle(Residual, "the cage's resolver recurses to the internet: data can leave encoded in DNS names (use the allowlist policy to close it)")
		return
	}
	c.settle(Sealed, "")
}

func (s *netState) dnsDirect(_ context.Context, p Params, c *Check) {
	if len(p.Resolvers) == 0 {
		noTargets(c, p, "resolver")
		return
	}
	var ts [][3]string
	for _, r := range p.Resolvers {
		ts = append(ts, [3]string{"dns", r, "53"}, [3]string{"dnstcp", r, "53"})
	}
	judge(c, s.fire(c.ID, p, ts, false), "direct resolvers")
}

func (s *netState) dot(_ context.Context, p Params, c *Check) {
	list := append(append([]string{}, p.Resolvers...), p.Internet...)
	if len(list) == 0 {
		noTargets(c, p, "resolver")
		return
	}
	var ts [][3]string
	for _, r := range list {
		ts = append(ts, [3]string{"tcp", r, "853"})
	}
	judge(c, s.fire(c.ID, p, ts, false), "DoT")
}

func (s *netState) doh(_ context.Context, p Params, c *Check) {
	if len(p.Internet) == 0 {
		noTargets(c, p, "internet")
		return
	}
	open := p.Policy == "internet" || p.Policy == "allowlist"
	var ts [][3]string
	for _, r := range p.Internet {
		ts = append(ts, [3]string{"tcp", r, "443"})
	}
	as := s.fire(c.ID, p, ts, open)
	c.Nonces = as
	n := 0
	for _, a := range as {
		if a.Reached {
			n++
		}
	}
	c.Observed = fmt.Sprintf("%d/%d HTTPS attempts answered", n, len(as))
	switch {
	case n > 0 && !open:
		c.escape("policy %s, yet HTTPS to the internet gets through", p.Policy)
	case n > 0:
		c.settle(Residual, "HTTPS to an allowed address cannot be told from DNS-over-HTTPS; only a name allowlist that excludes DoH resolvers closes it")
	default:
		c.settle(Sealed, "")
	}
}

func (s *netState) mcast(id string, p Params, c *Check, ts [][3]string) {
	if len(ifaces()) == 0 || !p.Multicast {
		noTargets(c, p, "multicast (targets.multicast)")
		return
	}
	judge(c, s.fire(id, p, ts, false), "multicast and broadcast")
}

func (s *netState) llmnr(_ context.Context, p Params, c *Check) {
	s.mcast(c.ID, p, c, [][3]string{{"udp", "224.0.0.252", "5355"}, {"udp", "ff02::1:3", "5355"}, {"udp", "255.255.255.255", "137"}})
}

func (s *netState) discovery(_ context.Context, p Params, c *Check) {
	s.mcast(c.ID, p, c, [][3]string{{"udp", "224.0.0.251", "5353"}, {"udp", "ff02::fb", "5353"}, {"udp", "239.255.255.250", "1900"}})
}

func rawSockets(_ context.Context, _ Params, c *Check) {
	for _, t := range []struct {
		name            string
		fam, typ, proto int
	}{
		{"AF_PACKET/SOCK_RAW", unix.AF_PACKET, unix.SOCK_RAW, int(htons(unix.ETH_P_ALL))},
		{"AF_INET/SOCK_RAW", unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_RAW},
		{"AF_INET6/SOCK_RAW", unix.AF_INET6, unix.SOCK_RAW, unix.IPPROTO_RAW},
	} {
		fd, err := unix.Socket(t.fam, t.typ|unix.SOCK_CLOEXEC, t.proto)
		if err == nil {
			unix.Close(fd)
			c.escape("%s opened (CAP_NET_RAW)", t.name)
			continue
		}
		c.ev("%s: %s", t.name, errnoName(err))
		c.Errno = errnoName(err)
	}
	c.Observed = "raw socket: " + c.Errno
	c.settle(Sealed, "")
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

func arpSocket(_ context.Context, _ Params, c *Check) {
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(htons(unix.ETH_P_ARP)))
	if err != nil {
		c.Errno, c.Observed = errnoName(err), "ARP packet socket: "+errnoName(err)
		c.settle(Sealed, "")
		return
	}
	defer unix.Close(fd)
	c.Observed = "ARP packet socket opened"
	for _, i := range ifaces() {
		if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ARP), Ifindex: i.Index}); err == nil {
			c.escape("an ARP socket is bound to %s: gratuitous ARP could be sent (nothing was)", i.Name)
			return
		}
	}
	c.escape("an ARP packet socket can be opened (CAP_NET_RAW)")
}

func raSocket(_ context.Context, _ Params, c *Check) {
	fd, err := unix.Socket(unix.AF_INET6, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_ICMPV6)
	if err != nil {
		c.Errno, c.Observed = errnoName(err), "raw ICMPv6 socket: "+errnoName(err)
		c.settle(Sealed, "")
		return
	}
	unix.Close(fd)
	c.Observed = "raw ICMPv6 socket opened"
	c.escape("a raw ICMPv6 socket can be opened: router advertisements could be sent (nothing was)")
}

func (s *netState) parity(_ context.Context, p Params, c *Check) {
	s.mu.Lock()
	defer s.mu.Unlock()
	// Like with like: per check and protocol, only the attempts the
	// policy does not allow (an allowed one reaching is no escape), and
	// only where both families made such attempts (a check aimed at IPv4
	// targets alone has nothing to compare on an IPv4-only network).
	type key struct{ id, proto string }
	type tally struct{ tried, reached int }
	v4, v6 := map[key]*tally{}, map[key]*tally{}
	n4, n6 := 0, 0
	for id, as := range s.byCheck {
		if id < "D3" || id > "D9z" {
			continue
		}
		for _, a := range as {
			f := strings.SplitN(a.Target, ":", 2)
			addr := a.Target[len(f[0])+1 : strings.LastIndex(a.Target, ":")]
			ip, err := netip.ParseAddr(addr)
			if err != nil {
				continue
			}
			if ip.Is4() {
				n4++
			} else {
				n6++
			}
			if a.Allowed {
				continue
			}
			k, m := key{id, f[0]}, v4
			if !ip.Is4() {
				m = v6
			}
			if m[k] == nil {
				m[k] = &tally{}
			}
			m[k].tried++
			if a.Reached {
				m[k].reached++
			}
		}
	}
	compared := 0
	for k, t6 := range v6 {
		t4 := v4[k]
		if t4 == nil {
			continue
		}
		compared++
		switch {
		case t6.reached > 0 && t4.reached == 0:
			c.escape("%s %s: IPv6 got through where IPv4 did not (%d of %d IPv6 attempts, 0 of %d IPv4)", k.id, k.proto, t6.reached, t6.tried, t4.tried)
		case t4.reached > 0 && t6.reached == 0:
			c.escape("%s %s: IPv4 got through where IPv6 did not (%d of %d IPv4 attempts, 0 of %d IPv6)", k.id, k.proto, t4.reached, t4.tried, t6.tried)
		}
	}
	c.Observed = fmt.Sprintf("%d IPv4 and %d IPv6 attempts in D3–D9; %d check/protocol pairs tried over both families compared (allowed attempts left out)", n4, n6, compared)
	if n6 == 0 && len(ifaces()) > 0 {
		hasV6 := false
		for _, i := range ifaces() {
			addrs, _ := i.Addrs()
			for _, a := range addrs {
				if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() == nil && !ipn.IP.IsLinkLocalUnicast() {
					hasV6 = true
				}
			}
		}
		if hasV6 {
			c.Verdict, c.Reason = Error, "the cage has IPv6 but no IPv6 targets were given"
			return
		}
	}
	c.settle(Sealed, "")
}

// listen starts the D15 listener and announces the cage's addresses on
// stderr so the host side knows where to connect.
func (s *netState) listen(p Params) {
	ln, err := net.Listen("tcp", ":"+strconv.Itoa(p.InboundPort))
	if err != nil {
		return
	}
	s.listener, s.started = ln, time.Now()
	for _, i := range ifaces() {
		addrs, _ := i.Addrs()
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok && !ipn.IP.IsLinkLocalUnicast() {
				fmt.Fprintf(os.Stderr, "%s %s %d\n", InboundAnnounce, ipn.IP, p.InboundPort)
			}
		}
	}
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			conn.SetDeadline(time.Now().Add(time.Second))
			b := make([]byte, 128)
			n, _ := conn.Read(b)
			s.mu.Lock()
			s.inbound = append(s.inbound, conn.RemoteAddr().String()+" "+strings.TrimSpace(string(b[:n])))
			s.mu.Unlock()
			conn.Close()
		}
	}()
}

// InboundAnnounce starts the stderr line with which the inside tells the
// host side where D15 listens: "shrooms-probe-inbound ADDR PORT".
const InboundAnnounce = "shrooms-probe-inbound"

func (s *netState) inboundCheck(_ context.Context, p Params, c *Check) {
	if len(ifaces()) == 0 {
		noTargets(c, p, "inbound")
		return
	}
	if s.listener == nil {
		c.Verdict, c.Reason = Error, "no inbound listener (targets.inboundPort unset or port busy)"
		return
	}
	if wait := time.Duration(p.InboundWaitMs)*time.Millisecond - time.Since(s.started); wait > 0 {
		time.Sleep(wait)
	}
	s.listener.Close()
	s.mu.Lock()
	defer s.mu.Unlock()
	c.Observed = fmt.Sprintf("%d inbound connections on port %d in %v", len(s.inbound), p.InboundPort, time.Since(s.started).Round(time.Millisecond))
	for _, in := range s.inbound {
		c.escape("inbound connection from %s", in)
	}
	c.settle(Sealed, "")
}

// send is one tagged attempt; reached means something answered (a reply,
// or a reset/port-unreachable from a non-loopback target, which proves the
// packet got there).
func send(proto, addr string, port int, nonce string) bool {
	hp := net.JoinHostPort(addr, strconv.Itoa(port))
	ip, _ := netip.ParseAddr(addr)
	refusedCounts := !ip.IsLoopback()
	switch proto {
	case "tcp":
		conn, err := net.DialTimeout("tcp", hp, attemptTimeout)
		if err != nil {
			return refusedCounts && errors.Is(err, unix.ECONNREFUSED)
		}
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(attemptTimeout))
		fmt.Fprintf(conn, "%s\n", nonce)
		if port == 80 {
			fmt.Fprintf(conn, "GET /latest/meta-data/?%s HTTP/1.0\r\n\r\n", nonce)
		}
		return true
	case "udp":
		if ip.IsMulticast() || ip == netip.AddrFrom4([4]byte{255, 255, 255, 255}) {
			return sendGroup(ip, port, nonce)
		}
		conn, err := net.Dial("udp", hp)
		if err != nil {
			return false
		}
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(attemptTimeout))
		if _, err := conn.Write([]byte(nonce + "\n")); err != nil {
			return false
		}
		b := make([]byte, 256)
		n, err := conn.Read(b)
		return n > 0 || refusedCounts && errors.Is(err, unix.ECONNREFUSED)
	case "icmp":
		return ping(ip, nonce)
	case "dns", "dnstcp":
		r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
			if proto == "dnstcp" {
				network = "tcp"
			}
			return (&net.Dialer{}).DialContext(ctx, network, hp)
		}}
		ctx, cancel := context.WithTimeout(context.Background(), attemptTimeout)
		defer cancel()
		_, err := r.LookupHost(ctx, nonce+".canary.test")
		var de *net.DNSError
		return err == nil || errors.As(err, &de) && de.IsNotFound
	}
	return false
}

// sendGroup sends to a multicast or broadcast address from an unconnected
// socket, out of every interface (an IPv6 link-local group needs the zone),
// and reports whether anyone answered. A connected socket would never see
// the answer: responders reply from their own unicast address.
func sendGroup(ip netip.Addr, port int, nonce string) bool {
	network := "udp4"
	if ip.Is6() {
		network = "udp6"
	}
	pc, err := net.ListenPacket(network, ":0")
	if err != nil {
		return false
	}
	defer pc.Close()
	sent := false
	for _, i := range ifaces() {
		dst := &net.UDPAddr{IP: ip.AsSlice(), Port: port}
		if ip.Is6() {
			dst.Zone = i.Name
		}
		if _, err := pc.WriteTo([]byte(nonce+"\n"), dst); err == nil {
			sent = true
		}
	}
	if !sent {
		return false
	}
	pc.SetReadDeadline(time.Now().Add(attemptTimeout))
	b := make([]byte, 512)
	n, _, err := pc.ReadFrom(b)
	return err == nil && n > 0
}

// pingSocket reports whether an unprivileged ICMP echo socket for a's
// family can be opened here.
func pingSocket(a netip.Addr) error {
	fam, proto := unix.AF_INET6, unix.IPPROTO_ICMPV6
	if a.Unmap().Is4() {
		fam, proto = unix.AF_INET, unix.IPPROTO_ICMP
	}
	fd, err := unix.Socket(fam, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, proto)
	if err != nil {
		return err
	}
	unix.Close(fd)
	return nil
}

// ping sends one ICMP echo over an unprivileged ICMP socket.
func ping(a netip.Addr, nonce string) bool {
	if !a.IsValid() {
		return false
	}
	fam, proto, typ := unix.AF_INET6, unix.IPPROTO_ICMPV6, byte(128)
	var sa unix.Sockaddr = &unix.SockaddrInet6{Addr: a.As16()}
	if a.Unmap().Is4() {
		fam, proto, typ = unix.AF_INET, unix.IPPROTO_ICMP, 8
		sa = &unix.SockaddrInet4{Addr: a.Unmap().As4()}
	}
	fd, err := unix.Socket(fam, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, proto)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	tv := unix.NsecToTimeval(int64(attemptTimeout))
	unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	if err := unix.Sendto(fd, append([]byte{typ, 0, 0, 0, 0, 0, 0, 1}, nonce...), 0, sa); err != nil {
		return false
	}
	b := make([]byte, 512)
	n, _, err := unix.Recvfrom(fd, b, 0)
	return err == nil && n > 8
}
