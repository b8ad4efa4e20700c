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
	"strings"
	"unicode"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"github.com/shrooms-cage/shrooms/pkg/taskid"
)

// ManifestName and FilesDir lay out a delivery directory: the files under
// FilesDir, the manifest beside them, written last.
const (
	ManifestName = "manifest.json"
	FilesDir     = "files"
)

// maxListedRejections bounds the report; the rest are only counted.
const maxListedRejections = 1000

// File is one delivered (or, for List, deliverable) file.
type File struct {
	Name   string `json:"name"` // slash-separated, relative to the outbox
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
	Mode   string `json:"mode"`
}

// Rejected is an outbox entry collect did not deliver, and why.
type Rejected struct {
	Name   string `json:"name"`
	Reason string `json:"reason"`
}

// Report is the result of List or Collect.
type Report struct {
	Task     string     `json:"task"`
	Delivery string     `json:"delivery,omitempty"` // the delivery directory (Collect)
	Manifest string     `json:"manifest,omitempty"` // its manifest (Collect)
	Files    []File     `json:"files"`
	Rejected []Rejected `json:"rejected"`
	// MoreRejected counts rejections left out of Rejected to bound its size.
	MoreRejected int `json:"moreRejected,omitempty"`
	// Left lists delivered files that could not be removed from the outbox.
	Left []Rejected `json:"left,omitempty"`
}

// Manifest is the JSON written to <delivery>/manifest.json.
type Manifest struct {
	Task  string `json:"task"`
	Files []File `json:"files"`
}

// Request names what to collect and where to.
type Request struct {
	Root   string // outbox root ([outbox] root)
	Task   string
	To     string // delivery directory: created, or an existing empty directory
	Limits Limits
	// Worktree is the task's worktree; a delivery directory inside it (or
	// inside the outbox root) is refused.
	Worktree string
}

// List reports what Collect would deliver and reject, reading file contents
// (for the digests) the same way Collect does, and changing nothing.
func List(ctx context.Context, root, task string, lim Limits) (*Report, error) {
	w, closeFn, err := open(ctx, root, task, lim)
	if err != nil {
		return nil, err
	}
	defer closeFn()
	return w.run(nil)
}

// Collect moves the valid regular files of the task's outbox into req.To:
// each is copied by content through a pinned descriptor into
// <To>/files/<name> (mode 0644, or 0755 when exec is allowed and the source
// was executable; no setuid/setgid, no xattrs), the manifest is written last
// and atomically, and only then are the delivered files removed from the
// outbox. Rejected entries stay in the outbox and are listed with the reason.
// On error nothing is removed from the outbox and a partial delivery
// directory is removed again.
func Collect(ctx context.Context, req Request) (*Report, error) {
	to, err := checkDelivery(req)
	if err != nil {
		return nil, err
	}
	w, closeFn, err := open(ctx, req.Root, req.Task, req.Limits)
	if err != nil {
		return nil, err
	}
	defer closeFn()
	created, err := makeDelivery(to)
	if err != nil {
		return nil, err
	}
	d := &delivery{dir: to, files: filepath.Join(to, FilesDir), exec: req.Limits.AllowExec}
	rep, err := w.run(d)
	if err == nil {
		err = d.finish(req.Task, rep)
	}
	if err != nil {
		d.abort(created)
		return nil, err
	}
	rep.Delivery = to
	rep.Manifest = filepath.Join(to, ManifestName)
	rep.Left = w.removeDelivered(d.moved)
	return rep, nil
}

func open(ctx context.Context, root, task string, lim Limits) (*walker, func(), error) {
	if _, err := taskid.Parse(task); err != nil {
		return nil, nil, err
	}
	if lim.MaxFiles < 1 || lim.MaxDepth < 1 || lim.MaxNameLength < 1 || lim.MaxFileSize < 1 || lim.MaxTotalSize < 1 || lim.Timeout <= 0 {
		return nil, nil, fmt.Errorf("outbox limits are not set (use LimitsFrom)")
	}
	rootfd, err := openRoot(root)
	if err != nil {
		return nil, nil, err
	}
	fd, err := openTask(rootfd, root, task, unix.O_RDONLY)
	unix.Close(rootfd)
	if err != nil {
		return nil, nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, lim.Timeout)
	w := &walker{ctx: ctx, lim: lim, top: fd, rep: &Report{Task: task, Files: []File{}, Rejected: []Rejected{}}}
	return w, func() { cancel(); unix.Close(fd) }, nil
}

type walker struct {
	ctx   context.Context
	lim   Limits
	top   int // the pinned outbox directory
	rep   *Report
	files int
	total int64
	dirs  []string // visited directories, parents first
}

func (w *walker) reject(name, reason string) {
	if len(w.rep.Rejected) < maxListedRejections {
		w.rep.Rejected = append(w.rep.Rejected, Rejected{Name: name, Reason: reason})
	} else {
		w.rep.MoreRejected++
	}
}

func (w *walker) run(d *delivery) (*Report, error) {
	if err := w.dir(d, w.top, "", 1); err != nil {
		return nil, err
	}
	return w.rep, nil
}

// dir walks the pinned directory fd (rel is its slash path, depth its level).
func (w *walker) dir(d *delivery, fd int, rel string, depth int) error {
	names, err := readNames(fd)
	if err != nil {
		return fmt.Errorf("read outbox directory %q: %w", displayName(rel), err)
	}
	for _, name := range names {
		if err := w.ctx.Err(); err != nil {
			return fmt.Errorf("collect did not finish within %s (nothing was moved): %w", w.lim.Timeout, err)
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
	pfd, err := unix.Openat2(dirfd, name, &unix.OpenHow{Flags: unix.O_PATH | unix.O_NOFOLLOW | unix.O_CLOEXEC, Resolve: resolveIn})
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
	case w.files+1 > w.lim.MaxFiles:
		w.reject(relName, fmt.Sprintf("over max_files %d", w.lim.MaxFiles))
		return nil
	case w.total+st.Size > w.lim.MaxTotalSize:
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
	if d != nil {
		if err := out.Chmod(mode); err != nil {
			return fmt.Errorf("delivery %s: %w", relName, err)
		}
		d.moved = append(d.moved, moved{dir: rel, name: name, dev: st.Dev, ino: st.Ino})
	}
	w.files++
	w.total += st.Size
	w.rep.Files = append(w.rep.Files, File{Name: relName, Size: st.Size, SHA256: hex.EncodeToString(sumOf(h)), Mode: fmt.Sprintf("%04o", mode)})
	return nil
}

func sumOf(h hash.Hash) []byte { return h.Sum(nil) }

// reopen opens name in dirfd again for reading and checks it is still the
// object first pinned with O_PATH (same device, inode and type).
func reopen(dirfd int, name string, flags uint64, want *unix.Stat_t) (int, error) {
	fd, err := unix.Openat2(dirfd, name, &unix.OpenHow{Flags: flags | unix.O_NOFOLLOW | unix.O_CLOEXEC, Resolve: resolveIn})
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
	dup, err := unix.Openat2(fd, ".", &unix.OpenHow{Flags: unix.O_RDONLY | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: resolveIn})
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
type delivery struct {
	dir, files string
	exec       bool
	moved      []moved
}

func (d *delivery) create(rel string) (*os.File, error) {
	p := filepath.Join(d.files, filepath.FromSlash(rel))
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
	if err := os.Remove(filepath.Join(d.files, filepath.FromSlash(rel))); err != nil {
		return fmt.Errorf("delivery: remove rejected copy: %w", err)
	}
	return nil
}

// finish makes the delivery durable, then writes the manifest atomically.
func (d *delivery) finish(task string, rep *Report) error {
	if err := os.MkdirAll(d.files, 0o755); err != nil {
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
	data, err := json.MarshalIndent(Manifest{Task: task, Files: rep.Files}, "", "  ")
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
		os.RemoveAll(d.files)
	}
}

// removeDelivered unlinks delivered files from the outbox, each in its
// parent re-resolved beneath the pinned outbox and only if the name still
// refers to the inode that was copied; then removes emptied directories.
// What cannot be removed is reported, not fatal: the delivery is complete.
func (w *walker) removeDelivered(ms []moved) []Rejected {
	var left []Rejected
	for _, m := range ms {
		rel := path.Join(m.dir, m.name)
		if err := w.unlinkIn(m.dir, m.name, 0, func(st *unix.Stat_t) bool { return st.Dev == m.dev && st.Ino == m.ino }); err != nil {
			left = append(left, Rejected{Name: rel, Reason: "delivered but not removed from the outbox: " + err.Error()})
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
	pfd, err := unix.Openat2(w.top, dir, &unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC, Resolve: resolveIn})
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
