package resolve

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
	"gotest.tools/v3/assert"
)

// TestPolicies: each policy refuses a symlink (even one pointing inside),
// and Beneath/BeneathAnyMount refuse "..", while a plain file opens.
func TestPolicies(t *testing.T) {
	dir := t.TempDir()
	assert.NilError(t, os.WriteFile(filepath.Join(dir, "f"), []byte("x"), 0o600))
	assert.NilError(t, os.Symlink("f", filepath.Join(dir, "l")))
	d, err := os.Open(dir)
	assert.NilError(t, err)
	defer d.Close()
	open := func(name string, res uint64) error {
		fd, err := unix.Openat2(int(d.Fd()), name, &unix.OpenHow{Flags: unix.O_RDONLY | unix.O_CLOEXEC, Resolve: res})
		if err == nil {
			unix.Close(fd)
		}
		return err
	}
	for _, res := range []uint64{Beneath, BeneathAnyMount, NoLinks} {
		assert.NilError(t, open("f", res))
		assert.ErrorIs(t, open("l", res), unix.ELOOP)
	}
	for _, res := range []uint64{Beneath, BeneathAnyMount} {
		assert.ErrorIs(t, open("../"+filepath.Base(dir)+"/f", res), unix.EXDEV)
	}
}

// TestInRoot: an absolute link and ".." stay inside the directory, as they
// would for a process whose root it is.
func TestInRoot(t *testing.T) {
	dir := t.TempDir()
	assert.NilError(t, os.WriteFile(filepath.Join(dir, "f"), []byte("in"), 0o600))
	assert.NilError(t, os.Symlink("/f", filepath.Join(dir, "abs")))
	d, err := os.Open(dir)
	assert.NilError(t, err)
	defer d.Close()
	for _, name := range []string{"abs", "../../f"} {
		fd, err := unix.Openat2(int(d.Fd()), name, &unix.OpenHow{Flags: unix.O_RDONLY | unix.O_CLOEXEC, Resolve: InRoot})
		assert.NilError(t, err, name)
		b := make([]byte, 8)
		n, _ := unix.Read(fd, b)
		unix.Close(fd)
		assert.Equal(t, string(b[:n]), "in", name)
	}
}
