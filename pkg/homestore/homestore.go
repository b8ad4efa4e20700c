// Package homestore caps the size of a task HOME: the HOME volume's
// directory is the mount point of a per-task ext4 filesystem image (a sparse
// file under the state dir) attached to a loop device, so whatever a turn
// writes in HOME lands in that filesystem and fails with ENOSPC at its size,
// while the host loses at most that much disk. The image persists across
// turns and reboots; Ensure mounts it again whenever it finds it unmounted,
// and refuses anything at the mount point that is not exactly that image.
// It is mounted for a turn only (home.Store.Release after it); drift.go finds
// every loop device and mount of an image — deleted, or copied into other
// mount namespaces — to salvage or release it.
package homestore

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/shrooms-cage/shrooms/pkg/taskstate"
	"golang.org/x/sys/unix"
)

// Limits are the size of a new HOME filesystem and its number of inodes.
type Limits struct {
	Size   int64
	Inodes int64
}

// Outcome says what Ensure had to do.
type Outcome string

const (
	// AlreadyMounted: the image was mounted at the mount point already.
	AlreadyMounted Outcome = "already-mounted"
	// Mounted: the existing image was mounted (first use after a reboot or
	// an unmount).
	Mounted Outcome = "mounted"
	// Created: a new image was made and mounted.
	Created Outcome = "created"
)

// mountFlags are the host-side mount options of every HOME filesystem.
// Exec stays allowed, as it was on the plain volume: tools installed in HOME
// (pip --user, go install) run, and the reset removes them between turns.
const mountFlags = unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOATIME

// ext4 superblock: at byte 1024; s_magic at offset 0x38.
const (
	superblockOffset = 1024
	magicOffset      = 0x38
)

// ImagePath is where the HOME image of a volume lives: <stateDir>/homes/<volume>.img.
func ImagePath(stateDir, volume string) string {
	return taskstate.Layout{Dir: stateDir}.HomeImage(volume)
}

// Ensure makes mountpoint (a HOME volume's directory) the mount of the ext4
// image at image, creating the image (lim.Size bytes, sparse, lim.Inodes
// inodes, root directory 0700 root:root) if it does not exist. It is cheap
// when the image is mounted already: one read of mountinfo and one loop
// status query. Each peer is a mount namespace file (/proc/PID/ns/mnt) of a
// process that must see the same filesystem at mountpoint (the podman
// service, when it runs in another mount namespace than the caller); the
// caller's own namespace is skipped. Ensure fails closed: a symbolic link or
// a non-ext4 file at image, another mount at mountpoint, or a mountpoint
// holding files (an uncapped HOME) is refused and nothing is mounted.
func Ensure(ctx context.Context, image, mountpoint string, lim Limits, peers ...string) (Outcome, error) {
	if err := checkPaths(image, mountpoint); err != nil {
		return "", err
	}
	if lim.Size < 64<<20 || lim.Inodes < 1024 || lim.Inodes > lim.Size/4096 {
		return "", fmt.Errorf("HOME filesystem limits: size must be at least 64m and inodes 1024..size/4096")
	}
	out, dev, err := ensureHere(ctx, image, mountpoint, lim)
	if err != nil {
		return "", err
	}
	for _, p := range peers {
		if err := ensurePeer(p, image, mountpoint, dev); err != nil {
			return "", err
		}
	}
	return out, nil
}

func checkPaths(image, mountpoint string) error {
	for _, p := range []string{image, mountpoint} {
		if !filepath.IsAbs(p) || filepath.Clean(p) != p || p == "/" {
			return fmt.Errorf("HOME filesystem path %q must be a clean absolute path other than /", p)
		}
	}
	if !strings.HasSuffix(image, ".img") {
		return fmt.Errorf("HOME image %q must end in .img", image)
	}
	return nil
}

// ensureHere does Ensure's work in the caller's mount namespace and returns
// the loop device mounted at mountpoint.
func ensureHere(ctx context.Context, image, mountpoint string, lim Limits) (Outcome, uint64, error) {
	top, err := topMount(mountinfoSelf, mountpoint)
	if err != nil {
		return "", 0, err
	}
	img, created, err := openImage(ctx, image, lim)
	if err != nil {
		return "", 0, err
	}
	defer img.Close()
	if top != nil {
		if err := verify(top, img, image); err != nil {
			return "", 0, err
		}
		return AlreadyMounted, top.dev, nil
	}
	dev, err := attachAndMount(img, image, mountpoint)
	if err != nil {
		return "", 0, err
	}
	if created {
		return Created, dev, nil
	}
	return Mounted, dev, nil
}

// openImage opens the image read-write, creating and formatting it when it
// does not exist. The homes directory must be root's and private; a symbolic
// link at the image path is refused, never followed.
func openImage(ctx context.Context, image string, lim Limits) (f *os.File, created bool, err error) {
	dir, name := filepath.Dir(image), filepath.Base(image)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, false, fmt.Errorf("create HOME image directory: %w", err)
	}
	dfd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, false, fmt.Errorf("HOME image directory %s: %w", dir, err)
	}
	defer unix.Close(dfd)
	var st unix.Stat_t
	if err := unix.Fstat(dfd, &st); err != nil {
		return nil, false, fmt.Errorf("stat %s: %w", dir, err)
	}
	if st.Uid != 0 || st.Mode&0o077 != 0 {
		return nil, false, fmt.Errorf("HOME image directory %s must be owned by root with mode 0700 (it is %o, uid %d)", dir, st.Mode&0o7777, st.Uid)
	}
	fd, err := unix.Openat(dfd, name, unix.O_RDWR|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) {
		if err := format(ctx, dfd, dir, name, lim); err != nil {
			return nil, false, err
		}
		created = true
		fd, err = unix.Openat(dfd, name, unix.O_RDWR|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	}
	if err != nil {
		if errors.Is(err, unix.ELOOP) {
			return nil, false, fmt.Errorf("HOME image %s is a symbolic link (refused, not followed)", image)
		}
		return nil, false, fmt.Errorf("open HOME image %s: %w", image, err)
	}
	f = os.NewFile(uintptr(fd), image)
	if err := checkImage(f, image); err != nil {
		f.Close()
		return nil, false, err
	}
	return f, created, nil
}

// checkImage accepts only a private, root-owned, singly linked regular file
// that starts like an ext4 filesystem.
func checkImage(f *os.File, image string) error {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return fmt.Errorf("stat HOME image %s: %w", image, err)
	}
	switch {
	case st.Mode&unix.S_IFMT != unix.S_IFREG:
		return fmt.Errorf("HOME image %s is not a regular file (refused)", image)
	case st.Uid != 0 || st.Mode&0o077 != 0:
		return fmt.Errorf("HOME image %s must be owned by root with mode 0600 (it is %o, uid %d)", image, st.Mode&0o7777, st.Uid)
	case st.Nlink != 1:
		return fmt.Errorf("HOME image %s has %d hard links (refused)", image, st.Nlink)
	}
	var magic [2]byte
	if n, _ := f.ReadAt(magic[:], superblockOffset+magicOffset); n != 2 || binary.LittleEndian.Uint16(magic[:]) != unix.EXT4_SUPER_MAGIC {
		return fmt.Errorf("HOME image %s is not an ext4 filesystem (refused; remove it to have a new one made)", image)
	}
	return nil
}

// format makes name in dir a new ext4 image: a sparse file of lim.Size
// formatted under a temporary name and renamed into place once complete, so
// a crash never leaves a half-made image at the real name.
func format(ctx context.Context, dfd int, dir, name string, lim Limits) error {
	tmp := name + ".new"
	if err := unix.Unlinkat(dfd, tmp, 0); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("remove stale %s: %w", filepath.Join(dir, tmp), err)
	}
	fd, err := unix.Openat(dfd, tmp, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("create HOME image: %w", err)
	}
	f := os.NewFile(uintptr(fd), filepath.Join(dir, tmp))
	defer f.Close()
	fail := func(err error) error {
		_ = unix.Unlinkat(dfd, tmp, 0)
		return err
	}
	if err := f.Truncate(lim.Size); err != nil {
		return fail(fmt.Errorf("size HOME image: %w", err))
	}
	// mkfs.ext4 writes through the open descriptor (fd 3 in the child), not
	// a path anyone could swap. Lazy inode-table and journal init keep the
	// image sparse; 1% of the blocks are reserved for host root, so the
	// reset still has room when a turn filled HOME (the cage's uids cannot
	// use them); errors remount it read-only, which the next Ensure refuses.
	cmd := exec.CommandContext(ctx, mkfsPath(), "-F", "-q", "-b", "4096", "-m", "1",
		"-N", strconv.FormatInt(lim.Inodes, 10), "-L", "shrooms-home", "-e", "remount-ro",
		"-E", "root_owner=0:0,lazy_itable_init=1,lazy_journal_init=1", "/dev/fd/3")
	cmd.ExtraFiles = []*os.File{f}
	cmd.Env = []string{"PATH=/usr/sbin:/sbin:/usr/bin:/bin:/run/current-system/sw/bin"}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fail(fmt.Errorf("mkfs.ext4 for the HOME image failed (is e2fsprogs installed?): %v: %s", err, strings.TrimSpace(string(out))))
	}
	if err := f.Sync(); err != nil {
		return fail(fmt.Errorf("sync HOME image: %w", err))
	}
	if err := unix.Renameat2(dfd, tmp, dfd, name, unix.RENAME_NOREPLACE); err != nil {
		return fail(fmt.Errorf("install HOME image %s: %w", filepath.Join(dir, name), err))
	}
	return unix.Fsync(dfd)
}

// mkfsPath finds mkfs.ext4 on PATH or in the usual system directories
// (PATH may lack the sbin directories when shrooms is run by a user).
func mkfsPath() string {
	if p, err := exec.LookPath("mkfs.ext4"); err == nil {
		return p
	}
	for _, d := range []string{"/usr/sbin", "/sbin", "/run/current-system/sw/bin"} {
		if p := filepath.Join(d, "mkfs.ext4"); unix.Access(p, unix.X_OK) == nil {
			return p
		}
	}
	return "mkfs.ext4"
}
