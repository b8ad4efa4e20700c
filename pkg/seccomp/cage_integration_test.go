package seccomp

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
	"gotest.tools/v3/assert"

	"github.com/shrooms-cage/shrooms/internal/itest"
)

// TestSocketFamiliesInCage runs testdata/sock32 in a real cage (no
// capabilities) built for amd64 and for 386, under shrooms' profile and,
// as the positive control, under podman's default profile.
//
// amd64: AF_INET opens under both; AF_VSOCK and AF_ALG fail with
// EAFNOSUPPORT under shrooms' profile, while under podman's AF_ALG gets
// past seccomp (EINVAL for its invalid type) and AF_VSOCK opens wherever
// the host kernel offers it. 386: the same process reaches socket()
// through socketcall, where no family filter holds; under podman's profile
// it opens AF_VSOCK that way, under shrooms' it is killed (SIGSYS) at its
// first system call: the profile lets no 32-bit x86 call through.
//
// Some kernels run no 32-bit binaries at all (ia32 emulation off, as on the
// CI machines' guest kernel): the host's own exec of the 386 build is the
// control that tells which case holds, and there the cage's exec must fail
// the same way under both profiles.
func TestSocketFamiliesInCage(t *testing.T) {
	itest.Require(t, itest.Root, itest.Podman)
	dir := t.TempDir()
	profile, err := Install(dir)
	assert.NilError(t, err)
	build := func(goarch string) string {
		out := filepath.Join(dir, "sock-"+goarch)
		cmd := exec.Command("go", "build", "-o", out, "./testdata/sock32")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOARCH="+goarch)
		b, err := cmd.CombinedOutput()
		assert.NilError(t, err, string(b))
		return out
	}
	run := func(bin string, seccomp ...string) (string, int) {
		args := []string{"--url", itest.Socket(), "run", "--rm", "--name", itest.UniqueName("sc"), "--cap-drop", "ALL",
			"--security-opt", "no-new-privileges", "--user", "1000:1000", "--network", "none", "-v", bin + ":/sock:ro"}
		if len(seccomp) > 0 {
			args = append(args, "--security-opt", "seccomp="+seccomp[0])
		}
		cmd := exec.Command("podman", append(args, itest.TestImage, "/sock")...)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else {
			assert.NilError(t, err)
		}
		return string(out) + stderr.String(), code
	}
	vsock := "AF_VSOCK address family not supported by protocol"
	if fd, err := unix.Socket(unix.AF_VSOCK, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0); err == nil {
		unix.Close(fd)
		vsock = "AF_VSOCK open"
	}
	amd64, i386 := build("amd64"), build("386")

	out, code := run(amd64)
	assert.Equal(t, code, 0, out)
	assert.Equal(t, out, "AF_INET open\n"+vsock+"\nAF_ALG invalid argument\n", "podman's default profile")
	out, code = run(amd64, profile)
	assert.Equal(t, code, 0, out)
	assert.Equal(t, out, "AF_INET open\nAF_VSOCK address family not supported by protocol\nAF_ALG address family not supported by protocol\n", "shrooms' profile")

	if err := exec.Command(i386).Run(); err != nil {
		assert.Assert(t, errors.Is(err, syscall.ENOEXEC), "the host's exec of the 386 build failed otherwise than the kernel refusing it: %v", err)
		t.Logf("this kernel runs no 32-bit x86 binaries (host exec: %v): the socketcall path is closed below the cage", err)
		for _, profiles := range [][]string{nil, {profile}} {
			out, code := run(i386, profiles...)
			assert.Assert(t, code != 0, "a 32-bit binary ran in the cage where the host cannot run it: %q", out)
			assert.Assert(t, strings.Contains(out, "exec format error"), out)
			assert.Assert(t, !strings.Contains(out, "open"), out)
		}
		return
	}
	out, code = run(i386)
	assert.Equal(t, code, 0, out)
	assert.Equal(t, out, "AF_INET open\n"+vsock+"\nAF_ALG invalid argument\n", "podman's default profile, 32-bit")
	out, code = run(i386, profile)
	assert.Equal(t, code, 128+int(unix.SIGSYS), "a 32-bit process under shrooms' profile: %q", out)
	assert.Assert(t, !strings.Contains(out, "open"), out)
}

// TestTIOCSTIInCage runs testdata/tiocsti in a real cage with a terminal
// (podman run -t). Positive control: under podman's default profile both
// TIOCSTI calls push their byte into the terminal (its echo "X" shows in the
// output). Under shrooms' profile both fail with EPERM, the one with the
// upper 32 bits set included, while TIOCGWINSZ still works.
func TestTIOCSTIInCage(t *testing.T) {
	itest.Require(t, itest.Root, itest.Podman)
	dir := t.TempDir()
	profile, err := Install(dir)
	assert.NilError(t, err)
	bin := filepath.Join(dir, "tiocsti")
	cmd := exec.Command("go", "build", "-o", bin, "./testdata/tiocsti")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	b, err := cmd.CombinedOutput()
	assert.NilError(t, err, string(b))
	run := func(seccomp ...string) string {
		args := []string{"--url", itest.Socket(), "run", "--rm", "-t", "--name", itest.UniqueName("sti"), "--cap-drop", "ALL",
			"--security-opt", "no-new-privileges", "--user", "1000:1000", "--network", "none", "-v", bin + ":/tiocsti:ro"}
		if len(seccomp) > 0 {
			args = append(args, "--security-opt", "seccomp="+seccomp[0])
		}
		out, err := exec.Command("podman", append(args, itest.TestImage, "/tiocsti")...).Output()
		assert.NilError(t, err, string(out))
		return strings.ReplaceAll(string(out), "\r", "")
	}
	assert.Equal(t, run(), "XTIOCSTI 0x5412: injected\nXTIOCSTI 0xffffffff00005412: injected\nTIOCGWINSZ: ok\n",
		"podman's default profile lets TIOCSTI through")
	assert.Equal(t, run(profile), "TIOCSTI 0x5412: operation not permitted\nTIOCSTI 0xffffffff00005412: operation not permitted\nTIOCGWINSZ: ok\n",
		"shrooms' profile")
}
