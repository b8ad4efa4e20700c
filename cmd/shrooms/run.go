package main

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/shrooms-cage/shrooms/pkg/podman"
	"github.com/shrooms-cage/shrooms/pkg/turn"
)

func turnFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "task", Required: true, Usage: "task `ID` ([a-z0-9][a-z0-9_.-]{0,62})"},
		&cli.StringFlag{Name: "agent", Required: true, Usage: "agent `NAME` from the config ([agents.NAME])"},
		&cli.StringFlag{Name: "worktree", Usage: "host `DIR` mounted read-write at /work (default: an empty tmpfs)"},
		&cli.DurationFlag{Name: "timeout", Usage: "turn deadline `DUR` (default cage.timeout)"},
		&cli.BoolFlag{Name: "no-stdin", Usage: "do not attach shrooms' stdin to the agent"},
	}
}

func turnRequest(c *cli.Context) turn.Request {
	req := turn.Request{
		Task:     c.String("task"),
		Agent:    c.String("agent"),
		Worktree: c.String("worktree"),
		Args:     c.Args().Slice(),
		Timeout:  c.Duration("timeout"),
		Streams:  podman.Streams{Stdout: c.App.Writer, Stderr: c.App.ErrWriter},
	}
	if !c.Bool("no-stdin") {
		req.Streams.Stdin = c.App.Reader
	}
	return req
}

func runCommand() *cli.Command {
	return &cli.Command{
		Name:      "run",
		Usage:     "run one turn of an agent in a fresh sealed cage",
		ArgsUsage: "[-- ARGS...]",
		Description: `Runs the agent's command (plus ARGS) in a new cage, streams its output,
waits for it with a deadline and removes the cage on every path out.
The exit status is the agent's. With --json the last line of stdout is one
JSON object: task, turn, cage id, exit code, status and phase durations,
the HOME reset's report and the worktree guard's (agent config in the
worktree that differs from what the owner trusted is masked in the cage and
listed; see "shrooms trust --help").`,
		Flags: append(turnFlags(), &cli.BoolFlag{Name: "prepare-next", Usage: "after the turn, prepare the task's next cage (see the prepare command)"}),
		Action: func(c *cli.Context) error {
			r, ctx, stop, err := runner(c)
			if err != nil {
				return err
			}
			defer stop()
			res, err := r.Run(ctx, turnRequest(c))
			if res != nil && res.WorktreeGuard != nil && len(res.WorktreeGuard.Masked) > 0 {
				// Said on stderr too: a person at a terminal sees it without --json.
				fmt.Fprintf(c.App.ErrWriter, "shrooms: masked agent config the owner has not trusted (review, then `shrooms trust --task %s`): %s\n",
					c.String("task"), strings.Join(res.WorktreeGuard.Masked, ", "))
			}
			if err == nil && c.Bool("prepare-next") {
				next := turnRequest(c)
				next.Args = nil
				if _, perr := r.PrepareNext(ctx, next); perr != nil {
					fmt.Fprintln(c.App.ErrWriter, "shrooms: next cage not prepared: "+oneLine(perr.Error()))
				}
			}
			if c.Bool("json") {
				if res != nil && err != nil && res.Error == "" {
					res.Error = oneLine(err.Error())
				}
				line, _ := json.Marshal(res)
				fmt.Fprintln(c.App.Writer, string(line))
			}
			if err != nil {
				return fail(codeFor(err), err)
			}
			if res.ExitCode != 0 {
				return fail(res.ExitCode, nil)
			}
			return nil
		},
	}
}

func prepareCommand() *cli.Command {
	return &cli.Command{
		Name:  "prepare",
		Usage: "prepare the task's next turn now: HOME reset, cage created and initialised, not started",
		Description: `The next ` + "`run`" + ` with the same task, agent, worktree, stdin and config then
only hands the cage its argv and starts it. Anything different, or anything
found in HOME since, discards the prepared cage and the turn runs as usual.`,
		Flags: turnFlags(),
		Action: func(c *cli.Context) error {
			r, ctx, stop, err := runner(c)
			if err != nil {
				return err
			}
			defer stop()
			id, err := r.PrepareNext(ctx, turnRequest(c))
			if err != nil {
				return fail(codeFor(err), err)
			}
			if c.Bool("json") {
				return printJSON(c.App.Writer, map[string]string{"task": c.String("task"), "cage": id})
			}
			fmt.Fprintln(c.App.Writer, id)
			return nil
		},
	}
}

func specCommand() *cli.Command {
	return &cli.Command{
		Name:      "spec",
		Usage:     "print the podman spec (specgen JSON) the next `run` would send, changing nothing",
		ArgsUsage: "[-- ARGS...]",
		Flags:     turnFlags(),
		Action: func(c *cli.Context) error {
			r, ctx, stop, err := runner(c)
			if err != nil {
				return err
			}
			defer stop()
			spec, err := r.Spec(ctx, turnRequest(c))
			if err != nil {
				return fail(codeFor(err), err)
			}
			out, err := turn.SpecJSON(spec)
			if err != nil {
				return fail(ExitInternal, err)
			}
			_, err = c.App.Writer.Write(out)
			return err
		},
	}
}

func bootstrapCommand() *cli.Command {
	return &cli.Command{
		Name:  "bootstrap",
		Usage: "create the task HOME once and seed its credentials (an existing one is left as it is)",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "task", Required: true, Usage: "task `ID`"},
			&cli.StringFlag{Name: "agent", Usage: "seed only the HOME profiles of agent `NAME` (default: every profile)"},
		},
		Action: func(c *cli.Context) error {
			r, ctx, stop, err := runner(c)
			if err != nil {
				return err
			}
			defer stop()
			var profiles []string
			if name := c.String("agent"); name != "" {
				agent, err := r.Cfg.Agent(name)
				if err != nil {
					return fail(ExitUsage, err)
				}
				profiles = agent.Home
			}
			res, err := r.Bootstrap(ctx, c.String("task"), profiles)
			if err != nil {
				return fail(codeFor(err), err)
			}
			if c.Bool("json") {
				return printJSON(c.App.Writer, map[string]any{"task": c.String("task"), "volume": r.VolumeName(c.String("task")), "result": res.Result, "seeded": res.Seeded})
			}
			fmt.Fprintln(c.App.Writer, res.Result)
			return nil
		},
	}
}

func versionCommand() *cli.Command {
	return &cli.Command{
		Name:  "version",
		Usage: "print shrooms' version",
		Action: func(c *cli.Context) error {
			if c.Bool("json") {
				return printJSON(c.App.Writer, map[string]string{"version": version})
			}
			fmt.Fprintln(c.App.Writer, "shrooms "+version)
			return nil
		},
	}
}
