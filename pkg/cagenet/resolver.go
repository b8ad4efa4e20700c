package cagenet

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/miekg/dns"

	"github.com/shrooms-cage/shrooms/pkg/config"
	"github.com/shrooms-cage/shrooms/pkg/dnsseal"
	"github.com/shrooms-cage/shrooms/pkg/firewall"
)

// ResolverAddr is where a cage's resolver listens, on the cage's own
// loopback; the cage's resolv.conf names it and nothing else.
const ResolverAddr = "127.0.0.1:53"

// Resolver is the turn's resolver (turn.Resolver): StartResolver with the
// seal in opts' namespace and upstream connections made by dial (nil:
// shrooms' own namespace).
func Resolver(opts firewall.Options, dial func(ctx context.Context, network, addr string) (net.Conn, error)) func(ctx context.Context, cfg *config.Config, nsPath string) (func() dnsseal.Stats, error) {
	return func(ctx context.Context, cfg *config.Config, nsPath string) (func() dnsseal.Stats, error) {
		return StartResolver(ctx, cfg, opts, dial, nsPath)
	}
}

// StartResolver opens the cage's resolver (pkg/dnsseal) on ResolverAddr in
// the network namespace at nsPath, for cfg's policy, pinning allowlist
// answers into the seal in opts' namespace. It returns the function that
// stops it and reports what it did. An error means no resolver: the turn
// must not start (there is no fallback resolver).
func StartResolver(ctx context.Context, cfg *config.Config, opts firewall.Options, dial func(ctx context.Context, network, addr string) (net.Conn, error), nsPath string) (func() dnsseal.Stats, error) {
	n := cfg.Network
	dc := dnsseal.Config{
		Policy: n.Policy, Upstream: n.DNSUpstream, Dial: dial, Blocked: firewall.IsBlocked,
		Rate: n.DNSRate, Burst: n.DNSBurst,
	}
	if len(dc.Upstream) == 0 {
		cc, err := dns.ClientConfigFromFile("/etc/resolv.conf")
		if err != nil {
			return nil, fmt.Errorf("cage resolver: no network.dns_upstream and the host's resolv.conf is unreadable: %w", err)
		}
		for _, s := range cc.Servers {
			dc.Upstream = append(dc.Upstream, net.JoinHostPort(s, cc.Port))
		}
	}
	if n.Policy == dnsseal.Allowlist {
		dc.Rate = 0 // nothing but the listed names goes upstream anyway
		for _, a := range n.Allow {
			if _, err := netip.ParsePrefix(a); err == nil {
				continue
			}
			if _, err := netip.ParseAddr(a); err == nil {
				continue
			}
			dc.Names = append(dc.Names, a)
		}
		// Both walls: the host seal, then the in-cage wall in the cage's
		// own namespace; the answer goes out once both have the addresses.
		host, wall := Pinner(n, opts), firewall.Options{NetNS: nsPath}
		dc.Pin = func(ctx context.Context, addrs []netip.Addr, timeout time.Duration) error {
			if err := host(ctx, addrs, timeout); err != nil {
				return err
			}
			return firewall.PinWall(ctx, wall, addrs, timeout)
		}
		dc.PinTimeout = firewall.PinTimeout
	}
	srv, err := dnsseal.New(dc)
	if err != nil {
		return nil, fmt.Errorf("cage resolver: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	pc, ln, err := dnsseal.ListenInNetNS(nsPath, ResolverAddr)
	if err != nil {
		return nil, err
	}
	srv.Serve(pc, ln)
	return func() dnsseal.Stats { srv.Close(); return srv.Stats() }, nil
}

// Pinner pins resolver answers into the allowlist seal of every wall given:
// the host seal in opts' namespace, and any wall inside a cage's network
// namespace that enforces the same allowed set (firewall.PinnedSet4/6). An
// answer is sent only once every wall has its addresses.
func Pinner(n config.Network, walls ...firewall.Options) dnsseal.Pinner {
	return func(ctx context.Context, addrs []netip.Addr, timeout time.Duration) error {
		for _, w := range walls {
			if err := firewall.Pin(ctx, n, w, addrs, timeout); err != nil {
				return err
			}
		}
		return nil
	}
}
