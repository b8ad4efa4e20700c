package dnsseal

import (
	"fmt"
	"os"
	"runtime"
	"sync"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/sys/unix"
	"net"
)

// cache keeps served answers for their TTL, so that a repeated name costs
// no upstream query (nor a token of the rate limit).
type cache struct {
	mu      sync.Mutex
	max     int
	entries map[cacheKey]cacheEntry
}

type cacheKey struct {
	name  string
	qtype uint16
}

type cacheEntry struct {
	rrs     []dns.RR
	expires time.Time
}

func newCache(max int) *cache { return &cache{max: max, entries: map[cacheKey]cacheEntry{}} }

// get returns the records for name and qtype with the TTL they have left.
func (c *cache) get(name string, qtype uint16) ([]dns.RR, time.Duration, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.entries[cacheKey{name, qtype}]
	if !ok {
		return nil, 0, false
	}
	left := time.Until(e.expires)
	if left < time.Second {
		delete(c.entries, cacheKey{name, qtype})
		return nil, 0, false
	}
	return e.rrs, left.Truncate(time.Second), true
}

func (c *cache) put(name string, qtype uint16, rrs []dns.RR, ttl time.Duration) {
	if ttl < time.Second {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.entries) >= c.max {
		now := time.Now()
		for k, e := range c.entries {
			if now.After(e.expires) {
				delete(c.entries, k)
			}
		}
		if len(c.entries) >= c.max {
			return // full of live answers: serve uncached rather than grow
		}
	}
	c.entries[cacheKey{name, qtype}] = cacheEntry{rrs: rrs, expires: time.Now().Add(ttl)}
}

// bucket is a token bucket: rate tokens a second, at most burst saved.
type bucket struct {
	mu     sync.Mutex
	rate   float64
	burst  float64
	tokens float64
	last   time.Time
}

func newBucket(rate float64, burst int) *bucket {
	return &bucket{rate: rate, burst: float64(burst), tokens: float64(burst), last: time.Now()}
}

func (b *bucket) take() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := time.Now()
	b.tokens = min(b.burst, b.tokens+now.Sub(b.last).Seconds()*b.rate)
	b.last = now
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// ListenInNetNS opens the resolver's UDP and TCP sockets on addr inside the
// network namespace at nsPath (a cage's /proc/PID/ns/net): the sockets stay
// in the cage's namespace, served from the host, reachable only from the
// cage. A thread that cannot switch back stays locked and is discarded.
func ListenInNetNS(nsPath, addr string) (net.PacketConn, net.Listener, error) {
	target, err := os.Open(nsPath)
	if err != nil {
		return nil, nil, fmt.Errorf("resolver: open network namespace: %w", err)
	}
	defer target.Close()
	type result struct {
		pc  net.PacketConn
		ln  net.Listener
		err error
	}
	c := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		self, err := os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()))
		if err != nil {
			runtime.UnlockOSThread()
			c <- result{err: fmt.Errorf("resolver: own network namespace: %w", err)}
			return
		}
		defer self.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			c <- result{err: fmt.Errorf("resolver: enter the cage's network namespace: %w", err)}
			return
		}
		var r result
		r.pc, r.err = net.ListenPacket("udp", addr)
		if r.err == nil {
			if r.ln, r.err = net.Listen("tcp", addr); r.err != nil {
				r.pc.Close()
				r.pc = nil
			}
		}
		if err := unix.Setns(int(self.Fd()), unix.CLONE_NEWNET); err != nil {
			if r.pc != nil {
				r.pc.Close()
				r.ln.Close()
			}
			c <- result{err: fmt.Errorf("resolver: leave the cage's network namespace: %w", err)}
			return
		}
		runtime.UnlockOSThread()
		if r.err != nil {
			r.err = fmt.Errorf("resolver: listen in the cage: %w", r.err)
		}
		c <- r
	}()
	r := <-c
	return r.pc, r.ln, r.err
}
