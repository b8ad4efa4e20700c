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
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"fmt"

	"github.com/shrooms-cage/shrooms/pkg/taskstate"
)

//go:embed shrooms.json
var profile []byte

// Profile returns the embedded profile's JSON.
func Profile() []byte { return append([]byte{}, profile...) }

// ProfileFor returns the profile for a cage under gVisor (gvisor) or not.
// gVisor's runsc (up to google/gvisor#14688) turns every errno of an OCI
// profile into EPERM, so clone3's ENOSYS — which makes glibc fall back to
// clone, whose flags the profile checks — reaches the agent as EPERM and
// glibc cannot start a thread (Claude Code aborts). Under gVisor clone3 is
// the Sentry's, not the host kernel's, and the namespaces it makes are the
// Sentry's: the gVisor profile allows it.
func ProfileFor(gvisor bool) []byte {
	if !gvisor {
		return Profile()
	}
	var p map[string]any
	if err := json.Unmarshal(profile, &p); err != nil {
		panic("seccomp: embedded profile: " + err.Error()) // checked by the tests
	}
	rules, _ := p["syscalls"].([]any)
	for _, r := range rules {
		rule, _ := r.(map[string]any)
		if names, _ := rule["names"].([]any); len(names) == 1 && names[0] == "clone3" {
			rule["action"] = "SCMP_ACT_ALLOW"
			delete(rule, "errnoRet")
			rule["comment"] = "shrooms (gVisor): the Sentry's clone3; runsc returns EPERM for every errno (google/gvisor#14688), which breaks glibc's fallback"
		}
	}
	b, err := json.MarshalIndent(p, "", " ")
	if err != nil {
		panic("seccomp: gVisor profile: " + err.Error())
	}
	return b
}

// Path is where Install puts the profile under stateDir.
func Path(stateDir string) string { return PathFor(stateDir, false) }

// PathFor is where InstallFor puts the profile ProfileFor(gvisor) returns.
func PathFor(stateDir string, gvisor bool) string {
	sum := sha256.Sum256(ProfileFor(gvisor))
	return taskstate.Layout{Dir: stateDir}.SeccompProfile("shrooms-" + hex.EncodeToString(sum[:6]) + ".json")
}

// Install writes the profile to Path(stateDir) unless it is already there
// with the same content, and returns the path.
func Install(stateDir string) (string, error) { return InstallFor(stateDir, false) }

// InstallFor is Install of ProfileFor(gvisor).
func InstallFor(stateDir string, gvisor bool) (string, error) {
	path := PathFor(stateDir, gvisor)
	if err := taskstate.InstallFile(path, ProfileFor(gvisor)); err != nil {
		return "", fmt.Errorf("seccomp profile: %w", err)
	}
	return path, nil
}
