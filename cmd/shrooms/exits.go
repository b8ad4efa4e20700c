package main

import (
	"context"
	"errors"
	"fmt"
	"net/mail"

	"github.com/urfave/cli/v2"

	"github.com/shrooms-cage/shrooms/pkg/config"
	"github.com/shrooms-cage/shrooms/pkg/fault"
	"github.com/shrooms-cage/shrooms/pkg/gitseal"
	"github.com/shrooms-cage/shrooms/pkg/outbox"
	"github.com/shrooms-cage/shrooms/pkg/podman"
	"github.com/shrooms-cage/shrooms/pkg/safetext"
	"github.com/shrooms-cage/shrooms/pkg/task"
	"github.com/shrooms-cage/shrooms/pkg/taskid"
	"github.com/shrooms-cage/shrooms/pkg/turn"
)

// runner loads the config, connects to podman and returns a turn runner
// and a context that SIGINT, SIGTERM or SIGHUP cancel (call stop when done).
func runner(c *cli.Context) (r *task.Commands, ctx context.Context, stop context.CancelFunc, err error) {
	return runnerFor(c, nil)
}

// runnerFor is runner with the command's own input check: the config, the
// files it names and pre (when not nil) are validated before shrooms
// connects to podman, so bad input exits 121 even when podman is down.
func runnerFor(c *cli.Context, pre func(*config.Config) error) (r *task.Commands, ctx context.Context, stop context.CancelFunc, err error) {
	turns, ctx, stop, err := pipelineFor(c, pre)
	if err != nil {
		return nil, nil, nil, err
	}
	return task.New(turns.Cfg, turns.Podman), ctx, stop, nil
}

// pipelineFor is runnerFor for the commands of the turn pipeline (run,
// prepare, spec, bootstrap, probe, teardown): the turn runner itself.
func pipelineFor(c *cli.Context, pre func(*config.Config) error) (r *turn.Runner, ctx context.Context, stop context.CancelFunc, err error) {
	cfg, err := checkedConfig(c, pre)
	if err != nil {
		return nil, nil, nil, err
	}
	ctx, stop = signalContext(c.Context)
	client, err := connect(ctx, cfg)
	if err != nil {
		stop()
		return nil, nil, nil, err
	}
	return newRunner(cfg, client), ctx, stop, nil
}

// checkedConfig loads the config and checks the files it names and the
// command's own input (pre, when not nil), before anything is contacted.
func checkedConfig(c *cli.Context, pre func(*config.Config) error) (*config.Config, error) {
	cfg, err := loadConfig(c)
	if err != nil {
		return nil, err
	}
	if err := cfg.CheckFiles(); err != nil {
		return nil, fail(ExitUsage, err)
	}
	if pre != nil {
		if err := pre(cfg); err != nil {
			code := ExitUsage // bad input, unless shrooms' own state could not be read
			if fault.Of(err) == fault.HostNotReady {
				code = ExitHostNotReady
			}
			return nil, fail(code, err)
		}
	}
	return cfg, nil
}

// localRunner is runnerFor for the task commands that work on the state
// directory, the outbox and the worktree (outbox, commit, trust): podman
// is connected on its first use only (podman.Lazy), so they work while
// podman is down.
func localRunner(c *cli.Context, pre func(*config.Config) error) (r *task.Commands, ctx context.Context, stop context.CancelFunc, err error) {
	cfg, err := checkedConfig(c, pre)
	if err != nil {
		return nil, nil, nil, err
	}
	ctx, stop = signalContext(c.Context)
	return lazyCommands(cfg), ctx, stop, nil
}

// lazyCommands are the task commands of cfg with podman connected on its
// first use only.
func lazyCommands(cfg *config.Config) *task.Commands {
	return task.New(cfg, podman.Lazy(cfg.Podman.Socket))
}

// withTask is the one preamble of a command on one existing task: the
// config and --task checked before anything is contacted (pre, when the
// command checks more, instead of checkTask), a context that SIGINT,
// SIGTERM or SIGHUP cancel, and podman connected before fn when the
// command needs it (withPodman), else on its first use only. fn gets the
// task commands and the task id.
func withTask(c *cli.Context, need taskNeed, pre func(*config.Config, taskid.ID) error, fn func(ctx context.Context, r *task.Commands, id taskid.ID) error) error {
	open := localRunner
	if need == withPodman {
		open = runnerFor
	}
	if pre == nil {
		pre = task.CheckTask
	}
	var id taskid.ID
	r, ctx, stop, err := open(c, func(cfg *config.Config) (err error) {
		if id, err = taskArg(c); err != nil {
			return err
		}
		return pre(cfg, id)
	})
	if err != nil {
		return err
	}
	defer stop()
	return fn(ctx, r, id)
}

// taskNeed says whether a task command needs podman.
type taskNeed int

const (
	// local commands work on the state directory, the outbox and the
	// worktree, and work while podman is down (it is connected on its
	// first use only).
	local taskNeed = iota
	withPodman
)

// taskArg is --task as a task id: the one place a command parses it
// (fault.Input when it is no valid id).
func taskArg(c *cli.Context) (taskid.ID, error) {
	id, err := taskid.Parse(c.String("task"))
	if err != nil {
		return id, fmt.Errorf("%w: %w", fault.Input, err)
	}
	return id, nil
}

func taskFlag() cli.Flag {
	return &cli.StringFlag{Name: "task", Required: true, Usage: "task `ID`"}
}

func outboxCommand() *cli.Command {
	return &cli.Command{
		Name:  "outbox",
		Usage: "the task's pending deliveries (what its turns left in /outbox): list, collect, release",
		Description: `/outbox is one-way: every turn starts with an empty, size-capped tmpfs
there, and what the turn put in it is moved out of every cage's reach when
it ends, into <outbox.root>/.pending/<task>/<turn>/ (regular files only,
copied through pinned file descriptors; links, FIFOs, devices, bad names and
files past the [outbox] limits are dropped and listed). A turn whose shrooms
was killed is moved by the next run or gc. These commands work on the
pending deliveries, oldest turn first.`,
		Subcommands: []*cli.Command{
			{
				Name:  "list",
				Usage: "show what collect would deliver and refuse, changing nothing",
				Flags: []cli.Flag{taskFlag()},
				Action: func(c *cli.Context) error {
					return withTask(c, local, nil, func(ctx context.Context, r *task.Commands, id taskid.ID) error {
						rep, err := r.ListOutbox(ctx, id)
						if err != nil {
							return fail(codeFor(err), err)
						}
						return printOutbox(c, rep, false)
					})
				},
			},
			{
				Name:  "collect",
				Usage: "move the pending deliveries' files into a delivery directory with a manifest",
				Description: `Copies regular files only, through pinned file descriptors (openat2,
no symlinks, no magic links), with normalised modes and no xattrs, within the
[outbox] limits, to <DIR>/files/<turn>/<name>; writes manifest.json (turn,
name, path, size, sha256; and what was dropped at each turn's end) last.
Files past the limits stay pending and are listed with the reason.`,
				Flags: []cli.Flag{taskFlag(), &cli.StringFlag{Name: "to", Usage: "delivery `DIR` (new or empty; default <state.dir>/deliveries/<task>/<time>)"}},
				Action: func(c *cli.Context) error {
					return withTask(c, local, nil, func(ctx context.Context, r *task.Commands, id taskid.ID) error {
						rep, err := r.Collect(ctx, id, c.String("to"))
						if err != nil {
							return fail(codeFor(err), err)
						}
						return printOutbox(c, rep, true)
					})
				},
			},
			{
				Name:  "release",
				Usage: "discard the task's pending deliveries, and unmount its outbox wherever it is still mounted",
				Flags: []cli.Flag{taskFlag()},
				Action: func(c *cli.Context) error {
					return withTask(c, local, nil, func(_ context.Context, r *task.Commands, id taskid.ID) error {
						if err := r.ReleaseOutbox(id); err != nil {
							return fail(codeFor(err), err)
						}
						if jsonMode(c) {
							return printJSON(c.App.Writer, map[string]any{"task": id, "released": true})
						}
						textln(c.App.Writer, "released the outbox of "+id.String())
						return nil
					})
				},
			},
		},
	}
}

func printOutbox(c *cli.Context, rep *outbox.Report, delivered bool) error {
	if jsonMode(c) {
		return printJSON(c.App.Writer, rep)
	}
	w := c.App.Writer
	verb := "would deliver"
	if delivered {
		verb = "delivered"
		textf(w, "delivery %s (manifest %s)\n", rep.Delivery, rep.Manifest)
	}
	for _, f := range rep.Files {
		textf(w, "  %s %s (turn %d)  %d bytes  %s\n", verb, f.Name, f.Turn, f.Size, f.SHA256)
	}
	for _, r := range rep.Rejected {
		if r.Dropped {
			textf(w, "  refused \"%s\" (turn %d, dropped at its end): %s\n", r.Name, r.Turn, r.Reason)
		} else {
			textf(w, "  refused \"%s\" (turn %d, stays pending): %s\n", r.Name, r.Turn, r.Reason)
		}
	}
	if rep.MoreRejected > 0 {
		textf(w, "  … and %d more refused\n", rep.MoreRejected)
	}
	for _, l := range rep.Left {
		textf(w, "  delivered but left pending \"%s\" (turn %d): %s\n", l.Name, l.Turn, l.Reason)
	}
	if len(rep.Files) == 0 && len(rep.Rejected) == 0 {
		textln(w, "  nothing pending")
	}
	return nil
}

func commitCommand() *cli.Command {
	return &cli.Command{
		Name:  "commit",
		Usage: "commit the task's worktree on the host in a sealed git environment",
		Description: `Runs git with no system or global config, hooks, fsmonitor, filters, diff or
merge drivers, pager, editor, ssh command or credential helper, and no GIT_*
variables from the caller; refuses a repository whose .git/config names
anything executable. Whatever the worktree contains, the host runs nothing
from it.

Agent config the task's turns added or changed in the worktree (.claude/,
.opencode/, opencode.json, .mcp.json, CLAUDE.md, AGENTS.md, .envrc, .vscode/,
... — see "shrooms trust --help") would run next in the owner's repository:
the commit is refused (exit 121) unless --allow-agent-config names every such
path; the named paths become trusted for later turns.`,
		Flags: []cli.Flag{
			taskFlag(),
			&cli.StringFlag{Name: "message", Aliases: []string{"m"}, Required: true, Usage: "commit `MESSAGE`"},
			&cli.StringFlag{Name: "author", Usage: "`\"NAME <EMAIL>\"`", DefaultText: "user.name <user.email> from the repository's own config (no includes), else shrooms <shrooms@localhost>"},
			&cli.StringSliceFlag{Name: "allow-agent-config", Usage: "accept the changed agent config at worktree-relative `PATH` (repeat for each)"},
		},
		Action: func(c *cli.Context) error {
			var author gitseal.Author // the owner's, from the repository's config
			if c.IsSet("author") {
				addr, err := mail.ParseAddress(c.String("author"))
				if err != nil || addr.Name == "" {
					return fail(ExitUsage, fmt.Errorf("--author %q is not \"Name <email>\"", c.String("author")))
				}
				author = gitseal.Author{Name: addr.Name, Email: addr.Address}
			}
			return withTask(c, local, nil, func(ctx context.Context, r *task.Commands, id taskid.ID) error {
				res, err := r.Commit(ctx, id, c.String("message"), author, c.StringSlice("allow-agent-config"))
				nothing := errors.Is(err, gitseal.ErrNothingToCommit)
				if err != nil && !nothing {
					if jsonMode(c) && errors.Is(err, task.ErrAgentConfig) {
						_ = printJSON(c.App.Writer, map[string]any{"task": res.Task, "commit": nil, "refused": err.Error(), "agentConfig": res.AgentConfig})
					}
					return fail(codeFor(err), err)
				}
				if jsonMode(c) {
					out := map[string]any{"task": res.Task, "commit": res.Commit, "agentConfig": res.AgentConfig, "accepted": res.Accepted, "author": res.Author}
					if nothing {
						out["commit"] = nil
						out["nothingToCommit"] = true
					}
					return printJSON(c.App.Writer, out)
				}
				for _, p := range res.Accepted {
					textln(c.App.Writer, "accepted agent config "+p)
				}
				if nothing {
					textln(c.App.Writer, "nothing to commit")
					return nil
				}
				textln(c.App.Writer, res.Commit)
				return nil
			})
		},
	}
}

func trustCommand() *cli.Command {
	return &cli.Command{
		Name:      "trust",
		Usage:     "accept the worktree's agent config as the owner's, so later turns stop masking it",
		ArgsUsage: "[PATH...]",
		Description: `Agents load configuration from the worktree: opencode.json(c), .opencode/,
AGENTS.md, .claude/, .mcp.json, CLAUDE.md, CLAUDE.local.md, .gemini/,
GEMINI.md, .env, .codex/, other agents' (.crushrc, crush.json, CRUSH.md,
.github/hooks/, .cursor/, .aider.conf.yml, .amp/; docs/security-model.md
lists them), and tools run .envrc, .vscode/, .devcontainer/, .husky/,
.githooks/, .pre-commit-config.yaml, .tool-versions, mise.toml — at any depth.
A task's first turn records them as the owner's trusted version; in every
later turn, any of them that differs is masked in the cage (the trusted
bytes, or an empty file or directory, mounted read-only over it) and listed
in the result's worktree_guard. "trust" records the current version: of all
of them, or only of the worktree-relative PATHs given, as shrooms shows them
(escaped: a backslash doubled, \u202e for U+202E…). --worktree moves the
task to another worktree (all of its config is then trusted as it is).`,
		Flags: []cli.Flag{
			taskFlag(),
			&cli.StringFlag{Name: "worktree", Usage: "the task's worktree `DIR` (default: the one its turns ran on)"},
		},
		Action: func(c *cli.Context) error {
			return withTask(c, local, nil, func(ctx context.Context, r *task.Commands, id taskid.ID) error {
				paths, err := shownPaths(c.Args().Slice())
				if err != nil {
					return fail(ExitUsage, err)
				}
				res, err := r.Trust(ctx, id, c.String("worktree"), paths)
				if err != nil {
					return fail(codeFor(err), err)
				}
				if jsonMode(c) {
					return printJSON(c.App.Writer, res)
				}
				w := c.App.Writer
				for _, ch := range res.Changes {
					textf(w, "  was %s: %s\n", ch.Change, ch.Path)
				}
				for _, p := range res.Trusted {
					textln(w, "trusted "+p)
				}
				for _, p := range res.Forgotten {
					textln(w, "no longer trusted (gone) "+p)
				}
				for _, p := range res.Loads {
					textln(w, "trusted (loaded by trusted config) "+p)
				}
				for _, o := range res.Outside {
					textf(w, "not followed (out of the worktree): %s in %s\n", o.Spec, o.By)
				}
				textf(w, "%s: %d trusted agent config paths in %s\n", res.Task, res.Entries, res.Worktree)
				return nil
			})
		},
	}
}

func forgetCommand() *cli.Command {
	return &cli.Command{
		Name:  "forget",
		Usage: "remove everything shrooms keeps of a task: cages, HOME (credentials too), outbox, state",
		Description: `The task's worktree and delivered outboxes are left alone. Its user-namespace
slot becomes free for a new task. HOME goes with every mount and loop device
of it, in any mount namespace, one whose image file was deleted included.
A task of which nothing is kept (never run, or forgotten already) is not an
error: forget exits 0 and --json says "forgotten": false. Afterwards forget looks again: anything of the task still there is listed
and it exits 122 instead of reporting success.`,
		Flags: []cli.Flag{taskFlag()},
		Action: func(c *cli.Context) error {
			var id taskid.ID
			r, ctx, stop, err := runnerFor(c, func(cfg *config.Config) (err error) {
				if id, err = taskArg(c); err != nil {
					return err
				}
				return task.CheckForget(cfg, id)
			})
			if errors.Is(err, task.ErrUnknownTask) {
				// Nothing is kept of the task: forgetting it again is done.
				if jsonMode(c) {
					return printJSON(c.App.Writer, map[string]any{"task": c.String("task"), "forgotten": false})
				}
				textln(c.App.Writer, "nothing kept of "+c.String("task"))
				return nil
			}
			if err != nil {
				return err
			}
			defer stop()
			if err := r.Forget(ctx, id); err != nil {
				return fail(codeFor(err), err)
			}
			if jsonMode(c) {
				return printJSON(c.App.Writer, map[string]any{"task": c.String("task"), "forgotten": true})
			}
			textln(c.App.Writer, "forgot "+c.String("task"))
			return nil
		},
	}
}

func resetCommand() *cli.Command {
	return &cli.Command{
		Name:  "reset",
		Usage: "reset the task HOME to the baseline and keep-list now (run does it before every turn)",
		Flags: []cli.Flag{
			taskFlag(),
			&cli.StringFlag{Name: "agent", Usage: "agent `NAME` whose HOME profiles apply (default: the task's last agent)"},
			&cli.BoolFlag{Name: "dry-run", Usage: "report what would be kept, rebuilt and removed; change nothing"},
		},
		Action: func(c *cli.Context) error {
			check := func(cfg *config.Config, id taskid.ID) error {
				if err := task.CheckTask(cfg, id); err != nil {
					return err
				}
				if name := c.String("agent"); name != "" {
					if _, err := cfg.Agent(name); err != nil {
						return err
					}
				}
				return nil
			}
			return withTask(c, withPodman, check, func(ctx context.Context, r *task.Commands, id taskid.ID) error {
				rep, err := r.Reset(ctx, id, c.String("agent"), c.Bool("dry-run"))
				if err != nil {
					return fail(codeFor(err), err)
				}
				if jsonMode(c) {
					return printJSON(c.App.Writer, rep)
				}
				verb := "reset"
				if rep.DryRun {
					verb = "would reset"
				}
				textf(c.App.Writer, "%s %s: kept %d, rebuilt %d, removed %d; baseline %s\n", verb, id, rep.KeptCount, len(rep.Rebuilt), rep.RemovedCount, rep.BaselineDigest)
				for _, w := range rep.Warnings {
					textln(c.App.Writer, "  warning: "+w)
				}
				for _, p := range rep.Removed {
					textln(c.App.Writer, "  removed "+p)
				}
				return nil
			})
		},
	}
}

// shownPaths turns PATHs as shrooms shows them (safetext.Escape) back into
// the names they show.
func shownPaths(args []string) ([]string, error) {
	out := make([]string, 0, len(args))
	for _, a := range args {
		p, err := safetext.Unescape(a)
		if err != nil {
			return nil, fmt.Errorf("PATH %s: give it as shrooms shows it (escaped): %w", a, err)
		}
		out = append(out, p)
	}
	return out, nil
}
