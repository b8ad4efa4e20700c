package main

import (
	"context"
	"fmt"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/shrooms-cage/shrooms/pkg/cagenet"
	"github.com/shrooms-cage/shrooms/pkg/config"
	"github.com/shrooms-cage/shrooms/pkg/firewall"
)

func netCommand() *cli.Command {
	return &cli.Command{
		Name:  "net",
		Usage: "the cage network and its nftables seal: apply, status, flush",
		Subcommands: []*cli.Command{
			{
				Name:  "apply",
				Usage: "install the seal (atomic, idempotent) and create the cage network if missing",
				Description: `Run as root at boot before podman starts cages (the NixOS module's
shrooms-seal unit does, with --seal-only, before podman is up), and after
changing [network]. The seal matches the bridge by name, so it can be in
place before the network exists; a networked turn creates a missing network
itself once it has verified the seal. Under the allowlist policy each turn
re-applies the seal to refresh resolved host names. The seal also blocks
every prefix the host routes other than by its default route (read now) and
network.lan; a turn adds a route that appeared since (a VPN, a LAN) to the
seal before it starts, and a running turn within a quarter second.`,
				Flags: []cli.Flag{&cli.BoolFlag{Name: "seal-only", Usage: "install the seal only; do not contact podman"}},
				Action: func(c *cli.Context) error {
					return withNet(c, func(ctx context.Context, cfg *config.Config) error {
						if cfg.Network.Networked() && !c.Bool("seal-only") {
							client, err := connect(ctx, cfg)
							if err != nil {
								return err
							}
							if _, err := cagenet.EnsureNetwork(ctx, cfg, client); err != nil {
								return fail(codeFor(err), err)
							}
						}
						if err := firewall.Apply(ctx, cfg.Network, firewall.Options{}); err != nil {
							return fail(ExitHostNotReady, err)
						}
						return printStatus(c, ctx, cfg)
					})
				},
			},
			{
				Name:  "status",
				Usage: "verify the installed seal against the config (exit 122 when it differs or is missing)",
				Action: func(c *cli.Context) error {
					return withNet(c, func(ctx context.Context, cfg *config.Config) error {
						return printStatus(c, ctx, cfg)
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
	st, err := firewall.Verify(ctx, cfg.Network, firewall.Options{})
	if err != nil {
		return fail(ExitHostNotReady, err)
	}
	if jsonMode(c) {
		if err := printJSON(c.App.Writer, st); err != nil {
			return err
		}
	} else if st.OK {
		textf(c.App.Writer, "sealed: policy %s, tables %v, digest %s\n", st.Policy, st.Tables, st.Installed)
		if st.Reason != "" {
			textln(c.App.Writer, st.Reason)
		}
	}
	if !st.OK {
		return fail(ExitHostNotReady, fmt.Errorf("seal not in place: %s", st.Reason))
	}
	return nil
}
