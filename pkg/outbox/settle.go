package outbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/shrooms-cage/shrooms/pkg/resolve"
	"github.com/shrooms-cage/shrooms/pkg/taskid"
)

// Moved is what Settle moved out of a turn's outbox: the record kept as
// the pending turn's manifest.json, and the summary a turn reports.
type Moved struct {
	Task string `json:"task"`
	Turn int    `json:"turn"`
	// Pending is the pending turn's directory (files/ and manifest.json).
	Pending string `json:"pending,omitempty"`
	Files   []File `json:"files"`
	// Rejected are the entries dropped at the move (links, FIFOs, devices,
	// bad names, past the limits): they went with the turn's tmpfs.
	Rejected     []Rejected `json:"rejected"`
	MoreRejected int        `json:"moreRejected,omitempty"`
}

// Settle ends the task's live outbox: what is in root/task — in each mount
// namespace in nss (the podman service's) and then in the caller's own —
// is moved into the pending turn <root>/.pending/<task>/<turn>/ (valid
// regular files within lim, copied through pinned descriptors; the rest
// is dropped and recorded), and the tmpfs is unmounted. A bare directory
// holding files (a cage given it without its tmpfs) is first renamed out of
// the cages' reach. Call it with the task lock held and no process of the
// task's cages running. A turn already moved is not moved again (what its
// tmpfs still holds is what was refused then), and nothing to move is no
// error: Moved is nil then. When the move fails, the live outbox is left
// as it is, so Mount refuses to hand it to the next turn.
func Settle(ctx context.Context, root string, id taskid.ID, turn int, lim Limits, nss ...string) (*Moved, error) {
	task := id.String()
	if id.IsZero() {
		return nil, errNoTask
	}
	if turn < 0 {
		return nil, fmt.Errorf("outbox of task %s: turn %d is no turn", task, turn)
	}
	if err := checkLimits(lim); err != nil {
		return nil, err
	}
	var out *Moved
	for _, ns := range namespaces(nss) {
		for i := 0; ; i++ {
			if i >= 8 {
				return out, fmt.Errorf("outbox %s: still mounted after 8 moves", filepath.Join(root, task))
			}
			m, more, err := settleOnce(ctx, root, id, turn, lim, ns)
			if out == nil {
				out = m
			}
			if err != nil {
				return out, err
			}
			if !more {
				break
			}
		}
	}
	return out, nil
}

// source is a live outbox opened for its move: src is its pinned content,
// mnt the tmpfs to unmount afterwards (-1 for none), aside a quarantined
// bare directory to remove afterwards ("" for none).
type source struct {
	src, mnt int
	aside    string
}

func (s *source) close() {
	for _, fd := range []int{s.src, s.mnt} {
		if fd >= 0 {
			unix.Close(fd)
		}
	}
}

// settleOnce moves and unmounts the top of root/task in ns; more says
// whether there was anything to settle (then it is tried again).
func settleOnce(ctx context.Context, root string, id taskid.ID, turn int, lim Limits, ns string) (*Moved, bool, error) {
	task := id.String()
	var s *source
	if err := inNS(ns, func() (err error) { s, err = openLive(root, id); return err }); err != nil || s == nil {
		return nil, false, err
	}
	defer s.close()
	m, err := move(ctx, s.src, root, id, turn, lim)
	if err != nil {
		return nil, true, fmt.Errorf("turn %d's outbox could not be moved to its pending delivery (it stays where it is, and no turn of the task starts until it is moved or `shrooms outbox release --task %s` discards it): %w", turn, task, err)
	}
	err = inNS(ns, func() error {
		if s.mnt >= 0 {
			if err := unix.Unmount("/proc/thread-self/fd/"+strconv.Itoa(s.mnt), unix.MNT_DETACH); err != nil {
				return fmt.Errorf("unmount outbox %s: %w", filepath.Join(root, task), err)
			}
		}
		if s.aside != "" {
			return os.RemoveAll(s.aside)
		}
		return nil
	})
	return m, true, err
}

// openLive opens what root/task holds in the caller's namespace: the tmpfs
// mounted there, or a bare directory that is not empty (renamed aside
// first). nil means there is nothing to settle.
func openLive(root string, id taskid.ID) (*source, error) {
	rootfd, err := openRoot(root)
	if errors.Is(err, unix.ENOENT) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer unix.Close(rootfd)
	tfd, err := openTask(rootfd, root, id, unix.O_PATH)
	if errors.Is(err, unix.ENOENT) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	mounted, err := isOwnMount(rootfd, tfd)
	if err != nil {
		unix.Close(tfd)
		return nil, err
	}
	s := &source{src: -1, mnt: -1}
	if mounted {
		s.mnt = tfd
		if s.src, err = openTask(rootfd, root, id, unix.O_RDONLY); err != nil {
			s.close()
			return nil, err
		}
		return s, nil
	}
	unix.Close(tfd)
	dfd, err := openTask(rootfd, root, id, unix.O_RDONLY)
	if err != nil {
		return nil, err
	}
	names, err := readNames(dfd)
	unix.Close(dfd)
	if err != nil || len(names) == 0 {
		return nil, err
	}
	if s.aside, err = quarantine(rootfd, root, id, "aside"); err != nil {
		return nil, err
	}
	s.src, err = unix.Openat2(unix.AT_FDCWD, s.aside, &unix.OpenHow{Flags: unix.O_RDONLY | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC, Resolve: resolve.NoLinks})
	if err != nil {
		return nil, fmt.Errorf("outbox moved aside to %s: %w", s.aside, err)
	}
	return s, nil
}

// move copies what the pinned directory src holds into the pending turn
// (written as .new-<turn>, renamed to <turn> once complete). An existing
// pending turn is kept and returned as it is; nothing to move is nil.
func move(ctx context.Context, src int, root string, id taskid.ID, turn int, lim Limits) (*Moved, error) {
	task := id.String()
	rootfd, err := openRoot(root)
	if err != nil {
		return nil, err
	}
	pfd, err := openPending(rootfd, root, id)
	unix.Close(rootfd)
	if err != nil {
		return nil, err
	}
	defer unix.Close(pfd)
	dir := Pending(root, id)
	final := filepath.Join(dir, strconv.Itoa(turn))
	if _, err := os.Lstat(final); err == nil {
		return &Moved{Task: task, Turn: turn, Pending: final, Files: []File{}, Rejected: []Rejected{}}, nil
	}
	tmp := filepath.Join(dir, ".new-"+strconv.Itoa(turn))
	if err := os.RemoveAll(tmp); err != nil {
		return nil, fmt.Errorf("remove an unfinished move: %w", err)
	}
	if err := os.Mkdir(tmp, 0o700); err != nil {
		return nil, fmt.Errorf("pending delivery: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, lim.Timeout)
	defer cancel()
	rep := &Report{Task: task, Files: []File{}, Rejected: []Rejected{}}
	w := &walker{ctx: ctx, lim: lim, top: src, turn: turn, t: &tally{rep: rep}}
	d := &delivery{dir: tmp, exec: lim.AllowExec}
	if err := w.dir(d, src, "", 1); err != nil {
		os.RemoveAll(tmp)
		return nil, err
	}
	if len(rep.Files) == 0 && len(rep.Rejected) == 0 {
		return nil, os.RemoveAll(tmp) // an empty outbox leaves no pending turn
	}
	m := &Moved{Task: task, Turn: turn, Files: rep.Files, Rejected: rep.Rejected, MoreRejected: rep.MoreRejected}
	if err := d.finish(m); err != nil {
		os.RemoveAll(tmp)
		return nil, err
	}
	if err := unix.Renameat2(unix.AT_FDCWD, tmp, unix.AT_FDCWD, final, unix.RENAME_NOREPLACE); err != nil {
		os.RemoveAll(tmp)
		return nil, fmt.Errorf("pending delivery %s: %w", final, err)
	}
	if df, err := os.Open(dir); err == nil {
		err = df.Sync()
		df.Close()
		if err != nil {
			return nil, fmt.Errorf("pending delivery: sync: %w", err)
		}
	}
	m.Pending = final
	return m, nil
}

// Summary is a turn's outbox in a turn's result: how much was moved to its
// pending delivery and how much dropped.
type Summary struct {
	Turn    int    `json:"turn"`
	Pending string `json:"pending,omitempty"`
	Files   int    `json:"files"`
	Bytes   int64  `json:"bytes"`
	Dropped int    `json:"dropped"`
	// MoveMs is how long the move took.
	MoveMs float64 `json:"moveMs"`
	// Error is why the outbox could not be moved (it stays as it is, and no
	// turn of the task starts until it is moved or released).
	Error string `json:"error,omitempty"`
}

// Summarize is m as a turn reports it.
func (m *Moved) Summarize() Summary {
	s := Summary{Turn: m.Turn, Pending: m.Pending, Files: len(m.Files), Dropped: len(m.Rejected) + m.MoreRejected}
	for _, f := range m.Files {
		s.Bytes += f.Size
	}
	return s
}

// PendingTurns lists the task's complete pending turns, oldest first.
func PendingTurns(root string, id taskid.ID) ([]int, error) {
	ents, err := os.ReadDir(Pending(root, id))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var turns []int
	for _, e := range ents {
		if t, err := strconv.Atoi(e.Name()); err == nil && t > 0 && !strings.HasPrefix(e.Name(), "0") {
			turns = append(turns, t)
		}
	}
	return turns, nil
}
