// Package firewall is the seal: the nftables policy around the cage network,
// installed as shrooms' own drop-only tables (one inet, one bridge) so that no
// accept rule of podman, netavark or firewalld can undo it, and verified
// against what the config asks for with a digest.
//
// Apply installs the seal in one netlink batch (atomic) and is idempotent;
// Verify compares what is installed with what the config expects; Flush
// removes it. Nothing here shells out to nft.
package firewall

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"

	"github.com/google/nftables"

	"github.com/shrooms-cage/shrooms/pkg/config"
)

// Options says where the seal lives.
type Options struct {
	// NetNS is the path of the network namespace to act in
	// (e.g. /run/netns/NAME); "" is the caller's own namespace.
	NetNS string
	// Resolver resolves the allowlist's host names; nil is net.DefaultResolver.
	Resolver *net.Resolver
}

// Status is the result of Verify.
type Status struct {
	Policy string `json:"policy"`
	// Tables are the tables the seal consists of ("inet shrooms_NAME", ...).
	Tables []string `json:"tables"`
	// Expected and Installed are digests (sha256 of a canonical rendering)
	// of the ruleset the config asks for and of the one in the kernel;
	// Installed is "" when the tables are missing.
	Expected  string `json:"expected"`
	Installed string `json:"installed"`
	// OK is true when the seal is in place exactly as configured.
	OK bool `json:"ok"`
	// Reason is one line saying why OK is false (or, for policy none, that
	// there is nothing to install).
	Reason string `json:"reason,omitempty"`
	// Stale is true when the seal is in place as applied but the host
	// routes to networks it does not block yet (a VPN or a LAN that came
	// up since): applying again only blocks more (see Refresh).
	Stale bool `json:"stale,omitempty"`
}

// Apply installs the seal for cfg: both tables are (re)created in one
// netlink batch, so the kernel holds either the old seal or the new one,
// never a half. Host names of an allowlist are resolved now; call Apply
// again (before each turn) to refresh them. After the batch the seal is
// verified; an error means it is not known to be in place.
// Under policy "none" Apply removes any seal tables (cages have no network).
func Apply(ctx context.Context, cfg config.Network, opts Options) error {
	_, err := ApplyResolved(ctx, cfg, opts)
	return err
}

// ApplyResolved is Apply that also returns the allowlist's host names as it
// resolved them into the seal, so that the cage's /etc/hosts can name
// exactly the addresses the seal lets through.
func ApplyResolved(ctx context.Context, cfg config.Network, opts Options) (Resolved, error) {
	var resolved Resolved
	fail := func(err error) (Resolved, error) { return Resolved{}, err }
	if err := checkCfg(cfg); err != nil {
		return fail(fmt.Errorf("seal not applied: %w", err))
	}
	if cfg.Policy == "allowlist" {
		r, err := Resolve(ctx, cfg, opts)
		if err != nil {
			return fail(fmt.Errorf("seal not applied: %w", err))
		}
		resolved = r
	}
	rules, err := DescribeHost(cfg, resolved, opts)
	if err != nil {
		return fail(fmt.Errorf("seal not applied: %w", err))
	}
	p, err := build(rules)
	if err != nil {
		return fail(fmt.Errorf("seal not applied: %w", err))
	}
	c, done, err := conn(opts)
	if err != nil {
		return fail(err)
	}
	defer done()
	if err := checkBridge(cfg, opts); err != nil {
		return fail(fmt.Errorf("seal not applied: %w", err))
	}
	if err := checkBrNetfilter(opts); err != nil {
		return fail(fmt.Errorf("seal not applied: %w", err))
	}
	if err := carryPins(c, cfg, p); err != nil {
		return fail(fmt.Errorf("seal not applied: %w", err))
	}
	if err := ctx.Err(); err != nil {
		return fail(err)
	}
	for _, fam := range []nftables.TableFamily{nftables.TableFamilyINet, nftables.TableFamilyBridge} {
		// Adding an existing table is a no-op, deleting a missing one an
		// error: add-then-delete empties it either way, in the same batch.
		t := &nftables.Table{Family: fam, Name: tableName(cfg.Name)}
		c.AddTable(t)
		c.DelTable(t)
	}
	for _, ts := range p.tables {
		if err := queue(c, ts); err != nil {
			return fail(fmt.Errorf("seal not applied: %w", err))
		}
	}
	if err := c.Flush(); err != nil {
		return fail(fmt.Errorf("seal not applied (netlink batch refused, nothing changed): %w", err))
	}
	st, err := verify(cfg, p, opts)
	if err != nil {
		return fail(err)
	}
	if !st.OK {
		return fail(fmt.Errorf("seal applied but does not verify: %s", st.Reason))
	}
	return resolved, nil
}

// Flush removes the seal tables of cfg's network, if any, in one batch.
func Flush(ctx context.Context, cfg config.Network, opts Options) error {
	if !validIfName(cfg.Name) {
		return fmt.Errorf("network.name: %q is not a network name", cfg.Name)
	}
	c, done, err := conn(opts)
	if err != nil {
		return err
	}
	defer done()
	if err := ctx.Err(); err != nil {
		return err
	}
	for _, fam := range []nftables.TableFamily{nftables.TableFamilyINet, nftables.TableFamilyBridge} {
		t := &nftables.Table{Family: fam, Name: tableName(cfg.Name)}
		c.AddTable(t)
		c.DelTable(t)
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("flush seal: %w", err)
	}
	return nil
}

// Verify reports whether the seal in the kernel is exactly the one cfg asks
// for. It returns an error only when it cannot look; a missing or altered
// seal is a Status with OK false and a Reason.
func Verify(ctx context.Context, cfg config.Network, opts Options) (Status, error) {
	if err := checkCfg(cfg); err != nil {
		return Status{Policy: cfg.Policy}, err
	}
	if err := ctx.Err(); err != nil {
		return Status{Policy: cfg.Policy}, err
	}
	rules, err := DescribeHost(cfg, Resolved{}, opts)
	if err != nil {
		return Status{Policy: cfg.Policy}, err
	}
	p, err := build(rules)
	if err != nil {
		return Status{Policy: cfg.Policy}, err
	}
	return verify(cfg, p, opts)
}

// Refresh is Verify that applies the seal again when the only thing wrong
// is that the host routes to networks it does not block yet: the new seal
// only blocks more. A seal missing or altered in any other way is reported,
// not repaired (that takes `shrooms net apply`).
func Refresh(ctx context.Context, cfg config.Network, opts Options) (Status, error) {
	st, err := Verify(ctx, cfg, opts)
	if err != nil || st.OK || !st.Stale {
		return st, err
	}
	if err := Apply(ctx, cfg, opts); err != nil {
		return st, err
	}
	return Verify(ctx, cfg, opts)
}

func verify(cfg config.Network, p *plan, opts Options) (Status, error) {
	st := Status{Policy: cfg.Policy, Tables: []string{}}
	c, done, err := conn(opts)
	if err != nil {
		return st, err
	}
	defer done()
	if cfg.Policy == "none" {
		st.Expected = digest("")
		st.OK = true
		st.Reason = "policy none: cages have no network, there is no seal to install"
		return st, nil
	}
	want := render(p)
	st.Expected = digest(want)
	var got strings.Builder
	for _, ts := range p.tables {
		st.Tables = append(st.Tables, familyName(ts.family)+" "+ts.name)
		txt, found, err := readTable(c, ts)
		if err != nil {
			return st, fmt.Errorf("read table %s %s: %w", familyName(ts.family), ts.name, err)
		}
		if !found {
			st.Reason = fmt.Sprintf("table %s %s is missing: run `shrooms net apply`", familyName(ts.family), ts.name)
			return st, nil
		}
		got.WriteString(txt)
	}
	st.Installed = digest(got.String())
	if err := checkResolved(c, p); err != nil {
		st.Reason = err.Error()
		return st, nil
	}
	if err := checkRouted(c, p); err != nil {
		st.Reason = err.Error()
		st.Stale = got.String() == want
		return st, nil
	}
	if got.String() != want {
		st.Reason = "seal differs from config (tampered or stale): " + firstDiff(want, got.String()) + "; run `shrooms net apply`"
		return st, nil
	}
	if err := checkBridge(cfg, opts); err != nil {
		st.Reason = err.Error()
		return st, nil
	}
	if err := checkBrNetfilter(opts); err != nil {
		st.Reason = err.Error()
		return st, nil
	}
	st.OK = true
	return st, nil
}

func digest(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:])
}

func firstDiff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	for i := 0; i < len(w) || i < len(g); i++ {
		var a, b string
		if i < len(w) {
			a = w[i]
		}
		if i < len(g) {
			b = g[i]
		}
		if a != b {
			if a == "" {
				return fmt.Sprintf("unexpected %q", strings.TrimSpace(b))
			}
			if b == "" {
				return fmt.Sprintf("missing %q", strings.TrimSpace(a))
			}
			return fmt.Sprintf("expected %q, found %q", strings.TrimSpace(a), strings.TrimSpace(b))
		}
	}
	return "no difference"
}

// Conn opens an nftables connection in the network namespace at netns
// ("" is the caller's); the caller calls the returned func when done.
func Conn(netns string) (*nftables.Conn, func(), error) { return conn(Options{NetNS: netns}) }

// conn opens a netlink connection in opts.NetNS (or the current namespace).
func conn(opts Options) (*nftables.Conn, func(), error) {
	if opts.NetNS == "" {
		c, err := nftables.New()
		if err != nil {
			return nil, nil, fmt.Errorf("nftables: %w", err)
		}
		return c, func() {}, nil
	}
	f, err := os.Open(opts.NetNS)
	if err != nil {
		return nil, nil, fmt.Errorf("open network namespace: %w", err)
	}
	c, err := nftables.New(nftables.WithNetNSFd(int(f.Fd())), nftables.AsLasting())
	if err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("nftables in %s: %w", opts.NetNS, err)
	}
	return c, func() { c.CloseLasting(); f.Close() }, nil
}

// checkBridge refuses a bridge interface that exists but is not the cage
// network's: if cfg.Bridge carries IPv4 addresses, the gateway must be one
// of them. A bridge that does not exist yet is fine (the seal goes in
// before podman creates it, at boot).
func checkBridge(cfg config.Network, opts Options) error {
	g4, _, err := gateways(cfg)
	if err != nil {
		return err
	}
	addrs, exists, err := ifAddrs(cfg.Bridge, opts.NetNS)
	if err != nil {
		return fmt.Errorf("inspect interface %s: %w", cfg.Bridge, err)
	}
	if !exists {
		return nil
	}
	var has4 []string
	for _, a := range addrs {
		if a.Addr().Is4() {
			if a.Addr() == g4 {
				return nil
			}
			has4 = append(has4, a.String())
		}
	}
	if len(has4) == 0 {
		return nil // bridge up but not addressed yet: netavark adds it
	}
	return fmt.Errorf("network.bridge: interface %s has %s, not the cage network's gateway %s: it is not the bridge of network %q", cfg.Bridge, strings.Join(has4, ", "), g4, cfg.Name)
}

// ifAddrs lists the addresses of interface name inside netns via netlink.
func ifAddrs(name, netns string) ([]netip.Prefix, bool, error) {
	var out []netip.Prefix
	var exists bool
	err := inNetNS(netns, func() error {
		ifc, err := net.InterfaceByName(name)
		if err != nil {
			var nerr *net.OpError
			if errors.As(err, &nerr) || strings.Contains(err.Error(), "no such network interface") {
				return nil
			}
			return err
		}
		exists = true
		as, err := ifc.Addrs()
		if err != nil {
			return err
		}
		for _, a := range as {
			if ipn, ok := a.(*net.IPNet); ok {
				addr, _ := netip.AddrFromSlice(ipn.IP)
				ones, _ := ipn.Mask.Size()
				out = append(out, netip.PrefixFrom(addr.Unmap(), ones))
			}
		}
		return nil
	})
	return out, exists, err
}

func familyName(f nftables.TableFamily) string {
	switch f {
	case nftables.TableFamilyINet:
		return "inet"
	case nftables.TableFamilyBridge:
		return "bridge"
	case nftables.TableFamilyIPv4:
		return "ip"
	case nftables.TableFamilyIPv6:
		return "ip6"
	}
	return fmt.Sprintf("family%d", f)
}

// checkBrNetfilter requires bridged IP traffic to pass the inet hooks: the
// seal's cage-to-cage rule for IPv6 link-local (which no subnet match
// catches) depends on it.
func checkBrNetfilter(opts Options) error {
	return inNetNS(opts.NetNS, func() error {
		for _, k := range []string{"bridge-nf-call-iptables", "bridge-nf-call-ip6tables"} {
			b, err := os.ReadFile("/proc/sys/net/bridge/" + k)
			if err != nil {
				return fmt.Errorf("br_netfilter is not loaded (%v): run `modprobe br_netfilter` and set net.bridge.%s=1", err, k)
			}
			if strings.TrimSpace(string(b)) != "1" {
				return fmt.Errorf("net.bridge.%s is %s, the seal needs 1 (bridged cage traffic would bypass it)", k, strings.TrimSpace(string(b)))
			}
		}
		return nil
	})
}
