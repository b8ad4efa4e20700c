package homestore

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/shrooms-cage/shrooms/internal/itest"
)

var small = Limits{Size: 64 << 20, Inodes: 4096}

// newVolume makes a state dir and an empty volume directory, both root's
// and private, in a directory of the test's, and returns the HOME image's
// path in the state dir and the volume's mount point; it unmounts and
// removes them after the test.
func newVolume(t *testing.T) (image, mountpoint string) {
	t.Helper()
	itest.Require(t, itest.Root)
	dir := t.TempDir()
	image, mountpoint = ImagePath(filepath.Join(dir, "state"), "vol"), filepath.Join(dir, "vol", "_data")
	assert.NilError(t, os.MkdirAll(mountpoint, 0o700))
	t.Cleanup(func() {
		if err := Remove(image, mountpoint); err != nil {
			t.Errorf("cleanup: %v", err)
		}
		assert.Check(t, freedHere(t, image), "a loop device still holds %s", image)
	})
	return image, mountpoint
}

// mounted returns the mount at path in this namespace (nil for none).
func mounted(t *testing.T, path string) *mountEntry {
	t.Helper()
	e, err := topMount(mountinfoSelf, path)
	assert.NilError(t, err)
	return e
}

// freedHere reports whether image's loop device went once it was
// unmounted here, as far as this namespace can tell: it clears within two
// seconds, or every mount still holding it is a copy in another mount
// namespace. Those are not this test's doing: a namespace made while the
// image was mounted copies the mount (podman 4.3 runs each container's
// conmon in a mount namespace of its own, copied from the host's at the
// container's start; another test process's holder until it drops the
// copy), and only Release reaches them — which this then calls, so that
// the device goes. A device attached with no mount anywhere, or still
// mounted here, is not freed.
func freedHere(t *testing.T, image string) bool {
	t.Helper()
	for deadline := time.Now().Add(2 * time.Second); attached(t, image); time.Sleep(20 * time.Millisecond) {
		if time.Now().Before(deadline) {
			continue
		}
		all, err := Attachments(filepath.Dir(image))
		assert.NilError(t, err)
		atts := Of(all, image)
		for _, a := range atts {
			if len(a.Mounts) == 0 || slices.ContainsFunc(a.Mounts, func(m Mount) bool { return m.NS == "" }) {
				t.Logf("still attached: %v", a)
				return false
			}
		}
		t.Logf("held only by copies in other mount namespaces, released: %v", atts)
		assert.NilError(t, Release(atts))
		return !attached(t, image)
	}
	return true
}

// attached reports whether any loop device is backed by image (by name, so
// also after the image was deleted).
func attached(t *testing.T, image string) bool {
	t.Helper()
	files, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err == nil && strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), " (deleted)") == image {
			return true
		}
	}
	return false
}

func freeBytes(t *testing.T, path string) int64 {
	t.Helper()
	var fs unix.Statfs_t
	assert.NilError(t, unix.Statfs(path, &fs))
	return int64(fs.Bavail) * fs.Bsize
}

// fill writes zeros to path until the filesystem refuses; it returns the
// bytes written and the error that stopped it.
func fill(path string, limit int64) (int64, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	var n int64
	for n < limit {
		w, err := f.Write(buf)
		n += int64(w)
		if err != nil {
			return n, err
		}
	}
	return n, f.Sync()
}

func TestEnsureCreatesCapsPersistsAndRemoves(t *testing.T) {
	image, mountpoint := newVolume(t)
	ctx := context.Background()
	before := freeBytes(t, filepath.Dir(filepath.Dir(mountpoint)))

	out, err := Ensure(ctx, image, mountpoint, small)
	assert.NilError(t, err)
	assert.Equal(t, out, Created)
	e := mounted(t, mountpoint)
	assert.Assert(t, e != nil, "nothing mounted at %s", mountpoint)
	assert.Equal(t, e.fstype, "ext4")
	for _, o := range []string{"rw", "nosuid", "nodev"} {
		assert.Check(t, hasOpt(e.opts, o), "mount options %s lack %s", e.opts, o)
	}
	assert.Check(t, !hasOpt(e.opts, "noexec"), "exec stays allowed in HOME")
	var st unix.Stat_t
	assert.NilError(t, unix.Stat(mountpoint, &st))
	assert.Equal(t, st.Uid, uint32(0))
	assert.Equal(t, st.Mode&0o7777, uint32(0o700))
	names, err := os.ReadDir(mountpoint)
	assert.NilError(t, err)
	assert.Check(t, is.Len(names, 0), "the new HOME root is empty (no lost+found)")

	// The image is sparse: its size is the cap, its blocks far fewer.
	var ist unix.Stat_t
	assert.NilError(t, unix.Stat(image, &ist))
	assert.Equal(t, ist.Size, small.Size)
	assert.Equal(t, ist.Mode&0o7777, uint32(0o600))
	t.Logf("new image: %d bytes, %d allocated", ist.Size, ist.Blocks*512)
	assert.Check(t, ist.Blocks*512 < small.Size/4, "image allocates %d bytes", ist.Blocks*512)

	// Cheap and idempotent when mounted.
	start := time.Now()
	out, err = Ensure(ctx, image, mountpoint, small)
	assert.NilError(t, err)
	assert.Equal(t, out, AlreadyMounted)
	t.Logf("Ensure when mounted: %v", time.Since(start))

	// Writing past the cap: ENOSPC, never more than the cap on the host.
	n, err := fill(filepath.Join(mountpoint, "big"), 1<<30)
	assert.Check(t, errors.Is(err, unix.ENOSPC), "got %v", err)
	assert.Check(t, n < small.Size, "wrote %d bytes into a %d-byte HOME", n, small.Size)
	after := freeBytes(t, filepath.Dir(filepath.Dir(mountpoint)))
	assert.NilError(t, unix.Stat(image, &ist))
	t.Logf("wrote %d bytes; image allocates %d; host free space dropped by %d", n, ist.Blocks*512, before-after)
	assert.Check(t, ist.Blocks*512 <= small.Size, "the image allocates %d bytes", ist.Blocks*512)
	// 1 GiB was attempted; other work on the machine may move the figure,
	// not by half a gibibyte.
	assert.Check(t, before-after < 512<<20, "host lost %d bytes for a %d-byte HOME", before-after, small.Size)

	// Inodes are capped too.
	files := 0
	for ; files < 10000; files++ {
		if err := os.WriteFile(filepath.Join(mountpoint, fmt.Sprint("f", files)), nil, 0o600); err != nil {
			assert.Check(t, errors.Is(err, unix.ENOSPC), "got %v", err)
			break
		}
	}
	assert.Check(t, files < 10000 && files > 1000, "created %d empty files with %d inodes", files, small.Inodes)

	// Unmounted (as by a reboot): the next Ensure mounts the same data.
	assert.NilError(t, os.WriteFile(filepath.Join(mountpoint, "f0"), []byte("kept"), 0o600))
	assert.NilError(t, Unmount(image, mountpoint))
	assert.Assert(t, mounted(t, mountpoint) == nil)
	assert.Check(t, freedHere(t, image), "the loop device is freed with the unmount")
	names, err = os.ReadDir(mountpoint)
	assert.NilError(t, err)
	assert.Check(t, is.Len(names, 0), "nothing was written to the volume directory itself")
	assert.NilError(t, Unmount(image, mountpoint), "unmounting twice is not an error")

	out, err = Ensure(ctx, image, mountpoint, small)
	assert.NilError(t, err)
	assert.Equal(t, out, Mounted)
	b, err := os.ReadFile(filepath.Join(mountpoint, "f0"))
	assert.NilError(t, err)
	assert.Equal(t, string(b), "kept")

	assert.NilError(t, Remove(image, mountpoint))
	assert.Assert(t, mounted(t, mountpoint) == nil)
	_, err = os.Lstat(image)
	assert.Check(t, os.IsNotExist(err))
	assert.Check(t, freedHere(t, image))
}

func TestEnsureRefusesHostileImagesAndMountPoints(t *testing.T) {
	ctx := context.Background()
	cases := []struct {
		name  string
		plant func(t *testing.T, image, mountpoint string)
		want  string
	}{
		{"symlink to an ext4 image", func(t *testing.T, image, mountpoint string) {
			// A valid image elsewhere: only the link makes it hostile.
			other := filepath.Join(filepath.Dir(image), "other.img")
			_, err := Ensure(ctx, other, mountpoint, small)
			assert.NilError(t, err)
			assert.NilError(t, Unmount(other, mountpoint))
			assert.NilError(t, os.Symlink(other, image))
		}, "is a symbolic link (refused, not followed)"},
		{"symlink to /etc/shadow", func(t *testing.T, image, mountpoint string) {
			assert.NilError(t, os.Symlink("/etc/shadow", image))
		}, "is a symbolic link (refused, not followed)"},
		{"regular file, not ext4", func(t *testing.T, image, mountpoint string) {
			assert.NilError(t, os.WriteFile(image, make([]byte, 1<<20), 0o600))
		}, "is not an ext4 filesystem (refused"},
		{"world-readable image", func(t *testing.T, image, mountpoint string) {
			assert.NilError(t, os.WriteFile(image, nil, 0o644))
		}, "must be owned by root with mode 0600"},
		{"hard-linked image", func(t *testing.T, image, mountpoint string) {
			assert.NilError(t, os.WriteFile(image, nil, 0o600))
			assert.NilError(t, os.Link(image, image+".2"))
		}, "has 2 hard links (refused)"},
		{"directory at the image path", func(t *testing.T, image, mountpoint string) {
			assert.NilError(t, os.Mkdir(image, 0o700))
		}, "open HOME image"},
		{"FIFO at the image path", func(t *testing.T, image, mountpoint string) {
			assert.NilError(t, unix.Mkfifo(image, 0o600))
		}, "is not a regular file (refused)"},
		{"mount point holds an uncapped HOME", func(t *testing.T, image, mountpoint string) {
			assert.NilError(t, os.Mkdir(filepath.Join(mountpoint, "home"), 0o755))
		}, `is not empty (it holds "home"`},
		{"mount point is another filesystem", func(t *testing.T, image, mountpoint string) {
			assert.NilError(t, unix.Mount("tmpfs", mountpoint, "tmpfs", 0, "size=1m"))
			t.Cleanup(func() { _ = unix.Unmount(mountpoint, 0) })
		}, "is a mount point of something else (tmpfs from tmpfs)"},
		{"homes directory is group-writable", func(t *testing.T, image, mountpoint string) {
			assert.NilError(t, os.Chmod(filepath.Dir(image), 0o770))
		}, "must be owned by root with mode 0700"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			image, mountpoint := newVolume(t)
			assert.NilError(t, os.MkdirAll(filepath.Dir(image), 0o700))
			tc.plant(t, image, mountpoint)
			before := mounted(t, mountpoint)
			_, err := Ensure(ctx, image, mountpoint, small)
			assert.ErrorContains(t, err, tc.want)
			after := mounted(t, mountpoint)
			assert.Check(t, (before == nil) == (after == nil) && (before == nil || before.id == after.id), "Ensure changed the mounts at %s", mountpoint)
			assert.Check(t, !attached(t, image), "a loop device was attached to %s", image)
			if strings.HasPrefix(tc.name, "symlink") {
				// The link's target was not touched.
				fi, err := os.Lstat(image)
				assert.NilError(t, err)
				assert.Check(t, fi.Mode()&os.ModeSymlink != 0)
			}
			// Unmount and Remove leave someone else's mount alone.
			if before != nil {
				assert.ErrorContains(t, Unmount(image, mountpoint), "left alone")
				assert.Check(t, mounted(t, mountpoint) != nil)
			}
		})
	}
}

// TestEnsureMountsInPeerNamespace: a process in a private mount namespace
// (as the testbed's podman service) sees the capped HOME only when it is
// named as a peer; the negative control shows it otherwise sees the bare
// directory.
func TestEnsureMountsInPeerNamespace(t *testing.T) {
	image, mountpoint := newVolume(t)
	ctx := context.Background()
	ns := holder(t, "private", "")
	through := filepath.Join(filepath.Dir(filepath.Dir(ns)), "root", mountpoint, "marker")

	// Negative control: without the peer, the other namespace does not see
	// the mount.
	_, err := Ensure(ctx, image, mountpoint, small)
	assert.NilError(t, err)
	assert.NilError(t, os.WriteFile(filepath.Join(mountpoint, "marker"), []byte("capped"), 0o600))
	_, err = os.Stat(through)
	assert.Check(t, os.IsNotExist(err), "the private namespace saw the mount without being a peer: %v", err)

	// With the peer (and our own namespace as a peer, skipped), it does.
	out, err := Ensure(ctx, image, mountpoint, small, ns, "/proc/self/ns/mnt")
	assert.NilError(t, err)
	assert.Equal(t, out, AlreadyMounted)
	b, err := os.ReadFile(through)
	assert.NilError(t, err)
	assert.Equal(t, string(b), "capped")
	_, err = Ensure(ctx, image, mountpoint, small, ns)
	assert.NilError(t, err, "idempotent in the peer too")

	// Unmount with the peer unmounts both; the loop device goes.
	assert.NilError(t, Unmount(image, mountpoint, ns))
	_, err = os.Stat(through)
	assert.Check(t, os.IsNotExist(err))
	assert.Check(t, mounted(t, mountpoint) == nil)
	assert.Check(t, freedHere(t, image))
}

func TestParseMountinfo(t *testing.T) {
	e, ok := parseMountinfo(`36 35 7:3 / /var/lib/a\040b/_data rw,nosuid,nodev,noatime shared:7 master:1 - ext4 /dev/loop3 rw`)
	assert.Assert(t, ok)
	assert.Equal(t, e.id, 36)
	assert.Equal(t, e.parent, 35)
	assert.Equal(t, e.dev, unix.Mkdev(7, 3))
	assert.Equal(t, e.point, "/var/lib/a b/_data")
	assert.Equal(t, e.fstype, "ext4")
	assert.Equal(t, e.source, "/dev/loop3")
	assert.Check(t, hasOpt(e.opts, "nosuid") && !hasOpt(e.opts, "nosu"))
	for _, bad := range []string{"", "1 2 3", "36 35 7:3 / /x rw shared:1 ext4 /dev/loop3 rw", "x 35 7:3 / /x rw - ext4 /dev/loop3 rw"} {
		_, ok := parseMountinfo(bad)
		assert.Check(t, !ok, bad)
	}
	assert.Equal(t, unescape(`a\134b\011c\`), "a\\b\tc\\")
}

func TestEnsureRejectsBadArguments(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		image, mp string
		lim       Limits
		want      string
	}{
		{"rel.img", "/m", small, "must be a clean absolute path"},
		{"/s/../x.img", "/m", small, "must be a clean absolute path"},
		{"/s/x.raw", "/m", small, "must end in .img"},
		{"/s/x.img", "/", small, "must be a clean absolute path other than /"},
		{"/s/x.img", "/m", Limits{Size: 1 << 20, Inodes: 4096}, "size must be at least 64m"},
		{"/s/x.img", "/m", Limits{Size: 64 << 20, Inodes: 1 << 20}, "inodes 1024..size/4096"},
	} {
		_, err := Ensure(ctx, tc.image, tc.mp, tc.lim)
		assert.ErrorContains(t, err, tc.want)
	}
}
