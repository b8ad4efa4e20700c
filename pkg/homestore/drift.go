package homestore

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Attachment is a loop device whose backing file is (or was, before it was
// deleted) a HOME image, with the places it is mounted.
type Attachment struct {
	// Loop is the device name (loop3).
	Loop string `json:"loop"`
	Dev  uint64 `json:"-"`
	// Image is the backing file's path as the kernel recorded it.
	Image string `json:"image"`
	// Deleted is true when the backing file no longer has a name: its
	// blocks live on only as long as the device does.
	Deleted bool `json:"deleted"`
	// Mounts are the device's mounts in every mount namespace of the host.
	Mounts []Mount `json:"mounts"`
}

// Mount is one mount of a HOME device.
type Mount struct {
	// NS is the mount namespace (/proc/PID/ns/mnt), "" for the caller's.
	NS    string `json:"ns,omitempty"`
	Point string `json:"point"`
}

func (a Attachment) String() string {
	s := "/dev/" + a.Loop + " (" + a.Image
	if a.Deleted {
		s += ", deleted"
	}
	s += ")"
	var here []string
	other := 0
	for _, m := range a.Mounts {
		if m.NS == "" {
			here = append(here, m.Point)
		} else {
			other++
		}
	}
	if len(here) > 0 {
		s += " mounted on " + strings.Join(here, ", ")
	}
	if other > 0 {
		s += fmt.Sprintf(" and in %d other mount namespace(s)", other)
	}
	return s
}

// Attachments lists the loop devices backed by HOME images in homesDir
// (<state>/homes), live or deleted, found through
// /sys/block/loop*/loop/backing_file, each with its mounts in every mount
// namespace of the host (a namespace made while HOME was mounted holds a
// copy of the mount, and with it the device). It finds what a mount of a
// deleted image still holds, which nothing on the file system names.
func Attachments(homesDir string, peers ...string) ([]Attachment, error) {
	if !filepath.IsAbs(homesDir) || filepath.Clean(homesDir) != homesDir {
		return nil, fmt.Errorf("HOME image directory %q must be a clean absolute path", homesDir)
	}
	files, err := filepath.Glob("/sys/block/loop*/loop/backing_file")
	if err != nil {
		return nil, fmt.Errorf("list loop devices: %w", err)
	}
	var out []Attachment
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue // detached meanwhile
		}
		path := strings.TrimSuffix(string(b), "\n")
		deleted := false
		if p, ok := strings.CutSuffix(path, " (deleted)"); ok {
			path, deleted = p, true
		}
		if filepath.Dir(path) != homesDir || !strings.HasSuffix(path, ".img") {
			continue
		}
		name := filepath.Base(filepath.Dir(filepath.Dir(f)))
		dev, err := loopDev(name)
		if err != nil {
			continue
		}
		out = append(out, Attachment{Loop: name, Dev: dev, Image: path, Deleted: deleted})
	}
	if len(out) == 0 {
		return out, nil
	}
	spaces, err := namespaces()
	if err != nil {
		return nil, err
	}
	for _, ns := range spaces {
		points, err := mountsOf(ns.mountinfo)
		if err != nil {
			continue // the process went
		}
		for i := range out {
			for _, p := range points[out[i].Dev] {
				m := Mount{NS: ns.path, Point: p}
				if !slices.Contains(out[i].Mounts, m) {
					out[i].Mounts = append(out[i].Mounts, m)
				}
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Loop < out[j].Loop })
	return out, nil
}

// nsInfo is one mount namespace: a process's ns path ("" for the caller's)
// and the mountinfo that shows it.
type nsInfo struct{ path, mountinfo string }

// namespaces lists each mount namespace of the host once, the caller's
// first, through one process in it.
func namespaces() ([]nsInfo, error) {
	var self unix.Stat_t
	if err := unix.Stat("/proc/thread-self/ns/mnt", &self); err != nil {
		return nil, fmt.Errorf("stat own mount namespace: %w", err)
	}
	out := []nsInfo{{"", mountinfoSelf}}
	seen := map[uint64]bool{self.Ino: true}
	procs, err := os.ReadDir("/proc")
	if err != nil {
		return nil, fmt.Errorf("list processes: %w", err)
	}
	for _, p := range procs {
		if strings.Trim(p.Name(), "0123456789") != "" {
			continue
		}
		var st unix.Stat_t
		ns := "/proc/" + p.Name() + "/ns/mnt"
		if unix.Stat(ns, &st) != nil || seen[st.Ino] {
			continue
		}
		seen[st.Ino] = true
		out = append(out, nsInfo{ns, "/proc/" + p.Name() + "/mountinfo"})
	}
	return out, nil
}

// loopDev returns the device number of /sys/block/<name>.
func loopDev(name string) (uint64, error) {
	b, err := os.ReadFile("/sys/block/" + name + "/dev")
	if err != nil {
		return 0, err
	}
	var ma, mi uint32
	if _, err := fmt.Sscanf(strings.TrimSpace(string(b)), "%d:%d", &ma, &mi); err != nil {
		return 0, fmt.Errorf("%s: %w", name, err)
	}
	return unix.Mkdev(ma, mi), nil
}

// mountsOf maps each block device to its mount points in one mountinfo.
func mountsOf(mountinfo string) (map[uint64][]string, error) {
	f, err := os.Open(mountinfo)
	if err != nil {
		return nil, fmt.Errorf("read mount table: %w", err)
	}
	defer f.Close()
	out := map[uint64][]string{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if e, ok := parseMountinfo(sc.Text()); ok {
			out[e.dev] = append(out[e.dev], e.point)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read mount table: %w", err)
	}
	return out, nil
}

// Of returns the attachments of one image (by its path, live or deleted).
func Of(atts []Attachment, image string) []Attachment {
	var out []Attachment
	for _, a := range atts {
		if a.Image == image {
			out = append(out, a)
		}
	}
	return out
}

// Release unmounts every mount of the given attachments, in whatever mount
// namespace it is, and detaches their loop devices. Whatever it could not
// release is listed in the error, one item each; nothing is unmounted
// lazily (a detached mount would keep the image in use where nobody can
// see it).
func Release(atts []Attachment, peers ...string) error {
	return releaseRetrying(atts, true)
}

// releaseRetrying is Release; wait=false leaves a device the caller itself
// holds open marked to clear on its last close instead of waiting for it.
func releaseRetrying(atts []Attachment, wait bool) error {
	// A copy in a namespace being set up (a container runtime before its
	// pivot_root) refuses to be unmounted there, and goes by itself soon.
	var err error
	for try := 0; try < 20; try++ {
		if err = release(atts, wait); err == nil {
			return nil
		}
		time.Sleep(150 * time.Millisecond)
		atts = refresh(atts)
	}
	return err
}

// refresh re-reads the mounts of attachments.
func refresh(atts []Attachment) []Attachment {
	var out []Attachment
	for _, a := range atts {
		if len(a.Image) == 0 {
			out = append(out, a)
			continue
		}
		all, err := Attachments(filepath.Dir(a.Image))
		if err != nil {
			out = append(out, a)
			continue
		}
		for _, b := range all {
			// The same device now backed by another image is another
			// task's HOME: never ours to release.
			if b.Loop == a.Loop && b.Dev == a.Dev && b.Image == a.Image {
				out = append(out, b)
			}
		}
	}
	return out
}

func release(atts []Attachment, wait bool) error {
	var left []string
	for _, a := range atts {
		done := map[string]bool{}
		for _, m := range a.Mounts {
			if done[m.NS] {
				continue
			}
			done[m.NS] = true
			un := func(mountinfo string) error { return unmountDev(mountinfo, a.Dev) }
			var err error
			if m.NS == "" {
				err = un(mountinfoSelf)
			} else {
				err = inNamespace(m.NS, un)
				if errors.Is(err, os.ErrNotExist) || errors.Is(err, unix.ESRCH) {
					err = nil // that process, and maybe its namespace, went
				}
			}
			if err != nil {
				if m.NS != "" {
					err = fmt.Errorf("in mount namespace %s: %w", m.NS, err)
				}
				left = append(left, err.Error())
			}
		}
		if err := detach(a.Loop, a.Dev, a.Image, wait); err != nil {
			left = append(left, err.Error())
		}
	}
	if len(left) > 0 {
		return errors.New(strings.Join(left, "; "))
	}
	return nil
}

// unmountDev unmounts every mount of the block device dev in one namespace.
func unmountDev(mountinfo string, dev uint64) error {
	for i := 0; i < 16; i++ {
		points, err := mountsOf(mountinfo)
		if err != nil {
			return err
		}
		ps := points[dev]
		if len(ps) == 0 {
			return nil
		}
		// Deepest first: a mount stacked below another cannot go before it.
		sort.Slice(ps, func(i, j int) bool { return len(ps[i]) > len(ps[j]) })
		if err := unix.Unmount(ps[0], unix.UMOUNT_NOFOLLOW); err != nil {
			return fmt.Errorf("%s is still mounted (%v): stop what uses it, then `umount %s`", ps[0], err, ps[0])
		}
	}
	return fmt.Errorf("HOME device %d:%d: still mounted after 16 unmounts", unix.Major(dev), unix.Minor(dev))
}

// detach clears a loop device that no mount holds any more (autoclear does
// it by itself once the last user closes the device; this covers one
// attached without autoclear). A device already free is not an error.
func detach(name string, dev uint64, image string, wait bool) error {
	// The device is ours only while it is backed by our image: once it was
	// cleared it can at once be attached again for another task's HOME.
	backing, err := os.ReadFile("/sys/block/" + name + "/loop/backing_file")
	if errors.Is(err, os.ErrNotExist) || err == nil && !namesImage(backing, image) {
		return nil
	}
	fd, err := openLoop(name, dev, unix.O_RDONLY)
	if err != nil {
		if _, serr := os.Stat("/sys/block/" + name + "/loop/backing_file"); errors.Is(serr, os.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("/dev/%s: %v", name, err)
	}
	// Held open by us the device cannot be cleared and taken by another
	// image: look once more before clearing it.
	if backing, err = os.ReadFile("/sys/block/" + name + "/loop/backing_file"); err != nil || !namesImage(backing, image) {
		unix.Close(fd)
		return nil
	}
	err = unix.IoctlSetInt(fd, unix.LOOP_CLR_FD, 0)
	unix.Close(fd)
	if err != nil && !errors.Is(err, unix.ENXIO) {
		return fmt.Errorf("/dev/%s still holds a HOME image (%v): `losetup -d /dev/%s`", name, err, name)
	}
	if !wait {
		return nil
	}
	// LOOP_CLR_FD on a device someone still has open (a mount copied into
	// a mount namespace made after the namespaces were listed, a runtime
	// setting one up) only marks it to clear on the last close: wait for
	// that, or fail so that Release looks again for who holds it.
	// Once cleared, the device may at once be attached again for another
	// task's HOME: a different backing file means ours is gone.
	for deadline := time.Now().Add(loopClearWait); ; time.Sleep(5 * time.Millisecond) {
		now, err := os.ReadFile("/sys/block/" + name + "/loop/backing_file")
		if errors.Is(err, os.ErrNotExist) || err == nil && (!bytes.Equal(now, backing) || !namesImage(now, image)) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("/dev/%s is still held open after its HOME was unmounted everywhere this process saw", name)
		}
	}
}

// namesImage reports whether a backing_file's content names image (live or
// deleted).
func namesImage(backing []byte, image string) bool {
	p := strings.TrimSuffix(string(backing), "\n")
	return strings.TrimSuffix(p, " (deleted)") == image
}

// heldDeleted reports whether a loop device's backing file is image,
// deleted.
func heldDeleted(image string) (bool, error) {
	files, err := filepath.Glob("/sys/block/loop*/loop/backing_file")
	if err != nil {
		return false, fmt.Errorf("list loop devices: %w", err)
	}
	for _, f := range files {
		if b, err := os.ReadFile(f); err == nil && strings.TrimSuffix(string(b), "\n") == image+" (deleted)" {
			return true, nil
		}
	}
	return false, nil
}

// loopClearWait bounds how long detach waits for a loop device to clear.
const loopClearWait = time.Second

// Salvage saves a HOME whose image file was deleted while it was still
// attached to a loop device (the deleted file lives on in the device): it
// unmounts the device everywhere while holding it open, copies its blocks
// into a new image at image (sparse: zero blocks are skipped) and lets the
// device go. It returns true when it saved one. When image exists again (a
// new one was made meanwhile) the deleted one is left alone and reported:
// which of the two to keep is the owner's call.
func Salvage(ctx context.Context, image string, peers ...string) (bool, error) {
	if err := checkPaths(image, "/none"); err != nil {
		return false, err
	}
	// Every turn's HOME opens here: the scan of every mount namespace on
	// the host (Attachments) only when a loop device holds this image
	// deleted, the one case to act on.
	if held, err := heldDeleted(image); err != nil || !held {
		return false, err
	}
	atts, err := Attachments(filepath.Dir(image), peers...)
	if err != nil {
		return false, err
	}
	var dead []Attachment
	for _, a := range Of(atts, image) {
		if a.Deleted {
			dead = append(dead, a)
		}
	}
	if len(dead) == 0 {
		return false, nil
	}
	if _, err := os.Lstat(image); err == nil || len(dead) > 1 {
		where := dead[0].String()
		return false, fmt.Errorf("HOME image %s was deleted and replaced while the old one is still attached at %s: copy what you need out of it, then unmount it and `losetup -d /dev/%s`", image, where, dead[0].Loop)
	}
	a := dead[0]
	fd, err := openLoop(a.Loop, a.Dev, unix.O_RDONLY)
	if err != nil {
		return false, fmt.Errorf("HOME image %s was deleted while attached to /dev/%s: %w", image, a.Loop, err)
	}
	// Held open, the device survives its last unmount (autoclear waits for
	// the last close), and unmounted its filesystem is clean to copy.
	defer unix.Close(fd)
	// Salvage holds the device open (fd) to copy it: its clearing waits
	// for that close, so Release must not wait for it.
	if err := releaseRetrying([]Attachment{{Loop: a.Loop, Dev: a.Dev, Image: a.Image, Mounts: a.Mounts}}, false); err != nil && !strings.Contains(err.Error(), "losetup") {
		return false, fmt.Errorf("HOME image %s was deleted while mounted; its contents are only in /dev/%s: %w", image, a.Loop, err)
	}
	if err := copyDevice(ctx, fd, image); err != nil {
		return false, fmt.Errorf("HOME image %s was deleted while mounted; copying it back from /dev/%s failed (its contents stay there until it is detached): %w", image, a.Loop, err)
	}
	_ = unix.IoctlSetInt(fd, unix.LOOP_CLR_FD, 0)
	return true, nil
}

// copyDevice copies the block device at fd into a new file at image,
// written under a temporary name and renamed into place when complete.
func copyDevice(ctx context.Context, fd int, image string) error {
	// A block device's end is its size.
	size, err := unix.Seek(fd, 0, 2)
	if err != nil || size <= 0 {
		return fmt.Errorf("device size: %d, %v", size, err)
	}
	dir, name := filepath.Dir(image), filepath.Base(image)
	dfd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("HOME image directory: %w", err)
	}
	defer unix.Close(dfd)
	tmp := name + ".new"
	_ = unix.Unlinkat(dfd, tmp, 0)
	ofd, err := unix.Openat(dfd, tmp, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("create %s: %w", tmp, err)
	}
	out := os.NewFile(uintptr(ofd), filepath.Join(dir, tmp))
	defer out.Close()
	fail := func(err error) error {
		_ = unix.Unlinkat(dfd, tmp, 0)
		return err
	}
	if err := out.Truncate(size); err != nil {
		return fail(fmt.Errorf("size %s: %w", tmp, err))
	}
	buf := make([]byte, 1<<20)
	zero := make([]byte, len(buf))
	for off := int64(0); off < size; {
		if err := ctx.Err(); err != nil {
			return fail(err)
		}
		n, err := unix.Pread(fd, buf, off)
		if err != nil {
			return fail(fmt.Errorf("read device at %d: %w", off, err))
		}
		if n == 0 {
			break
		}
		if !bytes.Equal(buf[:n], zero[:n]) {
			if _, err := out.WriteAt(buf[:n], off); err != nil {
				return fail(fmt.Errorf("write %s: %w", tmp, err))
			}
		}
		off += int64(n)
	}
	if err := out.Sync(); err != nil {
		return fail(fmt.Errorf("sync %s: %w", tmp, err))
	}
	if err := checkImage(out, image); err != nil {
		return fail(err)
	}
	if err := unix.Renameat2(dfd, tmp, dfd, name, unix.RENAME_NOREPLACE); err != nil {
		return fail(fmt.Errorf("install %s: %w", image, err))
	}
	return unix.Fsync(dfd)
}

// ReleaseImage unmounts the HOME image (live, or deleted and still
// attached) everywhere it is mounted and detaches its loop devices: after
// a turn, so nothing holds a loop device between turns, and before the
// image or its volume is removed. It refuses to throw away a deleted
// image's only copy unless discard is set (forget).
func ReleaseImage(image string, discard bool, peers ...string) error {
	if err := checkPaths(image, "/none"); err != nil {
		return err
	}
	atts, err := Attachments(filepath.Dir(image), peers...)
	if err != nil {
		return err
	}
	mine := Of(atts, image)
	if !discard {
		for _, a := range mine {
			if a.Deleted {
				return fmt.Errorf("HOME image %s was deleted while %s still holds it; run the task again to copy it back, or `shrooms forget` the task to discard it", image, a)
			}
		}
	}
	return Release(mine, peers...)
}

// reuseLoop returns an open descriptor and the name of a loop device that
// is already backed by img (by device and inode), or -1 when there is none.
func reuseLoop(img *os.File) (int, string, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(img.Fd()), &st); err != nil {
		return -1, "", fmt.Errorf("stat HOME image: %w", err)
	}
	files, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, f := range files {
		name := filepath.Base(filepath.Dir(filepath.Dir(f)))
		dev, err := loopDev(name)
		if err != nil || !backedBy(dev, &st) {
			continue
		}
		fd, err := openLoop(name, dev, unix.O_RDWR)
		if err != nil {
			continue
		}
		return fd, name, nil
	}
	return -1, "", nil
}

// IsMounted reports whether mountpoint shows the HOME image (its own loop
// device, the top mount there) in the caller's namespace.
func IsMounted(image, mountpoint string) bool {
	if checkPaths(image, mountpoint) != nil {
		return false
	}
	top, err := topMount(mountinfoSelf, mountpoint)
	if err != nil || top == nil || top.fstype != "ext4" {
		return false
	}
	var st unix.Stat_t
	return unix.Stat(image, &st) == nil && backedBy(top.dev, &st)
}
