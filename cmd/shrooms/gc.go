package main

import (
	"github.com/urfave/cli/v2"
)

func gcCommand() *cli.Command {
	return &cli.Command{
		Name:  "gc",
		Usage: "remove cages a crashed shrooms left behind, give their worktrees back, move their outboxes to the pending deliveries and release idle HOME mounts (running turns are kept)",
		Action: func(c *cli.Context) error {
			r, ctx, stop, err := runner(c)
			if err != nil {
				return err
			}
			defer stop()
			rep, err := r.GC(ctx)
			if err != nil {
				if rep != nil && jsonMode(c) {
					_ = printJSON(c.App.Writer, rep)
				}
				return fail(codeFor(err), err)
			}
			if jsonMode(c) {
				return printJSON(c.App.Writer, rep)
			}
			textf(c.App.Writer, "removed %d leftover cage(s); %d task(s) busy\n", len(rep.Removed), len(rep.Busy))
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
