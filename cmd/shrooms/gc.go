package main

import (
	"github.com/urfave/cli/v2"
)

func gcCommand() *cli.Command {
	return &cli.Command{
		Name:  "gc",
		Usage: "remove cages a crashed shrooms left behind and prepared cages older than cage.prepared_ttl, give their worktrees back (an idmapped worktree's staging mount detached), move their outboxes to the pending deliveries and release idle HOME mounts (running turns are kept; a teardown lingering for the next turns, cage.teardown_linger, holds no cage and is left: shrooms doctor names it)",
		Flags: []cli.Flag{&cli.BoolFlag{Name: "dry-run", Usage: "list the leftover cages gc would remove and the prepared cages it would expire; change nothing"}},
		Action: func(c *cli.Context) error {
			r, ctx, stop, err := runner(c)
			if err != nil {
				return err
			}
			defer stop()
			gc := r.GC
			if c.Bool("dry-run") {
				gc = r.GCDryRun
			}
			rep, err := gc(ctx)
			if err != nil {
				if rep != nil && jsonMode(c) {
					_ = printJSON(c.App.Writer, rep)
				}
				return fail(codeFor(err), err)
			}
			if jsonMode(c) {
				return printJSON(c.App.Writer, rep)
			}
			if rep.DryRun {
				textf(c.App.Writer, "would remove %d leftover cage(s) and expire %d prepared cage(s); %d task(s) busy\n", len(rep.Removed), len(rep.Expired), len(rep.Busy))
				for _, n := range append(append([]string{}, rep.Removed...), rep.Expired...) {
					textln(c.App.Writer, "  would remove "+n)
				}
				return nil
			}
			textf(c.App.Writer, "removed %d leftover cage(s); %d task(s) busy\n", len(rep.Removed), len(rep.Busy))
			for _, n := range rep.Expired {
				textln(c.App.Writer, "  expired prepared cage "+n)
			}
			for _, n := range rep.Removed {
				textln(c.App.Writer, "  removed "+n)
			}
			for _, l := range rep.Released {
				textln(c.App.Writer, "  released HOME "+l)
			}
			for _, o := range rep.Outboxes {
				textln(c.App.Writer, "  moved the outbox of "+o+" to its pending deliveries")
			}
			for _, w := range rep.Worktrees {
				textln(c.App.Writer, "  gave back worktree "+w)
			}
			return nil
		},
	}
}
