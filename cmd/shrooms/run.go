package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/shrooms-cage/shrooms/pkg/config"
	"github.com/shrooms-cage/shrooms/pkg/home"
	"github.com/shrooms-cage/shrooms/pkg/podman"
	"github.com/shrooms-cage/shrooms/pkg/taskid"
	"github.com/shrooms-cage/shrooms/pkg/taskstate"
	"github.com/shrooms-cage/shrooms/pkg/turn"
)

func turnFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "task", Required: true, Usage: "task `ID` ([a-z0-9][a-z0-9_.-]{0,62})"},
		&cli.StringFlag{Name: "agent", Required: true, Usage: "agent `NAME` from the config ([agents.NAME])"},
		&cli.StringFlag{Name: "worktree", Usage: "host `DIR` mounted read-write at /work: a git work tree or a directory inside [worktree] roots (default: the task's worktree from its earlier turns, else an empty tmpfs)"},
		&cli.DurationFlag{Name: "timeout", Usage: "turn deadline `DUR`", DefaultText: "cage.timeout of the config"},
		&cli.BoolFlag{Name: "stdin", Usage: "attach shrooms' stdin to the agent (otherwise the cage's stdin is empty, so claude -p never waits for input)"},
		&cli.BoolFlag{Name: "no-stdin", Hidden: true, Usage: "the default; accepted for older callers"},
		&cli.BoolFlag{Name: "tty", Usage: "give the cage a terminal: for a person at one (stdin and stdout must be terminals; needs TIOCSTI closed: shrooms' seccomp profile or dev.tty.legacy_tiocsti=0)"},
	}
}

// turnRequest is the turn the flags ask for, of task id (checkTurn parsed it).
func turnRequest(c *cli.Context, id taskid.ID) turn.Request {
	req := turn.Request{
		Task:     id,
		Agent:    c.String("agent"),
		Worktree: c.String("worktree"),
		Args:     c.Args().Slice(),
		Timeout:  c.Duration("timeout"),
		Wait:     c.Duration("wait"),
		Streams:  podman.Streams{Stdout: c.App.Writer, Stderr: c.App.ErrWriter},
	}
	if c.Bool("stdin") {
		req.Streams.Stdin = c.App.Reader
	}
	if c.Bool("tty") {
		req.Terminal = true
		if in, out, err := terminal(c); err == nil {
			req.Streams = podman.Streams{Stdin: in, Stdout: out, Terminal: true}
		}
	}
	return req
}

// terminal returns the person's terminal for run --tty: shrooms' own stdin
// and stdout, both terminals.
func terminal(c *cli.Context) (in, out *os.File, err error) {
	in, _ = c.App.Reader.(*os.File)
	if so, ok := c.App.Writer.(*stdout); ok {
		out, _ = so.w.(*os.File)
	}
	if in == nil || out == nil || !isTerminal(in) || !isTerminal(out) {
		return nil, nil, fmt.Errorf("--tty needs a terminal on stdin and stdout (run it from one, or drop --tty)")
	}
	return in, out, nil
}

// checkTurn validates a turn's flags and input against the config, before
// shrooms connects to podman.
func checkTurn(c *cli.Context, id *taskid.ID) func(*config.Config) error {
	return func(cfg *config.Config) error {
		if c.Bool("stdin") && c.Bool("no-stdin") {
			return fmt.Errorf("--stdin and --no-stdin contradict each other")
		}
		if c.Bool("tty") && c.Command.Name == "run" {
			if _, _, err := terminal(c); err != nil {
				return err
			}
		}
		task, err := taskid.Parse(c.String("task"))
		if err != nil {
			return fmt.Errorf("%w: %w", turn.ErrInput, err)
		}
		*id = task
		if err := turn.ValidateRequest(cfg, turnRequest(c, task)); err != nil {
			return err
		}
		// The agent's baseline as its reset will lay it down: a file that
		// overlaps the keep-list is bad config (121), not a host problem.
		if agent, err := cfg.Agent(c.String("agent")); err == nil {
			return home.CheckBaseline(cfg, agent.Home)
		}
		return nil
	}
}

func runCommand() *cli.Command {
	return &cli.Command{
		Name:      "run",
		Usage:     "run one turn of an agent in a fresh sealed cage",
		ArgsUsage: "[-- ARGS...]",
		Description: `Runs the agent's command (plus ARGS) in a new cage, streams its output,
waits for it with a deadline and removes the cage on every path out; then
gives the worktree back to its owner (worktree.idmap: with an idmapped mount
what the cage wrote is the owner's already, so only the setuid/setgid bits of
the files the turn changed are taken and the nested git repositories it made
go to the task's user; with the chown walks every entry the task's uid range
owns is chowned back; "shrooms doctor" says which).
Once the agent has exited, shrooms prints the result and exits at once: the
cage's removal and the preparation of the task's next cage (cage.prepare_next,
on by default; --prepare-next=false skips it) go on in a detached child that
holds the task lock, so the task's next turn waits at most for it. That
child lingers for cage.teardown_linger (1m; 0 turns it off) and takes the
next turns' teardowns ("shrooms doctor" names it).
The exit status is the agent's. With --json the last line of stdout is one
JSON object (docs/json.md): task, turn, cage id, exit code, status, OOM
flag, phase durations, the HOME reset report, the worktree guard's report
(agent config in the worktree that differs from what the owner trusted is
masked in the cage and listed; see "shrooms trust --help"), model usage
through the gateway, the worktree give-back, the image, config and seal
digests, and what the turn changed in the worktree (agent config flagged).
With --tty the cage gets a terminal for a person at one.`,
		Flags: append(turnFlags(),
			&cli.BoolFlag{Name: "prepare-next", Usage: "after the turn, prepare the task's next cage (see the prepare command); =false skips it", DefaultText: "cage.prepare_next of the config"},
			&cli.StringFlag{Name: "result-file", Usage: "also write the result object (docs/json.md) to `FILE`, replaced atomically: at the start with {\"status\":\"running\",…}, at the end with the result, on every path once the flags are parsed"},
			&cli.DurationFlag{Name: "wait", Usage: "if another turn of the task runs, wait up to `DUR` for it to end (default: exit 123 at once)"}),
		Action: func(c *cli.Context) error {
			if path := c.String("result-file"); path != "" {
				// A result file never shows the previous turn's result while
				// this one runs, nor after this shrooms was killed.
				if err := writeResultFile(path, runningResult{Task: c.String("task"), Agent: c.String("agent"), Status: "running", StartedAt: taskstate.Now(), PID: os.Getpid()}); err != nil {
					return fail(ExitUsage, err)
				}
			}
			if c.Duration("wait") < 0 {
				return finishRun(c, nil, fail(ExitUsage, fmt.Errorf("--wait must not be negative")))
			}
			var task taskid.ID
			r, ctx, stop, err := pipelineFor(c, checkTurn(c, &task))
			if err != nil {
				return finishRun(c, nil, err)
			}
			defer stop()
			// Prepared by default (cage.prepare_next); --prepare-next=false
			// skips it for this turn.
			prepareNext := r.Cfg.Cage.PrepareNext && r.Binary != ""
			if c.IsSet("prepare-next") {
				prepareNext = c.Bool("prepare-next")
			}
			// The result is printed as soon as the exit code is known; the
			// cage's removal and the next preparation go on in a child.
			r.Detach = detacher(c, r, prepareNext)
			req := turnRequest(c, task)
			res, err := r.Run(ctx, req)
			if req.Terminal && jsonMode(c) {
				// The terminal's output bypassed stdout's line tracking: the
				// result starts on a line of its own.
				fmt.Fprint(c.App.Writer, "\r\n")
			}
			if res != nil && res.WorktreeGuard != nil && len(res.WorktreeGuard.Masked) > 0 {
				// Said on stderr too: a person at a terminal sees it without --json.
				warn(c.App.ErrWriter, fmt.Sprintf("masked agent config the owner has not trusted (review, then `shrooms trust --task %s`): %s",
					c.String("task"), strings.Join(res.WorktreeGuard.Masked, ", ")))
			}
			if res != nil && res.Outbox != nil && res.Outbox.Error != "" {
				warn(c.App.ErrWriter, "outbox: "+res.Outbox.Error)
			}
			if err == nil && prepareNext && res.Teardown != "detached" {
				next := turnRequest(c, task)
				next.Args = nil
				if _, perr := r.PrepareNext(ctx, next); perr != nil {
					warn(c.App.ErrWriter, "next cage not prepared: "+perr.Error())
				}
			}
			return finishRun(c, res, err)
		},
	}
}

// finishRun prints the turn's result under --json (a result with what is
// known when the turn never started) and maps it to the exit status.
func finishRun(c *cli.Context, res *turn.Result, err error) error {
	if res == nil {
		now := taskstate.Now()
		res = &turn.Result{Task: c.String("task"), Agent: c.String("agent"), Status: "error", ExitCode: -1, Phases: []turn.Phase{}, StartedAt: now, EndedAt: now}
	}
	if err != nil && res.Error == "" {
		res.Error = oneLine(errorText(err))
	}
	if path := c.String("result-file"); path != "" {
		if werr := writeResultFile(path, res); werr != nil {
			warn(c.App.ErrWriter, werr.Error())
			if err == nil {
				err = fail(ExitInternal, werr)
			}
		}
	}
	if jsonMode(c) {
		if perr := printJSON(c.App.Writer, res); perr != nil {
			return perr
		}
	}
	if err != nil {
		var ee *exitError
		if errors.As(err, &ee) {
			return err
		}
		return fail(codeFor(err), err)
	}
	if res.ExitCode != 0 {
		return fail(res.ExitCode, nil)
	}
	return nil
}

// writeResultFile replaces path with the result object: written to a new
// file beside it, then renamed over it, so a reader sees all of it or the
// previous one; a symbolic link at path is replaced, never followed.
func writeResultFile(path string, res any) error {
	b, err := schemaJSON(res)
	if err != nil {
		return err
	}
	f, err := os.CreateTemp(filepath.Dir(path), ".shrooms-result-*")
	if err != nil {
		return fmt.Errorf("--result-file: %w", err)
	}
	defer os.Remove(f.Name())
	if _, err := f.Write(append(b, '\n')); err != nil {
		f.Close()
		return fmt.Errorf("--result-file: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("--result-file: %w", err)
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return fmt.Errorf("--result-file: %w", err)
	}
	return nil
}

// runningResult is the result file while the turn runs.
type runningResult struct {
	Task      string `json:"task"`
	Agent     string `json:"agent"`
	Status    string `json:"status"`
	StartedAt string `json:"startedAt"`
	PID       int    `json:"pid"`
}

func errorText(err error) string {
	var ee *exitError
	if errors.As(err, &ee) && ee.err != nil {
		return ee.err.Error()
	}
	return err.Error()
}

func prepareCommand() *cli.Command {
	return &cli.Command{
		Name:  "prepare",
		Usage: "prepare the task's next turn now: HOME reset, cage created and initialised, not started",
		Description: `The next ` + "`run`" + ` with the same task, agent, worktree, --stdin and config then
only hands the cage its argv and starts it. Anything different, or anything
found in HOME since, discards the prepared cage and the turn runs as usual.`,
		Flags: turnFlags(),
		Action: func(c *cli.Context) error {
			var task taskid.ID
			r, ctx, stop, err := pipelineFor(c, checkTurn(c, &task))
			if err != nil {
				return err
			}
			defer stop()
			id, err := r.PrepareNext(ctx, turnRequest(c, task))
			if err != nil {
				return fail(codeFor(err), err)
			}
			if jsonMode(c) {
				return printJSON(c.App.Writer, map[string]string{"task": c.String("task"), "cage": id})
			}
			textln(c.App.Writer, id)
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
			var task taskid.ID
			r, ctx, stop, err := pipelineFor(c, checkTurn(c, &task))
			if err != nil {
				return err
			}
			defer stop()
			spec, err := r.Spec(ctx, turnRequest(c, task))
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
			var profiles []string
			var task taskid.ID
			r, ctx, stop, err := runnerFor(c, func(cfg *config.Config) (err error) {
				if task, err = taskid.Parse(c.String("task")); err != nil {
					return err
				}
				if name := c.String("agent"); name != "" {
					agent, err := cfg.Agent(name)
					if err != nil {
						return err
					}
					profiles = agent.Home
				}
				return nil
			})
			if err != nil {
				return err
			}
			defer stop()
			res, err := r.Bootstrap(ctx, task, profiles)
			if err != nil {
				return fail(codeFor(err), err)
			}
			if jsonMode(c) {
				return printJSON(c.App.Writer, map[string]any{"task": c.String("task"), "volume": r.Homes.Name(task), "result": res.Result, "seeded": res.Seeded})
			}
			textln(c.App.Writer, res.Result)
			return nil
		},
	}
}

func versionCommand() *cli.Command {
	return &cli.Command{
		Name:   "version",
		Usage:  "print shrooms' version",
		Action: printVersion,
	}
}

// printVersion is `shrooms version` and `shrooms --version`.
func printVersion(c *cli.Context) error {
	if jsonMode(c) {
		return printJSON(c.App.Writer, map[string]string{"version": version})
	}
	textln(c.App.Writer, "shrooms "+version)
	return nil
}
