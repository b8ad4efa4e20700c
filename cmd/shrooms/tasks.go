package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/shrooms-cage/shrooms/pkg/config"
	"github.com/shrooms-cage/shrooms/pkg/task"
	"github.com/shrooms-cage/shrooms/pkg/taskid"
)

// stateRunner is a runner for the task commands: they read the state
// directory and signal shrooms processes, and never contact podman.
func stateRunner(c *cli.Context, withTask bool) (*task.Commands, taskid.ID, error) {
	var id taskid.ID
	cfg, err := loadConfig(c)
	if err != nil {
		return nil, id, err
	}
	if withTask {
		if id, err = taskid.Parse(c.String("task")); err != nil {
			return nil, id, fail(ExitUsage, err)
		}
	}
	return lazyCommands(cfg), id, nil
}

func tasksCommand() *cli.Command {
	return &cli.Command{
		Name:  "tasks",
		Usage: "list every task: turns, busy, last status, HOME size",
		Action: func(c *cli.Context) error {
			r, _, err := stateRunner(c, false)
			if err != nil {
				return err
			}
			ts, err := r.Tasks()
			if err != nil {
				return fail(codeFor(err), err)
			}
			showPrepared(c, r, ts)
			if jsonMode(c) {
				return printJSON(c.App.Writer, map[string]any{"tasks": ts})
			}
			textf(c.App.Writer, "%-32s %5s %-5s %-12s %5s %10s %-9s %s\n", "TASK", "TURNS", "BUSY", "LAST", "EXIT", "HOME", "PREPARED", "ENDED")
			for _, t := range ts {
				last, exit, ended := "-", "-", "-"
				if t.Last != nil {
					last, exit, ended = t.Last.Status, fmt.Sprint(t.Last.ExitCode), t.Last.EndedAt
				}
				textf(c.App.Writer, "%-32s %5d %-5v %-12s %5s %10s %-9s %s\n", t.Task, t.Turns, t.Busy, last, exit, config.Size(t.HomeBytes>>20<<20), preparedText(t), ended)
			}
			return nil
		},
	}
}

func statusCommand() *cli.Command {
	return &cli.Command{
		Name:  "status",
		Usage: "show one task: turns, whether a turn runs (and its process), last turn, HOME size",
		Flags: []cli.Flag{taskFlag()},
		Action: func(c *cli.Context) error {
			r, id, err := stateRunner(c, true)
			if err != nil {
				return err
			}
			st, err := r.Status(id)
			if err != nil {
				return fail(codeFor(err), err)
			}
			sts := []task.TaskStatus{*st}
			showPrepared(c, r, sts)
			st = &sts[0]
			if jsonMode(c) {
				return printJSON(c.App.Writer, st)
			}
			w := c.App.Writer
			textf(w, "task      %s\nturns     %d\n", st.Task, st.Turns)
			if st.Busy {
				textf(w, "busy      yes (shrooms process %d)\n", st.PID)
			} else {
				textln(w, "busy      no")
			}
			textf(w, "agent     %s\nworktree  %s\nhome      %d bytes\n", st.Agent, st.Worktree, st.HomeBytes)
			textf(w, "prepared  %s\n", preparedText(*st))
			if st.Last != nil {
				textf(w, "last      turn %d: %s, exit %d, %.0f ms, %s .. %s%s\n", st.Last.Turn, st.Last.Status, st.Last.ExitCode, st.Last.TotalMs, st.Last.StartedAt, st.Last.EndedAt, errSuffix(st.Last.Error))
			}
			return nil
		},
	}
}

// showPrepared adds the tasks' waiting prepared cages when podman answers
// within five seconds; without podman the listing is complete otherwise.
func showPrepared(c *cli.Context, r *task.Commands, sts []task.TaskStatus) {
	ctx, cancel := context.WithTimeout(c.Context, 5*time.Second)
	defer cancel()
	r.ShowPrepared(ctx, sts)
}

func preparedText(t task.TaskStatus) string {
	if !t.Prepared {
		return "-"
	}
	return (time.Duration(t.PreparedAgeS) * time.Second).String()
}

func errSuffix(e string) string {
	if e == "" {
		return ""
	}
	return " (" + e + ")"
}

func logCommand() *cli.Command {
	return &cli.Command{
		Name:  "log",
		Usage: "show the records of the task's turns (the run --json result of each, reset report included)",
		Flags: []cli.Flag{taskFlag(), &cli.IntFlag{Name: "turn", Usage: "only turn `N`"}},
		Action: func(c *cli.Context) error {
			r, id, err := stateRunner(c, true)
			if err != nil {
				return err
			}
			if c.Int("turn") < 0 {
				return fail(ExitUsage, fmt.Errorf("--turn must be positive"))
			}
			recs, err := r.Log(id, c.Int("turn"))
			if err != nil {
				return fail(codeFor(err), err)
			}
			if jsonMode(c) {
				return printJSON(c.App.Writer, map[string]any{"task": c.String("task"), "turns": recs})
			}
			for _, rec := range recs {
				phases := make([]string, 0, len(rec.Phases))
				for _, p := range rec.Phases {
					phases = append(phases, fmt.Sprintf("%s %.0f", p.Name, p.Ms))
				}
				textf(c.App.Writer, "turn %d  %s  %s  exit %d  %.0f ms  [%s]%s\n", rec.Turn, rec.Agent, rec.Status, rec.ExitCode, rec.TotalMs, strings.Join(phases, ", "), errSuffix(rec.Error))
				if rec.Reset != nil {
					textf(c.App.Writer, "        reset: kept %d, rebuilt %d, removed %d\n", rec.Reset.KeptCount, len(rec.Reset.Rebuilt), rec.Reset.RemovedCount)
				}
			}
			return nil
		},
	}
}

func stopCommand() *cli.Command {
	return &cli.Command{
		Name:  "stop",
		Usage: "end the task's running turn from another process (its cage stopped and removed; that run exits 130)",
		Description: `Sends SIGTERM to the shrooms process that holds the task, which stops the
cage (SIGTERM, then SIGKILL after cage.stop_grace), removes it, gives the
worktree back, records the turn and exits 130; waits until it has. With no
turn running it changes nothing and says so.`,
		Flags: []cli.Flag{taskFlag()},
		Action: func(c *cli.Context) error {
			r, id, err := stateRunner(c, true)
			if err != nil {
				return err
			}
			res, err := r.Stop(id, r.StopWait())
			if err != nil {
				return fail(codeFor(err), err)
			}
			if jsonMode(c) {
				return printJSON(c.App.Writer, res)
			}
			if res.Stopped {
				textf(c.App.Writer, "stopped turn %d of %s (shrooms process %d)\n", res.Turn, res.Task, res.PID)
			} else {
				textf(c.App.Writer, "no turn of %s is running\n", res.Task)
			}
			return nil
		},
	}
}
