package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/shrooms-cage/shrooms/pkg/cagelink"
	"github.com/shrooms-cage/shrooms/pkg/config"
	"github.com/shrooms-cage/shrooms/pkg/firewall"
	"github.com/shrooms-cage/shrooms/pkg/outbox"
	"github.com/shrooms-cage/shrooms/pkg/sealed"
	"github.com/shrooms-cage/shrooms/pkg/taskstate"
)

// purgeReport is what `shrooms purge` removed (or, with --dry-run, would).
type purgeReport struct {
	DryRun     bool   `json:"dry_run"`
	Network    string `json:"network,omitempty"`      // the podman network removed
	NetworkNot string `json:"network_kept,omitempty"` // why a network of that name was left
	Bridge     string `json:"bridge,omitempty"`       // the shrooms driver's bridge and NAT table removed
	Seal       bool   `json:"seal"`                   // the seal's tables removed
	Outbox     string `json:"outbox,omitempty"`
	StateDir   string `json:"state_dir,omitempty"`
}

func purgeCommand() *cli.Command {
	return &cli.Command{
		Name:  "purge",
		Usage: "remove what shrooms made on this host once no task is left: its cage network (the bridge and NAT table, or the podman network), the seal, the outbox root and the state directory (`make uninstall PURGE=1` runs it); refuses, changing nothing, while a task, HOME, delivery, worktree claim or cage remains (exit 123)",
		Description: `Everything is checked before anything is removed: the state directory may
hold only what shrooms makes again by itself (empty directories, lock files,
the generated seccomp profiles and resolv.conf, the cages' git config), the outbox root only
an empty .pending, and podman no container or volume shrooms made. Only
those known names are removed, never a whole tree, so whatever appears
meanwhile stays and makes purge fail. A podman network of the configured
name that shrooms did not make is left alone. The config file stays.`,
		Flags: []cli.Flag{&cli.BoolFlag{Name: "dry-run", Usage: "check and report what would be removed; change nothing"}},
		Action: func(c *cli.Context) error {
			cfg, err := loadConfig(c)
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(c.Context, 2*time.Minute)
			defer cancel()
			rep, err := purge(ctx, cfg, c.Bool("dry-run"))
			if err != nil {
				return err
			}
			if jsonMode(c) {
				return printJSON(c.App.Writer, rep)
			}
			verb := "removed"
			if rep.DryRun {
				verb = "would remove"
			}
			if rep.Network != "" {
				textf(c.App.Writer, "%s podman network %s\n", verb, rep.Network)
			}
			if rep.Bridge != "" {
				textf(c.App.Writer, "%s bridge %s and its NAT table\n", verb, rep.Bridge)
			}
			if rep.NetworkNot != "" {
				textln(c.App.Writer, "kept "+rep.NetworkNot)
			}
			if rep.Seal {
				textf(c.App.Writer, "%s the seal (network %s)\n", verb, cfg.Network.Name)
			}
			if rep.Outbox != "" {
				textf(c.App.Writer, "%s outbox root %s\n", verb, rep.Outbox)
			}
			if rep.StateDir != "" {
				textf(c.App.Writer, "%s state directory %s\n", verb, rep.StateDir)
			}
			return nil
		},
	}
}

// purge checks that nothing but shrooms' own skeleton is left, then removes
// it: the network, the seal, the outbox root, the state directory.
func purge(ctx context.Context, cfg *config.Config, dryRun bool) (*purgeReport, error) {
	layout := taskstate.Layout{Dir: cfg.State.Dir}
	left, err := layout.Leftovers(5, cfg.Outbox.Root)
	if err != nil {
		return nil, fail(ExitHostNotReady, err)
	}
	if len(left) > 0 {
		return nil, fail(ExitBusy, fmt.Errorf("purge: state directory %s still holds %s (shrooms forget each task, collect or remove its deliveries first); nothing removed", cfg.State.Dir, strings.Join(left, ", ")))
	}
	box, err := outbox.Leftover(cfg.Outbox.Root)
	if err != nil {
		return nil, fail(ExitHostNotReady, err)
	}
	if box != "" {
		return nil, fail(ExitBusy, fmt.Errorf("purge: outbox %s still holds %s (shrooms outbox collect or forget its task first); nothing removed", cfg.Outbox.Root, box))
	}
	client, err := connect(ctx, cfg)
	if err != nil {
		return nil, err
	}
	// This state directory's cages and HOME volumes; another shrooms (its
	// own state directory) may share the podman, and podman itself refuses
	// to remove a network a container still uses.
	cages, err := client.ListByLabel(ctx, sealed.LabelState, sealed.StateLabel(cfg.State.Dir))
	if err != nil {
		return nil, fail(ExitHostNotReady, err)
	}
	for _, cage := range cages {
		if cage.Labels[sealed.LabelManaged] == "1" {
			return nil, fail(ExitBusy, fmt.Errorf("purge: podman still has cage %s of this state directory (shrooms gc, or forget its task); nothing removed", cage.Name))
		}
	}
	vols, err := client.VolumesByLabel(ctx, sealed.LabelManaged, "1")
	if err != nil {
		return nil, fail(ExitHostNotReady, err)
	}
	for _, v := range vols {
		if strings.HasPrefix(v, cfg.Home.VolumePrefix) {
			return nil, fail(ExitBusy, fmt.Errorf("purge: podman still has HOME volume %s (shrooms forget its task); nothing removed", v))
		}
	}
	rep := &purgeReport{DryRun: dryRun, Seal: true, Outbox: cfg.Outbox.Root, StateDir: cfg.State.Dir}
	n, err := client.InspectNetwork(ctx, cfg.Network.Name)
	if err != nil {
		return nil, fail(ExitHostNotReady, err)
	}
	switch {
	case n == nil:
	case n.Labels[sealed.LabelManaged] == "1":
		rep.Network = n.Name
	default:
		rep.NetworkNot = fmt.Sprintf("podman network %s: shrooms did not make it (no %s label)", n.Name, sealed.LabelManaged)
	}
	link, err := cagelink.FromConfig(cfg.Network, "")
	if err != nil {
		return nil, fail(ExitUsage, err)
	}
	if cfg.Network.Driver == config.DriverShrooms {
		if exists, err := cagelink.Identify(link); err != nil && exists {
			return nil, fail(ExitHostNotReady, fmt.Errorf("purge: %w; nothing removed", err))
		} else if exists {
			rep.Bridge = link.Bridge
		}
	}
	if dryRun {
		return rep, nil
	}
	if rep.Bridge != "" {
		if err := cagelink.Remove(link); err != nil {
			return nil, fail(ExitHostNotReady, err)
		}
	}
	if rep.Network != "" {
		if err := client.RemoveNetwork(ctx, rep.Network); err != nil {
			return nil, fail(ExitHostNotReady, err)
		}
	}
	if err := firewall.Flush(ctx, cfg.Network, firewall.Options{}); err != nil {
		return nil, fail(ExitHostNotReady, err)
	}
	if err := outbox.RemoveEmpty(cfg.Outbox.Root); err != nil {
		return nil, fail(ExitBusy, fmt.Errorf("purge: %w", err))
	}
	if err := layout.RemoveSkeleton(); err != nil {
		return nil, fail(ExitBusy, fmt.Errorf("purge: %w", err))
	}
	return rep, nil
}
