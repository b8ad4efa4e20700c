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

	"gotest.tools/v3/assert"
)

// TestSalvageCopiesBackADeletedImage: an image deleted while mounted lives
// on in its loop device only; Salvage copies it into a new image and lets
// the device go, and what HOME held is there when the new image mounts.
func TestSalvageCopiesBackADeletedImage(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	_, err := Ensure(ctx, f.image, f.mountpoint, small)
	assert.NilError(t, err)
	assert.NilError(t, os.WriteFile(filepath.Join(f.mountpoint, "credentials"), []byte("kept-secret"), 0o600))
	assert.NilError(t, os.Remove(f.image))

	homes := filepath.Dir(f.image)
	atts, err := Attachments(homes)
	assert.NilError(t, err)
	assert.Equal(t, len(atts), 1)
	assert.Assert(t, atts[0].Deleted, "%v", atts[0])
	assert.Assert(t, len(atts[0].Mounts) >= 1 && atts[0].Mounts[0] == Mount{Point: f.mountpoint}, "%v", atts[0].Mounts)
	// Positive control: refused while it is the only copy.
	assert.ErrorContains(t, ReleaseImage(f.image, false), "was deleted while")

	saved, err := Salvage(ctx, f.image)
	assert.NilError(t, err)
	assert.Assert(t, saved)
	atts, err = Attachments(homes)
	assert.NilError(t, err)
	assert.Equal(t, len(atts), 0, "%v", atts)
	assert.Assert(t, mounted(t, f.mountpoint) == nil)

	out, err := Ensure(ctx, f.image, f.mountpoint, small)
	assert.NilError(t, err)
	assert.Equal(t, out, Mounted)
	b, err := os.ReadFile(filepath.Join(f.mountpoint, "credentials"))
	assert.NilError(t, err)
	assert.Equal(t, string(b), "kept-secret")
	// Nothing deleted: nothing to salvage.
	saved, err = Salvage(ctx, f.image)
	assert.NilError(t, err)
	assert.Assert(t, !saved)
}

// holder starts a process in a new mount namespace (a copy of ours, with
// the given propagation) and returns its namespace path.
func holder(t *testing.T, propagation string) string {
	t.Helper()
	c := exec.Command("unshare", "-m", "--propagation", propagation, "sleep", "120")
	assert.NilError(t, c.Start())
	t.Cleanup(func() { _ = c.Process.Kill(); _ = c.Wait() })
	ns := "/proc/" + strconv.Itoa(c.Process.Pid) + "/ns/mnt"
	self, _ := os.Readlink("/proc/self/ns/mnt")
	for i := 0; i < 100; i++ {
		if l, _ := os.Readlink(ns); l != "" && l != self {
			return ns
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
	f := newFixture(t)
	ctx := context.Background()
	homes := filepath.Dir(f.image)
	_, err := Ensure(ctx, f.image, f.mountpoint, small)
	assert.NilError(t, err)

	ns := holder(t, "private")
	atts, err := Attachments(homes)
	assert.NilError(t, err)
	assert.Equal(t, len(atts), 1)
	assert.Assert(t, is2(atts[0].Mounts, ns), "the copy in %s is not found: %v", ns, atts[0].Mounts)
	assert.NilError(t, Unmount(f.image, f.mountpoint))
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
