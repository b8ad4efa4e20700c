package turn

import (
	"fmt"

	"github.com/shrooms-cage/shrooms/pkg/config"
	"github.com/shrooms-cage/shrooms/pkg/home"
	"github.com/shrooms-cage/shrooms/pkg/taskstate"
	"github.com/shrooms-cage/shrooms/pkg/worktree"
)

// ValidateRequest checks a request's input against cfg — task id, agent,
// timeout, token files, worktree (allowlist and one task per worktree) —
// without contacting podman or changing anything, so that bad input is
// refused (ErrInput) before shrooms connects anywhere.
func ValidateRequest(cfg *config.Config, req Request) error {
	_, err := checkInput(cfg, req)
	return err
}

// checkInput is the input half of check. It unpacks the request: what the
// turn uses of it after check is in the checked it returns.
func checkInput(cfg *config.Config, req Request) (*checked, error) {
	task := req.Task
	if task.IsZero() {
		return nil, fmt.Errorf("%w: no task id", ErrInput)
	}
	agent, err := cfg.Agent(req.Agent)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInput, err)
	}
	if req.Timeout < 0 {
		return nil, fmt.Errorf("%w: timeout must be positive", ErrInput)
	}
	tokens, err := readTokens(cfg, agent)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInput, err)
	}
	state, err := taskstate.Store{Dir: cfg.State.Dir}.Task(task)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInput, err)
	}
	holder, err := worktree.NewClaims(cfg).Holder(task)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInput, err)
	}
	in := &checked{
		state: state, holder: holder, home: home.NewStore(nil, cfg).Volume(task), dir: cfg.State.Dir + "/tasks/" + task.String(),
		agentName: req.Agent, agent: agent, tokens: tokens,
		command: req.Command, args: req.Args, extraMounts: req.ExtraMounts,
		streams: req.Streams, terminal: req.Terminal, timeout: req.Timeout,
	}
	if in.timeout <= 0 {
		in.timeout = cfg.Cage.Timeout.Std()
	}
	wt := req.Worktree
	if wt == "" {
		// The task's worktree is sticky: a turn without --worktree runs on
		// the one its earlier turns ran on (an empty /work only for a task
		// that never had one).
		recorded, err := in.state.Recall(taskstate.FactWorktree)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrHostNotReady, err)
		}
		if wt = recorded; wt != "" {
			if _, err := worktree.CheckPath(cfg, wt); err != nil {
				return nil, fmt.Errorf("task %s runs on the worktree its earlier turns ran on (%s), which is no longer usable; pass --worktree DIR to move it, or start a new task: %w", req.Task, wt, err)
			}
		}
	}
	if wt != "" {
		if in.worktree, err = worktree.CheckPath(cfg, wt); err != nil {
			return nil, err
		}
		if err := worktree.NewClaims(cfg).Check(in.holder, in.worktree); err != nil {
			return nil, err
		}
	}
	return in, nil
}
