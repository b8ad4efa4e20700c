package homestore

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// The mount table of the calling thread: /proc/self would show the main
// thread's, which need not be in the caller's namespace.
const mountinfoSelf = "/proc/thread-self/mountinfo"

// mountEntry is one line of mountinfo.
type mountEntry struct {
	id, parent int
	dev        uint64
	point      string
	opts       string
	fstype     string
	source     string
	superOpts  string
}

// topMount returns the mount visible at mountpoint (the last one stacked
// there), or nil when mountpoint is no mount point.
func topMount(mountinfo, mountpoint string) (*mountEntry, error) {
	f, err := os.Open(mountinfo)
	if err != nil {
		return nil, fmt.Errorf("read mount table: %w", err)
	}
	defer f.Close()
	var at []*mountEntry
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		e, ok := parseMountinfo(sc.Text())
		if ok && e.point == mountpoint {
			at = append(at, e)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read mount table: %w", err)
	}
	// The top of a stack is the one no other mount there is mounted on.
	for _, e := range at {
		covered := false
		for _, o := range at {
			if o.parent == e.id {
				covered = true
			}
		}
		if !covered {
			return e, nil
		}
	}
	return nil, nil
}

// parseMountinfo parses "id parent maj:min root point opts [optional...] -
// fstype source superopts".
func parseMountinfo(line string) (*mountEntry, bool) {
	f := strings.Fields(line)
	sep := -1
	for i := 6; i < len(f); i++ {
		if f[i] == "-" {
			sep = i
			break
		}
	}
	if len(f) < 7 || sep < 0 || len(f) < sep+4 {
		return nil, false
	}
	id, err1 := strconv.Atoi(f[0])
	parent, err2 := strconv.Atoi(f[1])
	maj, min, ok := strings.Cut(f[2], ":")
	ma, err3 := strconv.ParseUint(maj, 10, 32)
	mi, err4 := strconv.ParseUint(min, 10, 32)
	if !ok || err1 != nil || err2 != nil || err3 != nil || err4 != nil {
		return nil, false
	}
	return &mountEntry{
		id: id, parent: parent, dev: unix.Mkdev(uint32(ma), uint32(mi)),
		point: unescape(f[4]), opts: f[5], fstype: f[sep+1], source: unescape(f[sep+2]), superOpts: f[sep+3],
	}, true
}

// unescape decodes mountinfo's octal escapes (\040 for a space, ...).
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func hasOpt(opts, want string) bool {
	for _, o := range strings.Split(opts, ",") {
		if o == want {
			return true
		}
	}
	return false
}

// loopName returns the loop device (loopN) behind a block device number,
// or "" when it is not a loop device.
func loopName(dev uint64) string {
	link, err := os.Readlink(fmt.Sprintf("/sys/dev/block/%d:%d", unix.Major(dev), unix.Minor(dev)))
	if err != nil {
		return ""
	}
	name := filepath.Base(link)
	if n := strings.TrimPrefix(name, "loop"); n == name || n == "" || strings.Trim(n, "0123456789") != "" {
		return ""
	}
	return name
}

// openLoop opens /dev/<name> and checks it is the block device dev.
func openLoop(name string, dev uint64, flags int) (int, error) {
	fd, err := unix.Open("/dev/"+name, flags|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return -1, fmt.Errorf("open loop device: %w", err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFBLK || uint64(st.Rdev) != dev {
		unix.Close(fd)
		return -1, fmt.Errorf("/dev/%s is not block device %d:%d", name, unix.Major(dev), unix.Minor(dev))
	}
	return fd, nil
}

// backedBy reports whether the loop device dev is backed by the file whose
// stat is img.
func backedBy(dev uint64, img *unix.Stat_t) bool {
	name := loopName(dev)
	if name == "" {
		return false
	}
	fd, err := openLoop(name, dev, unix.O_RDONLY)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	info, err := unix.IoctlLoopGetStatus64(fd)
	return err == nil && info.Device == uint64(img.Dev) && info.Inode == img.Ino
}

// verify accepts the mount top at mountpoint only if it is the image's
// loop device, ext4, read-write, nosuid and nodev, and is what the path
// shows.
func verify(top *mountEntry, img *os.File, image string) error {
	var st unix.Stat_t
	if err := unix.Fstat(int(img.Fd()), &st); err != nil {
		return fmt.Errorf("stat HOME image: %w", err)
	}
	if top.fstype != "ext4" || !backedBy(top.dev, &st) {
		return fmt.Errorf("HOME %s is a mount point of something else (%s from %s), not the image %s (refusing)", top.point, top.fstype, top.source, image)
	}
	if !hasOpt(top.opts, "rw") || !hasOpt(top.superOpts, "rw") {
		return fmt.Errorf("HOME filesystem %s is read-only (ext4 remounts it so after an error): check it with e2fsck -f %s after unmounting it", top.point, image)
	}
	if !hasOpt(top.opts, "nosuid") || !hasOpt(top.opts, "nodev") {
		return fmt.Errorf("HOME filesystem %s is mounted without nosuid,nodev (refusing)", top.point)
	}
	var ps unix.Stat_t
	if err := unix.Lstat(top.point, &ps); err != nil || uint64(ps.Dev) != top.dev {
		return fmt.Errorf("HOME %s does not show the HOME filesystem (another mount hides it; refusing)", top.point)
	}
	return nil
}

// attachAndMount attaches the image to a free loop device and mounts it at
// mountpoint, which must be an empty directory. It returns the device.
func attachAndMount(img *os.File, image, mountpoint string) (uint64, error) {
	mfd, err := unix.Open(mountpoint, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("HOME mount point %s: %w", mountpoint, err)
	}
	md := os.NewFile(uintptr(mfd), mountpoint)
	defer md.Close()
	if err := checkEmpty(md); err != nil {
		return 0, err
	}
	// A loop device that already holds the image (its mount survives in
	// another mount namespace) is mounted again: a second device would put
	// two ext4 instances on one file.
	lfd, name, err := reuseLoop(img)
	if err != nil {
		return 0, err
	}
	if lfd < 0 {
		lfd, name, err = attach(img, image)
	}
	if err != nil {
		return 0, err
	}
	// With autoclear, closing our descriptor frees the device unless the
	// mount holds it: nothing leaks when the mount fails, and the device
	// goes away with the last unmount.
	defer unix.Close(lfd)
	var lst unix.Stat_t
	if err := unix.Fstat(lfd, &lst); err != nil {
		return 0, fmt.Errorf("stat loop device: %w", err)
	}
	dev := uint64(lst.Rdev)
	// mount(2) on /proc/self/fd/N acts on the directory opened above, so a
	// rename or symlink swap after the open cannot redirect it.
	if err := unix.Mount("/dev/"+name, "/proc/self/fd/"+strconv.Itoa(mfd), "ext4", mountFlags, ""); err != nil {
		return 0, fmt.Errorf("mount HOME image %s on %s: %w", image, mountpoint, err)
	}
	if err := finish(mountpoint, dev); err != nil {
		_ = unix.Unmount(mountpoint, unix.UMOUNT_NOFOLLOW)
		return 0, err
	}
	return dev, nil
}

// checkEmpty refuses a mount point that holds anything: mounting over it
// would hide (and strand) an uncapped HOME.
func checkEmpty(d *os.File) error {
	names, err := d.Readdirnames(1)
	if err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("read %s: %w", d.Name(), err)
	}
	if len(names) > 0 {
		return fmt.Errorf("HOME volume directory %s is not empty (it holds %q: a HOME made before it was size-capped?); refusing to mount the capped filesystem over it — remove the task's HOME to start a capped one", d.Name(), names[0])
	}
	return nil
}

// attach configures a free loop device on the image, autoclear on.
func attach(img *os.File, image string) (int, string, error) {
	ctl, err := unix.Open("/dev/loop-control", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, "", fmt.Errorf("loop devices are unavailable (/dev/loop-control: %v); a size-capped HOME needs them", err)
	}
	defer unix.Close(ctl)
	info := unix.LoopInfo64{Flags: unix.LO_FLAGS_AUTOCLEAR}
	copy(info.File_name[:len(info.File_name)-1], image)
	for try := 0; try < 16; try++ {
		n, err := unix.IoctlRetInt(ctl, unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return -1, "", fmt.Errorf("find a free loop device: %w", err)
		}
		name := "loop" + strconv.Itoa(n)
		fd, err := unix.Open("/dev/"+name, unix.O_RDWR|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
		if err != nil {
			return -1, "", fmt.Errorf("open /dev/%s: %w", name, err)
		}
		err = unix.IoctlLoopConfigure(fd, &unix.LoopConfig{Fd: uint32(img.Fd()), Info: info})
		if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOTTY) {
			// Kernels before 5.8 have no LOOP_CONFIGURE.
			if err = unix.IoctlSetInt(fd, unix.LOOP_SET_FD, int(img.Fd())); err == nil {
				if err = unix.IoctlLoopSetStatus64(fd, &info); err != nil {
					_ = unix.IoctlSetInt(fd, unix.LOOP_CLR_FD, 0)
				}
			}
		}
		if errors.Is(err, unix.EBUSY) {
			unix.Close(fd) // taken by someone else meanwhile: next one
			continue
		}
		if err != nil {
			unix.Close(fd)
			return -1, "", fmt.Errorf("attach HOME image to /dev/%s: %w", name, err)
		}
		return fd, name, nil
	}
	return -1, "", fmt.Errorf("attach HOME image: no free loop device after 16 tries")
}

// finish checks the fresh mount and prepares its root for homereset: ext4
// on the loop device, root:root 0700, no lost+found (not shrooms' layout).
func finish(mountpoint string, dev uint64) error {
	fd, err := unix.Open(mountpoint, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open mounted HOME %s: %w", mountpoint, err)
	}
	defer unix.Close(fd)
	var fs unix.Statfs_t
	var st unix.Stat_t
	if err := unix.Fstatfs(fd, &fs); err != nil || fs.Type != unix.EXT4_SUPER_MAGIC {
		return fmt.Errorf("HOME %s is not the ext4 filesystem after mounting (refusing)", mountpoint)
	}
	if err := unix.Fstat(fd, &st); err != nil || uint64(st.Dev) != dev {
		return fmt.Errorf("HOME %s is not the loop device after mounting (refusing)", mountpoint)
	}
	if err := unix.Unlinkat(fd, "lost+found", unix.AT_REMOVEDIR); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("HOME filesystem %s has a lost+found that is not empty (files recovered by e2fsck): move them out and remove it: %w", mountpoint, err)
	}
	if err := unix.Fchown(fd, 0, 0); err != nil {
		return fmt.Errorf("chown HOME root: %w", err)
	}
	if err := unix.Fchmod(fd, 0o700); err != nil {
		return fmt.Errorf("chmod HOME root: %w", err)
	}
	return nil
}

// inNamespace runs fn on an OS thread that has joined the mount namespace
// at nsPath; it runs fn in the caller's thread when that is the caller's
// own namespace. The thread is never returned to the Go scheduler.
func inNamespace(nsPath string, fn func(mountinfo string) error) error {
	fd, err := unix.Open(nsPath, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open mount namespace %s: %w", nsPath, err)
	}
	defer unix.Close(fd)
	var peer, self unix.Stat_t
	if err := unix.Fstat(fd, &peer); err != nil {
		return fmt.Errorf("stat mount namespace %s: %w", nsPath, err)
	}
	if err := unix.Stat("/proc/thread-self/ns/mnt", &self); err != nil {
		return fmt.Errorf("stat own mount namespace: %w", err)
	}
	if peer.Dev == self.Dev && peer.Ino == self.Ino {
		return fn(mountinfoSelf)
	}
	var join func(errc chan<- error)
	join = func(errc chan<- error) {
		runtime.LockOSThread()
		if unix.Gettid() == unix.Getpid() {
			// The main thread cannot exit, only be parked for good, and
			// /proc/self would then show the other namespace. While this
			// goroutine holds it, another one runs on another thread.
			inner := make(chan error, 1)
			go join(inner)
			err := <-inner
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		// Never unlocked: the thread exits with this goroutine instead of
		// serving other goroutines from another namespace.
		if err := unix.Unshare(unix.CLONE_FS); err != nil {
			errc <- fmt.Errorf("unshare fs: %w", err)
			return
		}
		if err := unix.Setns(fd, unix.CLONE_NEWNS); err != nil {
			errc <- fmt.Errorf("join mount namespace %s: %w", nsPath, err)
			return
		}
		errc <- fn(mountinfoSelf)
	}
	errc := make(chan error, 1)
	go join(errc)
	return <-errc
}

// ensurePeer mounts the loop device dev at mountpoint in the mount namespace
// at nsPath too, unless it is mounted there already.
func ensurePeer(nsPath, image, mountpoint string, dev uint64) error {
	return inNamespace(nsPath, func(mountinfo string) error {
		top, err := topMount(mountinfo, mountpoint)
		if err != nil {
			return err
		}
		if top != nil {
			if top.dev != dev || top.fstype != "ext4" {
				return fmt.Errorf("HOME %s in the podman service's mount namespace is a mount point of something else (%s from %s; refusing)", mountpoint, top.fstype, top.source)
			}
			if !hasOpt(top.opts, "rw") || !hasOpt(top.superOpts, "rw") {
				return fmt.Errorf("HOME filesystem %s is read-only in the podman service's mount namespace: check it with e2fsck -f %s", mountpoint, image)
			}
			return nil
		}
		d, err := os.OpenFile(mountpoint, os.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
		if err != nil {
			return fmt.Errorf("HOME mount point %s in the podman service's mount namespace: %w", mountpoint, err)
		}
		defer d.Close()
		if err := checkEmpty(d); err != nil {
			return err
		}
		name := loopName(dev)
		if name == "" {
			return fmt.Errorf("HOME device %d:%d is not a loop device (refusing)", unix.Major(dev), unix.Minor(dev))
		}
		if err := unix.Mount("/dev/"+name, "/proc/thread-self/fd/"+strconv.Itoa(int(d.Fd())), "ext4", mountFlags, ""); err != nil {
			return fmt.Errorf("mount HOME image %s on %s in the podman service's mount namespace: %w", image, mountpoint, err)
		}
		var st unix.Stat_t
		if err := unix.Lstat(mountpoint, &st); err != nil || uint64(st.Dev) != dev {
			_ = unix.Unmount(mountpoint, unix.UMOUNT_NOFOLLOW)
			return fmt.Errorf("HOME %s in the podman service's mount namespace is not the loop device after mounting (refusing)", mountpoint)
		}
		return nil
	})
}

// ours reports whether a mount is the image's loop device; when the image
// no longer exists, by the loop device's recorded backing file name.
func ours(top *mountEntry, image string) bool {
	if top.fstype != "ext4" {
		return false
	}
	var st unix.Stat_t
	if err := unix.Stat(image, &st); err == nil {
		return backedBy(top.dev, &st)
	}
	name := loopName(top.dev)
	if name == "" {
		return false
	}
	b, err := os.ReadFile("/sys/block/" + name + "/loop/backing_file")
	f := strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), " (deleted)")
	return err == nil && f == image
}

// unmountIn unmounts every mount of the image stacked at mountpoint in one
// namespace; a mount of anything else there is left alone and reported.
func unmountIn(mountinfo, image, mountpoint string) error {
	for i := 0; i < 8; i++ {
		top, err := topMount(mountinfo, mountpoint)
		if err != nil || top == nil {
			return err
		}
		if !ours(top, image) {
			return fmt.Errorf("%s is a mount of something else (%s from %s), not the HOME image %s; left alone", mountpoint, top.fstype, top.source, image)
		}
		if err := unix.Unmount(mountpoint, unix.UMOUNT_NOFOLLOW); err != nil {
			return fmt.Errorf("unmount HOME %s: %w", mountpoint, err)
		}
	}
	return fmt.Errorf("unmount HOME %s: still mounted after 8 unmounts", mountpoint)
}

// Unmount unmounts the HOME image from mountpoint in the caller's mount
// namespace and in each peer's (see Ensure); the loop device frees itself
// with the last unmount. Nothing mounted, or an empty mountpoint (none
// known), is not an error.
func Unmount(image, mountpoint string, peers ...string) error {
	if mountpoint == "" {
		return checkPaths(image, "/none")
	}
	if err := checkPaths(image, mountpoint); err != nil {
		return err
	}
	for _, p := range peers {
		if err := inNamespace(p, func(mi string) error { return unmountIn(mi, image, mountpoint) }); err != nil {
			return err
		}
	}
	return unmountIn(mountinfoSelf, image, mountpoint)
}

// Remove unmounts the HOME image (see Unmount) and deletes it, with all it
// holds. Call it before removing the task's HOME volume. A missing image is
// not an error.
func Remove(image, mountpoint string, peers ...string) error {
	if err := Unmount(image, mountpoint, peers...); err != nil {
		return err
	}
	for _, p := range []string{image, image + ".new"} {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("remove HOME image: %w", err)
		}
	}
	return nil
}

// ServiceNamespace returns the mount namespace (/proc/PID/ns/mnt) of the
// process listening on the unix socket at path (e.g. the podman service),
// for Ensure's peers.
func ServiceNamespace(path string) (string, error) {
	c, err := net.Dial("unix", path)
	if err != nil {
		return "", fmt.Errorf("connect %s: %w", path, err)
	}
	defer c.Close()
	raw, err := c.(*net.UnixConn).SyscallConn()
	if err != nil {
		return "", err
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) { cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) }); err != nil {
		return "", err
	}
	if cerr != nil {
		return "", fmt.Errorf("peer of %s: %w", path, cerr)
	}
	if cred.Pid <= 0 {
		return "", fmt.Errorf("peer of %s: no process (it is in another pid namespace)", path)
	}
	return fmt.Sprintf("/proc/%d/ns/mnt", cred.Pid), nil
}

// InNamespace runs fn on an OS thread that has joined the mount namespace
// at nsPath (in the caller's thread when that is its own namespace): paths
// fn opens resolve as processes of that namespace see them, and the file
// descriptors it opens stay usable afterwards from any thread.
func InNamespace(nsPath string, fn func() error) error {
	return inNamespace(nsPath, func(string) error { return fn() })
}
