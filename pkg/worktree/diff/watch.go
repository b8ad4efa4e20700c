package diff

import (
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// A Watcher records, through fanotify, what changes on the worktree's
// filesystem while a turn runs, so that the scan after the turn visits
// only what changed (After). It marks the whole filesystem
// (FAN_MARK_FILESYSTEM, root only) and reports every event by its
// directory's file handle and name (FAN_REPORT_DFID_NAME) and, for a
// non-directory, its own handle (FAN_REPORT_FID); events outside the
// worktree are dropped as they are read (inWorktree). Every doubt — a
// lost event (queue overflow), more distinct events than maxDirty, an
// event with no handle or of another fsid, a read error — makes After
// return nil: the caller takes the full scan then.
type Watcher struct {
	fd     int
	rootFd int // the worktree root: mount fd for open_by_handle_at
	root   string
	fsid   [8]byte
	wake   int // an eventfd Stop writes: ends the reader's wait at once
	stop   chan struct{}
	done   chan struct{}

	mu    sync.Mutex
	dirty map[dirName]uint64 // (directory handle, name) → event mask seen
	inos  map[uint64]bool    // inodes of non-directory events with no name
	// outside: handles of the files of events outside the worktree (a
	// worktree file may be another link of one: afterNamespace reads
	// its links); outsideLost: more than maxOutside of them.
	outside     map[string]bool
	outsideLost bool
	// places: directory handle → in the worktree as first read (inWorktree)
	places map[string]placed
	doubt  string // why After must fall back ("" none)
	// fdClosed: the reader closed fd at a doubt (read after done only).
	fdClosed  bool
	maxDirty  int // maxDirty but in tests
	maxPlaces int // maxPlaces but in tests
	// maxOutside but in tests; nPrunes: times outside was pruned to it.
	maxOutside, nPrunes int
	// reads of the queue, events read and, of them, dropped as the rest of
	// the filesystem's (what the reader's cost grows with;
	// BenchmarkWatchBusyFilesystem).
	nReads, nEvents, nOutside int
	nIgnored                  int           // directories outside the kernel filters (ignore)
	nForgets                  int           // times the directories placed outside were forgotten
	noIgnore                  bool          // an ignore mark was refused: none more
	readerCPU                 time.Duration // the reader's thread's CPU, set as it ends
}

// dirName is one event's directory handle (type and bytes) and entry name
// ("" or "." for the directory itself).
type dirName struct {
	handle string
	name   string
}

// maxDirty bounds the distinct (directory, name) pairs a watcher keeps;
// past it After falls back to the full scan.
const maxDirty = 200_000

// gather is how long the reader lets events gather between drains, so
// that one read takes many: reading each as it came cost a poll, a read
// and the Go scheduler's wakeups per event, most of the watch's CPU when
// the rest of the filesystem is busy (BenchmarkWatchBusyFilesystem). The
// queue is unbounded: at 100 000 events a second it holds 5 000 between
// drains. Stop ends the wait at once.
const gather = 50 * time.Millisecond

// maxPlaces bounds the directories, the filesystem's, a watcher keeps
// placed (inWorktree): at it, those placed outside are forgotten; past it
// with the worktree's alone After falls back.
const maxPlaces = 200_000

// watchMask is every event that changes an entry's name, data or
// attributes (ctime): creation, deletion, renames both ways, writes,
// attribute and link-count changes, on files and directories. And every
// open of a file: a write through a shared mapping sets its mtime with no
// event, and the close that reports it can come after Stop (the file kept
// open in flight in a unix socket, released by a later garbage
// collection), so every file opened during the turn is read again.
const watchMask = unix.FAN_CREATE | unix.FAN_DELETE | unix.FAN_MOVED_FROM | unix.FAN_MOVED_TO |
	unix.FAN_MODIFY | unix.FAN_CLOSE_WRITE | unix.FAN_ATTRIB | unix.FAN_DELETE_SELF |
	unix.FAN_MOVE_SELF | unix.FAN_OPEN | unix.FAN_ONDIR

// Watch starts recording changes on root's filesystem. Call it before
// anything that may change the worktree for the turn can run (the cage's
// start) and, to match a full scan taken after it, before the scan before
// the turn. Close it on every path.
func Watch(root string) (*Watcher, error) { return watch(root, nil, maxDirty) }

// watch is Watch whose reader waits for hold to close first, with the
// default bounded queue, and keeps at most limit changes (tests: a queue
// that overflows, a turn that changes too much).
func watch(root string, hold <-chan struct{}, limit int) (*Watcher, error) {
	rootFd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("worktree watch: open %s: %w", root, err)
	}
	fail := func(err error) (*Watcher, error) {
		unix.Close(rootFd)
		return nil, err
	}
	real, err := fdPath(rootFd)
	if err != nil {
		return fail(err)
	}
	// A mount below the worktree now would be in the snapshot before and
	// out of the mark's sight (After checks again at the end).
	if m, err := mountBelow(real); err != nil || m != "" {
		return fail(fmt.Errorf("worktree watch: a mount below the worktree (%s, %v)", m, err))
	}
	var sfs unix.Statfs_t
	if err := unix.Fstatfs(rootFd, &sfs); err != nil {
		return fail(fmt.Errorf("worktree watch: statfs %s: %w", root, err))
	}
	// The queue is unbounded (the default 16 384 events overflowed in a
	// burst from the rest of the filesystem, a cage's teardown, with the
	// reader waiting for a CPU); what bounds it is the reader, which
	// drains it as events come and closes the group at its first doubt.
	flags := uint(unix.FAN_CLASS_NOTIF | unix.FAN_CLOEXEC | unix.FAN_NONBLOCK | unix.FAN_REPORT_DFID_NAME | unix.FAN_REPORT_FID)
	if hold == nil {
		flags |= unix.FAN_UNLIMITED_QUEUE
	}
	fd, err := unix.FanotifyInit(flags, unix.O_RDONLY|unix.O_CLOEXEC)
	if err != nil {
		return fail(fmt.Errorf("worktree watch: fanotify_init: %w", err))
	}
	if err := unix.FanotifyMark(fd, unix.FAN_MARK_ADD|unix.FAN_MARK_FILESYSTEM, watchMask, rootFd, ""); err != nil {
		unix.Close(fd)
		return fail(fmt.Errorf("worktree watch: fanotify_mark %s: %w", root, err))
	}
	wake, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		unix.Close(fd)
		return fail(fmt.Errorf("worktree watch: eventfd: %w", err))
	}
	w := &Watcher{fd: fd, rootFd: rootFd, root: real, wake: wake, stop: make(chan struct{}), done: make(chan struct{}),
		dirty: map[dirName]uint64{}, inos: map[uint64]bool{}, outside: map[string]bool{}, places: map[string]placed{},
		maxDirty: limit, maxPlaces: maxPlaces, maxOutside: maxOutside}
	binary.NativeEndian.PutUint32(w.fsid[0:4], uint32(sfs.Fsid.Val[0]))
	binary.NativeEndian.PutUint32(w.fsid[4:8], uint32(sfs.Fsid.Val[1]))
	go w.read(hold)
	return w, nil
}

// read drains the queue until stop, then once more: every event a change
// made before Stop is queued by then (fsnotify queues in the syscall).
// Between drains it sleeps gather, in poll on the eventfd Stop writes.
func (w *Watcher) read(hold <-chan struct{}) {
	defer close(w.done)
	// One thread of its own, so that its CPU is its own to measure.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	cpu0 := threadCPU()
	defer func() {
		w.mu.Lock()
		w.readerCPU = threadCPU() - cpu0
		w.mu.Unlock()
	}()
	if hold != nil {
		<-hold
	}
	buf := make([]byte, 256<<10)
	for {
		stopping := false
		select {
		case <-w.stop:
			stopping = true
		default:
		}
		for {
			n, err := unix.Read(w.fd, buf)
			if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
				break
			}
			if err != nil || n <= 0 {
				w.fail(fmt.Sprintf("read: %v", err))
				return
			}
			w.parse(buf[:n])
			if w.doubted() {
				// Nothing more can help: free the queue now.
				unix.Close(w.fd)
				w.fdClosed = true
				return
			}
		}
		if stopping {
			return
		}
		fds := []unix.PollFd{{Fd: int32(w.wake), Events: unix.POLLIN}}
		if _, err := unix.Poll(fds, int(gather/time.Millisecond)); err != nil && !errors.Is(err, unix.EINTR) {
			w.fail(fmt.Sprintf("poll: %v", err))
			return
		}
	}
}

// threadCPU is the calling thread's CPU time (0 when the clock fails).
func threadCPU() time.Duration {
	var ts unix.Timespec
	if unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts) != nil {
		return 0
	}
	return time.Duration(ts.Nano())
}

func (w *Watcher) doubted() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.doubt != ""
}

func (w *Watcher) fail(why string) {
	w.mu.Lock()
	if w.doubt == "" {
		w.doubt = why
	}
	w.mu.Unlock()
}

const metaLen = 24 // struct fanotify_event_metadata

// parse records one read's events.
func (w *Watcher) parse(b []byte) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.nReads++
	for len(b) >= metaLen {
		evLen := int(binary.NativeEndian.Uint32(b[0:4]))
		hdr := int(binary.NativeEndian.Uint16(b[6:8]))
		mask := binary.NativeEndian.Uint64(b[8:16])
		fd := int32(binary.NativeEndian.Uint32(b[16:20]))
		if evLen < metaLen || evLen > len(b) || hdr < metaLen || hdr > evLen {
			w.setDoubt("malformed event")
			return
		}
		if fd >= 0 {
			unix.Close(int(fd)) // not asked for; never expected with FID reporting
		}
		w.nEvents++
		w.event(mask, b[hdr:evLen])
		b = b[evLen:]
	}
}

func (w *Watcher) setDoubt(why string) {
	if w.doubt == "" {
		w.doubt = why
	}
}

// event records one event's info records (w.mu held).
func (w *Watcher) event(mask uint64, info []byte) {
	if mask&unix.FAN_Q_OVERFLOW != 0 {
		w.setDoubt("event queue overflowed")
		return
	}
	if mask&^uint64(unix.FAN_OPEN|unix.FAN_ONDIR) == 0 && mask&unix.FAN_ONDIR != 0 {
		return // a directory opened (read, or a scan's): no change through it
	}
	var dirH, dirN []byte // the directory's handle and the entry's name
	var child []byte      // the object's own handle record
	for len(info) >= 4 {
		typ := info[0]
		l := int(binary.NativeEndian.Uint16(info[2:4]))
		if l < 4 || l > len(info) {
			w.setDoubt("malformed info record")
			return
		}
		rec := info[4:l]
		info = info[l:]
		switch typ {
		case unix.FAN_EVENT_INFO_TYPE_DFID_NAME, unix.FAN_EVENT_INFO_TYPE_DFID:
			h, name, ok := w.handle(rec, typ == unix.FAN_EVENT_INFO_TYPE_DFID_NAME)
			if !ok {
				return // doubt set
			}
			dirH, dirN = h, name
		case unix.FAN_EVENT_INFO_TYPE_FID:
			child = rec
		}
	}
	switch {
	case dirH != nil:
		if !w.inWorktree(dirH) {
			w.nOutside++
			// A file changed outside (not only opened: a write through
			// a shared mapping by a host process is not seen, as below)
			// may be another link of a worktree file.
			if child != nil && !w.outsideLost && mask&(unix.FAN_DELETE_SELF|unix.FAN_ONDIR) == 0 && mask&^uint64(unix.FAN_OPEN) != 0 {
				w.keepOutside(child)
			}
			return // the host's, elsewhere on the filesystem
		}
		dir := dirName{handle: string(dirH), name: string(dirN)}
		if _, seen := w.dirty[dir]; !seen && len(w.dirty) >= w.maxDirty {
			w.setDoubt(fmt.Sprintf("more than %d changed entries", w.maxDirty))
			return
		}
		w.dirty[dir] |= mask
	case child != nil:
		// A non-directory's event with no directory (a link count changed
		// through a link elsewhere): After re-stats the worktree's
		// entries with its inode.
		h, _, ok := w.handle(child, false)
		if !ok {
			return
		}
		if mask&unix.FAN_DELETE_SELF != 0 {
			return // its last link went: that unlink had a directory event
		}
		ino, ok := w.inode(string(h))
		if !ok {
			return // gone: every link's removal had a directory event
		}
		if len(w.inos) >= w.maxDirty {
			w.setDoubt("too many inode events")
			return
		}
		w.inos[ino] = true
	default:
		w.setDoubt("an event with no file handle")
	}
}

// maxOutside bounds the distinct files outside the worktree a watcher
// keeps: at it, those After would not read are dropped (keepOutside);
// past half of it after that a snapshot before from the namespace cannot
// place their links (the walk after).
const maxOutside = 50_000

// keepOutside keeps the handle of a file changed outside the worktree
// (w.mu held).
func (w *Watcher) keepOutside(rec []byte) {
	if len(rec) < 16 || string(rec[0:8]) != string(w.fsid[:]) {
		return // not this filesystem's: no link into the worktree
	}
	hb := int(binary.NativeEndian.Uint32(rec[8:12]))
	if 16+hb > len(rec) {
		return
	}
	if len(w.outside) >= w.maxOutside {
		// Keep what afterNamespace would read: files that exist with
		// more than one link now. One gone never comes back; one with a
		// single link that gains another makes a link-count event
		// (w.inos). A host that writes new files all the time (5 000 a
		// second) reached the bound in 10 s (BenchmarkWatchBusyFilesystem).
		for h := range w.outside {
			if _, nlink, ok := w.inodeLinks(h); !ok || nlink <= 1 {
				delete(w.outside, h)
			}
		}
		w.nPrunes++
		if len(w.outside) >= w.maxOutside/2 {
			w.outsideLost = true
			w.outside = nil
			return
		}
	}
	w.outside[string(rec[12:16+hb])] = true
}

// inWorktree says whether an event in the directory h may be the
// worktree's, placing h as it is read (once): the rest of the
// filesystem's events, most of them on a busy host, are dropped here,
// neither kept nor counted against maxDirty. A directory outside now
// comes in only by a move, an event in the worktree whose subtree After
// walks again; one that cannot be placed now (moving) is kept. After
// places every kept one again. A handle placed before costs a map lookup
// and no allocation (most of a busy filesystem's events); one outside
// still busy in a later read is left to the kernel to drop (ignore).
func (w *Watcher) inWorktree(h []byte) bool {
	if pl, ok := w.places[string(h)]; ok {
		if !pl.in && !pl.ignored && pl.read != w.nReads {
			pl.ignored = true
			w.places[string(h)] = pl
			w.ignore(string(h))
		}
		return pl.in
	}
	if len(w.places) >= w.maxPlaces {
		// Forget the directories placed outside: placed again as their
		// next event comes, one is outside again or, moved in since, in
		// (read again: wider, never narrower). A host that makes and
		// removes directories all the time reached the bound in minutes.
		for k, pl := range w.places {
			if !pl.in {
				delete(w.places, k)
			}
		}
		w.nForgets++
		if len(w.places) >= w.maxPlaces {
			w.setDoubt(fmt.Sprintf("more than %d changed directories", w.maxPlaces))
			return true
		}
	}
	pl, why := w.place(string(h))
	if why != "" {
		return true // moving as it was placed: kept, for After to place
	}
	w.places[string(h)] = placed{in: pl.in, read: w.nReads}
	return pl.in
}

// placed is what the reader knows of a directory handle.
type placed struct {
	in      bool // in the worktree when placed
	read    int  // the read (nReads) that placed it
	ignored bool // outside and still busy a read later: an ignore mark asked
}

// maxIgnored bounds the ignore marks a watcher adds (they count against
// the user's fanotify marks, fs.fanotify.max_user_marks).
const maxIgnored = 20_000

// ignore asks the kernel to drop the opens of a directory placed outside
// the worktree, and of its entries, before they are queued (asked when
// it is still busy a read after it was placed: a mark costs about what
// 30–50 events read do, and most directories of a build or an install
// are busy for one burst only): an ignore mark on it (FAN_MARK_IGNORE,
// Linux 6.0) that does not pin its inode (FAN_MARK_EVICTABLE: evicted,
// its events come back and are dropped as read). Opens only: a change
// outside may be one through another link of a worktree file, which
// afterNamespace reads (keepOutside). It drops no more than inWorktree
// does: an open there names this directory, or is an open of the
// directory itself seen from its parent, and a directory placed outside
// comes into the worktree only by a move whose event (in the worktree, or
// in a directory that came in the same way) makes After walk its subtree
// whole. Best effort: a refusal (an older kernel, the marks' limit)
// leaves the events to inWorktree.
func (w *Watcher) ignore(h string) {
	if w.noIgnore || w.nIgnored >= maxIgnored {
		return
	}
	fd, err := w.open(h)
	if err != nil {
		return // gone: nothing more comes from it
	}
	defer unix.Close(fd)
	// "." beneath the O_PATH descriptor: fanotify_mark takes no O_PATH
	// descriptor as the object itself.
	err = unix.FanotifyMark(w.fd, unix.FAN_MARK_ADD|unix.FAN_MARK_IGNORE|unix.FAN_MARK_IGNORED_SURV_MODIFY|unix.FAN_MARK_EVICTABLE,
		unix.FAN_OPEN|unix.FAN_ONDIR|unix.FAN_EVENT_ON_CHILD, fd, ".")
	if err != nil {
		w.noIgnore = true
		return
	}
	w.nIgnored++
}

// handle reads a FID record: fsid, struct file_handle, then (withName) a
// NUL-terminated name. Only one filesystem is marked: a record of another
// fsid is a doubt, never a dropped event.
func (w *Watcher) handle(rec []byte, withName bool) (h, name []byte, ok bool) {
	if len(rec) < 16 {
		w.setDoubt("short file handle record")
		return nil, nil, false
	}
	if string(rec[0:8]) != string(w.fsid[:]) {
		w.setDoubt("an event of another filesystem id")
		return nil, nil, false
	}
	hb := int(binary.NativeEndian.Uint32(rec[8:12]))
	if 16+hb > len(rec) {
		w.setDoubt("short file handle")
		return nil, nil, false
	}
	h = rec[12 : 16+hb] // type and bytes
	if withName {
		rest := rec[16+hb:]
		for i, c := range rest {
			if c == 0 {
				rest = rest[:i]
				break
			}
		}
		name = rest
	}
	return h, name, true
}

// open opens a handle (type and bytes, as handle stores it) with O_PATH.
func (w *Watcher) open(h string) (int, error) {
	typ := int32(binary.NativeEndian.Uint32([]byte(h[0:4])))
	return unix.OpenByHandleAt(w.rootFd, unix.NewFileHandle(typ, []byte(h[4:])), unix.O_PATH|unix.O_CLOEXEC|unix.O_NOFOLLOW)
}

// inode is a handle's inode number (ok false: it no longer exists).
func (w *Watcher) inode(h string) (uint64, bool) {
	fd, err := w.open(h)
	if err != nil {
		return 0, false
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if unix.Fstat(fd, &st) != nil || st.Mode&unix.S_IFMT == unix.S_IFDIR {
		return 0, false
	}
	return st.Ino, true
}

// Stop ends the recording: call it once nothing of the turn runs. What
// changes later is not recorded.
func (w *Watcher) Stop() {
	select {
	case <-w.stop:
	default:
		close(w.stop)
		var one [8]byte
		binary.NativeEndian.PutUint64(one[:], 1)
		_, _ = unix.Write(w.wake, one[:]) // ends a wait in poll
	}
	<-w.done
}

// Close stops the watcher and releases it (nil-safe).
func (w *Watcher) Close() {
	if w == nil || w.fd < 0 {
		return
	}
	w.Stop()
	if !w.fdClosed {
		unix.Close(w.fd)
	}
	unix.Close(w.rootFd)
	unix.Close(w.wake)
	w.fd, w.rootFd, w.wake = -1, -1, -1
}

// fdPath is where an open file is now, in this mount namespace.
func fdPath(fd int) (string, error) {
	p, err := readlink(fmt.Sprintf("/proc/self/fd/%d", fd))
	if err != nil {
		return "", fmt.Errorf("worktree watch: %w", err)
	}
	return p, nil
}

func readlink(p string) (string, error) {
	buf := make([]byte, 512)
	for {
		n, err := unix.Readlink(p, buf)
		if err != nil {
			return "", fmt.Errorf("readlink %s: %w", p, err)
		}
		if n < len(buf) {
			return string(buf[:n]), nil
		}
		buf = make([]byte, 2*len(buf))
	}
}
