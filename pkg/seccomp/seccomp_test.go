package seccomp

import (
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
	"gotest.tools/v3/assert"
)

func TestInstallIsIdempotentAndExact(t *testing.T) {
	dir := t.TempDir()
	p, err := Install(dir)
	assert.NilError(t, err)
	assert.Equal(t, p, Path(dir))
	b, err := os.ReadFile(p)
	assert.NilError(t, err)
	assert.DeepEqual(t, b, Profile())
	var v map[string]any
	assert.NilError(t, json.Unmarshal(b, &v), "the profile is JSON")
	assert.NilError(t, os.WriteFile(p, []byte("tampered"), 0o644))
	p2, err := Install(dir)
	assert.NilError(t, err)
	b, _ = os.ReadFile(p2)
	assert.DeepEqual(t, b, Profile())
}

type rule struct {
	Names    []string `json:"names"`
	Action   string   `json:"action"`
	ErrnoRet int      `json:"errnoRet"`
	Args     []struct {
		Index    uint   `json:"index"`
		Value    uint64 `json:"value"`
		ValueTwo uint64 `json:"valueTwo"`
		Op       string `json:"op"`
	} `json:"args"`
	Includes struct {
		Caps []string `json:"caps"`
	} `json:"includes"`
}

// outcome evaluates the profile's rules for one call the way libseccomp
// does for a cage without capabilities: the action of the rules whose
// argument comparisons all hold, or the default action. Overlapping rules
// with different outcomes are an error: their precedence would be
// libseccomp's choice, not the profile's.
func outcome(t *testing.T, rules []rule, name string, args [6]uint64) string {
	t.Helper()
	var got []string
	for _, r := range rules {
		if len(r.Includes.Caps) > 0 || !slices.Contains(r.Names, name) {
			continue
		}
		match := true
		for _, a := range r.Args {
			v := args[a.Index]
			switch a.Op {
			case "SCMP_CMP_EQ":
				match = match && v == a.Value
			case "SCMP_CMP_NE":
				match = match && v != a.Value
			case "SCMP_CMP_GE":
				match = match && v >= a.Value
			case "SCMP_CMP_GT":
				match = match && v > a.Value
			case "SCMP_CMP_LT":
				match = match && v < a.Value
			case "SCMP_CMP_LE":
				match = match && v <= a.Value
			case "SCMP_CMP_MASKED_EQ":
				match = match && v&a.Value == a.ValueTwo
			default:
				t.Fatalf("%s: comparison %s not modelled", name, a.Op)
			}
		}
		if match {
			o := r.Action
			if r.Action == "SCMP_ACT_ERRNO" {
				o = unix.ErrnoName(syscall.Errno(r.ErrnoRet))
			}
			if !slices.Contains(got, o) {
				got = append(got, o)
			}
		}
	}
	switch len(got) {
	case 0:
		return "default"
	case 1:
		return got[0]
	}
	t.Fatalf("%s%v: overlapping rules %v", name, args, got)
	return ""
}

// The socket families a cage may open: unix, inet, inet6 and netlink for
// NETLINK_ROUTE. Every other family fails with EAFNOSUPPORT, as if the
// kernel lacked it; so do values with high bits set, which the kernel would
// truncate to an int.
func TestSocketFamilyAllowlist(t *testing.T) {
	var prof struct {
		DefaultAction string `json:"defaultAction"`
		ArchMap       []struct {
			Arch string   `json:"architecture"`
			Sub  []string `json:"subArchitectures"`
		} `json:"archMap"`
		Syscalls []rule `json:"syscalls"`
	}
	assert.NilError(t, json.Unmarshal(Profile(), &prof))
	assert.Equal(t, prof.DefaultAction, "SCMP_ACT_ERRNO")
	// On i386 libseccomp rewrites a socket rule into a socketcall rule
	// whose first comparison is the call number, not the family: the
	// allowlist would not hold for 32-bit processes, and runc refuses the
	// profile (two rules that differ only in their action).
	for _, a := range prof.ArchMap {
		if a.Arch == "SCMP_ARCH_X86_64" {
			assert.DeepEqual(t, a.Sub, []string{"SCMP_ARCH_X32"})
		}
	}
	for _, s := range prof.Syscalls {
		assert.Check(t, !slices.Contains(s.Names, "socketcall") || s.Action != "SCMP_ACT_ALLOW",
			"socketcall hides its arguments from seccomp and must not be allowed")
	}
	allowed := map[uint64]bool{unix.AF_UNIX: true, unix.AF_INET: true, unix.AF_INET6: true}
	var families []uint64
	for f := uint64(0); f < 64; f++ {
		families = append(families, f)
	}
	families = append(families, 1<<32|unix.AF_INET, 1<<32|unix.AF_VSOCK, 1<<63, ^uint64(0))
	for _, f := range families {
		for _, typ := range []uint64{unix.SOCK_STREAM, unix.SOCK_DGRAM, unix.SOCK_RAW | unix.SOCK_CLOEXEC} {
			got := outcome(t, prof.Syscalls, "socket", [6]uint64{f, typ, 0})
			want := "EAFNOSUPPORT"
			if allowed[f] || f == unix.AF_NETLINK {
				want = "SCMP_ACT_ALLOW"
			}
			assert.Check(t, got == want, "socket(%#x, %d, 0) = %s, want %s", f, typ, got, want)
		}
		want := "EAFNOSUPPORT"
		if f == unix.AF_UNIX {
			want = "SCMP_ACT_ALLOW"
		}
		got := outcome(t, prof.Syscalls, "socketpair", [6]uint64{f, unix.SOCK_STREAM, 0})
		assert.Check(t, got == want, "socketpair(%#x) = %s, want %s", f, got, want)
	}
	// Netlink: routing only; audit keeps podman's EINVAL.
	for p := uint64(0); p < 40; p++ {
		got := outcome(t, prof.Syscalls, "socket", [6]uint64{unix.AF_NETLINK, unix.SOCK_RAW, p})
		want := "EPROTONOSUPPORT"
		switch p {
		case unix.NETLINK_ROUTE:
			want = "SCMP_ACT_ALLOW"
		case unix.NETLINK_AUDIT:
			want = "EINVAL"
		}
		assert.Check(t, got == want, "socket(AF_NETLINK, SOCK_RAW, %d) = %s, want %s", p, got, want)
	}
	// The evaluator itself: a call no rule names falls to the default.
	assert.Equal(t, outcome(t, prof.Syscalls, "no_such_call", [6]uint64{}), "default")
	assert.Equal(t, outcome(t, prof.Syscalls, "read", [6]uint64{}), "SCMP_ACT_ALLOW")
}

// TIOCSTI (push a byte into the terminal's input) fails with EPERM whatever
// the upper 32 bits of the request hold (the kernel ignores them); every
// other ioctl request is allowed, as in podman's profile.
func TestIoctlTIOCSTIDenied(t *testing.T) {
	var prof struct {
		Syscalls []rule `json:"syscalls"`
	}
	assert.NilError(t, json.Unmarshal(Profile(), &prof))
	for _, hi := range []uint64{0, 1 << 32, 0xffffffff << 32, 1 << 63} {
		got := outcome(t, prof.Syscalls, "ioctl", [6]uint64{0, hi | unix.TIOCSTI})
		assert.Check(t, got == "EPERM", "ioctl(0, %#x) = %s", hi|unix.TIOCSTI, got)
	}
	reqs := []uint64{0, 1, unix.TCGETS, unix.TCSETS, unix.TIOCGWINSZ, unix.TIOCSWINSZ, 0x541b, // FIONREAD
		unix.TIOCLINUX,
		unix.TIOCSTI ^ 1, unix.TIOCSTI + 1<<16, 0xffffffff, 1<<32 | unix.TCGETS, ^uint64(0)}
	for bit := 0; bit < 32; bit++ {
		reqs = append(reqs, uint64(unix.TIOCSTI)^1<<bit)
	}
	for _, r := range reqs {
		got := outcome(t, prof.Syscalls, "ioctl", [6]uint64{0, r})
		assert.Check(t, got == "SCMP_ACT_ALLOW", "ioctl(0, %#x) = %s", r, got)
	}
}

// The gVisor profile differs from the built-in one in clone3 alone, which
// it allows (runsc turns its ENOSYS into EPERM: ProfileFor).
func TestGVisorProfileAllowsOnlyClone3More(t *testing.T) {
	assert.DeepEqual(t, ProfileFor(false), Profile())
	decode := func(b []byte) map[string]map[string]any {
		var p struct{ Syscalls []map[string]any }
		assert.NilError(t, json.Unmarshal(b, &p))
		out := map[string]map[string]any{}
		for i, r := range p.Syscalls {
			delete(r, "comment")
			out[fmt.Sprint(i, r["names"])] = r
		}
		return out
	}
	base, gv := decode(Profile()), decode(ProfileFor(true))
	assert.Equal(t, len(gv), len(base))
	changed := 0
	for k, r := range base {
		if fmt.Sprint(r["names"]) == "[clone3]" {
			assert.Equal(t, r["action"], "SCMP_ACT_ERRNO")
			assert.Equal(t, gv[k]["action"], "SCMP_ACT_ALLOW")
			changed++
			continue
		}
		assert.DeepEqual(t, gv[k], r)
	}
	assert.Equal(t, changed, 1)
	assert.Assert(t, PathFor("/s", true) != Path("/s"))
}
