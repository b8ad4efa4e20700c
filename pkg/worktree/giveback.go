package worktree

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"time"

	"github.com/shrooms-cage/shrooms/pkg/taskstate"
	"github.com/shrooms-cage/shrooms/pkg/worktree/diff"
)

// GiveBackReport is what a give-back did.
type GiveBackReport struct {
	Changed int `json:"changed"` // entries given back
	Skipped int `json:"skipped"` // entries that changed under the walk (left as they were)
	// Kept counts the nested git repositories left with the task's uid
	// (nested.go); KeptPaths lists them (worktree-relative, at most 100).
	Kept      int      `json:"kept,omitempty"`
	KeptPaths []string `json:"kept_paths,omitempty"`
}

// giveBack gives every entry beneath dir (dir included) whose owner uid lies
// in [lo, hi) — the task's user namespace on the host — back to uid:gid,
// the worktree owner's. Entries owned by anyone else stay as they are. A git
// repository nested below dir stays with the task's uid (see nested.go).
// It is the walk of walk.go, each directory given back after what lies
// below it, the root last.
func giveBack(dir string, uid, gid int, lo, hi uint32) (GiveBackReport, error) {
	h, err := newGiveBackHook(dir, uid, gid, lo, hi)
	if err != nil {
		return GiveBackReport{}, err
	}
	if err := h.w.walk(h.fd, "", 0); err != nil {
		h.close()
		return h.w.rep, fmt.Errorf("give worktree %s back: %w", dir, err)
	}
	rep, err := h.finish()
	if err != nil {
		return rep, fmt.Errorf("give worktree %s back: %w", dir, err)
	}
	return rep, nil
}

// newGiveBackHook opens the worktree dir for a give-back to uid:gid of
// what the task's uids [lo, hi) own, one entry at a time (Hook).
func newGiveBackHook(dir string, uid, gid int, lo, hi uint32) (*Hook, error) {
	fd, st, err := openRoot(dir)
	if err != nil {
		return nil, fmt.Errorf("give worktree %s back: %w", dir, err)
	}
	return &Hook{fd: fd, rootUID: st.Uid, w: &walker{uid: uid, gid: gid, dev: st.Dev, giveBack: true, lo: lo, hi: hi}}, nil
}

// Report is what happened to the worktree's ownership in a turn.
type Report struct {
	Path string `json:"path"`
	// OwnerUID and OwnerGID are the owner the worktree was given back to.
	OwnerUID uint32 `json:"owner_uid"`
	OwnerGID uint32 `json:"owner_gid"`
	// GivenBack counts entries changed back from the task's uid range;
	// Skipped those that changed under the walk and were left alone.
	GivenBack  int     `json:"given_back"`
	Skipped    int     `json:"skipped"`
	GiveBackMs float64 `json:"give_back_ms"`
	// KeptNestedRepos lists the nested git repositories left with the
	// task's user (nested.go): the owner's git refuses them.
	KeptNestedRepos []string `json:"kept_nested_repos,omitempty"`
	// Idmapped says the turn had the worktree through an idmapped mount
	// (idmap.go): nothing was chowned but the nested repositories it made;
	// Stripped counts the files whose setuid/setgid bits went.
	Idmapped bool `json:"idmapped,omitempty"`
	Stripped int  `json:"stripped,omitempty"`
}

func report(worktree string, cl *claim, gb GiveBackReport, start time.Time) *Report {
	return &Report{Path: worktree, OwnerUID: cl.UID, OwnerGID: cl.GID, GivenBack: gb.Changed, Skipped: gb.Skipped,
		GiveBackMs: float64(time.Since(start).Microseconds()) / 1000, KeptNestedRepos: gb.KeptPaths}
}

// GiveBack gives every file of the worktree that the task's uid range owns
// back to the worktree's recorded owner (nil, nil when the task holds no
// claim on it). Call it with the task lock held, after the cage is gone.
func (c Claims) GiveBack(holder Holder, worktree string) (*Report, error) {
	cl, err := c.read(worktree)
	if err != nil || cl == nil || cl.Task != holder.task.String() {
		return nil, err
	}
	// A staging mount a crash left (a turn's or a preparation's) goes first.
	if err := c.UnstageDir(holder.staging); err != nil {
		return nil, err
	}
	if rep, done, err := c.giveBackIdmapped(holder.staging, holder.turn, worktree); done || err != nil {
		return rep, err
	}
	ids, err := c.Store.IDsOf(holder.state, c.IDFiles, false)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	gb, err := giveBack(worktree, int(cl.UID), int(cl.GID), ids.UID, ids.UID+taskstate.SlotSize)
	rep := report(worktree, cl, gb, start)
	if errors.Is(err, syscall.ENOENT) {
		return rep, nil // the worktree itself is gone: nothing to give back
	}
	return rep, err
}

// GiveBackScanning gives the worktree back in the walk of the change scan
// after the turn (call it once no process of the cage runs) and returns
// the scan and the give-back's report; a nil report (an error, or a scan
// that stopped at its bounds) leaves the give-back to GiveBack's full
// walk.
func (c Claims) GiveBackScanning(ctx context.Context, holder Holder, worktree string) (*diff.Snapshot, *Report) {
	cl, err := c.read(worktree)
	if err != nil || cl == nil || cl.Task != holder.task.String() {
		return nil, nil
	}
	if after, rep, done := c.giveBackIdmappedScanning(ctx, holder.staging, holder.turn, worktree); done {
		return after, rep
	}
	ids, err := c.Store.IDsOf(holder.state, c.IDFiles, false)
	if err != nil {
		return nil, nil
	}
	start := time.Now()
	h, err := newGiveBackHook(worktree, int(cl.UID), int(cl.GID), ids.UID, ids.UID+taskstate.SlotSize)
	if err != nil {
		return nil, nil
	}
	after, err := diff.ScanThenHook(ctx, worktree, h)
	gb, ferr := h.Finish()
	if err != nil || ferr != nil || after.Truncated() {
		return nil, nil
	}
	return after, report(worktree, cl, gb, start)
}
