package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"
	"golang.org/x/sys/unix"

	"github.com/shrooms-cage/shrooms/pkg/config"
	"github.com/shrooms-cage/shrooms/pkg/fault"
	"github.com/shrooms-cage/shrooms/pkg/home"
	"github.com/shrooms-cage/shrooms/pkg/podman"
	"github.com/shrooms-cage/shrooms/pkg/task"
	"github.com/shrooms-cage/shrooms/pkg/taskid"
	"github.com/shrooms-cage/shrooms/pkg/taskstate"
	"github.com/shrooms-cage/shrooms/pkg/teardownd"
	"github.com/shrooms-cage/shrooms/pkg/turn"
)

// teardownCommand is the detached child of `run`: it inherits the task lock
// as file descriptors 3 and 4 (teardown.log as stdout and stderr), removes
// the turn's cage, secrets and old HOME tree, and with --prepare-next
// prepares the task's next cage. With cage.teardown_linger it is also the
// state directory's teardown worker (pkg/teardownd) while it runs and for
// the linger after: later turns hand it their teardowns instead of
// starting a child each. Hidden: only shrooms starts it.
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
			cfg, err := checkedConfig(c, nil)
			if err != nil {
				lock.Release()
				return err
			}
			ctx, stop := signalContext(c.Context)
			defer stop()
			client, err := connect(ctx, cfg)
			if err != nil {
				lock.Release()
				return err
			}
			w := newWorker(c, cfg, client)
			if w == nil {
				return teardownJob(ctx, cfg, client, jobOf(c), lock)
			}
			// A worker: the jobs handed to it run beside this one.
			done := w.srv.Begin()
			served := make(chan struct{})
			go func() {
				defer close(served)
				w.srv.Serve(ctx, w.key, cfg.Cage.TeardownLinger.Std(), func(job teardownd.Job, files []*os.File) {
					w.run(ctx, job, files)
				})
			}()
			if err := teardownJob(ctx, cfg, client, jobOf(c), lock); err != nil {
				warn(c.App.ErrWriter, err.Error())
			}
			// Its own job's teardown.log goes (a task's teardown is over
			// when no one holds that file: itest.Env.WaitIdle).
			releaseStdio()
			done()
			// Lingering, it holds the heap of a few jobs at most (resident
			// ~44 MB after 45 jobs; 71 MB with 64 MiB).
			debug.SetMemoryLimit(32 << 20)
			<-served
			return nil
		},
	}
}

// jobOf is the job teardown-detached's flags describe.
func jobOf(c *cli.Context) teardownd.Job {
	return teardownd.Job{
		Task: c.String("task"), Agent: c.String("agent"), Cage: c.String("cage"), Secrets: c.StringSlice("secret"),
		PrepareNext: c.Bool("prepare-next"), Worktree: c.String("worktree"), Stdin: c.Bool("stdin"), Timeout: c.Duration("timeout"),
		Gate: os.Getenv(teardownd.GateEnv), RemoveGate: os.Getenv(teardownd.RemoveGateEnv),
	}
}

// jobArgs are teardown-detached's arguments for job (the gates go in the
// environment).
func jobArgs(job teardownd.Job, config string) []string {
	args := []string{"teardown-detached", "--task", job.Task, "--agent", job.Agent}
	if config != "" {
		args = append(args, "--config", config)
	}
	for _, s := range job.Secrets {
		args = append(args, "--secret", s)
	}
	if job.Cage != "" {
		args = append(args, "--cage", job.Cage)
	}
	if job.PrepareNext {
		args = append(args, "--prepare-next")
	}
	if job.Worktree != "" {
		args = append(args, "--worktree", job.Worktree)
	}
	if job.Stdin {
		args = append(args, "--stdin")
	}
	if job.Timeout != 0 {
		args = append(args, "--timeout", job.Timeout.String())
	}
	return args
}

// teardownJob is one turn's teardown, under the task lock handed to it:
// the gates tests hold it at, the job's check against the config (as
// `run` checked the turn), then turn.Runner.FinishTeardown and, at most
// once per task.ExpireEvery, the sweep of expired prepared cages.
func teardownJob(ctx context.Context, cfg *config.Config, client *podman.Client, job teardownd.Job, lock *taskstate.Lock) error {
	// Tests hold the teardown here to see the cage before it goes and to
	// kill the process half-way.
	if job.Gate != "" {
		waitGate(job.Gate)
	}
	req, err := jobRequest(cfg, job)
	if err != nil {
		lock.Release()
		code := ExitUsage
		if fault.Of(err) == fault.HostNotReady {
			code = ExitHostNotReady
		}
		return fail(code, err)
	}
	r := newRunner(cfg, client)
	// Tests hold the teardown here, the task lock dropped and the next
	// cage prepared, to run turns before the exited cage goes.
	if job.RemoveGate != "" {
		r.BeforeLateRemove = func() { waitGate(job.RemoveGate) }
	}
	var next *turn.Request
	if job.PrepareNext {
		next = &req
	}
	td := turn.Teardown{Task: req.Task, Agent: job.Agent, Cage: job.Cage, Secrets: job.Secrets}
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
}

// jobRequest is the turn request of a job (its next turn's, when it
// prepares one), checked as checkTurn checks `run`'s.
func jobRequest(cfg *config.Config, job teardownd.Job) (turn.Request, error) {
	id, err := taskid.Parse(job.Task)
	if err != nil {
		return turn.Request{}, fmt.Errorf("%w: %w", turn.ErrInput, err)
	}
	req := turn.Request{Task: id, Agent: job.Agent, Worktree: job.Worktree, Timeout: job.Timeout,
		Streams: podman.Streams{Stdout: io.Discard, Stderr: io.Discard}}
	if job.Stdin {
		req.Streams.Stdin = strings.NewReader("")
	}
	if err := turn.ValidateRequest(cfg, req); err != nil {
		return req, err
	}
	if agent, err := cfg.Agent(job.Agent); err == nil {
		return req, home.CheckBaseline(cfg, agent.Home)
	}
	return req, nil
}

// releaseStdio points stdin, stdout and stderr at /dev/null: a lingering
// worker keeps no file of the turn that started it.
func releaseStdio() {
	null, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		return
	}
	defer null.Close()
	for fd := 0; fd <= 2; fd++ {
		_ = unix.Dup3(int(null.Fd()), fd, 0)
	}
}

// worker is this teardown process as the state directory's worker.
type worker struct {
	srv    *teardownd.Server
	key    string
	cfg    *config.Config
	client *podman.Client
	layout taskstate.Layout
}

// newWorker makes this process the state directory's teardown worker, or
// returns nil: no linger configured, another worker there, or anything
// unclear (then this process is a child as without a worker).
func newWorker(c *cli.Context, cfg *config.Config, client *podman.Client) *worker {
	if cfg.Cage.TeardownLinger.Std() <= 0 {
		return nil
	}
	exe, err := os.Executable()
	if err != nil {
		return nil
	}
	if exe, err = filepath.EvalSymlinks(exe); err != nil {
		return nil
	}
	key, err := teardownd.Key(exe, "/proc/self/exe", resolvedConfigPath(c), cfg.Digest(), cfg.State.Dir)
	if err != nil {
		return nil
	}
	layout := taskstate.Layout{Dir: cfg.State.Dir}
	srv, err := teardownd.Listen(layout.TeardownSocket(), layout.TeardownWorker())
	if err != nil {
		if !errors.Is(err, teardownd.ErrTaken) {
			warn(c.App.ErrWriter, fmt.Sprintf("%v (this teardown does not linger)", err))
		}
		return nil
	}
	return &worker{srv: srv, key: key, cfg: cfg, client: client, layout: layout}
}

// run is a job handed to the worker: its output goes to the task's
// teardown.log it came with.
func (w *worker) run(ctx context.Context, job teardownd.Job, files []*os.File) {
	lockFile, lockDir, logf := files[0], files[1], files[2]
	defer logf.Close()
	lock, err := w.adopt(job, lockFile, lockDir, logf)
	if err != nil {
		lockFile.Close()
		lockDir.Close()
		warn(logf, err.Error())
		return
	}
	if err := teardownJob(ctx, w.cfg, w.client, job, lock); err != nil {
		warn(logf, err.Error())
	}
}

// adopt takes over the task lock handed with a job, once the files are
// the task's own: its lock file, its directory and its teardown.log.
func (w *worker) adopt(job teardownd.Job, lockFile, lockDir, logf *os.File) (*taskstate.Lock, error) {
	id, err := taskid.Parse(job.Task)
	if err != nil {
		return nil, fmt.Errorf("teardown worker: %w", err)
	}
	for _, f := range []struct {
		file *os.File
		path string
	}{{lockFile, w.layout.TaskFile(id, "lock")}, {lockDir, w.layout.Task(id)}, {logf, w.layout.TaskFile(id, "teardown.log")}} {
		var got, want unix.Stat_t
		if err := unix.Fstat(int(f.file.Fd()), &got); err != nil {
			return nil, fmt.Errorf("teardown worker: %w", err)
		}
		if err := unix.Lstat(f.path, &want); err != nil {
			return nil, fmt.Errorf("teardown worker: %w", err)
		}
		if got.Dev != want.Dev || got.Ino != want.Ino {
			return nil, fmt.Errorf("teardown worker: the file handed as %s is another", f.path)
		}
	}
	return taskstate.AdoptLock(lockFile, lockDir)
}

// detacher hands a turn's teardown to the state directory's lingering
// worker when one of the same key answers, else starts `shrooms
// teardown-detached`: the same binary, in a new session (a Ctrl-C at the
// terminal does not reach it), stdin from /dev/null, its output in the
// task's teardown.log. Either holds teardown.log (a shared flock) until
// the job is done.
func detacher(c *cli.Context, r *turn.Runner, prepareNext bool) turn.Detacher {
	return func(td turn.Teardown) (int, error) {
		exe := r.Binary
		if exe == "" {
			var err error
			if exe, err = os.Executable(); err != nil {
				return 0, fmt.Errorf("detach teardown: %w", err)
			}
		}
		job := teardownd.Job{Task: td.Task.String(), Agent: td.Agent, Cage: td.Cage, Secrets: td.Secrets,
			Gate: os.Getenv(teardownd.GateEnv), RemoveGate: os.Getenv(teardownd.RemoveGateEnv)}
		if prepareNext {
			job.PrepareNext, job.Worktree, job.Stdin = true, c.String("worktree"), c.Bool("stdin")
			if c.IsSet("timeout") {
				job.Timeout = c.Duration("timeout")
			}
		}
		layout := taskstate.Layout{Dir: r.Cfg.State.Dir}
		logf, err := os.OpenFile(layout.TaskFile(td.Task, "teardown.log"), os.O_WRONLY|os.O_CREATE|os.O_TRUNC|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0o600)
		if err != nil {
			return 0, fmt.Errorf("detach teardown: %w", err)
		}
		defer logf.Close()
		if err := unix.Flock(int(logf.Fd()), unix.LOCK_SH); err != nil {
			return 0, fmt.Errorf("detach teardown: %w", err)
		}
		if r.Cfg.Cage.TeardownLinger.Std() > 0 {
			if key, err := teardownd.Key(exe, exe, resolvedConfigPath(c), r.Cfg.Digest(), r.Cfg.State.Dir); err == nil {
				if pid, err := teardownd.Hand(layout.TeardownSocket(), key, job, []*os.File{td.Lock, td.LockDir, logf}); err == nil {
					return pid, nil
				}
			}
		}
		cmd := exec.Command(exe, jobArgs(job, configPath(c))...)
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
