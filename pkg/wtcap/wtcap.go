// Package wtcap caps what a turn can write into its worktree: a per-task
// project quota (ext4 or xfs mounted with prjquota) on the worktree's
// filesystem, in bytes and in files, enforced by the kernel while the cage
// runs (a write past it fails with ENOSPC). Where the filesystem has no
// project quota, Probe says why, and the caller refuses the turn or runs it
// uncapped as the owner chose (worktree.uncapped); never silently.
package wtcap

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Support is what Probe found about a worktree's filesystem.
type Support struct {
	// OK is true when a project quota can cap the worktree.
	OK bool `json:"ok"`
	// FSType and Device are the filesystem and its block device.
	FSType string `json:"fsType"`
	Device string `json:"device"`
	// Reason says why OK is false.
	Reason string `json:"reason,omitempty"`
}

// Probe reports whether the filesystem holding dir enforces project quotas.
// It returns an error only when it cannot look.
func Probe(dir string) (Support, error) {
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return Support{}, fmt.Errorf("worktree cap: %w", err)
	}
	major, minor := unix.Major(st.Dev), unix.Minor(st.Dev)
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return Support{}, fmt.Errorf("worktree cap: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	want := fmt.Sprintf("%d:%d", major, minor)
	for sc.Scan() {
		// id parent major:minor root mountpoint opts [optional...] - fstype source superopts
		line := sc.Text()
		pre, post, ok := strings.Cut(line, " - ")
		fields, tail := strings.Fields(pre), strings.Fields(post)
		if !ok || len(fields) < 5 || len(tail) < 3 || fields[2] != want {
			continue
		}
		s := Support{FSType: tail[0], Device: tail[1]}
		opts := "," + tail[2] + ","
		switch {
		case s.FSType != "ext4" && s.FSType != "xfs":
			s.Reason = fmt.Sprintf("the worktree is on %s, which has no project quota (ext4 or xfs mounted with prjquota can cap it)", s.FSType)
		case !strings.Contains(opts, ",prjquota,") && !strings.Contains(opts, ",pquota,"):
			s.Reason = fmt.Sprintf("the worktree's %s filesystem (%s) is not mounted with prjquota", s.FSType, s.Device)
		case !strings.HasPrefix(s.Device, "/dev/"):
			s.Reason = fmt.Sprintf("the worktree's filesystem has no block device (%s)", s.Device)
		default:
			s.OK = true
		}
		return s, nil
	}
	if err := sc.Err(); err != nil {
		return Support{}, fmt.Errorf("worktree cap: mountinfo: %w", err)
	}
	return Support{Reason: "the worktree's mount is not in /proc/self/mountinfo"}, nil
}

// fsxattr is struct fsxattr (linux/fs.h).
type fsxattr struct {
	xflags     uint32
	extsize    uint32
	nextents   uint32
	projid     uint32
	cowextsize uint32
	pad        [8]byte
}

const (
	fsIocFsgetxattr   = 0x801c581f // _IOR('X', 31, struct fsxattr)
	fsIocFssetxattr   = 0x401c5820 // _IOW('X', 32, struct fsxattr)
	fsXflagProjinheri = 0x00000200 // FS_XFLAG_PROJINHERIT
	prjQuota          = 2          // PRJQUOTA
	qGetQuota         = 0x800007
	qSetQuota         = 0x800008
	qifLimits         = 1 | 4 // QIF_BLIMITS | QIF_ILIMITS
	qifUsage          = 2 | 8 // QIF_SPACE | QIF_INODES
)

// dqblk is struct if_dqblk (linux/quota.h).
type dqblk struct {
	bhardlimit uint64 // 1 KiB blocks
	bsoftlimit uint64
	curspace   uint64 // bytes
	ihardlimit uint64
	isoftlimit uint64
	curinodes  uint64
	btime      uint64
	itime      uint64
	valid      uint32
	_          uint32
}

func quotactl(cmd int, dev string, id uint32, q *dqblk) error {
	p, err := unix.BytePtrFromString(dev)
	if err != nil {
		return err
	}
	qcmd := uintptr(cmd<<8 | prjQuota)
	_, _, e := unix.Syscall6(unix.SYS_QUOTACTL, qcmd, uintptr(unsafe.Pointer(p)), uintptr(id), uintptr(unsafe.Pointer(q)), 0, 0)
	if e != 0 {
		return e
	}
	return nil
}

// Apply puts dir and everything in it (directories and regular files; a
// link is never followed, nor a FIFO, socket or device opened) into
// project projID, marks directories so that what is created in them
// inherits it, and sets the project's limits: maxBytes (rounded up to
// KiB) and maxFiles. It must run while no cage uses dir.
func Apply(s Support, dir string, projID uint32, maxBytes, maxFiles uint64) error {
	if !s.OK {
		return fmt.Errorf("worktree cap: %s", s.Reason)
	}
	if projID == 0 {
		return errors.New("worktree cap: project id 0 is the default project")
	}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.Type().IsRegular() && !d.IsDir() {
			return nil // links, FIFOs, sockets, devices: never opened
		}
		return setProject(p, d.IsDir(), projID)
	})
	if err != nil {
		return fmt.Errorf("worktree cap: %w", err)
	}
	q := dqblk{bhardlimit: (maxBytes + 1023) / 1024, bsoftlimit: 0, ihardlimit: maxFiles, valid: qifLimits}
	if err := quotactl(qSetQuota, s.Device, projID, &q); err != nil {
		return fmt.Errorf("worktree cap: set the project quota on %s: %w", s.Device, err)
	}
	return nil
}

func setProject(p string, dir bool, projID uint32) error {
	flags := unix.O_RDONLY | unix.O_NOFOLLOW | unix.O_NONBLOCK | unix.O_NOCTTY | unix.O_CLOEXEC
	if dir {
		flags |= unix.O_DIRECTORY
	}
	fd, err := unix.Open(p, flags, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", p, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	if kind := st.Mode & unix.S_IFMT; kind != unix.S_IFREG && kind != unix.S_IFDIR {
		return fmt.Errorf("%s changed under the walk", p) // nothing runs in it now
	}
	var x fsxattr
	if err := ioctlPtr(fd, fsIocFsgetxattr, unsafe.Pointer(&x)); err != nil {
		return fmt.Errorf("read project of %s: %w", p, err)
	}
	want := x
	want.projid = projID
	if dir {
		want.xflags |= fsXflagProjinheri
	}
	if want == x {
		// Already in the project: a set would move the entry's ctime on
		// every turn, and with it send every directory of the worktree to
		// a new listing by the guard's and the change scan's caches.
		return nil
	}
	x = want
	if err := ioctlPtr(fd, fsIocFssetxattr, unsafe.Pointer(&x)); err != nil {
		return fmt.Errorf("set project of %s: %w", p, err)
	}
	return nil
}

func ioctlPtr(fd int, req uintptr, arg unsafe.Pointer) error {
	_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), req, uintptr(arg))
	if e != 0 {
		return e
	}
	return nil
}

// Usage is the project's use now: bytes and files.
func Usage(s Support, projID uint32) (bytes, files uint64, err error) {
	var q dqblk
	if err := quotactl(qGetQuota, s.Device, projID, &q); err != nil {
		return 0, 0, fmt.Errorf("worktree cap: read the project quota: %w", err)
	}
	return q.curspace, q.curinodes, nil
}
