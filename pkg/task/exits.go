package task

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/shrooms-cage/shrooms/pkg/fault"
	"github.com/shrooms-cage/shrooms/pkg/gitseal"
	"github.com/shrooms-cage/shrooms/pkg/home"
	"github.com/shrooms-cage/shrooms/pkg/outbox"
	"github.com/shrooms-cage/shrooms/pkg/taskid"
	"github.com/shrooms-cage/shrooms/pkg/taskstate"
	"github.com/shrooms-cage/shrooms/pkg/turn"
	"github.com/shrooms-cage/shrooms/pkg/worktree"
	"github.com/shrooms-cage/shrooms/pkg/worktree/guard"
)

// ErrUnknownTask is a task shrooms has no state of.
var ErrUnknownTask = errors.New("unknown task")

// withTask runs f with the task's id under the task lock, for a task that
// exists. It is the phase of the commands on one task: a failure of f that
// no callee kinded (the state directory, the worktree's trust store, the
// HOME's reset) is the host's to fix; f kinds the bad input it finds.
func (r *Commands) withTask(task taskid.ID, f func(id taskid.ID) error) error {
	id, err := r.knownTask(task)
	if err != nil {
		return err
	}
	lock, err := r.Store.LockTask(id)
	if err != nil {
		return turn.Classify(err)
	}
	defer lock.Release()
	return fault.Default(fault.HostNotReady, f(id))
}

// Collect moves the task's pending deliveries (what its turns left in
// /outbox, moved out at each turn's end) into to (or a new directory under
// the state dir), under the task lock so no turn adds to them meanwhile.
func (r *Commands) Collect(ctx context.Context, task taskid.ID, to string) (*outbox.Report, error) {
	var rep *outbox.Report
	err := r.withTask(task, func(id taskid.ID) error {
		wt, err := r.Store.Recall(id, taskstate.FactWorktree)
		if err != nil {
			return err
		}
		if to == "" {
			// The default delivery directory's parents are shrooms' own,
			// made here on first use (0700: deliveries are the owner's).
			to = taskstate.Layout{Dir: r.Cfg.State.Dir}.Delivery(id, time.Now().UTC().Format("20060102T150405.000000000Z"))
			if err := mkdirPrivate(filepath.Dir(to)); err != nil {
				return fmt.Errorf("default delivery directory: %w", err)
			}
		}
		cctx, cancel := context.WithTimeout(ctx, r.Cfg.Outbox.CollectTimeout.Std())
		defer cancel()
		rep, err = outbox.Collect(cctx, outbox.Request{Root: r.Cfg.Outbox.Root, Task: task, To: to, Limits: outbox.LimitsFrom(r.Cfg.Outbox), Worktree: wt})
		if err != nil {
			return fmt.Errorf("%w: %w", fault.Input, err)
		}
		return nil
	})
	return rep, err
}

// mkdirPrivate makes dir and its missing parents with mode 0700, and
// refuses one that is not a directory of its own (a symbolic link).
func mkdirPrivate(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return fmt.Errorf("%s is not a directory", dir)
	}
	return nil
}

// ListOutbox reports what Collect would deliver, changing nothing.
func (r *Commands) ListOutbox(ctx context.Context, task taskid.ID) (*outbox.Report, error) {
	var rep *outbox.Report
	err := r.withTask(task, func(id taskid.ID) error {
		var err error
		rep, err = outbox.List(ctx, r.Cfg.Outbox.Root, task, outbox.LimitsFrom(r.Cfg.Outbox))
		if err != nil {
			return fmt.Errorf("%w: %w", fault.Input, err)
		}
		return nil
	})
	return rep, err
}

// ReleaseOutbox discards the task's pending deliveries and unmounts its
// outbox wherever it is still mounted (a prepared cage then no longer
// matches, and is prepared afresh).
func (r *Commands) ReleaseOutbox(task taskid.ID) error {
	return r.withTask(task, func(id taskid.ID) error { return r.releaseOutbox(task) })
}

// CommitResult is what Commit did.
type CommitResult struct {
	Task string `json:"task"`
	// Commit is the new commit id ("" when there was nothing to commit).
	Commit string `json:"commit"`
	// AgentConfig are the guarded paths that differ from the owner's trusted
	// version; Accepted those --allow-agent-config named (now trusted).
	AgentConfig []guard.Change `json:"agentConfig"`
	Accepted    []string       `json:"accepted"`
	// Author is who the commit names as author and committer.
	Author string `json:"author,omitempty"`
}

// Commit commits the task's worktree on the host in a sealed git
// environment, under the task lock so the cage cannot race it. Agent
// config that a turn added or changed (pkg/worktree/guard) is the next thing the
// owner's repository would run: the commit is refused unless every such
// path is named in allow, and the named ones become trusted.
func (r *Commands) Commit(ctx context.Context, task taskid.ID, message string, author gitseal.Author, allow []string) (*CommitResult, error) {
	res := &CommitResult{Task: task.String(), AgentConfig: []guard.Change{}, Accepted: []string{}}
	var nothing error // gitseal.ErrNothingToCommit: no failure, so no kind
	err := r.withTask(task, func(id taskid.ID) error {
		wt, err := r.Store.Recall(id, taskstate.FactWorktree)
		if err != nil {
			return err
		}
		if wt == "" {
			return fmt.Errorf("%w: task %q has no worktree (run it with --worktree)", fault.Input, task)
		}
		store := r.trustStore(task)
		m, err := store.Load()
		if err != nil {
			return err
		}
		if m == nil {
			return fmt.Errorf("%w: task %q has no trusted record of its worktree's agent config; review %s and run `shrooms trust --task %s` first", fault.Input, task, wt, task)
		}
		check, err := store.Guard(ctx, wt, m)
		if err != nil {
			return fmt.Errorf("%w: %w", fault.Input, err)
		}
		res.AgentConfig = check.Changes
		if err := acceptAgentConfig(check.Changes, allow); err != nil {
			return err
		}
		commit, used, err := gitseal.CommitAs(ctx, wt, message, author)
		res.Author = used.Name + " <" + used.Email + ">"
		if errors.Is(err, gitseal.ErrNothingToCommit) {
			nothing = err
		} else if err != nil {
			return fmt.Errorf("%w: %w", fault.Input, err)
		}
		res.Commit = commit
		if len(allow) > 0 {
			if _, terr := store.Trust(ctx, wt, allow); terr != nil {
				return fmt.Errorf("committed %s, but trusting %v failed: %w", commit, allow, terr)
			}
			res.Accepted = append(res.Accepted, allow...)
		}
		return nil
	})
	if err == nil {
		err = nothing
	}
	return res, err
}

// acceptAgentConfig refuses unless allow names every added or changed
// guarded path, and names nothing else.
func acceptAgentConfig(changes []guard.Change, allow []string) error {
	named := map[string]bool{}
	for _, p := range allow {
		named[p] = true
	}
	var pending []string
	for _, c := range changes {
		if c.Change == "deleted" {
			delete(named, c.Path)
			continue
		}
		if named[c.Path] {
			delete(named, c.Path)
			continue
		}
		pending = append(pending, fmt.Sprintf("%s (%s: %s)", c.Path, c.Change, c.Why))
	}
	if len(pending) > 0 {
		return fmt.Errorf("%w: %w: %s; review them and name each with --allow-agent-config PATH to commit", fault.Input, ErrAgentConfig, strings.Join(pending, ", "))
	}
	for p := range named {
		return fmt.Errorf("%w: --allow-agent-config %q names no changed agent config", fault.Input, p)
	}
	return nil
}

// ErrAgentConfig is a commit refused because of untrusted agent config.
var ErrAgentConfig = errors.New("the worktree has agent config the owner has not trusted")

// TrustResult is what Trust did.
type TrustResult struct {
	Task string `json:"task"`
	*guard.TrustResult
	// Changes are what differed from the trusted version before.
	Changes []guard.Change `json:"changes"`
}

// Trust records the worktree's agent config (all of it, or the given
// worktree-relative paths) as the owner's trusted version, so later turns
// no longer mask it. worktree "" means the task's remembered worktree.
func (r *Commands) Trust(ctx context.Context, task taskid.ID, path string, paths []string) (*TrustResult, error) {
	for _, p := range paths {
		if p == "" || strings.HasPrefix(p, "/") || p != filepath.ToSlash(filepath.Clean(p)) || strings.HasPrefix(p, "../") || p == ".." {
			return nil, fmt.Errorf("%w: %q is not a clean worktree-relative path", fault.Input, p)
		}
	}
	res := &TrustResult{Task: task.String(), Changes: []guard.Change{}}
	err := r.withTask(task, func(id taskid.ID) error {
		if path == "" {
			var err error
			if path, err = r.Store.Recall(id, taskstate.FactWorktree); err != nil {
				return err
			}
			if path == "" {
				return fmt.Errorf("%w: task %q has no worktree; pass --worktree", fault.Input, task)
			}
		}
		wt, err := worktree.CheckPath(r.Cfg, path)
		if err != nil {
			return err
		}
		store := r.trustStore(task)
		if m, err := store.Load(); err == nil && m != nil && m.Worktree == wt {
			if c, err := store.Guard(ctx, wt, m); err == nil {
				res.Changes = c.Changes
			}
		}
		tr, err := store.Trust(ctx, wt, paths)
		if err != nil {
			return fmt.Errorf("%w: %w", fault.Input, err)
		}
		res.TrustResult = tr
		return r.Store.Remember(id, taskstate.FactWorktree, wt)
	})
	return res, err
}

// Reset resets the task HOME now (or, with dryRun, reports what a reset
// would do). agent "" means the agent of the task's last turn.
func (r *Commands) Reset(ctx context.Context, task taskid.ID, agent string, dryRun bool) (*home.Report, error) {
	var rep *home.Report
	err := r.withTask(task, func(id taskid.ID) error {
		if agent == "" {
			var err error
			if agent, err = r.Store.Recall(id, taskstate.FactAgent); err != nil {
				return err
			}
			if agent == "" {
				return fmt.Errorf("%w: task %q has run no agent yet; pass --agent", fault.Input, task)
			}
		}
		a, err := r.Cfg.Agent(agent)
		if err != nil {
			return fmt.Errorf("%w: %w", fault.Input, err)
		}
		ids, err := r.Store.TaskIDs(id, r.IDFiles, false)
		if err != nil {
			return err
		}
		root, err := r.Homes.Mounted(ctx, task)
		if err != nil {
			return err
		}
		st, err := r.Store.Task(id)
		if err != nil {
			return err
		}
		kept, err := home.KeptProfiles(r.Cfg, st, a.Home)
		if err != nil {
			return err
		}
		rep, err = home.Reset(ctx, home.ResetInput{Task: home.TaskOf(r.Cfg, root, ids, a.Home, kept), DryRun: dryRun})
		if err != nil {
			return fmt.Errorf("HOME reset: %w", err)
		}
		if !dryRun {
			if _, err := home.Cleanup(ctx, root); err != nil {
				return fmt.Errorf("HOME cleanup: %w", err)
			}
		}
		return r.releaseHome(ctx, task)
	})
	return rep, err
}
