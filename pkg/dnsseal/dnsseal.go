// Package dnsseal is a cage's resolver: a small DNS server of shrooms' own
// (github.com/miekg/dns) that a turn opens on the cage's own loopback, the
// one resolver the cage's resolv.conf names and the only DNS the seal lets a
// cage reach (it drops DNS to the gateway and to every other address).
//
// Under the allowlist policy it answers only the allowlisted names, only with
// public A/AAAA addresses, and pins each address into the seal's allowed set
// (Config.Pin, a timeout bounded by the answer's TTL) before the answer is
// sent: an address the seal would drop is never handed out, and a name whose
// addresses rotate keeps working. Every other name is refused without a
// query leaving the host, so no data leaves through names.
//
// Under the internet policy it recurses for public names only: no single-
// label, local or reverse names, no answer carrying a private, local or
// metadata address (DNS rebinding to the LAN), and upstream queries
// rate-limited per cage. What a cage can still send through names under
// internet is measured and written in docs/residual-risks.md.
package dnsseal

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/miekg/dns"
)

// Policies the server serves.
const (
	Allowlist = "allowlist"
	Internet  = "internet"
)

// Pinner puts addrs into the seal's allowed set for timeout; it returns once
// every wall that enforces the allowlist has them (firewall.Pin).
type Pinner func(ctx context.Context, addrs []netip.Addr, timeout time.Duration) error

// Config is one cage's resolver.
type Config struct {
	// Policy is Allowlist or Internet.
	Policy string
	// Names are the allowlisted host names (Allowlist): exact names, any
	// case, with or without the trailing dot.
	Names []string
	// Upstream are the resolvers queried ("addr" or "addr:port").
	Upstream []string
	// Dial opens a connection to an upstream resolver; nil is net.Dialer.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// Pin is required under Allowlist.
	Pin Pinner
	// PinTimeout maps an answer's TTL to the pin's life (required under
	// Allowlist; firewall.PinTimeout).
	PinTimeout func(ttl time.Duration) time.Duration
	// Blocked reports addresses no answer may carry (firewall.IsBlocked).
	Blocked func(netip.Addr) bool
	// Rate and Burst bound the queries per second that go upstream
	// (a token bucket; cache hits and refusals are free). 0 is no limit.
	Rate  float64
	Burst int
	// Timeout bounds one upstream exchange (default 3s).
	Timeout time.Duration
}

// RepinAfter is how long a cached answer's pin is trusted before a cache
// hit pins it again.
const RepinAfter = 5 * time.Second

// Stats counts what the server did.
type Stats struct {
	Queries  int64 `json:"queries"`
	Answered int64 `json:"answered"`
	Refused  int64 `json:"refused"`
	Limited  int64 `json:"limited"`
	Upstream int64 `json:"upstream"`
	Failed   int64 `json:"failed"`
}

// Server is a running resolver.
type Server struct {
	cfg     Config
	names   map[string]bool
	cache   *cache
	limiter *bucket
	servers []*dns.Server
	// pinned is when each cached answer was last pinned and until when:
	// a cache hit re-pins only after RepinAfter, as a pin is a netlink
	// commit (milliseconds), yet a seal flushed and re-applied meanwhile
	// gets the addresses back at the next lookup.
	pinMu  sync.Mutex
	pinned map[cacheKey][2]time.Time
	stats  struct{ queries, answered, refused, limited, upstream, failed atomic.Int64 }
	wg     sync.WaitGroup
}

// New checks cfg and returns a server that is not serving yet.
func New(cfg Config) (*Server, error) {
	switch cfg.Policy {
	case Allowlist:
		if cfg.Pin == nil || cfg.PinTimeout == nil {
			return nil, errors.New("dnsseal: the allowlist resolver needs a pinner (it never answers an address the seal would drop)")
		}
	case Internet:
	default:
		return nil, fmt.Errorf("dnsseal: policy %q has no resolver", cfg.Policy)
	}
	if cfg.Blocked == nil {
		return nil, errors.New("dnsseal: no blocked-range check")
	}
	if len(cfg.Upstream) == 0 {
		return nil, errors.New("dnsseal: no upstream resolver (network.dns_upstream, or nameserver lines in the host's /etc/resolv.conf)")
	}
	ups := make([]string, 0, len(cfg.Upstream))
	for _, u := range cfg.Upstream {
		if _, _, err := net.SplitHostPort(u); err != nil {
			u = net.JoinHostPort(u, "53")
		}
		ups = append(ups, u)
	}
	cfg.Upstream = ups
	if cfg.Timeout <= 0 {
		cfg.Timeout = 3 * time.Second
	}
	if cfg.Dial == nil {
		d := &net.Dialer{}
		cfg.Dial = d.DialContext
	}
	s := &Server{cfg: cfg, names: map[string]bool{}, cache: newCache(4096), pinned: map[cacheKey][2]time.Time{}}
	for _, n := range cfg.Names {
		s.names[dns.CanonicalName(n)] = true
	}
	if cfg.Rate > 0 {
		s.limiter = newBucket(cfg.Rate, max(cfg.Burst, 1))
	}
	return s, nil
}

// Serve answers on pc (UDP) and ln (TCP) until Close; either may be nil.
func (s *Server) Serve(pc net.PacketConn, ln net.Listener) {
	if pc != nil {
		srv := &dns.Server{PacketConn: pc, Handler: s, UDPSize: dns.DefaultMsgSize}
		s.servers = append(s.servers, srv)
		s.wg.Add(1)
		go func() { defer s.wg.Done(); _ = srv.ActivateAndServe() }()
	}
	if ln != nil {
		srv := &dns.Server{Listener: ln, Handler: s, ReadTimeout: 5 * time.Second}
		s.servers = append(s.servers, srv)
		s.wg.Add(1)
		go func() { defer s.wg.Done(); _ = srv.ActivateAndServe() }()
	}
}

// Close stops serving and closes the sockets.
func (s *Server) Close() {
	for _, srv := range s.servers {
		_ = srv.Shutdown()
	}
	s.wg.Wait()
}

// Stats is what the server did so far.
func (s *Server) Stats() Stats {
	return Stats{
		Queries: s.stats.queries.Load(), Answered: s.stats.answered.Load(), Refused: s.stats.refused.Load(),
		Limited: s.stats.limited.Load(), Upstream: s.stats.upstream.Load(), Failed: s.stats.failed.Load(),
	}
}

// ServeDNS answers one query (dns.Handler).
func (s *Server) ServeDNS(w dns.ResponseWriter, req *dns.Msg) {
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.Timeout+time.Second)
	defer cancel()
	_ = w.WriteMsg(s.Answer(ctx, req))
}

// Answer is the reply to req (ServeDNS without the socket, for tests and
// benchmarks).
func (s *Server) Answer(ctx context.Context, req *dns.Msg) *dns.Msg {
	s.stats.queries.Add(1)
	reply := func(rcode int) *dns.Msg {
		m := new(dns.Msg)
		m.SetRcode(req, rcode)
		m.RecursionAvailable = true
		switch rcode {
		case dns.RcodeRefused:
			s.stats.refused.Add(1)
		case dns.RcodeServerFailure:
			s.stats.failed.Add(1)
		}
		return m
	}
	if req.Response || req.Opcode != dns.OpcodeQuery || len(req.Question) != 1 {
		return reply(dns.RcodeRefused)
	}
	q := req.Question[0]
	if q.Qclass != dns.ClassINET {
		return reply(dns.RcodeRefused)
	}
	name := dns.CanonicalName(q.Name)
	if !s.mayAsk(name, q.Qtype) {
		return reply(dns.RcodeRefused)
	}
	if s.cfg.Policy == Allowlist && q.Qtype != dns.TypeA && q.Qtype != dns.TypeAAAA {
		return s.answered(reply(dns.RcodeSuccess)) // no data: only addresses are served
	}
	rrs, ttl, cached := s.cache.get(name, q.Qtype)
	if !cached {
		if s.limiter != nil && !s.limiter.take() {
			s.stats.limited.Add(1)
			return reply(dns.RcodeRefused)
		}
		var rcode int
		var err error
		rrs, ttl, rcode, err = s.resolve(ctx, name, q.Qtype)
		if err != nil {
			return reply(dns.RcodeServerFailure)
		}
		if rcode != dns.RcodeSuccess {
			return reply(rcode)
		}
		s.cache.put(name, q.Qtype, rrs, ttl)
	}
	if s.cfg.Policy == Allowlist {
		var addrs []netip.Addr
		for _, rr := range rrs {
			if a, ok := rrAddr(rr); ok {
				addrs = append(addrs, a)
			}
		}
		if len(addrs) > 0 {
			// Pinned before the answer leaves: the cage never holds an
			// address the seal drops. A failed pin is a failed answer.
			timeout := s.cfg.PinTimeout(ttl)
			key, now := cacheKey{name, q.Qtype}, time.Now()
			s.pinMu.Lock()
			last := s.pinned[key]
			s.pinMu.Unlock()
			if !cached || now.Sub(last[0]) >= RepinAfter || now.Add(ttl).After(last[1]) {
				if err := s.cfg.Pin(ctx, addrs, timeout); err != nil {
					return reply(dns.RcodeServerFailure)
				}
				s.pinMu.Lock()
				s.pinned[key] = [2]time.Time{now, now.Add(timeout)}
				s.pinMu.Unlock()
			}
			ttl = min(ttl, timeout)
		}
	}
	m := reply(dns.RcodeSuccess)
	secs := uint32(ttl / time.Second)
	for _, rr := range rrs {
		rr = dns.Copy(rr)
		rr.Header().Ttl = secs
		m.Answer = append(m.Answer, rr)
	}
	return s.answered(m)
}

func (s *Server) answered(m *dns.Msg) *dns.Msg {
	s.stats.answered.Add(1)
	return m
}

// mayAsk says whether a query for name may be answered at all (before any
// upstream query is made for it).
func (s *Server) mayAsk(name string, qtype uint16) bool {
	if s.cfg.Policy == Allowlist {
		return s.names[name]
	}
	labels := dns.CountLabel(name)
	switch {
	case labels < 2: // single-label names: LAN hosts through a search domain
		return false
	case dns.IsSubDomain("arpa.", name): // reverse and other infrastructure names
		return false
	case qtype == dns.TypeANY || qtype == dns.TypeAXFR || qtype == dns.TypeIXFR:
		return false
	}
	for _, local := range localZones {
		if dns.IsSubDomain(local, name) {
			return false
		}
	}
	return true
}

// localZones are names that only mean something on a LAN or a host.
var localZones = []string{"localhost.", "local.", "internal.", "lan.", "home.", "home.arpa.", "corp.", "intranet.", "private.", "localdomain."}

// servedTypes are the record types passed on under Internet, besides
// A/AAAA: none of them carries an address a client connects to unchecked.
var servedTypes = map[uint16]bool{
	dns.TypeA: true, dns.TypeAAAA: true, dns.TypeCNAME: true, dns.TypeMX: true, dns.TypeTXT: true,
	dns.TypeSRV: true, dns.TypeNS: true, dns.TypeCAA: true, dns.TypeDNAME: true,
}

// resolve asks the upstream resolvers for name and returns the records to
// serve, their lowest TTL and the rcode. Under Allowlist only the A/AAAA
// records (the CNAME chain flattened to name); under Internet the answer
// section's served types. Any address in a blocked range is dropped; an
// answer left with none that had some is refused (DNS rebinding).
func (s *Server) resolve(ctx context.Context, name string, qtype uint16) ([]dns.RR, time.Duration, int, error) {
	q := new(dns.Msg)
	q.SetQuestion(name, qtype)
	q.RecursionDesired = true
	var resp *dns.Msg
	var err error
	for _, up := range s.cfg.Upstream {
		s.stats.upstream.Add(1)
		if resp, err = s.exchange(ctx, q, up); err == nil {
			break
		}
	}
	if err != nil {
		return nil, 0, 0, err
	}
	if resp.Rcode != dns.RcodeSuccess {
		if resp.Rcode == dns.RcodeNameError {
			return nil, 0, dns.RcodeNameError, nil
		}
		return nil, 0, dns.RcodeServerFailure, nil
	}
	var out []dns.RR
	ttl := time.Duration(-1)
	hadAddr := false
	for _, rr := range resp.Answer {
		h := rr.Header()
		if h.Class != dns.ClassINET || !servedTypes[h.Rrtype] {
			continue
		}
		if a, ok := rrAddr(rr); ok {
			hadAddr = true
			if a.Is4In6() || s.cfg.Blocked(a) {
				continue
			}
			if s.cfg.Policy == Allowlist {
				if h.Rrtype != qtype {
					continue
				}
				rr = dns.Copy(rr)
				rr.Header().Name = q.Question[0].Name
			}
		} else if s.cfg.Policy == Allowlist {
			continue // CNAMEs flattened
		}
		if t := time.Duration(h.Ttl) * time.Second; ttl < 0 || t < ttl {
			ttl = t
		}
		out = append(out, rr)
	}
	if hadAddr && !hasAddr(out) {
		return nil, 0, dns.RcodeRefused, nil
	}
	if ttl < 0 {
		ttl = 30 * time.Second // no data: a short negative cache
	}
	return out, ttl, dns.RcodeSuccess, nil
}

func (s *Server) exchange(ctx context.Context, q *dns.Msg, addr string) (*dns.Msg, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	resp, err := s.exchangeOver(ctx, "udp", q, addr)
	if err == nil && resp.Truncated {
		resp, err = s.exchangeOver(ctx, "tcp", q, addr)
	}
	if err != nil {
		return nil, fmt.Errorf("upstream %s: %w", addr, err)
	}
	if resp.Id != q.Id || len(resp.Question) != 1 || !strings.EqualFold(resp.Question[0].Name, q.Question[0].Name) {
		return nil, fmt.Errorf("upstream %s: reply does not match the query", addr)
	}
	return resp, nil
}

func (s *Server) exchangeOver(ctx context.Context, network string, q *dns.Msg, addr string) (*dns.Msg, error) {
	c, err := s.cfg.Dial(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	if d, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(d)
	}
	client := &dns.Client{Net: network, UDPSize: dns.DefaultMsgSize}
	resp, _, err := client.ExchangeWithConnContext(ctx, q, &dns.Conn{Conn: c, UDPSize: dns.DefaultMsgSize})
	return resp, err
}

func rrAddr(rr dns.RR) (netip.Addr, bool) {
	switch r := rr.(type) {
	case *dns.A:
		a, ok := netip.AddrFromSlice(r.A.To4())
		return a, ok
	case *dns.AAAA:
		a, ok := netip.AddrFromSlice(r.AAAA.To16())
		return a, ok
	}
	return netip.Addr{}, false
}

func hasAddr(rrs []dns.RR) bool {
	for _, rr := range rrs {
		if _, ok := rrAddr(rr); ok {
			return true
		}
	}
	return false
}
