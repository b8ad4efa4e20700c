package turn

import (
	"context"
	"fmt"

	"github.com/shrooms-cage/shrooms/pkg/worktree/diff"

	"github.com/shrooms-cage/shrooms/pkg/worktree"
)

// claims is the worktree door (pkg/worktree) on the runner's state and id
// files.
func (r *Runner) claims() worktree.Claims {
	c := worktree.NewClaims(r.Cfg)
	c.Store, c.IDFiles, c.WalkBefore = r.Store, r.IDFiles, r.walkBefore
	return c
}

// finishWorktree gives the worktree back at the end of a turn, on every path
// out of Run (agent exit, deadline, interruption, errors), unless the change
// scan's walk did (given). A failure is the turn's error unless it already
// has one.
func (r *Runner) finishWorktree(holder worktree.Holder, wt string, given *worktree.Report, res *Result, err error) error {
	if given != nil {
		res.Worktree = given
		res.Phases = append(res.Phases, Phase{Name: "give-back", Ms: given.GiveBackMs})
		return err
	}
	rep, gerr := r.claims().GiveBack(holder, wt)
	if rep != nil {
		res.Worktree = rep
		res.Phases = append(res.Phases, Phase{Name: "give-back", Ms: rep.GiveBackMs})
	}
	if gerr == nil {
		return err
	}
	msg := fmt.Sprintf("worktree not given back to its owner: %v", gerr)
	if err != nil {
		if res.Error == "" {
			res.Error = msg
		}
		return err
	}
	res.Error = msg
	return fmt.Errorf("%w: %s", ErrHostNotReady, msg)
}

// takeWorktree takes the worktree for the turn: the hand-over, or for an
// idmapped one the staging mount (stage: a fresh cage; a prepared one has
// bound its own at init).
func (r *Runner) takeWorktree(ctx context.Context, in *checked, p *Plan, stage bool) (*diff.Snapshot, error) {
	if p.idmap {
		// The guard's directory stats of this turn (its plan's check, taken
		// under the same lock, nothing of the cage run since): the scan
		// before stats only the directories the guard did not.
		return r.claims().TakeIdmapped(ctx, in.holder, in.worktree, p.ids, stage, p.guard.DirStats())
	}
	before, err := r.claims().Take(ctx, in.holder, in.worktree, p.ids)
	if before != nil {
		before.SetWalkWhy("not idmapped (the hand-over's chown walk takes it)")
	}
	return before, err
}
