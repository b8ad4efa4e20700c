package outbox

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"github.com/shrooms-cage/shrooms/pkg/resolve"
	"github.com/shrooms-cage/shrooms/pkg/taskid"
)

// ManifestName and FilesDir lay out a delivery directory (and a pending
// turn): the files under FilesDir (a delivery: FilesDir/<turn>/), the
// manifest beside them, written last.
const (
	ManifestName = "manifest.json"
	FilesDir     = "files"
)

// maxListedRejections bounds the report; the rest are only counted.
const maxListedRejections = 1000

// File is one delivered (or, for List, deliverable) file.
type File struct {
	Name   string `json:"name"` // slash-separated, relative to the turn's /outbox
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
	Mode   string `json:"mode"`
	// Turn is the turn that left it in /outbox.
	Turn int `json:"turn,omitempty"`
	// Path is where Collect put it, relative to the delivery directory
	// (files/<turn>/<name>).
	Path string `json:"path,omitempty"`
}

// Rejected is an outbox entry that was not delivered, and why.
type Rejected struct {
	Name   string `json:"name"`
	Reason string `json:"reason"`
	Turn   int    `json:"turn,omitempty"`
	// Dropped is set for what was refused when the turn's outbox was moved
	// at its end: it is gone. Without it, the file stays pending.
	Dropped bool `json:"dropped,omitempty"`
}

// Report is the result of List or Collect.
type Report struct {
	Task     string `json:"task"`
	Delivery string `json:"delivery,omitempty"` // the delivery directory (Collect)
	Manifest string `json:"manifest,omitempty"` // its manifest (Collect)
	// Turns are the pending turns listed or collected, oldest first.
	Turns    []int      `json:"turns"`
	Files    []File     `json:"files"`
	Rejected []Rejected `json:"rejected"`
	// MoreRejected counts rejections left out of Rejected to bound its size.
	MoreRejected int `json:"moreRejected,omitempty"`
	// Left lists delivered files that could not be removed from the pending
	// deliveries.
	Left []Rejected `json:"left,omitempty"`
}

// Manifest is the JSON written to <delivery>/manifest.json.
type Manifest struct {
	Task     string     `json:"task"`
	Turns    []int      `json:"turns,omitempty"`
	Files    []File     `json:"files"`
	Rejected []Rejected `json:"rejected,omitempty"`
}

// Request names what to collect and where to.
type Request struct {
	Root   string // outbox root ([outbox] root)
	Task   taskid.ID
	To     string // delivery directory: created, or an existing empty directory
	Limits Limits
	// Worktree is the task's worktree; a delivery directory inside it (or
	// inside the outbox root) is refused.
	Worktree string
}

// List reports what Collect would deliver and reject of the task's pending
// deliveries, reading file contents (for the digests) the same way Collect
// does, and changing nothing.
func List(ctx context.Context, root string, id taskid.ID, lim Limits) (*Report, error) {
	p, err := openPendings(ctx, root, id, lim)
	if err != nil {
		return nil, err
	}
	defer p.close()
	if err := p.walk(nil); err != nil {
		return nil, err
	}
	return p.rep, nil
}

// Collect moves the valid regular files of the task's pending deliveries
// into req.To: each is copied by content through a pinned descriptor into
// <To>/files/<turn>/<name> (mode 0644, or 0755 when exec is allowed and
// the source was executable; no setuid/setgid, no xattrs), the manifest is
// written last and atomically, and only then are the delivered files
// removed from the pending deliveries (a turn with nothing left goes, with
// the record of what was dropped at its end). Files past the limits stay
// pending and are listed with the reason. On error nothing is removed and
// a partial delivery directory is removed again.
func Collect(ctx context.Context, req Request) (*Report, error) {
	to, err := checkDelivery(req)
	if err != nil {
		return nil, err
	}
	p, err := openPendings(ctx, req.Root, req.Task, req.Limits)
	if err != nil {
		return nil, err
	}
	defer p.close()
	created, err := makeDelivery(to)
	if err != nil {
		return nil, err
	}
	d := &delivery{dir: to, exec: req.Limits.AllowExec}
	err = p.walk(d)
	if err == nil {
		err = d.finish(Manifest{Task: req.Task.String(), Turns: p.rep.Turns, Files: p.rep.Files, Rejected: p.rep.Rejected})
	}
	if err != nil {
		d.abort(created)
		return nil, err
	}
	p.rep.Delivery = to
	p.rep.Manifest = filepath.Join(to, ManifestName)
	p.rep.Left = p.removeDelivered()
	return p.rep, nil
}

func checkLimits(lim Limits) error {
	if lim.MaxFiles < 1 || lim.MaxDepth < 1 || lim.MaxNameLength < 1 || lim.MaxFileSize < 1 || lim.MaxTotalSize < 1 || lim.Timeout <= 0 {
		return fmt.Errorf("outbox limits are not set (use LimitsFrom)")
	}
	return nil
}

// tally is what the walkers of one List, Collect or move share: the report
// and the limits' counters.
type tally struct {
	rep   *Report
	files int
	total int64
}

func (t *tally) reject(r Rejected) {
	if len(t.rep.Rejected) < maxListedRejections {
		t.rep.Rejected = append(t.rep.Rejected, r)
	} else {
		t.rep.MoreRejected++
	}
}

// pendings are the task's pending turns, opened for one List or Collect.
type pendings struct {
	ctx    context.Context
	cancel func()
	lim    Limits
	dir    string // <root>/.pending/<task>
	rep    *Report
	turns  []pendingTurn
}

type pendingTurn struct {
	turn    int
	files   int // its pinned files directory, -1 for none
	dropped []Rejected
	more    int // dropped entries not listed in the record
	w       *walker
}

// openPendings opens the task's complete pending turns (a turn directory
// is complete once renamed to its number), oldest first.
func openPendings(ctx context.Context, root string, id taskid.ID, lim Limits) (*pendings, error) {
	task := id.String()
	if id.IsZero() {
		return nil, errNoTask
	}
	if err := checkLimits(lim); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, lim.Timeout)
	p := &pendings{ctx: ctx, cancel: cancel, lim: lim, dir: Pending(root, id), rep: &Report{Task: task, Turns: []int{}, Files: []File{}, Rejected: []Rejected{}}}
	rootfd, err := openRoot(root)
	if err != nil {
		cancel()
		return nil, err
	}
	defer unix.Close(rootfd)
	pfd, err := unix.Openat2(rootfd, PendingDir+"/"+task, &unix.OpenHow{Flags: unix.O_RDONLY | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC, Resolve: resolve.Beneath})
	if errors.Is(err, unix.ENOENT) {
		return p, nil // nothing pending
	}
	if err != nil {
		cancel()
		var st unix.Stat_t
		if unix.Lstat(p.dir, &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK {
			return nil, fmt.Errorf("pending deliveries %s are a symbolic link (refused, not followed)", p.dir)
		}
		return nil, fmt.Errorf("pending deliveries %s: %w", p.dir, explain(err))
	}
	defer unix.Close(pfd)
	names, err := readNames(pfd)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("read pending deliveries %s: %w", p.dir, err)
	}
	var turns []int
	for _, n := range names {
		if t, err := strconv.Atoi(n); err == nil && t >= 0 && strconv.Itoa(t) == n {
			turns = append(turns, t)
		}
	}
	sort.Ints(turns)
	for _, t := range turns {
		pt, err := openTurn(pfd, p.dir, t)
		if err != nil {
			p.close()
			return nil, err
		}
		p.turns = append(p.turns, pt)
		p.rep.Turns = append(p.rep.Turns, t)
	}
	return p, nil
}

// openTurn reads a pending turn's record and pins its files directory.
func openTurn(pfd int, dir string, turn int) (pendingTurn, error) {
	pt := pendingTurn{turn: turn, files: -1}
	name := strconv.Itoa(turn)
	mfd, err := unix.Openat2(pfd, name+"/"+ManifestName, &unix.OpenHow{Flags: unix.O_RDONLY | unix.O_NOFOLLOW | unix.O_NONBLOCK | unix.O_CLOEXEC, Resolve: resolve.Beneath})
	if err != nil {
		return pt, fmt.Errorf("pending turn %s: record: %w", filepath.Join(dir, name), explain(err))
	}
	f := os.NewFile(uintptr(mfd), ManifestName)
	var m Moved
	err = json.NewDecoder(io.LimitReader(f, 64<<20)).Decode(&m)
	f.Close()
	if err != nil || m.Turn != turn {
		return pt, fmt.Errorf("pending turn %s: record is not readable (%v); `shrooms outbox release` discards the pending deliveries", filepath.Join(dir, name), err)
	}
	for _, r := range m.Rejected {
		r.Turn, r.Dropped = turn, true
		pt.dropped = append(pt.dropped, r)
	}
	pt.more = m.MoreRejected
	fd, err := unix.Openat2(pfd, name+"/"+FilesDir, &unix.OpenHow{Flags: unix.O_RDONLY | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC, Resolve: resolve.Beneath})
	if err == nil {
		pt.files = fd
	} else if !errors.Is(err, unix.ENOENT) {
		return pt, fmt.Errorf("pending turn %s: %w", filepath.Join(dir, name), explain(err))
	}
	return pt, nil
}

func (p *pendings) close() {
	p.cancel()
	for _, t := range p.turns {
		if t.files >= 0 {
			unix.Close(t.files)
		}
	}
}

// walk walks every pending turn in order, into d (nil for List).
func (p *pendings) walk(d *delivery) error {
	t := &tally{rep: p.rep}
	for i := range p.turns {
		pt := &p.turns[i]
		for _, r := range pt.dropped {
			t.reject(r)
		}
		t.rep.MoreRejected += pt.more
		if pt.files < 0 {
			continue
		}
		pt.w = &walker{ctx: p.ctx, lim: p.lim, top: pt.files, turn: pt.turn, t: t}
		if d != nil {
			d.sub = strconv.Itoa(pt.turn)
		}
		if err := pt.w.dir(d, pt.files, "", 1); err != nil {
			return err
		}
	}
	return nil
}

// removeDelivered removes what was delivered from the pending turns, and
// the turns that have nothing left.
func (p *pendings) removeDelivered() []Rejected {
	var left []Rejected
	for _, pt := range p.turns {
		if pt.w != nil {
			left = append(left, pt.w.removeDelivered()...)
		}
		if pt.files >= 0 {
			if names, err := readNames(pt.files); err != nil || len(names) > 0 {
				continue // files past the limits stay pending
			}
		}
		if err := os.RemoveAll(filepath.Join(p.dir, strconv.Itoa(pt.turn))); err != nil {
			left = append(left, Rejected{Name: strconv.Itoa(pt.turn) + "/", Turn: pt.turn, Reason: "delivered, but the pending turn was not removed: " + err.Error()})
		}
	}
	return left
}

type walker struct {
	ctx   context.Context
	lim   Limits
	top   int // the pinned directory walked
	turn  int
	t     *tally
	dirs  []string // visited directories, parents first
	moved []moved  // delivered files, for their removal afterwards
}

func (w *walker) reject(name, reason string) {
	w.t.reject(Rejected{Name: name, Reason: reason, Turn: w.turn})
}

// dir walks the pinned directory fd (rel is its slash path, depth its level).
func (w *walker) dir(d *delivery, fd int, rel string, depth int) error {
	names, err := readNames(fd)
	if err != nil {
		return fmt.Errorf("read outbox directory %q: %w", displayName(rel), err)
	}
	for _, name := range names {
		if err := w.ctx.Err(); err != nil {
			return fmt.Errorf("the outbox walk did not finish within %s (nothing was moved): %w", w.lim.Timeout, err)
		}
		relName := name
		if rel != "" {
			relName = rel + "/" + name
		}
		if reason := checkName(name, w.lim.MaxNameLength); reason != "" {
			w.reject(displayName(relName), reason)
			continue
		}
		if err := w.entry(d, fd, rel, name, relName, depth); err != nil {
			return err
		}
	}
	return nil
}

func (w *walker) entry(d *delivery, dirfd int, rel, name, relName string, depth int) error {
	// O_PATH opens nothing: FIFOs, sockets and devices are typed unopened.
	pfd, err := unix.Openat2(dirfd, name, &unix.OpenHow{Flags: unix.O_PATH | unix.O_NOFOLLOW | unix.O_CLOEXEC, Resolve: resolve.Beneath})
	if err != nil {
		w.reject(relName, "cannot be pinned: "+explain(err).Error())
		return nil
	}
	defer unix.Close(pfd)
	var st unix.Stat_t
	if err := unix.Fstat(pfd, &st); err != nil {
		w.reject(relName, "fstat: "+err.Error())
		return nil
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFLNK:
		w.reject(relName, "symbolic link (not followed)")
	case unix.S_IFIFO:
		w.reject(relName, "FIFO (not opened)")
	case unix.S_IFSOCK:
		w.reject(relName, "socket (not opened)")
	case unix.S_IFCHR, unix.S_IFBLK:
		w.reject(relName, "device node (not opened)")
	case unix.S_IFDIR:
		if depth+1 > w.lim.MaxDepth {
			w.reject(relName+"/", fmt.Sprintf("directory deeper than max_depth %d", w.lim.MaxDepth))
			return nil
		}
		cfd, err := reopen(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY, &st)
		if err != nil {
			w.reject(relName+"/", err.Error())
			return nil
		}
		defer unix.Close(cfd)
		w.dirs = append(w.dirs, relName)
		return w.dir(d, cfd, relName, depth+1)
	case unix.S_IFREG:
		return w.regular(d, dirfd, rel, name, relName, &st)
	default:
		w.reject(relName, "not a regular file")
	}
	return nil
}

func (w *walker) regular(d *delivery, dirfd int, rel, name, relName string, st *unix.Stat_t) error {
	switch {
	case st.Nlink > 1:
		w.reject(relName, fmt.Sprintf("hard link (%d names)", st.Nlink))
		return nil
	case st.Size > w.lim.MaxFileSize:
		w.reject(relName, fmt.Sprintf("%d bytes exceeds max_file_size %d", st.Size, w.lim.MaxFileSize))
		return nil
	case w.t.files+1 > w.lim.MaxFiles:
		w.reject(relName, fmt.Sprintf("over max_files %d", w.lim.MaxFiles))
		return nil
	case w.t.total+st.Size > w.lim.MaxTotalSize:
		w.reject(relName, fmt.Sprintf("would exceed max_total_size %d", w.lim.MaxTotalSize))
		return nil
	}
	// O_NONBLOCK: should the name have been swapped for a FIFO since the
	// O_PATH open, opening it still returns at once (and is then refused).
	fd, err := reopen(dirfd, name, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY, st)
	if err != nil {
		w.reject(relName, err.Error())
		return nil
	}
	f := os.NewFile(uintptr(fd), relName)
	defer f.Close()
	h := sha256.New()
	var dst io.Writer = h
	var out *os.File
	if d != nil {
		out, err = d.create(relName)
		if err != nil {
			return err
		}
		defer out.Close()
		dst = io.MultiWriter(h, out)
	}
	// Copy at most st.Size+1 bytes: a file that grows (or a sparse file
	// whose size lied) is caught without reading past the cap.
	n, err := io.Copy(dst, io.LimitReader(f, st.Size+1))
	if err == nil && n != st.Size {
		err = fmt.Errorf("changed size while being read (%d bytes, expected %d)", n, st.Size)
	}
	if err != nil {
		if d != nil {
			if rerr := d.discard(out, relName); rerr != nil {
				return rerr
			}
		}
		w.reject(relName, err.Error())
		return nil
	}
	mode := normalMode(st.Mode, w.lim.AllowExec)
	file := File{Name: relName, Size: st.Size, SHA256: hex.EncodeToString(sumOf(h)), Mode: fmt.Sprintf("%04o", mode), Turn: w.turn}
	if d != nil {
		if err := out.Chmod(mode); err != nil {
			return fmt.Errorf("delivery %s: %w", relName, err)
		}
		w.moved = append(w.moved, moved{dir: rel, name: name, dev: st.Dev, ino: st.Ino})
		if d.sub != "" {
			file.Path = path.Join(FilesDir, d.sub, relName)
		}
	}
	w.t.files++
	w.t.total += st.Size
	w.t.rep.Files = append(w.t.rep.Files, file)
	return nil
}

func sumOf(h hash.Hash) []byte { return h.Sum(nil) }

// reopen opens name in dirfd again for reading and checks it is still the
// object first pinned with O_PATH (same device, inode and type).
func reopen(dirfd int, name string, flags uint64, want *unix.Stat_t) (int, error) {
	fd, err := unix.Openat2(dirfd, name, &unix.OpenHow{Flags: flags | unix.O_NOFOLLOW | unix.O_CLOEXEC, Resolve: resolve.Beneath})
	if err != nil {
		return -1, fmt.Errorf("cannot be opened: %v", explain(err))
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("fstat: %v", err)
	}
	if st.Dev != want.Dev || st.Ino != want.Ino || st.Mode&unix.S_IFMT != want.Mode&unix.S_IFMT {
		unix.Close(fd)
		return -1, fmt.Errorf("replaced while being collected (refused)")
	}
	return fd, nil
}

// normalMode is the delivered mode: 0644, or 0755 when exec is allowed and
// the owner could execute the source. Never setuid, setgid or sticky.
func normalMode(m uint32, allowExec bool) os.FileMode {
	if allowExec && m&0o100 != 0 {
		return 0o755
	}
	return 0o644
}

// readNames lists a directory through its pinned fd (a duplicate, so the
// walker's fd keeps its own offset), sorted.
func readNames(fd int) ([]string, error) {
	dup, err := unix.Openat2(fd, ".", &unix.OpenHow{Flags: unix.O_RDONLY | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: resolve.Beneath})
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(dup), ".")
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return nil, err
	}
	sort.Strings(names)
	return names, nil
}

// checkName returns why a path component cannot be delivered, or "".
func checkName(name string, maxLen int) string {
	switch {
	case !utf8.ValidString(name):
		return "name is not valid UTF-8"
	case len(name) > maxLen:
		return fmt.Sprintf("name longer than max_name_length %d bytes", maxLen)
	case name == "." || name == ".." || strings.Contains(name, ".."):
		return "name contains \"..\""
	case strings.HasPrefix(name, "-"):
		return "name starts with \"-\""
	case strings.ContainsRune(name, '/'):
		return "name contains \"/\""
	}
	for _, r := range name {
		if unicode.IsControl(r) || r == utf8.RuneError || unicode.In(r, unicode.Cf, unicode.Zl, unicode.Zp) {
			return fmt.Sprintf("name contains control or format character %U", r)
		}
	}
	return ""
}

// displayName makes a rejected name printable (quoted, escapes visible).
func displayName(s string) string {
	q := fmt.Sprintf("%q", s)
	return q[1 : len(q)-1]
}

// checkDelivery validates the delivery directory: absolute, its parent an
// existing directory, and neither inside the outbox root nor the worktree.
func checkDelivery(req Request) (string, error) {
	if req.To == "" {
		return "", fmt.Errorf("no delivery directory given")
	}
	// The path is printed in every message below: one line, readable.
	if strings.ContainsFunc(req.To, unicode.IsControl) {
		return "", fmt.Errorf("delivery directory %q contains a control character (refused)", req.To)
	}
	if !filepath.IsAbs(req.To) {
		return "", fmt.Errorf("delivery directory %q must be an absolute path", req.To)
	}
	to := filepath.Clean(req.To)
	parent, err := filepath.EvalSymlinks(filepath.Dir(to))
	if err != nil {
		return "", fmt.Errorf("delivery directory %s: parent: %w", to, err)
	}
	real := filepath.Join(parent, filepath.Base(to))
	if fi, err := os.Lstat(real); err == nil && fi.Mode()&os.ModeSymlink != 0 {
		return "", fmt.Errorf("delivery directory %s is a symbolic link (refused)", to)
	}
	for _, p := range []struct{ what, dir string }{{"outbox root", req.Root}, {"worktree", req.Worktree}} {
		if p.dir == "" {
			continue
		}
		rd, err := filepath.EvalSymlinks(p.dir)
		if err != nil {
			rd = filepath.Clean(p.dir)
		}
		if within(real, rd) || within(to, filepath.Clean(p.dir)) {
			return "", fmt.Errorf("delivery directory %s is inside the %s %s; deliver outside it", to, p.what, p.dir)
		}
	}
	return real, nil
}

func within(p, dir string) bool {
	return p == dir || strings.HasPrefix(p, strings.TrimSuffix(dir, "/")+"/")
}

// makeDelivery creates the delivery directory, or accepts an existing empty
// one. created says whether abort may remove it.
func makeDelivery(to string) (created bool, err error) {
	if err := os.Mkdir(to, 0o755); err == nil {
		return true, nil
	} else if !errors.Is(err, os.ErrExist) {
		return false, fmt.Errorf("create delivery directory: %w", err)
	}
	f, err := os.Open(to)
	if err != nil {
		return false, fmt.Errorf("delivery directory: %w", err)
	}
	defer f.Close()
	if _, err := f.Readdirnames(1); err != io.EOF {
		return false, fmt.Errorf("delivery directory %s exists and is not empty; give a new or empty directory", to)
	}
	return false, nil
}

// moved identifies a delivered source entry for its removal afterwards.
type moved struct {
	dir, name string
	dev, ino  uint64
}

// delivery writes into a directory shrooms created; the cage never sees it.
// Files go to <dir>/files/<sub>/ (sub is the turn for a collect, "" for a
// pending turn).
type delivery struct {
	dir, sub string
	exec     bool
}

func (d *delivery) path(rel string) string {
	return filepath.Join(d.dir, FilesDir, d.sub, filepath.FromSlash(rel))
}

func (d *delivery) create(rel string) (*os.File, error) {
	p := d.path(rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return nil, fmt.Errorf("delivery: %w", err)
	}
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, fmt.Errorf("delivery: %w", err)
	}
	return f, nil
}

func (d *delivery) discard(f *os.File, rel string) error {
	f.Close()
	if err := os.Remove(d.path(rel)); err != nil {
		return fmt.Errorf("delivery: remove rejected copy: %w", err)
	}
	return nil
}

// finish makes the delivery durable, then writes the manifest atomically.
func (d *delivery) finish(manifest any) error {
	if err := os.MkdirAll(filepath.Join(d.dir, FilesDir), 0o755); err != nil {
		return fmt.Errorf("delivery: %w", err)
	}
	df, err := os.Open(d.dir)
	if err != nil {
		return fmt.Errorf("delivery: %w", err)
	}
	defer df.Close()
	if err := unix.Syncfs(int(df.Fd())); err != nil {
		return fmt.Errorf("delivery: sync: %w", err)
	}
	data, err := json.MarshalIndent(manifest, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(d.dir, ".manifest-*")
	if err != nil {
		return fmt.Errorf("delivery: manifest: %w", err)
	}
	_, err = tmp.Write(append(data, '\n'))
	if err == nil {
		err = tmp.Chmod(0o644)
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), filepath.Join(d.dir, ManifestName))
	}
	if err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("delivery: manifest: %w", err)
	}
	return df.Sync()
}

func (d *delivery) abort(created bool) {
	if created {
		os.RemoveAll(d.dir)
	} else {
		os.RemoveAll(filepath.Join(d.dir, FilesDir))
	}
}

// removeDelivered unlinks delivered files from the outbox, each in its
// parent re-resolved beneath the pinned outbox and only if the name still
// refers to the inode that was copied; then removes emptied directories.
// What cannot be removed is reported, not fatal: the delivery is complete.
func (w *walker) removeDelivered() []Rejected {
	var left []Rejected
	for _, m := range w.moved {
		rel := path.Join(m.dir, m.name)
		if err := w.unlinkIn(m.dir, m.name, 0, func(st *unix.Stat_t) bool { return st.Dev == m.dev && st.Ino == m.ino }); err != nil {
			left = append(left, Rejected{Name: rel, Turn: w.turn, Reason: "delivered but not removed from the pending deliveries: " + err.Error()})
		}
	}
	for i := len(w.dirs) - 1; i >= 0; i-- {
		dir, name := path.Split(w.dirs[i])
		// Directories still holding rejected entries stay (ENOTEMPTY).
		_ = w.unlinkIn(strings.TrimSuffix(dir, "/"), name, unix.AT_REMOVEDIR, func(st *unix.Stat_t) bool { return st.Mode&unix.S_IFMT == unix.S_IFDIR })
	}
	return left
}

func (w *walker) unlinkIn(dir, name string, flags int, same func(*unix.Stat_t) bool) error {
	if dir == "" {
		dir = "."
	}
	pfd, err := unix.Openat2(w.top, dir, &unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC, Resolve: resolve.Beneath})
	if err != nil {
		return explain(err)
	}
	defer unix.Close(pfd)
	var st unix.Stat_t
	if err := unix.Fstatat(pfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return err
	}
	if !same(&st) {
		return fmt.Errorf("replaced since it was copied")
	}
	return unix.Unlinkat(pfd, name, flags)
}
