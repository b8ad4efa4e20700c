package worktree

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shrooms-cage/shrooms/pkg/fault"
	"github.com/shrooms-cage/shrooms/pkg/resolve"
	"github.com/shrooms-cage/shrooms/pkg/taskstate"
	"github.com/shrooms-cage/shrooms/pkg/worktree/diff"
	"github.com/shrooms-cage/shrooms/pkg/worktree/guard"
)

// The idmapped worktree's turn (idmap.go): taken without a hand-over,
// given back without a chown walk.

// agentIDs are the task agent's host uid and gid.
func (c Claims) agentIDs(ids taskstate.IDs) [2]uint32 {
	return [2]uint32{ids.UID + uint32(c.User), ids.GID + uint32(c.User)}
}

// TakeIdmapped is Take for an idmapped turn: the claim and the cap, then
// the change scan before the turn, which finds the owner's nested
// repositories. A fresh cage (stage) gets the staging mount now; a cage
// prepared ahead (PrepareIdmapped) was made on one whose nested
// repositories and owner must still be the worktree's, or the turn is
// refused. shared (nil: none) is the directory stats of this turn's guard
// scan, taken just before under the same lock (diff.ScanNamespace).
func (c Claims) TakeIdmapped(ctx context.Context, holder Holder, worktree string, ids taskstate.IDs, stage bool, shared *guard.DirStats) (_ *diff.Snapshot, err error) {
	defer fault.Phase(fault.HostNotReady, &err)
	cl, gaveBack, err := c.claimAndCap(holder, worktree, ids)
	if err != nil {
		return nil, err
	}
	if gaveBack {
		// A dead turn's give-back just changed owners and modes: the
		// guard's stats predate it.
		shared.Take()
	}
	rec := &idmapRecord{Worktree: worktree, Owner: [2]uint32{cl.UID, cl.GID}, Agent: c.agentIDs(ids)}
	if rec.Owner[0] == 0 || rec.Owner[1] == 0 {
		return nil, errors.New("worktree owned by root: never idmapped") // plan decided otherwise: fail closed
	}
	before, nested, err := c.scanBefore(ctx, holder.trust, worktree, shared)
	if err != nil {
		return nil, err
	}
	// Ts, after the revalidation, before anything of the cage runs; the
	// step timer armed before the record's start is read, so that a step
	// of the clock after that reading is seen (ClockStepped) and the
	// setuid strip's "ctime from the start on" never rests on one unseen.
	if err := before.Settle(); err != nil {
		before.Close() // its cache file
		return nil, err
	}
	defer func() {
		if err != nil {
			before.Close()
		}
	}()
	rec.Nested, rec.Start = nested, before.ClockArmed()
	if stage {
		if err := c.stage(holder.staging, worktree, rec); err != nil {
			return nil, err
		}
	} else {
		prep, err := readRecord(holder.prepared)
		if err != nil {
			return nil, err
		}
		if prep == nil || prep.Worktree != worktree || prep.Owner != rec.Owner || prep.Agent != rec.Agent || !maps.Equal(prep.Nested, rec.Nested) {
			return nil, fmt.Errorf("%w: worktree %s: its owner or nested git repositories changed since its cage was prepared; run the turn again (it gets a fresh cage)", fault.Input, worktree)
		}
		_ = os.Remove(holder.prepared)
	}
	if err := writeRecord(holder.turn, rec); err != nil {
		_ = c.UnstageDir(holder.staging)
		return nil, err
	}
	return before, nil
}

// PrepareIdmapped stages the worktree for a cage prepared ahead (its turn
// takes the worktree with TakeIdmapped); call Unstage once the cage is
// initialised.
func (c Claims) PrepareIdmapped(ctx context.Context, holder Holder, worktree string, ids taskstate.IDs) error {
	uid, gid, err := c.owner(holder, worktree, ids.UID)
	if err != nil {
		return err
	}
	if uid == 0 || gid == 0 {
		return errors.New("worktree owned by root: never idmapped")
	}
	snap, nested, err := c.scanBefore(ctx, holder.trust, worktree, nil)
	if err != nil {
		return err
	}
	defer snap.Close()
	_ = snap.Keep() // a cache: the turn's scan before lists what it lacks
	rec := &idmapRecord{Worktree: worktree, Owner: [2]uint32{uid, gid}, Agent: c.agentIDs(ids), Nested: nested, Boot: bootID()}
	if err := c.stage(holder.staging, worktree, rec); err != nil {
		return err
	}
	if err := writeRecord(holder.prepared, rec); err != nil {
		_ = c.UnstageDir(holder.staging)
		return err
	}
	return nil
}

// scanBefore is the snapshot before an idmapped turn and the owner's
// nested repositories: from the worktree's namespace, revalidated against
// its cache in the task's trust store (the directory trust;
// diff.ScanNamespace, given the guard's directory stats shared, nil for
// none), or where that cannot be trusted the full walk, which says why.
func (c Claims) scanBefore(ctx context.Context, trust, worktree string, shared *guard.DirStats) (*diff.Snapshot, map[string]uint64, error) {
	why := "asked for"
	if !c.WalkBefore {
		var snap *diff.Snapshot
		cache := filepath.Join(trust, diff.NamespaceCacheFile)
		if snap, why = diff.ScanNamespace(ctx, worktree, cache, shared); snap != nil {
			return snap, snap.Namespace().Nested(), nil
		}
	}
	snap, nested, err := scanNested(ctx, worktree)
	if err != nil {
		return nil, nil, err
	}
	snap.SetWalkWhy(why)
	return snap, nested, nil
}

// scanNested is the change scan, which also finds the nested repositories.
func scanNested(ctx context.Context, worktree string) (*diff.Snapshot, map[string]uint64, error) {
	var st unix.Stat_t
	if err := unix.Lstat(worktree, &st); err != nil {
		return nil, nil, fmt.Errorf("worktree %s: %w", worktree, err)
	}
	f := &nestedFinder{dev: st.Dev, nested: map[string]uint64{}}
	snap, err := diff.ScanHook(ctx, worktree, f)
	if err != nil {
		return nil, nil, fmt.Errorf("worktree %s: %w", worktree, err)
	}
	if snap.Truncated() {
		return nil, nil, fmt.Errorf("worktree %s: too large to find its nested git repositories", worktree)
	}
	return snap, f.nested, nil
}

// nestedFinder is a diff.Hook that changes nothing and records the nested
// git repositories (nested.go) by path and inode, not descending into them.
type nestedFinder struct {
	dev    uint64
	nested map[string]uint64
}

func (f *nestedFinder) Entry(dirFd int, name, rel string, st *unix.Stat_t) (bool, bool, error) {
	if name == ".git" {
		f.nested[rel] = st.Ino
		return false, false, nil
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR || st.Dev != f.dev {
		return false, false, nil
	}
	d, err := openBeneath(dirFd, name, st)
	if err != nil || d == nil {
		return false, false, err
	}
	defer unix.Close(d.fd)
	if looksLikeGitDir(d.fd) {
		f.nested[rel] = st.Ino
		return false, false, nil
	}
	return false, true, nil
}

// idmapHook is the give-back of an idmapped turn, one entry at a time: the
// setuid and setgid bits of the regular files the turn changed go, and a
// nested repository that is not one of the owner's found before the turn
// goes to the task's agent uid (without permissions for others).
type idmapHook struct {
	rec      *idmapRecord
	dev      uint64
	w        walker // keep's counts and task range (the agent's uid)
	stripped int
	given    map[string]bool // the nested repositories handed to the agent
}

func newIdmapHook(rec *idmapRecord, dev uint64) *idmapHook {
	return &idmapHook{rec: rec, dev: dev, given: map[string]bool{},
		w: walker{uid: int(rec.Agent[0]), gid: int(rec.Agent[1]), dev: dev, giveBack: true, lo: rec.Agent[0], hi: rec.Agent[0] + 1}}
}

func (h *idmapHook) Entry(dirFd int, name, rel string, st *unix.Stat_t) (bool, bool, error) {
	if st.Dev != h.dev {
		return false, false, nil
	}
	if name == ".git" { // a directory, gitdir pointer file or link
		return h.nested(dirFd, name, rel, st)
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		if st.Mode&(unix.S_ISUID|unix.S_ISGID) == 0 || st.Ctim.Nano() < h.rec.Start {
			return false, false, nil
		}
		return h.strip(dirFd, name, st)
	case unix.S_IFDIR:
	default:
		return false, false, nil
	}
	d, err := openBeneath(dirFd, name, st)
	if err != nil || d == nil {
		return false, false, err
	}
	git := looksLikeGitDir(d.fd)
	unix.Close(d.fd)
	if git {
		return h.nested(dirFd, name, rel, st)
	}
	return false, true, nil
}

// nested gives a nested repository the turn made to the agent's uid.
func (h *idmapHook) nested(dirFd int, name, rel string, st *unix.Stat_t) (bool, bool, error) {
	if ino, ok := h.rec.Nested[rel]; ok && ino == st.Ino {
		return false, false, nil // the owner's, read-only in the cage
	}
	h.given[rel] = true
	if err := chownSubtree(dirFd, name, st, int(h.rec.Agent[0]), int(h.rec.Agent[1]), h.dev, 0); err != nil {
		return false, false, fmt.Errorf("nested repository %s to the task's user: %w", rel, err)
	}
	var now unix.Stat_t
	if err := unix.Fstatat(dirFd, name, &now, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return true, false, fmt.Errorf("stat %s: %w", rel, err)
	}
	return true, false, h.w.keep(dirFd, name, rel, &now)
}

// strip takes the setuid and setgid bits from the regular file name.
func (h *idmapHook) strip(dirFd int, name string, st *unix.Stat_t) (bool, bool, error) {
	fd, err := unix.Openat2(dirFd, name, &unix.OpenHow{
		Flags:   unix.O_RDONLY | unix.O_NOFOLLOW | unix.O_CLOEXEC | unix.O_NONBLOCK | unix.O_NOCTTY,
		Resolve: resolve.Beneath,
	})
	if err != nil {
		// A file nobody may read (mode 4111): its path, never followed.
		fd, err = unix.Openat2(dirFd, name, &unix.OpenHow{Flags: unix.O_PATH | unix.O_NOFOLLOW | unix.O_CLOEXEC,
			Resolve: resolve.Beneath})
		if errors.Is(err, unix.ENOENT) {
			return false, false, nil
		}
		if err != nil {
			return false, false, fmt.Errorf("open %s: %w", name, err)
		}
	}
	defer unix.Close(fd)
	var now unix.Stat_t
	if err := unix.Fstat(fd, &now); err != nil {
		return false, false, fmt.Errorf("stat %s: %w", name, err)
	}
	if now.Ino != st.Ino || now.Dev != st.Dev || now.Mode&unix.S_IFMT != unix.S_IFREG {
		return false, false, nil
	}
	// fchmodat on the descriptor's /proc path works for O_PATH ones too.
	if err := unix.Fchmodat(unix.AT_FDCWD, fmt.Sprintf("/proc/self/fd/%d", fd), now.Mode&0o1777, 0); err != nil {
		return false, false, fmt.Errorf("chmod %s: %w", name, err)
	}
	h.stripped++
	return true, false, nil
}

// chownSubtree gives the entry name of dirFd and everything below it (on the
// worktree's filesystem, following no link) to uid:gid.
func chownSubtree(dirFd int, name string, st *unix.Stat_t, uid, gid int, dev uint64, depth int) error {
	if st.Dev != dev {
		return nil
	}
	if depth > maxDepth {
		return fmt.Errorf("directories nested deeper than %d levels", maxDepth)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		if err := unix.Fchownat(dirFd, name, uid, gid, unix.AT_SYMLINK_NOFOLLOW); err != nil && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("chown %s: %w", name, err)
		}
		return nil
	}
	d, err := openBeneath(dirFd, name, st)
	if err != nil || d == nil {
		return err
	}
	defer unix.Close(d.fd)
	if err := unix.Fchown(d.fd, uid, gid); err != nil {
		return fmt.Errorf("chown %s: %w", name, err)
	}
	return eachEntry(d.fd, func(child string, cst *unix.Stat_t) error {
		return chownSubtree(d.fd, child, cst, uid, gid, dev, depth+1)
	})
}

// eachEntry calls fn with every entry of the open directory fd and its
// lstat (entries gone meanwhile skipped).
func eachEntry(fd int, fn func(name string, st *unix.Stat_t) error) error {
	return eachName(fd, func(name string) error {
		var st unix.Stat_t
		if err := unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			if errors.Is(err, unix.ENOENT) {
				return nil
			}
			return fmt.Errorf("stat %s: %w", name, err)
		}
		return fn(name, &st)
	})
}

// walkHook runs hook over every entry below the open directory fd (rel
// below the root), the root's own .git left out as scans do.
func walkHook(fd int, rel string, depth int, hook diff.Hook) error {
	if depth > maxDepth {
		return fmt.Errorf("directories nested deeper than %d levels", maxDepth)
	}
	return eachEntry(fd, func(name string, st *unix.Stat_t) error {
		if depth == 0 && name == ".git" {
			return nil
		}
		r := joinRel(rel, name)
		_, below, err := hook.Entry(fd, name, r, st)
		if err != nil || !below {
			return err
		}
		d, err := openBeneath(fd, name, st)
		if err != nil || d == nil {
			return err
		}
		defer unix.Close(d.fd)
		return walkHook(d.fd, r, depth+1, hook)
	})
}

// idmapReport is the Report of an idmapped turn's give-back.
func idmapReport(worktree string, rec *idmapRecord, h *idmapHook, start time.Time) *Report {
	slices.Sort(h.w.rep.KeptPaths)
	return &Report{Path: worktree, OwnerUID: rec.Owner[0], OwnerGID: rec.Owner[1], Idmapped: true, Stripped: h.stripped,
		GiveBackMs: float64(time.Since(start).Microseconds()) / 1000, KeptNestedRepos: h.w.rep.KeptPaths}
}

// giveBackIdmapped is the give-back of a task whose last turn was
// idmapped (nil, false when it was not): its staging mount detached, then
// the idmap hook over the whole worktree; the turn's record goes once it is
// done. staging and record are the task's staging directory and turn
// record (its Holder's).
func (c Claims) giveBackIdmapped(staging, record, worktree string) (*Report, bool, error) {
	rec, err := readRecord(record)
	if err != nil || rec == nil || rec.Worktree != worktree {
		return nil, err != nil, err
	}
	if err := c.UnstageDir(staging); err != nil {
		return nil, true, err
	}
	start := time.Now()
	fd, st, err := openRoot(worktree)
	if errors.Is(err, unix.ENOENT) {
		return nil, true, os.Remove(record)
	}
	if err != nil {
		return nil, true, fmt.Errorf("give worktree %s back: %w", worktree, err)
	}
	defer unix.Close(fd)
	h := newIdmapHook(rec, st.Dev)
	if err := walkHook(fd, "", 0, h); err != nil {
		return nil, true, fmt.Errorf("give worktree %s back: %w", worktree, err)
	}
	if err := os.Remove(record); err != nil {
		return nil, true, fmt.Errorf("give worktree %s back: %w", worktree, err)
	}
	return idmapReport(worktree, rec, h, start), true, nil
}

// giveBackIdmappedScanning is giveBackIdmapped in the change scan's walk
// after the turn (nil, nil when the task's last turn was not idmapped, or
// the scan did not see everything: GiveBack's full walk then does it).
func (c Claims) giveBackIdmappedScanning(ctx context.Context, staging, record, worktree string) (*diff.Snapshot, *Report, bool) {
	rec, err := readRecord(record)
	if err != nil || rec == nil || rec.Worktree != worktree {
		return nil, nil, err != nil
	}
	if err := c.UnstageDir(staging); err != nil {
		return nil, nil, true
	}
	var st unix.Stat_t
	if err := unix.Lstat(worktree, &st); err != nil {
		return nil, nil, true
	}
	start := time.Now()
	h := newIdmapHook(rec, st.Dev)
	after, err := diff.ScanThenHook(ctx, worktree, h)
	if err != nil || after.Truncated() {
		return nil, nil, true
	}
	if err := os.Remove(record); err != nil {
		return nil, nil, true
	}
	return after, idmapReport(worktree, rec, h, start), true
}

// ClockStepped makes the give-back of the task's idmapped turn strip the
// setuid and setgid bits of every regular file of the worktree, not only
// those with a ctime from the turn's start on: CLOCK_REALTIME was set
// during the turn, so a file the turn made may carry an older ctime (the
// owner's own setuid files lose their bits too: fail closed). Call the
// full give-back (GiveBack) after it, not GiveBackChanged.
func (c Claims) ClockStepped(m Idmap) error {
	rec, err := readRecord(m.turn)
	if err != nil || rec == nil {
		return err
	}
	rec.Start = 0
	return writeRecord(m.turn, rec)
}

// GiveBackChanged is the give-back of an idmapped turn that looks only at
// what the turn changed (changed: the worktree-relative paths diff.Changed
// lists, from the turn's events) and at the directories above them (one
// the turn made a git directory of by adding to it); nil, nil when the
// task's last turn was not idmapped. On an error the full give-back
// (GiveBack) is still to run. m is the task's (Holder.Idmap).
func (c Claims) GiveBackChanged(m Idmap, worktree string, changed []string) (*Report, error) {
	rec, err := readRecord(m.turn)
	if err != nil || rec == nil || rec.Worktree != worktree {
		return nil, err
	}
	if err := c.UnstageDir(m.staging); err != nil {
		return nil, err
	}
	start := time.Now()
	root, st, err := openRoot(worktree)
	if err != nil {
		return nil, fmt.Errorf("give worktree %s back: %w", worktree, err)
	}
	defer unix.Close(root)
	h := newIdmapHook(rec, st.Dev)
	seen := map[string]bool{}
	for _, rel := range changed {
		if err := h.changed(root, rel, seen); err != nil {
			return nil, fmt.Errorf("give worktree %s back: %s: %w", worktree, rel, err)
		}
	}
	if err := os.Remove(m.turn); err != nil {
		return nil, fmt.Errorf("give worktree %s back: %w", worktree, err)
	}
	return idmapReport(worktree, rec, h, start), nil
}

// changed gives back the entry rel below the open root and the
// directories above it not seen yet; below a nested repository handed to
// the agent, nothing more.
func (h *idmapHook) changed(root int, rel string, seen map[string]bool) error {
	parts := strings.Split(rel, "/")
	for i := range parts {
		p := strings.Join(parts[:i+1], "/")
		if h.given[p] {
			return nil
		}
		if i < len(parts)-1 && seen[p] {
			continue
		}
		seen[p] = true
		dir := root
		if i > 0 {
			fd, err := unix.Openat2(root, strings.Join(parts[:i], "/"), &unix.OpenHow{
				Flags:   unix.O_RDONLY | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC | unix.O_NONBLOCK,
				Resolve: resolve.Beneath,
			})
			if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP) || errors.Is(err, unix.EXDEV) {
				return nil // gone, or not below the worktree's own mount
			}
			if err != nil {
				return err
			}
			dir = fd
		}
		var st unix.Stat_t
		err := unix.Fstatat(dir, parts[i], &st, unix.AT_SYMLINK_NOFOLLOW)
		if err == nil {
			_, _, err = h.Entry(dir, parts[i], p, &st)
		} else if errors.Is(err, unix.ENOENT) {
			err = nil
		}
		if dir != root {
			unix.Close(dir)
		}
		if err != nil {
			return err
		}
	}
	return nil
}
