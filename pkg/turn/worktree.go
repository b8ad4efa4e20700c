package turn

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shrooms-cage/shrooms/pkg/config"
	"github.com/shrooms-cage/shrooms/pkg/mounts"
	"github.com/shrooms-cage/shrooms/pkg/taskid"
	"github.com/shrooms-cage/shrooms/pkg/taskstate"
	"github.com/shrooms-cage/shrooms/pkg/worktree/diff"
	"github.com/shrooms-cage/shrooms/pkg/wtcap"
)

// A worktree claim records, in the state directory, which task a worktree
// belongs to (one task per worktree) and who owns it on the host, so that
// it can be given back after every turn, also after a crash.
type worktreeClaim struct {
	Worktree string `json:"worktree"`
	Task     string `json:"task"`
	UID      uint32 `json:"uid"`
	GID      uint32 `json:"gid"`
}

// WorktreeReport is what happened to the worktree's ownership in a turn.
type WorktreeReport struct {
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
	// task's user (mounts.GiveBack): the owner's git refuses them.
	KeptNestedRepos []string `json:"kept_nested_repos,omitempty"`
}

// claimPath names a worktree's claim by the directory's device and inode,
// so that another path to the same directory (a bind mount) is the same
// worktree; a worktree that no longer exists is named by its path.
func claimPath(stateDir, worktree string) string {
	key := "path:" + worktree
	var st unix.Stat_t
	if unix.Lstat(worktree, &st) == nil {
		key = fmt.Sprintf("inode:%d:%d", st.Dev, st.Ino)
	}
	sum := sha256.Sum256([]byte(key))
	return taskstate.Layout{Dir: stateDir}.WorktreeClaim(hex.EncodeToString(sum[:16]))
}

// readClaim returns the worktree's claim, nil if it has none.
func readClaim(stateDir, worktree string) (*worktreeClaim, error) {
	path := claimPath(stateDir, worktree)
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("worktree claim: %w", err)
	}
	var c worktreeClaim
	if err := json.Unmarshal(b, &c); err != nil || c.Task == "" {
		return nil, fmt.Errorf("worktree claim %s is damaged; remove it once the worktree's owner is right", path)
	}
	return &c, nil
}

// checkClaim refuses a worktree that another task holds (read-only):
// ErrInput, or ErrHostNotReady when the claim cannot be read.
func checkClaim(stateDir string, task taskid.ID, worktree string) error {
	c, err := readClaim(stateDir, worktree)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrHostNotReady, err)
	}
	if c != nil && c.Task != task.String() {
		return fmt.Errorf("%w: worktree %q belongs to task %q (one task per worktree; `shrooms forget --task %s` releases it)", ErrInput, worktree, c.Task, c.Task)
	}
	return nil
}

func writeClaim(stateDir string, c *worktreeClaim) error {
	path := claimPath(stateDir, c.Worktree)
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("worktree claim: %w", err)
	}
	b, _ := json.Marshal(c)
	tmp := path + ".tmp-" + c.Task
	if err := os.WriteFile(tmp, append(b, '\n'), 0o600); err != nil {
		return fmt.Errorf("worktree claim: %w", err)
	}
	// Another task's first turn may race this one (each holds only its own
	// task lock): whoever links first owns the worktree.
	if err := os.Link(tmp, path); err != nil && !errors.Is(err, os.ErrExist) {
		os.Remove(tmp)
		return fmt.Errorf("worktree claim: %w", err)
	} else if err != nil {
		cur, rerr := readClaim(stateDir, c.Worktree)
		if rerr != nil || cur == nil || cur.Task != c.Task {
			os.Remove(tmp)
			if rerr != nil {
				return rerr
			}
			return fmt.Errorf("%w: worktree %q was just claimed by another task", ErrInput, c.Worktree)
		}
		if err := os.Rename(tmp, path); err != nil {
			os.Remove(tmp)
			return fmt.Errorf("worktree claim: %w", err)
		}
		return nil
	}
	return os.Remove(tmp)
}

// takeWorktree claims the worktree for the task (recording its owner) and
// hands it to the task's agent user for the turn. Call it with the task
// lock held. The hand-over's walk is also the change scan before the turn:
// it returns that snapshot (nil when there was nothing to hand over; the
// turn then scans on its own).
func (r *Runner) takeWorktree(ctx context.Context, task taskid.ID, worktree string, ids taskstate.IDs) (*diff.Snapshot, error) {
	var st unix.Stat_t
	if err := unix.Lstat(worktree, &st); err != nil {
		return nil, fmt.Errorf("%w: worktree %s: %w", ErrInput, worktree, err)
	}
	c, err := readClaim(r.Cfg.State.Dir, worktree)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrHostNotReady, err)
	}
	inRange := st.Uid >= ids.UID && st.Uid < ids.UID+taskstate.SlotSize
	switch {
	case c != nil && c.Task != task.String():
		return nil, fmt.Errorf("%w: worktree %q belongs to task %q (one task per worktree)", ErrInput, worktree, c.Task)
	case c == nil && inRange:
		return nil, fmt.Errorf("%w: worktree %q is owned by task %s's user namespace and shrooms has no record of its owner; chown -R it to its owner and retry", ErrInput, worktree, task)
	case c == nil:
		c = &worktreeClaim{Worktree: worktree, Task: task.String()}
	}
	if !inRange {
		c.UID, c.GID = st.Uid, st.Gid // the owner now (who may have changed)
	}
	if err := writeClaim(r.Cfg.State.Dir, c); err != nil {
		if errors.Is(err, ErrInput) {
			return nil, err
		}
		return nil, fmt.Errorf("%w: %w", ErrHostNotReady, err)
	}
	// The cap first: setting project ids changes ctimes, which the
	// snapshot below must already see.
	if err := capWorktree(r.Cfg.Worktree, worktree, ids); err != nil {
		return nil, err
	}
	agent := int(r.Cfg.Cage.User)
	h, err := mounts.NewHandOver(worktree, int(ids.UID)+agent, int(ids.GID)+agent)
	if err != nil || h == nil {
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrHostNotReady, err)
		}
		return nil, nil
	}
	defer h.Close()
	before, err := diff.ScanHook(ctx, worktree, h)
	if err != nil {
		return nil, fmt.Errorf("%w: worktree %s: give it to the task's user: %w", ErrHostNotReady, worktree, err)
	}
	return before, nil
}

// capWorktree puts the worktree under the task's project quota (its id the
// task's first host uid: unique per task, never 0) before the cage starts;
// where the filesystem has none the turn is refused, unless the owner
// chose worktree.uncapped = "allow".
func capWorktree(cfg config.Worktree, worktree string, ids taskstate.IDs) error {
	s, err := wtcap.Probe(worktree)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrHostNotReady, err)
	}
	if !s.OK {
		if cfg.Uncapped == "allow" {
			return nil // the owner's choice (worktree.uncapped), said by doctor
		}
		return fmt.Errorf("%w: worktree cap: %s; mount it with prjquota, or set worktree.uncapped = \"allow\" to run turns whose worktree can fill that filesystem", ErrHostNotReady, s.Reason)
	}
	if err := wtcap.Apply(s, worktree, ids.UID, uint64(cfg.MaxSize), uint64(cfg.MaxFiles)); err != nil {
		return fmt.Errorf("%w: %w", ErrHostNotReady, err)
	}
	return nil
}

// giveBackWorktree gives every file of the worktree that the task's uid
// range owns back to the worktree's recorded owner. Call it with the task
// lock held, after the cage is gone.
func (r *Runner) giveBackWorktree(task taskid.ID, worktree string) (*WorktreeReport, error) {
	c, err := readClaim(r.Cfg.State.Dir, worktree)
	if err != nil || c == nil || c.Task != task.String() {
		return nil, err
	}
	ids, err := r.Store.TaskIDs(task, r.IDFiles, false)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	gb, err := mounts.GiveBack(worktree, int(c.UID), int(c.GID), ids.UID, ids.UID+taskstate.SlotSize)
	rep := &WorktreeReport{Path: worktree, OwnerUID: c.UID, OwnerGID: c.GID, GivenBack: gb.Changed, Skipped: gb.Skipped, GiveBackMs: ms(time.Since(start)), KeptNestedRepos: gb.KeptPaths}
	if errors.Is(err, syscall.ENOENT) {
		return rep, nil // the worktree itself is gone: nothing to give back
	}
	return rep, err
}

// giveBackScanning gives the worktree back in the walk of the change scan
// after the turn (call it once no process of the cage runs) and returns
// the scan and the give-back's report; a nil report (an error, or a scan
// that stopped at its bounds) leaves the give-back to finishWorktree's
// full walk.
func (r *Runner) giveBackScanning(ctx context.Context, task taskid.ID, worktree string) (*diff.Snapshot, *WorktreeReport) {
	c, err := readClaim(r.Cfg.State.Dir, worktree)
	if err != nil || c == nil || c.Task != task.String() {
		return nil, nil
	}
	ids, err := r.Store.TaskIDs(task, r.IDFiles, false)
	if err != nil {
		return nil, nil
	}
	start := time.Now()
	h, err := mounts.NewGiveBackHook(worktree, int(c.UID), int(c.GID), ids.UID, ids.UID+taskstate.SlotSize)
	if err != nil {
		return nil, nil
	}
	after, err := diff.ScanThenHook(ctx, worktree, h)
	gb, ferr := h.Finish()
	if err != nil || ferr != nil || after.Truncated() {
		return nil, nil
	}
	return after, &WorktreeReport{Path: worktree, OwnerUID: c.UID, OwnerGID: c.GID, GivenBack: gb.Changed, Skipped: gb.Skipped, GiveBackMs: ms(time.Since(start)), KeptNestedRepos: gb.KeptPaths}
}

// finishWorktree gives the worktree back at the end of a turn, on every path
// out of Run (agent exit, deadline, interruption, errors), unless the change
// scan's walk did (given). A failure is the turn's error unless it already
// has one.
func (r *Runner) finishWorktree(task taskid.ID, worktree string, given *WorktreeReport, res *Result, err error) error {
	if given != nil {
		res.Worktree = given
		res.Phases = append(res.Phases, Phase{Name: "give-back", Ms: given.GiveBackMs})
		return err
	}
	rep, gerr := r.giveBackWorktree(task, worktree)
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

// ReleaseWorktrees gives back and unclaims every worktree of the task (for
// forget, under the task lock).
func (r *Runner) ReleaseWorktrees(task taskid.ID) error {
	dir := taskstate.Layout{Dir: r.Cfg.State.Dir}.Worktrees()
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("worktree claims: %w", err)
	}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			continue
		}
		var c worktreeClaim
		if json.Unmarshal(b, &c) != nil || c.Task != task.String() {
			continue
		}
		if _, err := r.giveBackWorktree(task, c.Worktree); err != nil {
			return fmt.Errorf("give worktree %s back: %w", c.Worktree, err)
		}
		if err := os.Remove(filepath.Join(dir, e.Name())); err != nil {
			return fmt.Errorf("worktree claim: %w", err)
		}
	}
	return nil
}

// GiveBackIdle gives back the worktrees of tasks with no turn running (a
// crashed or killed shrooms leaves its worktree with the task's user). It
// takes each task's lock only for the give-back, skipping busy tasks.
func (r *Runner) GiveBackIdle() ([]string, error) {
	dir := taskstate.Layout{Dir: r.Cfg.State.Dir}.Worktrees()
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("worktree claims: %w", err)
	}
	var given []string
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			continue
		}
		var c worktreeClaim
		if json.Unmarshal(b, &c) != nil {
			continue
		}
		task, err := taskid.Parse(c.Task)
		if err != nil {
			continue // not ours to trust
		}
		lock, err := r.Store.LockTask(task)
		if err != nil {
			continue // busy (or not ours to trust): its own turn gives it back
		}
		rep, err := r.giveBackWorktree(task, c.Worktree)
		lock.Release()
		if err != nil {
			return given, fmt.Errorf("give worktree %s back: %w", c.Worktree, err)
		}
		if rep != nil && rep.GivenBack > 0 {
			given = append(given, c.Worktree)
		}
	}
	return given, nil
}
