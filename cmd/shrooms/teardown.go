package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/shrooms-cage/shrooms/pkg/task"
	"github.com/shrooms-cage/shrooms/pkg/taskid"
	"github.com/shrooms-cage/shrooms/pkg/taskstate"
	"github.com/shrooms-cage/shrooms/pkg/turn"
)

// teardownCommand is the detached child of `run`: it inherits the task lock
// as file descriptor 3, removes the turn's cage, secrets and old HOME tree,
// and with --prepare-next prepares the task's next cage. Hidden: only
// shrooms starts it.
func teardownCommand() *cli.Command {
	return &cli.Command{
		Name:   "teardown-detached",
		Hidden: true,
		Flags: append(append(turnFlags(), globalFlags(false)...),
			&cli.StringSliceFlag{Name: "secret"},
			&cli.StringFlag{Name: "cage"},
			&cli.BoolFlag{Name: "prepare-next"}),
		Action: func(c *cli.Context) error {
			lockFile, lockDir := os.NewFile(3, "task-lock"), os.NewFile(4, "task-dir-lock")
			if lockFile == nil || lockDir == nil {
				return fail(ExitUsage, errors.New("teardown-detached needs the task lock as file descriptors 3 and 4"))
			}
			lock, err := taskstate.AdoptLock(lockFile, lockDir)
			if err != nil {
				return fail(ExitHostNotReady, err)
			}
			// Tests hold the child here to see the cage before it goes and
			// to kill the child half-way.
			if gate := os.Getenv("SHROOMS_TEARDOWN_GATE"); gate != "" {
				waitGate(gate)
			}
			var id taskid.ID
			r, ctx, stop, err := pipelineFor(c, checkTurn(c, &id))
			if err != nil {
				lock.Release()
				return err
			}
			defer stop()
			// Tests hold the child here, the task lock dropped and the next
			// cage prepared, to run turns before the exited cage goes.
			if gate := os.Getenv("SHROOMS_TEARDOWN_REMOVE_GATE"); gate != "" {
				r.BeforeLateRemove = func() { waitGate(gate) }
			}
			var next *turn.Request
			if c.Bool("prepare-next") {
				req := turnRequest(c, id)
				req.Args = nil
				next = &req
			}
			td := turn.Teardown{Task: id, Agent: c.String("agent"), Cage: c.String("cage"), Secrets: c.StringSlice("secret")}
			if err := r.FinishTeardown(ctx, lock, td, next); err != nil {
				return fail(codeFor(err), err)
			}
			// Off every caller's path: prepared cages that waited too long,
			// looked for once per task.ExpireEvery, not at every turn.
			if tc := task.New(r.Cfg, r.Podman); tc.ExpireDue(time.Now()) {
				if _, err := tc.ExpirePrepared(ctx, false); err != nil {
					return fail(codeFor(err), err)
				}
			}
			return nil
		},
	}
}

// detacher starts `shrooms teardown-detached` for a turn of `run`: the same
// binary, in a new session (a Ctrl-C at the terminal does not reach it),
// stdin from /dev/null, its output in the task's teardown.log.
func detacher(c *cli.Context, r *turn.Runner, prepareNext bool) turn.Detacher {
	return func(td turn.Teardown) (int, error) {
		exe := r.Binary
		if exe == "" {
			var err error
			if exe, err = os.Executable(); err != nil {
				return 0, fmt.Errorf("detach teardown: %w", err)
			}
		}
		args := []string{"teardown-detached", "--task", td.Task.String(), "--agent", td.Agent}
		if p := configPath(c); p != "" {
			args = append(args, "--config", p)
		}
		for _, s := range td.Secrets {
			args = append(args, "--secret", s)
		}
		if td.Cage != "" {
			args = append(args, "--cage", td.Cage)
		}
		if prepareNext {
			args = append(args, "--prepare-next")
			if w := c.String("worktree"); w != "" {
				args = append(args, "--worktree", w)
			}
			if c.Bool("stdin") {
				args = append(args, "--stdin")
			}
			if c.IsSet("timeout") {
				args = append(args, "--timeout", c.Duration("timeout").String())
			}
		}
		logPath := taskstate.Layout{Dir: r.Cfg.State.Dir}.TaskFile(td.Task, "teardown.log")
		logf, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0o600)
		if err != nil {
			return 0, fmt.Errorf("detach teardown: %w", err)
		}
		defer logf.Close()
		cmd := exec.Command(exe, args...)
		cmd.Stdout, cmd.Stderr = logf, logf
		cmd.ExtraFiles = []*os.File{td.Lock, td.LockDir}
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		if err := cmd.Start(); err != nil {
			return 0, fmt.Errorf("detach teardown: %w", err)
		}
		pid := cmd.Process.Pid
		_ = cmd.Process.Release()
		return pid, nil
	}
}

// waitGate waits, at most taskstate.TeardownWait, for the file gate a test
// creates to let a detached teardown go on.
func waitGate(gate string) {
	for deadline := time.Now().Add(taskstate.TeardownWait); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if _, err := os.Lstat(gate); err == nil {
			return
		}
	}
}
