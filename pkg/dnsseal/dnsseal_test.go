package dnsseal

import (
	"context"
	"encoding/base32"
	"errors"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
	"gotest.tools/v3/assert"
)

// upstream is an authoritative test server on loopback that logs every
// name it is asked and answers from a table the test changes.
type upstream struct {
	mu      sync.Mutex
	answers map[string][]string // name -> addresses
	asked   []string
	addr    string
}

func startUpstream(t testing.TB) *upstream {
	u := &upstream{answers: map[string][]string{}}
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	assert.NilError(t, err)
	u.addr = pc.LocalAddr().String()
	srv := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		q := r.Question[0]
		u.mu.Lock()
		u.asked = append(u.asked, q.Name)
		addrs := u.answers[strings.ToLower(q.Name)]
		u.mu.Unlock()
		m := new(dns.Msg)
		m.SetReply(r)
		m.Authoritative = true
		if strings.HasPrefix(q.Name, "alias.") {
			m.Answer = append(m.Answer, &dns.CNAME{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeCNAME, Class: dns.ClassINET, Ttl: 300}, Target: "target.example."})
		}
		for _, a := range addrs {
			ip := netip.MustParseAddr(a)
			owner := q.Name
			if strings.HasPrefix(q.Name, "alias.") {
				owner = "target.example."
			}
			hdr := dns.RR_Header{Name: owner, Class: dns.ClassINET, Ttl: 60}
			switch {
			case ip.Is4() && q.Qtype == dns.TypeA:
				hdr.Rrtype = dns.TypeA
				m.Answer = append(m.Answer, &dns.A{Hdr: hdr, A: ip.AsSlice()})
			case ip.Is6() && q.Qtype == dns.TypeAAAA:
				hdr.Rrtype = dns.TypeAAAA
				m.Answer = append(m.Answer, &dns.AAAA{Hdr: hdr, AAAA: ip.AsSlice()})
			}
		}
		_ = w.WriteMsg(m)
	})}
	go func() { _ = srv.ActivateAndServe() }()
	t.Cleanup(func() { _ = srv.Shutdown() })
	return u
}

func (u *upstream) set(name string, addrs ...string) {
	u.mu.Lock()
	u.answers[name] = addrs
	u.mu.Unlock()
}

func (u *upstream) queries() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.asked...)
}

// blocked is a stand-in for firewall.IsBlocked: private, loopback, link-local.
func blocked(a netip.Addr) bool {
	return a.IsPrivate() || a.IsLoopback() || a.IsLinkLocalUnicast() || a.IsUnspecified()
}

type pins struct {
	mu   sync.Mutex
	got  map[netip.Addr]time.Duration
	fail error
}

func (p *pins) pin(_ context.Context, addrs []netip.Addr, timeout time.Duration) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.fail != nil {
		return p.fail
	}
	for _, a := range addrs {
		p.got[a] = timeout
	}
	return nil
}

func (p *pins) has(a string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, ok := p.got[netip.MustParseAddr(a)]
	return ok
}

func pinTimeout(ttl time.Duration) time.Duration { return max(ttl, 30*time.Second) }

func ask(t *testing.T, s *Server, name string, qtype uint16) *dns.Msg {
	t.Helper()
	q := new(dns.Msg)
	q.SetQuestion(dns.Fqdn(name), qtype)
	return s.Answer(context.Background(), q)
}

func addrsOf(m *dns.Msg) []string {
	var out []string
	for _, rr := range m.Answer {
		if a, ok := rrAddr(rr); ok {
			out = append(out, a.String())
		}
	}
	return out
}

func TestAllowlistAnswersOnlyListedNamesPinnedFirst(t *testing.T) {
	u := startUpstream(t)
	u.set("api.example.", "203.0.113.5", "203.0.113.6")
	u.set("other.example.", "203.0.113.7")
	u.set("rebind.example.", "192.168.1.1")
	p := &pins{got: map[netip.Addr]time.Duration{}}
	s, err := New(Config{Policy: Allowlist, Names: []string{"API.example", "rebind.example"}, Upstream: []string{u.addr}, Pin: p.pin, PinTimeout: pinTimeout, Blocked: blocked})
	assert.NilError(t, err)

	m := ask(t, s, "api.EXAMPLE.", dns.TypeA)
	assert.Equal(t, m.Rcode, dns.RcodeSuccess)
	assert.DeepEqual(t, addrsOf(m), []string{"203.0.113.5", "203.0.113.6"})
	assert.Assert(t, p.has("203.0.113.5") && p.has("203.0.113.6"), "answered addresses are pinned")
	assert.Equal(t, p.got[netip.MustParseAddr("203.0.113.5")], 60*time.Second, "pin timeout from the TTL")
	assert.Assert(t, m.Answer[0].Header().Ttl <= 60)

	// A name not on the list: refused, and nothing goes upstream.
	before := len(u.queries())
	m = ask(t, s, "other.example", dns.TypeA)
	assert.Equal(t, m.Rcode, dns.RcodeRefused)
	assert.Equal(t, len(u.queries()), before, "a refused name is never asked upstream")
	assert.Assert(t, !p.has("203.0.113.7"))

	// A listed name answering a LAN address: refused, nothing pinned.
	m = ask(t, s, "rebind.example", dns.TypeA)
	assert.Equal(t, m.Rcode, dns.RcodeRefused)
	assert.Assert(t, !p.has("192.168.1.1"))

	// Other types of a listed name: no data, no upstream query.
	before = len(u.queries())
	m = ask(t, s, "api.example", dns.TypeTXT)
	assert.Equal(t, m.Rcode, dns.RcodeSuccess)
	assert.Equal(t, len(m.Answer), 0)
	assert.Equal(t, len(u.queries()), before)
}

func TestAllowlistFailedPinIsNoAnswer(t *testing.T) {
	u := startUpstream(t)
	u.set("api.example.", "203.0.113.5")
	p := &pins{got: map[netip.Addr]time.Duration{}, fail: errors.New("no seal")}
	s, err := New(Config{Policy: Allowlist, Names: []string{"api.example"}, Upstream: []string{u.addr}, Pin: p.pin, PinTimeout: pinTimeout, Blocked: blocked})
	assert.NilError(t, err)
	m := ask(t, s, "api.example", dns.TypeA)
	assert.Equal(t, m.Rcode, dns.RcodeServerFailure)
	assert.Equal(t, len(m.Answer), 0, "an address that could not be pinned is never handed out")

	_, err = New(Config{Policy: Allowlist, Names: []string{"api.example"}, Upstream: []string{u.addr}, Blocked: blocked})
	assert.ErrorContains(t, err, "pinner")
}

func TestAllowlistFollowsRotationAndFlattensCNAMEs(t *testing.T) {
	u := startUpstream(t)
	p := &pins{got: map[netip.Addr]time.Duration{}}
	s, err := New(Config{Policy: Allowlist, Names: []string{"alias.example"}, Upstream: []string{u.addr}, Pin: p.pin, PinTimeout: pinTimeout, Blocked: blocked})
	assert.NilError(t, err)
	u.set("alias.example.", "203.0.113.5")
	m := ask(t, s, "alias.example", dns.TypeA)
	assert.DeepEqual(t, addrsOf(m), []string{"203.0.113.5"})
	for _, rr := range m.Answer {
		assert.Equal(t, rr.Header().Name, "alias.example.", "the chain is flattened to the asked name")
	}
	s.cache = newCache(16) // as if the TTL ran out
	u.set("alias.example.", "2001:db8::9")
	m = ask(t, s, "alias.example", dns.TypeAAAA)
	assert.DeepEqual(t, addrsOf(m), []string{"2001:db8::9"})
	assert.Assert(t, p.has("2001:db8::9"))
}

// TestAllowlistNamesCarryNothingOut: 10 KiB encoded in query names under
// the allowlist reach the upstream not at all.
func TestAllowlistNamesCarryNothingOut(t *testing.T) {
	u := startUpstream(t)
	p := &pins{got: map[netip.Addr]time.Duration{}}
	s, err := New(Config{Policy: Allowlist, Names: []string{"api.example"}, Upstream: []string{u.addr}, Pin: p.pin, PinTimeout: pinTimeout, Blocked: blocked})
	assert.NilError(t, err)
	for _, name := range exfilNames(10<<10, "canary.example") {
		m := ask(t, s, name, dns.TypeA)
		assert.Equal(t, m.Rcode, dns.RcodeRefused)
	}
	assert.Equal(t, len(u.queries()), 0)
}

// exfilNames encodes n bytes into query names under zone (base32 labels).
func exfilNames(n int, zone string) []string {
	data := make([]byte, n)
	for i := range data {
		data[i] = byte(i * 7)
	}
	enc := strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(data))
	var out []string
	for i := 0; len(enc) > 0; i++ {
		chunk := enc[:min(len(enc), 180)]
		enc = enc[len(chunk):]
		var labels []string
		for len(chunk) > 0 {
			l := chunk[:min(len(chunk), 60)]
			chunk = chunk[len(l):]
			labels = append(labels, l)
		}
		out = append(out, strings.Join(labels, ".")+"."+zone)
	}
	return out
}

func TestInternetPublicNamesOnly(t *testing.T) {
	u := startUpstream(t)
	u.set("www.example.", "203.0.113.5", "2001:db8::5")
	u.set("rebind.example.", "10.1.2.3")
	u.set("mixed.example.", "10.1.2.3", "203.0.113.8")
	s, err := New(Config{Policy: Internet, Upstream: []string{u.addr}, Blocked: blocked})
	assert.NilError(t, err)
	assert.DeepEqual(t, addrsOf(ask(t, s, "www.example", dns.TypeA)), []string{"203.0.113.5"})
	assert.DeepEqual(t, addrsOf(ask(t, s, "www.example", dns.TypeAAAA)), []string{"2001:db8::5"})
	assert.Equal(t, ask(t, s, "rebind.example", dns.TypeA).Rcode, dns.RcodeRefused, "DNS rebinding to the LAN")
	assert.DeepEqual(t, addrsOf(ask(t, s, "mixed.example", dns.TypeA)), []string{"203.0.113.8"})
	before := len(u.queries())
	for _, name := range []string{"nas", "printer.local", "router.lan", "x.home.arpa", "4.3.2.10.in-addr.arpa", "db.internal", "localhost"} {
		assert.Equal(t, ask(t, s, name, dns.TypeA).Rcode, dns.RcodeRefused, name)
	}
	assert.Equal(t, ask(t, s, "www.example", dns.TypeANY).Rcode, dns.RcodeRefused)
	assert.Equal(t, len(u.queries()), before, "local names never go upstream")
}

func TestInternetRateLimit(t *testing.T) {
	u := startUpstream(t)
	s, err := New(Config{Policy: Internet, Upstream: []string{u.addr}, Blocked: blocked, Rate: 1, Burst: 5})
	assert.NilError(t, err)
	names := exfilNames(2000, "canary.example")
	refused := 0
	for _, n := range names {
		if ask(t, s, n, dns.TypeA).Rcode == dns.RcodeRefused {
			refused++
		}
	}
	assert.Equal(t, len(u.queries()), 5, "only the burst went upstream")
	assert.Equal(t, refused, len(names)-5)
	assert.Equal(t, s.Stats().Limited, int64(len(names)-5))
}

func TestServesOverUDPAndTCP(t *testing.T) {
	u := startUpstream(t)
	u.set("www.example.", "203.0.113.5")
	s, err := New(Config{Policy: Internet, Upstream: []string{u.addr}, Blocked: blocked})
	assert.NilError(t, err)
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	assert.NilError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	assert.NilError(t, err)
	s.Serve(pc, ln)
	defer s.Close()
	for network, addr := range map[string]string{"udp": pc.LocalAddr().String(), "tcp": ln.Addr().String()} {
		q := new(dns.Msg)
		q.SetQuestion("www.example.", dns.TypeA)
		var m *dns.Msg
		for i := 0; i < 20; i++ { // the server goroutine may not be up yet
			if m, _, err = (&dns.Client{Net: network}).Exchange(q, addr); err == nil {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		assert.NilError(t, err, network)
		assert.DeepEqual(t, addrsOf(m), []string{"203.0.113.5"})
	}
}

// BenchmarkAnswer is the resolver's answer latency for an allowlisted name:
// uncached (an upstream query on loopback plus the pin) and cached.
func BenchmarkAnswer(b *testing.B) {
	u := startUpstream(b)
	u.set("api.example.", "203.0.113.5")
	p := &pins{got: map[netip.Addr]time.Duration{}}
	s, err := New(Config{Policy: Allowlist, Names: []string{"api.example"}, Upstream: []string{u.addr}, Pin: p.pin, PinTimeout: pinTimeout, Blocked: blocked})
	if err != nil {
		b.Fatal(err)
	}
	q := new(dns.Msg)
	q.SetQuestion("api.example.", dns.TypeA)
	b.Run("uncached", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			s.cache = newCache(16)
			if m := s.Answer(context.Background(), q); m.Rcode != dns.RcodeSuccess {
				b.Fatal(m.Rcode)
			}
		}
	})
	b.Run("cached", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			if m := s.Answer(context.Background(), q); m.Rcode != dns.RcodeSuccess {
				b.Fatal(m.Rcode)
			}
		}
	})
}

// TestCachedAnswersRepinSparingly: a cache hit does not pin again within
// RepinAfter (a pin is a netlink commit), but the first answer always does.
func TestCachedAnswersRepinSparingly(t *testing.T) {
	u := startUpstream(t)
	u.set("api.example.", "203.0.113.5")
	calls := 0
	pin := func(context.Context, []netip.Addr, time.Duration) error { calls++; return nil }
	s, err := New(Config{Policy: Allowlist, Names: []string{"api.example"}, Upstream: []string{u.addr}, Pin: pin, PinTimeout: pinTimeout, Blocked: blocked})
	assert.NilError(t, err)
	for i := 0; i < 5; i++ {
		assert.Equal(t, ask(t, s, "api.example", dns.TypeA).Rcode, dns.RcodeSuccess)
	}
	assert.Equal(t, calls, 1)
	assert.Equal(t, len(u.queries()), 1, "answered from the cache")
	s.pinned[cacheKey{"api.example.", dns.TypeA}] = [2]time.Time{time.Now().Add(-RepinAfter), time.Now().Add(time.Minute)}
	ask(t, s, "api.example", dns.TypeA)
	assert.Equal(t, calls, 2, "an older pin is renewed")
}
