package homestore

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"gotest.tools/v3/assert"
)

// TestSalvageCopiesBackADeletedImage: an image deleted while mounted lives
// on in its loop device only; Salvage copies it into a new image and lets
// the device go, and what HOME held is there when the new image mounts.
func TestSalvageCopiesBackADeletedImage(t *testing.T) {
	image, mountpoint := newVolume(t)
	ctx := context.Background()
	_, err := Ensure(ctx, image, mountpoint, small)
	assert.NilError(t, err)
	assert.NilError(t, os.WriteFile(filepath.Join(mountpoint, "credentials"), []byte("kept-secret"), 0o600))
	assert.NilError(t, os.Remove(image))

	homes := filepath.Dir(image)
	atts, err := Attachments(homes)
	assert.NilError(t, err)
	assert.Equal(t, len(atts), 1)
	assert.Assert(t, atts[0].Deleted, "%v", atts[0])
	assert.Assert(t, len(atts[0].Mounts) >= 1 && atts[0].Mounts[0] == Mount{Point: mountpoint}, "%v", atts[0].Mounts)
	// Positive control: refused while it is the only copy.
	assert.ErrorContains(t, ReleaseImage(image, false), "was deleted while")

	saved, err := Salvage(ctx, image)
	assert.NilError(t, err)
	assert.Assert(t, saved)
	// The device clears on its last close: a namespace another process
	// made meanwhile may hold it (see freedHere).
	assert.Check(t, freedHere(t, image), "the salvaged image's device is still attached")
	atts, err = Attachments(homes)
	assert.NilError(t, err)
	assert.Equal(t, len(atts), 0, "%v", atts)
	assert.Assert(t, mounted(t, mountpoint) == nil)

	out, err := Ensure(ctx, image, mountpoint, small)
	assert.NilError(t, err)
	assert.Equal(t, out, Mounted)
	b, err := os.ReadFile(filepath.Join(mountpoint, "credentials"))
	assert.NilError(t, err)
	assert.Equal(t, string(b), "kept-secret")
	// Nothing deleted: nothing to salvage.
	saved, err = Salvage(ctx, image)
	assert.NilError(t, err)
	assert.Assert(t, !saved)
}

// holderScript drops, in the holder's new namespace, every copy of an
// ext4 mount of a loop device but the one at $1 (none for ""), then
// sleeps. The copy of the whole mount table unshare makes holds every HOME
// mounted on the host at that moment — other tests', other test processes'
// (two suites at once) — and would keep their loop devices attached after
// they unmount them, for as long as the holder lives.
const holderScript = `awk -v keep="$1" '{ for (i = 7; $i != "-"; i++) {}; if ($(i+1) == "ext4" && $(i+2) ~ /^\/dev\/loop/ && $5 != keep) print $5 }' /proc/self/mountinfo |
while read -r m; do umount "$(printf '%b' "$m")" 2>/dev/null; done
exec sleep 120`

// holder starts a process in a new mount namespace (a copy of ours, with
// the given propagation, holding no HOME but the one mounted at keep) and
// returns its namespace path, once the namespace is set up (the process
// runs sleep).
func holder(t *testing.T, propagation, keep string) string {
	t.Helper()
	c := exec.Command("unshare", "-m", "--propagation", propagation, "sh", "-c", holderScript, "sh", keep)
	assert.NilError(t, c.Start())
	t.Cleanup(func() { _ = c.Process.Kill(); _ = c.Wait() })
	pid := strconv.Itoa(c.Process.Pid)
	self, _ := os.Readlink("/proc/self/ns/mnt")
	for i := 0; i < 250; i++ {
		// unshare(1) sets the propagation after it made the
		// namespace: only sleep runs in one fully set up.
		comm, _ := os.ReadFile("/proc/" + pid + "/comm")
		if l, _ := os.Readlink("/proc/" + pid + "/ns/mnt"); l != "" && l != self && string(comm) == "sleep\n" {
			return "/proc/" + pid + "/ns/mnt"
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatal("unshare did not make a namespace")
	return ""
}

// TestReleaseReachesOtherNamespaces: a mount namespace made while HOME is
// mounted holds a copy of the mount and with it the loop device. A private
// copy survives the unmount in our namespace (positive control); Release
// unmounts it there too.
func TestReleaseReachesOtherNamespaces(t *testing.T) {
	image, mountpoint := newVolume(t)
	ctx := context.Background()
	homes := filepath.Dir(image)
	_, err := Ensure(ctx, image, mountpoint, small)
	assert.NilError(t, err)

	ns := holder(t, "private", mountpoint)
	atts, err := Attachments(homes)
	assert.NilError(t, err)
	assert.Equal(t, len(atts), 1)
	assert.Assert(t, is2(atts[0].Mounts, ns), "the copy in %s is not found: %v", ns, atts[0].Mounts)
	assert.NilError(t, Unmount(image, mountpoint))
	atts, err = Attachments(homes)
	assert.NilError(t, err)
	assert.Equal(t, len(atts), 1, "positive control: the private copy holds the device")
	assert.NilError(t, Release(atts))
	atts, err = Attachments(homes)
	assert.NilError(t, err)
	assert.Equal(t, len(atts), 0, "%v", atts)

}

func is2(ms []Mount, ns string) bool {
	for _, m := range ms {
		if m.NS != "" && strings.HasPrefix(ns, "/proc/") {
			a, _ := os.Readlink(m.NS)
			b, _ := os.Readlink(ns)
			if a == b {
				return true
			}
		}
	}
	return false
}

// TestDetachLeavesAReusedDeviceAlone: once our HOME's loop device clears,
// the kernel may hand it at once to another task's HOME. detach must then
// call ours gone, and must never clear the device for the other image.
func TestDetachLeavesAReusedDeviceAlone(t *testing.T) {
	image, _ := newVolume(t)
	dir := filepath.Dir(image)
	assert.NilError(t, os.MkdirAll(dir, 0o700))
	imgA, imgB := filepath.Join(dir, "a.img"), filepath.Join(dir, "b.img")
	open := func(p string) *os.File {
		fh, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE, 0o600)
		assert.NilError(t, err)
		assert.NilError(t, fh.Truncate(8<<20))
		t.Cleanup(func() { fh.Close() })
		return fh
	}
	fa, fb := open(imgA), open(imgB)

	// Not ours: a device backed by another image is left attached.
	fdA, name, err := attach(fa, imgA)
	assert.NilError(t, err)
	dev, err := loopDev(name)
	assert.NilError(t, err)
	assert.NilError(t, detach(name, dev, imgB, true))
	assert.Assert(t, attached(t, imgA), "detach cleared a device backed by another image")

	// Ours, still held open (fdA): detach waits; the holder lets go and B
	// takes the same device at once. detach must see ours gone.
	for try := 0; ; try++ {
		done := make(chan error, 1)
		go func() { done <- detach(name, dev, imgA, true) }()
		time.Sleep(50 * time.Millisecond)
		unix.Close(fdA)
		fdB, nameB, err := attach(fb, imgB)
		assert.NilError(t, err)
		errDetach := <-done
		if nameB != name {
			// Another test took the device first: try again on B's.
			assert.NilError(t, errDetach)
			assert.Assert(t, try < 5, "the freed device was never handed to the next image")
			fa, imgA, fb, imgB = fb, imgB, fa, imgA
			fdA, name = fdB, nameB
			dev, err = loopDev(name)
			assert.NilError(t, err)
			continue
		}
		assert.NilError(t, errDetach, "the reused device was taken for ours")
		assert.Assert(t, attached(t, imgB), "detach cleared the other image's device")
		_ = unix.IoctlSetInt(fdB, unix.LOOP_CLR_FD, 0)
		unix.Close(fdB)
		return
	}
}
