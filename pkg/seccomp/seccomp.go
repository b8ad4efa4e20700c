// Package seccomp ships shrooms' seccomp profile: podman's default profile,
// tightened to deny what coding agents do not need (nested namespaces,
// keyrings, io_uring, bpf, perf events, userfaultfd, ptrace, mounts, and
// TIOCSTI, which would let a cage with a terminal type into it) and to
// allow only the socket families they use: unix, inet, inet6 and netlink
// for routing (NETLINK_ROUTE). Every other family (vsock, which reaches a VM
// host's hypervisor without crossing the network seal, alg, key, packet,
// bluetooth...) fails with EAFNOSUPPORT, as on a kernel without it;
// socketcall, whose arguments seccomp cannot see, is not allowed, and
// 32-bit x86 processes do not run on x86_64 at all: libseccomp turns socket
// rules into socketcall rules that lose the family comparison. The profile
// is embedded in the binary and written, content-addressed, into
// the state directory, so a turn never depends on a file installed apart.
package seccomp

import (
	"bytes"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"

	"github.com/shrooms-cage/shrooms/pkg/taskstate"
)

//go:embed shrooms.json
var profile []byte

// Profile returns the embedded profile's JSON.
func Profile() []byte { return append([]byte{}, profile...) }

// Path is where Install puts the profile under stateDir.
func Path(stateDir string) string {
	sum := sha256.Sum256(profile)
	return taskstate.Layout{Dir: stateDir}.SeccompProfile("shrooms-" + hex.EncodeToString(sum[:6]) + ".json")
}

// Install writes the profile to Path(stateDir) unless it is already there
// with the same content, and returns the path.
func Install(stateDir string) (string, error) {
	path := Path(stateDir)
	if b, err := os.ReadFile(path); err == nil && bytes.Equal(b, profile) {
		return path, nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return "", fmt.Errorf("seccomp profile: %w", err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".profile-*")
	if err != nil {
		return "", fmt.Errorf("seccomp profile: %w", err)
	}
	_, err = tmp.Write(profile)
	if err == nil {
		err = tmp.Chmod(0o644)
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		os.Remove(tmp.Name())
		return "", fmt.Errorf("seccomp profile: %w", err)
	}
	return path, nil
}
