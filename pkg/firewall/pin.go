package firewall

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	"github.com/google/nftables"

	"github.com/shrooms-cage/shrooms/pkg/config"
)

// PinnedSet4 and PinnedSet6 are the seal's sets of addresses the cage's
// resolver handed out under the allowlist policy (pkg/dnsseal): each element
// carries a timeout bounded by its DNS answer's TTL. Every wall that enforces
// the allowlist (the host seal here, and a wall inside a cage's network
// namespace) lets a cage reach exactly allow4/6 + names4/6 + these, and is
// filled through Pin.
const (
	PinnedSet4 = "pinned4"
	PinnedSet6 = "pinned6"
)

// Pin bounds: an element lives at least MinPin (a TTL of 0 or 1 would make
// the answer useless before the cage connects) and at most MaxPin.
const (
	MinPin = 30 * time.Second
	MaxPin = time.Hour
)

// PinTimeout is how long a pin made for an answer with this TTL lives:
// the TTL, clamped to [MinPin, MaxPin].
func PinTimeout(ttl time.Duration) time.Duration {
	return min(max(ttl, MinPin), MaxPin)
}

// Pin adds addrs to the allowlist seal's pinned sets in the namespace opts
// names, each for timeout (PinTimeout), in one netlink batch; an address
// already pinned gets the new timeout. It refuses a blocked address: an
// answer can never open the LAN, the host or metadata. It returns only once
// the kernel has the elements, so a caller that answers the cage after Pin
// returns never hands out an address the seal would drop.
func Pin(ctx context.Context, cfg config.Network, opts Options, addrs []netip.Addr, timeout time.Duration) error {
	if cfg.Policy != "allowlist" {
		return fmt.Errorf("pin: policy %q has no pinned set", cfg.Policy)
	}
	if !validIfName(cfg.Name) {
		return fmt.Errorf("network.name: %q is not a network name", cfg.Name)
	}
	return pinInto(ctx, opts, tableName(cfg.Name), addrs, timeout)
}

// PinWall is Pin into the in-cage wall (WallTable) of the network
// namespace opts names, under the allowlist policy.
func PinWall(ctx context.Context, opts Options, addrs []netip.Addr, timeout time.Duration) error {
	return pinInto(ctx, opts, WallTable, addrs, timeout)
}

func pinInto(ctx context.Context, opts Options, table string, addrs []netip.Addr, timeout time.Duration) error {
	if timeout <= 0 || timeout > MaxPin {
		return fmt.Errorf("pin: timeout %s out of range", timeout)
	}
	var e4, e6 []nftables.SetElement
	for _, a := range addrs {
		a = a.Unmap()
		if !a.IsValid() || isBlocked(a) {
			return fmt.Errorf("pin: %s is in a blocked range", a)
		}
		e := nftables.SetElement{Key: a.AsSlice(), Timeout: timeout}
		if a.Is4() {
			e4 = append(e4, e)
		} else {
			e6 = append(e6, e)
		}
	}
	if len(e4)+len(e6) == 0 {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	c, done, err := conn(opts)
	if err != nil {
		return err
	}
	defer done()
	t := &nftables.Table{Family: nftables.TableFamilyINet, Name: table}
	for _, x := range []struct {
		name  string
		key   nftables.SetDatatype
		elems []nftables.SetElement
	}{{PinnedSet4, nftables.TypeIPAddr, e4}, {PinnedSet6, nftables.TypeIP6Addr, e6}} {
		if len(x.elems) == 0 {
			continue
		}
		s := &nftables.Set{Table: t, Name: x.name, KeyType: x.key, HasTimeout: true}
		// Add (a no-op for an element already there), delete, add again:
		// in one batch, so an existing element gets the new timeout and is
		// never absent in between.
		for _, step := range []func(*nftables.Set, []nftables.SetElement) error{c.SetAddElements, c.SetDeleteElements, c.SetAddElements} {
			if err := step(s, x.elems); err != nil {
				return fmt.Errorf("pin %s: %w", x.name, err)
			}
		}
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("pin resolved addresses into the seal (is the allowlist seal applied? `shrooms net apply`): %w", err)
	}
	return nil
}

// Pinned lists the addresses pinned now in the namespace opts names, with
// the life each has left.
func Pinned(cfg config.Network, opts Options) (map[netip.Addr]time.Duration, error) {
	c, done, err := conn(opts)
	if err != nil {
		return nil, err
	}
	defer done()
	return pinned(c, cfg)
}

func pinned(c *nftables.Conn, cfg config.Network) (map[netip.Addr]time.Duration, error) {
	out := map[netip.Addr]time.Duration{}
	t := &nftables.Table{Family: nftables.TableFamilyINet, Name: tableName(cfg.Name)}
	for _, name := range []string{PinnedSet4, PinnedSet6} {
		s, err := c.GetSetByName(t, name)
		if err != nil {
			continue // no seal, or one from before pinned sets: nothing to carry
		}
		elems, err := c.GetSetElements(s)
		if err != nil {
			return nil, fmt.Errorf("set %s: %w", name, err)
		}
		for _, e := range elems {
			if a, ok := netip.AddrFromSlice(e.Key); ok && !isBlocked(a) {
				out[a.Unmap()] = e.Expires
			}
		}
	}
	return out, nil
}

// carryPins puts the pins in the kernel now into p's pinned sets, so that
// re-applying the seal (before every allowlist turn) does not cut the cages
// already running off the addresses their resolver gave them.
func carryPins(c *nftables.Conn, cfg config.Network, p *plan) error {
	have, err := pinned(c, cfg)
	if err != nil {
		return err
	}
	for ti := range p.tables {
		for si := range p.tables[ti].sets {
			s := &p.tables[ti].sets[si]
			if !s.pinned {
				continue
			}
			v6 := s.name == PinnedSet6
			for a, left := range have {
				if a.Is6() != v6 || left <= 0 {
					continue
				}
				s.elems = append(s.elems, nftables.SetElement{Key: a.AsSlice(), Timeout: min(left, MaxPin)})
			}
		}
	}
	return nil
}
