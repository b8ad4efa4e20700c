// Package runsc reads and judges the flags gVisor's runsc runs with: the
// ones a podman service gives it (--runtime-flag), the ones a cage's
// sandbox process was started with, and the ones a runsc binary knows.
// shrooms' profile (docs/gvisor.md) needs oci-seccomp — without it runsc
// ignores the cage's seccomp profile — and expects platform=systrap and
// network=host.
package runsc

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// Flags are runsc's global flags by name (no dashes); a bool flag given
// without a value is "true".
type Flags map[string]string

// ParseArgs reads runsc's global flags from argv, each `--name[=value]` or
// `-name[=value]`, up to the first argument that is not a flag (its
// subcommand), as Go's flag package does: "--" ends the flags and "-" is
// no flag, so nothing after either counts. runsc writes its own
// children's flags as --name=value.
func ParseArgs(args []string) Flags {
	f := Flags{}
	for _, a := range args {
		if !strings.HasPrefix(a, "-") || a == "-" || a == "--" {
			break
		}
		f.add(a)
	}
	return f
}

// FromRuntimeFlags reads podman's --runtime-flag values ("oci-seccomp",
// "platform=systrap"; podman adds the dashes).
func FromRuntimeFlags(vals []string) Flags {
	f := Flags{}
	for _, v := range vals {
		f.add(v)
	}
	return f
}

func (f Flags) add(a string) {
	name, val, ok := strings.Cut(strings.TrimLeft(a, "-"), "=")
	if !ok {
		val = "true"
	}
	if name != "" {
		f[name] = val
	}
}

// on says whether bool flag name is set true.
func (f Flags) on(name string) bool {
	v, ok := f[name]
	if !ok {
		return false
	}
	b, err := strconv.ParseBool(v)
	return err == nil && b
}

// OCISeccomp says whether runsc enforces the OCI seccomp profile.
func (f Flags) OCISeccomp() bool { return f.on("oci-seccomp") }

// Judge checks flags against shrooms' runsc profile: fail is one line when
// the cage's seccomp profile would be ignored; warns name each choice other
// than the profile's (runsc's defaults: platform systrap, network sandbox).
func Judge(f Flags) (fail string, warns []string) {
	if !f.OCISeccomp() {
		fail = "runsc runs without --oci-seccomp: it ignores the cage's seccomp profile (every syscall the profile denies reaches the Sentry)"
	}
	if p, ok := f["platform"]; ok && p != "systrap" {
		warns = append(warns, "platform="+p+" (the profile's is systrap; kvm hangs without a usable /dev/kvm)")
	}
	switch n := f["network"]; n {
	case "host":
	case "":
		warns = append(warns, "network=sandbox (runsc's default): the cage's resolver and model gateway on its loopback are out of the netstack's reach; the profile's is host")
	default:
		warns = append(warns, "network="+n+": the profile's is host")
	}
	return fail, warns
}

// Sandbox reads the flags of the runsc sandbox process pid, which must be
// cage's (its command line names the cage's id): a pid of another pid
// namespace or host (a remote podman service) is refused, not guessed at.
func Sandbox(pid int, cage string) (Flags, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return nil, fmt.Errorf("runsc sandbox pid %d is not a process of this host: %w", pid, err)
	}
	args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
	if len(args) == 0 || args[0] != "runsc-sandbox" || cage == "" || !strings.Contains(string(b), cage) {
		return nil, fmt.Errorf("pid %d of this host (%.40q) is not the runsc sandbox of cage %.12s", pid, args[0], cage)
	}
	return ParseArgs(args[1:]), nil
}

// Known returns which of names the runsc binary at path does not know
// (`runsc flags` lists every flag, on stderr).
func Known(ctx context.Context, path string, names ...string) (missing []string, err error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, path, "flags").CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("%s flags: %w", path, err)
	}
	have := map[string]bool{}
	for _, l := range strings.Split(string(out), "\n") {
		if n, ok := strings.CutPrefix(l, "  -"); ok {
			n, _, _ = strings.Cut(n, " ")
			have[n] = true
		}
	}
	for _, n := range names {
		if !have[n] {
			missing = append(missing, n)
		}
	}
	return missing, nil
}
