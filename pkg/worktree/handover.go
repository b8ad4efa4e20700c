package worktree

import (
	"context"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/shrooms-cage/shrooms/pkg/config"
	"github.com/shrooms-cage/shrooms/pkg/fault"
	"github.com/shrooms-cage/shrooms/pkg/taskstate"
	"github.com/shrooms-cage/shrooms/pkg/worktree/diff"
	"github.com/shrooms-cage/shrooms/pkg/wtcap"
)

// handOver gives the worktree to the task's agent (host uid, gid) so the
// cage's non-root user can write it, when its root is not already theirs.
// The git metadata (.git) is left as it is: root-owned, the cage cannot
// write it. So are nested git repositories (nested.go): the cage cannot
// change the owner's in place. It reports whether it changed anything.
//
// It is the walk of walk.go. It runs before the task's cage starts, under
// the task lock, so no cage of the task writes the tree meanwhile; an
// entry the host replaces under the walk is left alone.
func handOver(dir string, uid, gid int) (bool, error) {
	h, err := newHandOverHook(dir, uid, gid)
	if err != nil || h == nil {
		return false, err
	}
	defer h.close()
	if err := h.w.walk(h.fd, "", 0); err != nil {
		return true, fmt.Errorf("worktree %s: give it to the task's user: %w", dir, err)
	}
	return true, nil
}

// newHandOverHook opens the worktree dir and gives its root to uid:gid,
// for a hand-over one entry at a time (Hook); it returns nil when the root
// is theirs already (nothing to hand over).
func newHandOverHook(dir string, uid, gid int) (*Hook, error) {
	fd, st, err := openRoot(dir)
	if err != nil {
		return nil, fmt.Errorf("worktree %s: %w", dir, err)
	}
	if int(st.Uid) == uid && int(st.Gid) == gid {
		unix.Close(fd)
		return nil, nil
	}
	if err := unix.Fchown(fd, uid, gid); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("worktree %s: give it to the task's user: %w", dir, err)
	}
	return &Hook{fd: fd, rootUID: st.Uid, w: &walker{uid: uid, gid: gid, dev: st.Dev}}, nil
}

// Take claims the worktree for the task (recording its owner), puts it
// under the task's cap and hands it to the task's agent user for the turn
// (ids: the task's host ids). Call it with the task lock held. The
// hand-over's walk is also the change scan before the turn: it returns
// that snapshot (nil when there was nothing to hand over; the turn then
// scans on its own). What fails in it without a kind (the claim file, the
// cap, the walk) is the host's to fix.
func (c Claims) Take(ctx context.Context, holder Holder, worktree string, ids taskstate.IDs) (_ *diff.Snapshot, err error) {
	defer fault.Phase(fault.HostNotReady, &err)
	if _, _, err := c.claimAndCap(holder, worktree, ids); err != nil {
		return nil, err
	}
	agent := int(c.User)
	h, err := newHandOverHook(worktree, int(ids.UID)+agent, int(ids.GID)+agent)
	if err != nil || h == nil {
		if err != nil {
			return nil, err
		}
		return nil, nil
	}
	defer h.close()
	before, err := diff.ScanHook(ctx, worktree, h)
	if err != nil {
		return nil, fmt.Errorf("worktree %s: give it to the task's user: %w", worktree, err)
	}
	return before, nil
}

// claimAndCap records the task's claim on the worktree (with its owner)
// and puts it under the task's cap; it returns the claim.
func (c Claims) claimAndCap(holder Holder, worktree string, ids taskstate.IDs) (_ *claim, gaveBack bool, _ error) {
	if holder.task.IsZero() {
		return nil, false, errNoTask
	}
	// An idmapped turn that died before its give-back (its record is still
	// there) is given back first: what it made setuid or a repository must
	// not pass for the owner's in this turn's scan.
	_, gaveBack, err := c.giveBackIdmapped(holder.staging, holder.turn, worktree)
	if err != nil {
		return nil, gaveBack, err
	}
	var st unix.Stat_t
	if err := unix.Lstat(worktree, &st); err != nil {
		return nil, gaveBack, fmt.Errorf("%w: worktree %s: %w", fault.Input, worktree, err)
	}
	cl, err := c.read(worktree)
	if err != nil {
		return nil, gaveBack, err
	}
	inRange := st.Uid >= ids.UID && st.Uid < ids.UID+taskstate.SlotSize
	switch {
	case cl != nil && cl.Task != holder.task.String():
		return nil, gaveBack, fmt.Errorf("%w: worktree %q belongs to task %q (one task per worktree)", fault.Input, worktree, cl.Task)
	case cl == nil && inRange:
		return nil, gaveBack, fmt.Errorf("%w: worktree %q is owned by task %s's user namespace and shrooms has no record of its owner; chown -R it to its owner and retry", fault.Input, worktree, holder.task.String())
	case cl == nil:
		cl = &claim{Worktree: worktree, Task: holder.task.String()}
	}
	if !inRange {
		cl.UID, cl.GID = st.Uid, st.Gid // the owner now (who may have changed)
	}
	if err := c.write(cl); err != nil {
		return nil, gaveBack, err
	}
	// The cap first: setting project ids changes ctimes, which the
	// snapshot below must already see.
	if err := capWorktree(c.Cap, worktree, ids); err != nil {
		return nil, gaveBack, err
	}
	return cl, gaveBack, nil
}

// capWorktree puts the worktree under the task's project quota (its id the
// task's first host uid: unique per task, never 0) before the cage starts;
// where the filesystem has none the turn is refused, unless the owner
// chose worktree.uncapped = "allow". (Take kinds a failure of the probe
// or the quota.)
func capWorktree(cfg config.Worktree, worktree string, ids taskstate.IDs) error {
	s, err := wtcap.Probe(worktree)
	if err != nil {
		return err
	}
	if !s.OK {
		if cfg.Uncapped == "allow" {
			return nil // the owner's choice (worktree.uncapped), said by doctor
		}
		return fmt.Errorf("%w: worktree cap: %s; mount it with prjquota, or set worktree.uncapped = \"allow\" to run turns whose worktree can fill that filesystem", fault.HostNotReady, s.Reason)
	}
	return wtcap.Apply(s, worktree, ids.UID, uint64(cfg.MaxSize), uint64(cfg.MaxFiles))
}
