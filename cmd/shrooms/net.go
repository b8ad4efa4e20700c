package main

import (
	"context"
	"fmt"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/shrooms-cage/shrooms/pkg/cagenet"
	"github.com/shrooms-cage/shrooms/pkg/config"
	"github.com/shrooms-cage/shrooms/pkg/engine"
	"github.com/shrooms-cage/shrooms/pkg/firewall"
	"github.com/shrooms-cage/shrooms/pkg/sealed"
)

func netCommand() *cli.Command {
	return &cli.Command{
		Name:  "net",
		Usage: "the cage network and its nftables seal: apply, status, check, flush",
		Subcommands: []*cli.Command{
			netCheckCommand(),
			{
				Name:  "apply",
				Usage: "install the seal (atomic, idempotent) and create the cage network if missing",
				Description: `Run as root at boot before podman starts cages (the NixOS module's
shrooms-seal unit does, with --seal-only, before podman is up), and after
changing [network]. It makes the cage network too (network.driver
"shrooms": the bridge, its addresses and the NAT table; "podman": the
podman network). The seal matches the bridge by name, so it can be in place
before the network exists; a networked turn creates a missing network
itself once it has verified the seal. Under the allowlist policy each turn
re-applies the seal to refresh resolved host names. The seal also blocks
every prefix the host routes other than by its default route (read now) and
network.lan; a turn adds a route that appeared since (a VPN, a LAN) to the
seal before it starts, and a running turn within a quarter second.`,
				Flags: []cli.Flag{&cli.BoolFlag{Name: "seal-only", Usage: "install the seal only; do not contact podman"}},
				Action: func(c *cli.Context) error {
					return withNet(c, func(ctx context.Context, cfg *config.Config) error {
						// The seal first: the bridge and its NAT never exist unguarded.
						if err := firewall.Apply(ctx, cfg.Network, firewall.Options{}); err != nil {
							return fail(ExitHostNotReady, err)
						}
						if cfg.Network.Networked() && !c.Bool("seal-only") {
							var client engine.Networks // the shrooms driver needs no podman
							if cfg.Network.Driver == config.DriverPodman {
								pc, err := connect(ctx, cfg)
								if err != nil {
									return err
								}
								client = pc
							}
							if err := cagenet.Ensure(ctx, cfg, client, firewall.Options{}); err != nil {
								return fail(codeFor(err), err)
							}
						}
						return printStatus(c, ctx, cfg)
					})
				},
			},
			{
				Name:  "status",
				Usage: "verify the installed seal, and the in-cage wall of every running or prepared cage, against the config (exit 122 when one differs or is missing)",
				Description: `Both walls are built from one rule set (its digest is shown): the host
seal around the cage bridge, and the in-cage wall (table inet shrooms_wall)
inside each cage's network namespace, installed before the cage starts.
Under the allowlist policy a cage's wall keeps the addresses resolved at its
turn's start; status compares it with the names resolved now.`,
				Action: func(c *cli.Context) error {
					return withNet(c, func(ctx context.Context, cfg *config.Config) error {
						return printStatusOf(c, ctx, cfg, true)
					})
				},
			},
			{
				Name:  "flush",
				Usage: "remove the seal (networked turns then refuse to start)",
				Action: func(c *cli.Context) error {
					return withNet(c, func(ctx context.Context, cfg *config.Config) error {
						if err := firewall.Flush(ctx, cfg.Network, firewall.Options{}); err != nil {
							return fail(ExitHostNotReady, err)
						}
						if jsonMode(c) {
							return printJSON(c.App.Writer, map[string]any{"policy": cfg.Network.Policy, "flushed": true})
						}
						textln(c.App.Writer, "seal removed")
						return nil
					})
				},
			},
		},
	}
}

func withNet(c *cli.Context, f func(context.Context, *config.Config) error) error {
	cfg, err := loadConfig(c)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(c.Context, time.Minute)
	defer cancel()
	return f(ctx, cfg)
}

func printStatus(c *cli.Context, ctx context.Context, cfg *config.Config) error {
	return printStatusOf(c, ctx, cfg, false)
}

// netStatus is `net status`: the host seal and the in-cage walls, both
// from one rule set.
type netStatus struct {
	firewall.Status
	// Rules is the digest of the rule set both walls are built from now.
	Rules string `json:"rules,omitempty"`
	// CageWall is the wall a cage started now gets (its digest), and
	// Cages the walls of the cages running or prepared now.
	CageWall string       `json:"cageWall,omitempty"`
	Cages    []cageStatus `json:"cages,omitempty"`
	// CagesError says why the cages could not be checked.
	CagesError string `json:"cagesError,omitempty"`
}

type cageStatus struct {
	Name string `json:"name"`
	firewall.WallStatus
}

// printStatusOf prints the host seal's status; with cages also the
// in-cage wall of every running or prepared cage, checked against the rule
// set the host seal is built from now.
func printStatusOf(c *cli.Context, ctx context.Context, cfg *config.Config, cages bool) error {
	st, err := firewall.Verify(ctx, cfg.Network, firewall.Options{})
	if err != nil {
		return fail(ExitHostNotReady, err)
	}
	ns := netStatus{Status: st}
	walls := true
	if cages && cfg.Network.Networked() {
		walls = checkCageWalls(ctx, cfg, &ns)
	}
	if jsonMode(c) {
		if err := printJSON(c.App.Writer, ns); err != nil {
			return err
		}
	} else {
		if st.OK {
			textf(c.App.Writer, "sealed: policy %s, tables %v, digest %s\n", st.Policy, st.Tables, st.Installed)
			if st.Reason != "" {
				textln(c.App.Writer, st.Reason)
			}
		}
		if ns.Rules != "" {
			textf(c.App.Writer, "in-cage wall: table inet %s in each cage's network namespace, digest %s; rule set %s (the host seal's)\n", firewall.WallTable, ns.CageWall, ns.Rules)
		}
		for _, cs := range ns.Cages {
			if cs.OK {
				textf(c.App.Writer, "  cage %s: wall in place\n", cs.Name)
			} else {
				textf(c.App.Writer, "  cage %s: %s\n", cs.Name, cs.Reason)
			}
		}
		if ns.CagesError != "" {
			textf(c.App.Writer, "  cages not checked: %s\n", ns.CagesError)
		}
	}
	if !st.OK {
		return fail(ExitHostNotReady, fmt.Errorf("seal not in place: %s", st.Reason))
	}
	if !walls {
		return fail(ExitHostNotReady, fmt.Errorf("an in-cage wall is not as the rule set implies (see above)"))
	}
	return nil
}

// checkCageWalls fills ns with the rule set and the walls of the cages
// podman runs or holds prepared; it reports whether every wall verified.
func checkCageWalls(ctx context.Context, cfg *config.Config, ns *netStatus) bool {
	var res firewall.Resolved
	if cfg.Network.Policy == "allowlist" {
		r, err := firewall.Resolve(ctx, cfg.Network, firewall.Options{})
		if err != nil {
			ns.CagesError = err.Error()
			return false
		}
		res = r
	}
	rules, err := firewall.DescribeHost(cfg.Network, res, firewall.Options{})
	if err != nil {
		ns.CagesError = err.Error()
		return false
	}
	ns.Rules = rules.Digest()
	if ns.CageWall, err = firewall.WallDigest(rules); err != nil {
		ns.CagesError = err.Error()
		return false
	}
	client, err := connect(ctx, cfg)
	if err != nil {
		ns.CagesError = err.Error()
		return true // the host seal is what status answers for without podman
	}
	// This shrooms' cages only (its state directory): a podman service may
	// hold cages of other configurations, with other networks and rules.
	list, err := client.ListByLabel(ctx, sealed.LabelState, sealed.StateLabel(cfg.State.Dir))
	if err != nil {
		ns.CagesError = err.Error()
		return true
	}
	ok := true
	for _, cg := range list {
		if cg.Labels[sealed.LabelManaged] != "1" || (cg.State != "running" && cg.State != "initialized") {
			continue
		}
		cs := cageStatus{Name: cg.Name}
		pid, err := client.Pid(ctx, cg.ID)
		if err == nil {
			cs.WallStatus, err = firewall.VerifyWall(ctx, rules, firewall.Options{NetNS: cagenet.CageNetNS(pid)})
		}
		if err != nil {
			cs.Reason = err.Error()
		} else if !cs.OK && cfg.Network.Policy == "allowlist" {
			cs.Reason += " (under allowlist a cage keeps the addresses resolved at its turn's start)"
		}
		ok = ok && cs.OK
		ns.Cages = append(ns.Cages, cs)
	}
	return ok
}
