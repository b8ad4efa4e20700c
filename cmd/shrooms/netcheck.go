package main

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/shrooms-cage/shrooms/pkg/config"
	"github.com/shrooms-cage/shrooms/pkg/firewall"
)

// ExitBlocked is net check's answer "the seal does not let it through".
const ExitBlocked = 1

func netCheckCommand() *cli.Command {
	return &cli.Command{
		Name:      "check",
		Usage:     "say whether the seal lets a destination through, and which rule decides, in both walls (no cage is started)",
		ArgsUsage: "DEST (ADDRESS, NAME, ADDRESS:PORT, NAME:PORT or [V6]:PORT)",
		Description: `Judges DEST against the rule set both walls are built from — the host
seal around the cage bridge and the in-cage wall inside each cage's network
namespace — with the host's routes and addresses as they are now and the
config's [network] (--policy overrides its policy). A name is resolved as
the cage would resolve it: under internet by the host's resolver (aardvark
forwards to it), under allowlist only if it is on the allowlist (the cage
has /etc/hosts entries for those names and no DNS), under none not at all.
Exit 0 when every address of DEST gets through both walls, 1 when one does
not; 121/122 when it cannot tell.`,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "policy", Usage: "judge under this policy (internet, allowlist, none) instead of network.policy"},
			&cli.StringFlag{Name: "proto", Value: "tcp", Usage: "tcp, udp or icmp"},
		},
		Action: func(c *cli.Context) error {
			if c.NArg() != 1 {
				return fail(ExitUsage, fmt.Errorf("net check takes one destination (see --help)"))
			}
			return withNet(c, func(ctx context.Context, cfg *config.Config) error {
				if p := c.String("policy"); p != "" {
					cfg.Network.Policy = p
				}
				ans, err := netCheck(ctx, cfg.Network, c.Args().First(), c.String("proto"), firewall.Options{})
				if err != nil {
					return err
				}
				if jsonMode(c) {
					if err := printJSON(c.App.Writer, ans); err != nil {
						return err
					}
				} else {
					printCheck(c, ans)
				}
				if !ans.Allowed {
					return fail(ExitBlocked, nil)
				}
				return nil
			})
		},
	}
}

// netAnswer is net check's answer.
type netAnswer struct {
	Policy string `json:"policy"`
	Dest   string `json:"dest"`
	Name   string `json:"name,omitempty"`
	// Resolution says how the cage would resolve Name (empty for an address).
	Resolution string             `json:"resolution,omitempty"`
	Allowed    bool               `json:"allowed"`
	Verdicts   []firewall.Verdict `json:"verdicts"`
	// Rules is the digest of the rule set both walls are built from.
	Rules string `json:"rules"`
}

// netCheck judges dest (with proto) under cfg, with the host routes of
// the namespace opts names.
func netCheck(ctx context.Context, cfg config.Network, dest, proto string, opts firewall.Options) (*netAnswer, error) {
	host, port, err := splitDest(dest, proto)
	if err != nil {
		return nil, fail(ExitUsage, err)
	}
	var resolved firewall.Resolved
	if cfg.Policy == "allowlist" {
		if resolved, err = firewall.Resolve(ctx, cfg, opts); err != nil {
			return nil, fail(ExitHostNotReady, err)
		}
	}
	rules, err := firewall.DescribeHost(cfg, resolved, opts)
	if err != nil {
		return nil, fail(ExitUsage, err)
	}
	ans := &netAnswer{Policy: cfg.Policy, Dest: dest, Rules: rules.Digest()}
	var addrs []netip.Addr
	if a, err := netip.ParseAddr(host); err == nil {
		addrs = []netip.Addr{a}
	} else {
		ans.Name = strings.TrimSuffix(strings.ToLower(host), ".")
		switch cfg.Policy {
		case "none":
			ans.Resolution = "policy none: the cage has no network and no resolver"
		case "allowlist":
			if as, ok := rules.Names[ans.Name]; ok {
				addrs = as
				ans.Resolution = "on the allowlist: the cage's /etc/hosts names " + joinAddrs(as)
			} else {
				ans.Resolution = "not on the allowlist: the cage cannot resolve it (no DNS under allowlist)"
			}
		default:
			as, err := net.DefaultResolver.LookupNetIP(ctx, "ip", ans.Name)
			if err != nil {
				return nil, fail(ExitHostNotReady, fmt.Errorf("resolve %s: %w", ans.Name, err))
			}
			addrs = as
			ans.Resolution = "resolved now by the host's resolver (the cage's resolver forwards there): " + joinAddrs(as)
		}
	}
	ans.Allowed = len(addrs) > 0
	for _, a := range addrs {
		v, err := firewall.Check(rules, firewall.Dest{Addr: a, Proto: proto, Port: port})
		if err != nil {
			return nil, fail(ExitUsage, err)
		}
		ans.Verdicts = append(ans.Verdicts, v)
		ans.Allowed = ans.Allowed && v.Allowed
	}
	return ans, nil
}

// splitDest splits DEST into host and port (443 when none is given; none
// for icmp).
func splitDest(dest, proto string) (string, uint16, error) {
	if !slices.Contains([]string{"tcp", "udp", "icmp"}, proto) {
		return "", 0, fmt.Errorf("--proto %q: use tcp, udp or icmp", proto)
	}
	if dest == "" {
		return "", 0, fmt.Errorf("empty destination")
	}
	host, port := dest, uint16(443)
	if _, err := netip.ParseAddr(dest); err != nil {
		if h, p, err := net.SplitHostPort(dest); err == nil {
			n, err := strconv.ParseUint(p, 10, 16)
			if err != nil || n == 0 {
				return "", 0, fmt.Errorf("%q: port %q is not 1-65535", dest, p)
			}
			host, port = h, uint16(n)
		}
	}
	if _, err := netip.ParseAddr(host); err != nil && !validName(host) {
		return "", 0, fmt.Errorf("%q is neither an address nor a host name", host)
	}
	if proto == "icmp" {
		port = 0
	}
	return host, port, nil
}

func validName(s string) bool {
	s = strings.TrimSuffix(s, ".")
	if s == "" || len(s) > 253 {
		return false
	}
	for _, l := range strings.Split(s, ".") {
		if l == "" || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
			return false
		}
		for _, r := range l {
			if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
				return false
			}
		}
	}
	return true
}

func joinAddrs(as []netip.Addr) string {
	s := make([]string, len(as))
	for i, a := range as {
		s[i] = a.String()
	}
	return strings.Join(s, ", ")
}

func printCheck(c *cli.Context, ans *netAnswer) {
	w := c.App.Writer
	word := map[bool]string{true: "ALLOWED", false: "BLOCKED"}
	textf(w, "%s under policy %s: %s\n", ans.Dest, ans.Policy, word[ans.Allowed])
	if ans.Resolution != "" {
		textf(w, "  %s: %s\n", ans.Name, ans.Resolution)
	}
	for _, v := range ans.Verdicts {
		textf(w, "  %s: %s\n", v.Dest, word[v.Allowed])
		for _, d := range v.Walls {
			label := map[string]string{"host": "host seal   ", "cage": "in-cage wall"}[d.Wall]
			textf(w, "    %s %s — %s\n", label, word[d.Allowed], d.Rule)
		}
	}
	textf(w, "  rule set %s\n", ans.Rules)
}
