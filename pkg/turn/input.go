package turn

import (
	"fmt"
	"path/filepath"
	"strings"

	"github.com/shrooms-cage/shrooms/pkg/config"
	"github.com/shrooms-cage/shrooms/pkg/mounts"
	"github.com/shrooms-cage/shrooms/pkg/taskstate"
)

// ValidateRequest checks a request's input against cfg — task id, agent,
// timeout, token files, worktree (allowlist and one task per worktree) —
// without contacting podman or changing anything, so that bad input is
// refused (ErrInput) before shrooms connects anywhere.
func ValidateRequest(cfg *config.Config, req Request) error {
	_, err := checkInput(cfg, req)
	return err
}

// checkInput is the input half of check.
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
	in := &checked{task: task, agent: agent, tokens: tokens}
	worktree := req.Worktree
	if worktree == "" {
		// The task's worktree is sticky: a turn without --worktree runs on
		// the one its earlier turns ran on (an empty /work only for a task
		// that never had one).
		recorded, err := taskstate.Store{Dir: cfg.State.Dir}.Recall(task, taskstate.FactWorktree)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrHostNotReady, err)
		}
		if worktree = recorded; worktree != "" {
			if _, err := worktreePath(cfg, worktree); err != nil {
				return nil, fmt.Errorf("task %s runs on the worktree its earlier turns ran on (%s), which is no longer usable; pass --worktree DIR to move it, or start a new task: %w", req.Task, worktree, err)
			}
		}
	}
	if worktree != "" {
		if in.worktree, err = worktreePath(cfg, worktree); err != nil {
			return nil, err
		}
		if err := checkClaim(cfg.State.Dir, req.Task, in.worktree); err != nil {
			return nil, err
		}
	}
	return in, nil
}

// worktreePath validates a worktree (mounts.CheckWorktree: a git work tree
// or inside [worktree] roots, never a system or home root, never shrooms'
// own directories) and returns it cleaned.
func worktreePath(cfg *config.Config, path string) (string, error) {
	forbidden := []string{cfg.State.Dir, cfg.Outbox.Root, filepath.Dir(strings.TrimPrefix(cfg.Podman.Socket, "unix://"))}
	wt, err := mounts.CheckWorktree(path, cfg.Worktree.Roots, forbidden)
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrInput, err)
	}
	return wt, nil
}
