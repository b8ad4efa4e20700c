package cagenet

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/shrooms-cage/shrooms/internal/itest"
)

func TestMountShared(t *testing.T) {
	f := filepath.Join(t.TempDir(), "mountinfo")
	assert.NilError(t, os.WriteFile(f, []byte(
		"25 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw\n"+
			"45 25 254:0 /run/netns /run/netns rw,relatime - ext4 /dev/vda rw\n"+
			"46 25 0:50 / /run/net\\040ns rw shared:9 - tmpfs tmpfs rw\n"), 0o644))
	shared, err := mountShared(f, NetnsDir)
	assert.NilError(t, err)
	assert.Assert(t, !shared, "a private /run/netns read as shared")
	shared, err = mountShared(f, "/run/net ns")
	assert.NilError(t, err)
	assert.Assert(t, shared, "an escaped mount point was not matched")

	// A later mount on the same point covers the earlier one.
	assert.NilError(t, os.WriteFile(f, []byte(
		"45 25 254:0 /run/netns /run/netns rw,relatime - ext4 /dev/vda rw\n"+
			"47 45 254:0 /run/netns /run/netns rw,relatime shared:7 master:1 - ext4 /dev/vda rw\n"), 0o644))
	shared, err = mountShared(f, NetnsDir)
	assert.NilError(t, err)
	assert.Assert(t, shared)
	shared, err = mountShared(f, "/run")
	assert.NilError(t, err)
	assert.Assert(t, !shared, "no mount point is not shared")
}

// fakeService listens on a unix socket from a process in a mount namespace
// of its own (private, as a service started without systemd), /run replaced
// by a tmpfs mounted with runOpts; it returns the socket's URL and pid.
func fakeService(t *testing.T, runOpts string) (string, int) {
	t.Helper()
	dir := t.TempDir()
	sock := filepath.Join(dir, "s.sock")
	ready := filepath.Join(dir, "ready")
	py := fmt.Sprintf("import socket,time,os\ns=socket.socket(socket.AF_UNIX)\ns.bind(%q)\ns.listen(8)\nopen(%q,'w').close()\ntime.sleep(60)\n", sock, ready)
	cmd := exec.Command("unshare", "--mount", "--propagation", "private", "sh", "-c",
		fmt.Sprintf("mount -t tmpfs -o %s tmpfs /run && exec /usr/bin/python3 -c \"$0\"", runOpts), py)
	out := &strings.Builder{}
	cmd.Stdout, cmd.Stderr = out, out
	assert.NilError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	for i := 0; ; i++ {
		if _, err := os.Stat(ready); err == nil {
			break
		}
		if i > 100 {
			t.Fatalf("fake service not ready: %s", out)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return "unix://" + sock, cmd.Process.Pid
}

// TestShareNetns: in a service's private mount namespace without
// /run/netns, ShareNetns creates it and makes it a shared mount there
// (and only there); where it cannot (/run read-only), it refuses with the
// cause and the fix.
func TestShareNetns(t *testing.T) {
	itest.Require(t, itest.Root)
	// Other tests mount beside this one: compare only our /run/netns.
	own := func() string {
		b, err := os.ReadFile("/proc/self/mountinfo")
		assert.NilError(t, err)
		var at []string
		for _, l := range strings.Split(string(b), "\n") {
			if f := strings.Fields(l); len(f) > 4 && f[4] == NetnsDir {
				at = append(at, l)
			}
		}
		return strings.Join(at, "\n")
	}
	before := own()

	url, pid := fakeService(t, "rw,mode=0755")
	st, err := NetnsShared(url)
	assert.NilError(t, err)
	assert.Equal(t, st.Pid, pid)
	assert.Assert(t, !st.Shared, "positive control: a fresh private namespace has no shared /run/netns")
	assert.NilError(t, ShareNetns(url))
	st, err = NetnsShared(url)
	assert.NilError(t, err)
	assert.Assert(t, st.Shared, "ShareNetns left /run/netns private")
	fi, err := os.Stat(fmt.Sprintf("/proc/%d/root%s", pid, NetnsDir))
	assert.NilError(t, err)
	assert.Equal(t, fi.Mode().Perm(), os.FileMode(0o755))
	// Shared already: nothing more is mounted.
	mi := func() int {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", pid))
		assert.NilError(t, err)
		return strings.Count(string(b), " "+NetnsDir+" ")
	}
	n := mi()
	assert.NilError(t, ShareNetns(url))
	assert.Equal(t, mi(), n, "ShareNetns mounted again on a shared /run/netns")
	assert.Equal(t, own(), before, "ShareNetns changed this process's own /run/netns")

	url, pid = fakeService(t, "ro")
	err = ShareNetns(url)
	assert.ErrorContains(t, err, "is not a shared mount and cannot be made one")
	assert.Assert(t, is.Contains(err.Error(), "read-only file system"))
	assert.Assert(t, is.Contains(err.Error(), fmt.Sprintf("nsenter -t %d -m", pid)))
	assert.Assert(t, !strings.Contains(err.Error(), "\n"), "one line: %q", err)
}

// BenchmarkNetnsShared is what every networked turn pays when /run/netns is
// shared already: one connection for the service's pid, one mountinfo read.
func BenchmarkNetnsShared(b *testing.B) {
	itest.Require(b, itest.Root, itest.Podman)
	for i := 0; i < b.N; i++ {
		if _, err := NetnsShared(itest.Socket()); err != nil {
			b.Fatal(err)
		}
	}
}
