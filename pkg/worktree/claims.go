// Package worktree is the worktree's one door: which task holds a worktree
// and who owns it on the host (the claims, in the state directory), whether
// a path may be a worktree at all (CheckPath), and the walks that hand it
// to the task's user before a turn and give it back after it (walk.go),
// with the change scan (diff) and the guard of trusted agent config
// (guard) below it. pkg/turn takes and gives back a turn's worktree
// through Claims; the task commands release and give back a task's.
package worktree

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/shrooms-cage/shrooms/pkg/config"
	"github.com/shrooms-cage/shrooms/pkg/fault"
	"github.com/shrooms-cage/shrooms/pkg/taskid"
	"github.com/shrooms-cage/shrooms/pkg/taskstate"
)

// Claims are the worktree claims of one state directory, with what the
// hand-out and the give-back need of the host: the task locks and host
// ids, the cap a turn's worktree gets and the agent's user in the cage.
type Claims struct {
	Layout  taskstate.Layout
	Store   taskstate.Store
	IDFiles taskstate.IDFiles
	// Cap is the worktree section of the config (its size and file cap,
	// and whether an uncapped filesystem is allowed).
	Cap config.Worktree
	// GVisor says cage.runtime is gVisor's runsc, whose cages keep the
	// chown walks (IdmapReason).
	GVisor bool
	// User is the agent's uid (and gid) inside the cage.
	User int64
	// Socket is the podman service's API URL: an idmapped worktree's
	// staging mount is made in the service's mount namespace (idmap.go).
	Socket string
	// WalkBefore makes the scan before an idmapped turn the full walk
	// rather than the namespace's revalidation (tests: the reference).
	WalkBefore bool
}

// NewClaims returns the worktree claims of cfg's state directory with the
// system's id files.
func NewClaims(cfg *config.Config) Claims {
	return Claims{
		Layout:  taskstate.Layout{Dir: cfg.State.Dir},
		Store:   taskstate.Store{Dir: cfg.State.Dir},
		IDFiles: taskstate.DefaultIDFiles(cfg.Cage.SubIDUser),
		Cap:     cfg.Worktree,
		GVisor:  filepath.Base(cfg.Cage.Runtime) == "runsc",
		User:    cfg.Cage.User,
		Socket:  cfg.Podman.Socket,
	}
}

// A claim records, in the state directory, which task a worktree belongs
// to (one task per worktree) and who owns it on the host, so that it can
// be given back after every turn, also after a crash.
type claim struct {
	Worktree string `json:"worktree"`
	Task     string `json:"task"`
	UID      uint32 `json:"uid"`
	GID      uint32 `json:"gid"`
}

// path names a worktree's claim by the directory's device and inode, so
// that another path to the same directory (a bind mount) is the same
// worktree; a worktree that no longer exists is named by its path.
func (c Claims) path(worktree string) string {
	key := "path:" + worktree
	var st unix.Stat_t
	if unix.Lstat(worktree, &st) == nil {
		key = fmt.Sprintf("inode:%d:%d", st.Dev, st.Ino)
	}
	sum := sha256.Sum256([]byte(key))
	return c.Layout.WorktreeClaim(hex.EncodeToString(sum[:16]))
}

// read returns the worktree's claim, nil if it has none.
func (c Claims) read(worktree string) (*claim, error) {
	path := c.path(worktree)
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("worktree claim: %w", err)
	}
	var cl claim
	if err := json.Unmarshal(b, &cl); err != nil || cl.Task == "" {
		return nil, fmt.Errorf("worktree claim %s is damaged; remove it once the worktree's owner is right", path)
	}
	return &cl, nil
}

// Check refuses a worktree that another task holds (read-only):
// fault.Input, or fault.HostNotReady when the claim cannot be read.
func (c Claims) Check(holder Holder, worktree string) error {
	cl, err := c.read(worktree)
	if err != nil {
		return fmt.Errorf("%w: %w", fault.HostNotReady, err)
	}
	if cl != nil && cl.Task != holder.task.String() {
		return fmt.Errorf("%w: worktree %q belongs to task %q (one task per worktree; `shrooms forget --task %s` releases it)", fault.Input, worktree, cl.Task, cl.Task)
	}
	return nil
}

func (c Claims) write(cl *claim) error {
	path := c.path(cl.Worktree)
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("worktree claim: %w", err)
	}
	b, _ := json.Marshal(cl)
	tmp := path + ".tmp-" + cl.Task
	if err := os.WriteFile(tmp, append(b, '\n'), 0o600); err != nil {
		return fmt.Errorf("worktree claim: %w", err)
	}
	// Another task's first turn may race this one (each holds only its own
	// task lock): whoever links first owns the worktree.
	if err := os.Link(tmp, path); err != nil && !errors.Is(err, os.ErrExist) {
		os.Remove(tmp)
		return fmt.Errorf("worktree claim: %w", err)
	} else if err != nil {
		cur, rerr := c.read(cl.Worktree)
		if rerr != nil || cur == nil || cur.Task != cl.Task {
			os.Remove(tmp)
			if rerr != nil {
				return rerr
			}
			return fmt.Errorf("%w: worktree %q was just claimed by another task", fault.Input, cl.Worktree)
		}
		if err := os.Rename(tmp, path); err != nil {
			os.Remove(tmp)
			return fmt.Errorf("worktree claim: %w", err)
		}
		return nil
	}
	return os.Remove(tmp)
}

// all is every readable claim with its file.
func (c Claims) all() ([]claim, []string, error) {
	dir := c.Layout.Worktrees()
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("worktree claims: %w", err)
	}
	var claims []claim
	var files []string
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			continue
		}
		var cl claim
		if json.Unmarshal(b, &cl) != nil {
			continue
		}
		claims = append(claims, cl)
		files = append(files, filepath.Join(dir, e.Name()))
	}
	return claims, files, nil
}

// Files lists the claim files of task (for forget's check that nothing of
// the task is left).
func (c Claims) Files(task taskid.ID) []string {
	claims, files, _ := c.all()
	var out []string
	for i, cl := range claims {
		if cl.Task == task.String() {
			out = append(out, files[i])
		}
	}
	return out
}

// Release gives back and unclaims every worktree of the task (for forget,
// under the task lock).
func (c Claims) Release(task taskid.ID) error {
	holder, err := c.Holder(task)
	if err != nil {
		return err
	}
	claims, files, err := c.all()
	if err != nil {
		return err
	}
	for i, cl := range claims {
		if cl.Task != holder.task.String() {
			continue
		}
		if _, err := c.GiveBack(holder, cl.Worktree); err != nil {
			return fmt.Errorf("give worktree %s back: %w", cl.Worktree, err)
		}
		if err := os.Remove(files[i]); err != nil {
			return fmt.Errorf("worktree claim: %w", err)
		}
	}
	return c.releaseIdmap(holder)
}

// GiveBackIdle gives back the worktrees of tasks with no turn running (a
// crashed or killed shrooms leaves its worktree with the task's user). It
// takes each task's lock only for the give-back, skipping busy tasks.
func (c Claims) GiveBackIdle() ([]string, error) {
	claims, _, err := c.all()
	if err != nil {
		return nil, err
	}
	var given []string
	for _, cl := range claims {
		task, err := taskid.Parse(cl.Task)
		if err != nil {
			continue // not ours to trust
		}
		holder, err := c.Holder(task)
		if err != nil {
			continue // the zero id, which Parse never returns
		}
		lock, err := c.Store.LockTask(task)
		if err != nil {
			continue // busy (or not ours to trust): its own turn gives it back
		}
		rep, err := c.GiveBack(holder, cl.Worktree)
		lock.Release()
		if err != nil {
			return given, fmt.Errorf("give worktree %s back: %w", cl.Worktree, err)
		}
		if rep != nil && (rep.GivenBack > 0 || rep.Idmapped) {
			given = append(given, cl.Worktree)
		}
	}
	return given, nil
}
