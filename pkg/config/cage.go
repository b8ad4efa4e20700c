package config

import (
	"fmt"
	"path/filepath"
	"strings"
	"time"
)

// Cage is the container every turn runs in.
type Cage struct {
	// Image is the agent image; it must already be in podman's store.
	Image string `toml:"image"`
	// Memory is the memory limit (swap is not added on top).
	Memory Size `toml:"memory"`
	// Pids caps the number of processes and threads in the cage.
	Pids int64 `toml:"pids"`
	// CPUs is the CPU quota, in cores.
	CPUs float64 `toml:"cpus"`
	// Nofile and Nproc are RLIMIT_NOFILE and RLIMIT_NPROC (soft = hard).
	Nofile int64 `toml:"nofile"`
	Nproc  int64 `toml:"nproc"`
	// Timeout is a turn's default deadline (run --timeout overrides it).
	Timeout Duration `toml:"timeout"`
	// StopGrace is how long the agent gets after SIGTERM before SIGKILL.
	StopGrace Duration `toml:"stop_grace"`
	// TmpSize and RunSize cap the tmpfs at /tmp and /run.
	TmpSize Size `toml:"tmp_size"`
	RunSize Size `toml:"run_size"`
	// TmpExec allows executing files from /tmp (noexec otherwise).
	TmpExec bool `toml:"tmp_exec"`
	// SubIDUser names the /etc/subuid and /etc/subgid entry whose range
	// shrooms carves into one 65536-id user namespace per task.
	SubIDUser string `toml:"subid_user"`
	// User is the uid (and gid) the agent runs as inside the cage.
	User int64 `toml:"user"`
	// Seccomp is "shrooms" (the built-in strict profile), "podman" (podman's
	// default profile) or the absolute path of a profile.
	Seccomp string `toml:"seccomp"`
	// Runtime is the OCI runtime cages run under: "default" (the podman
	// service's own), a name podman knows (runc, crun, runsc, kata) or the
	// absolute path of one. Podman before 5.x ignores a per-container
	// runtime over its API, so the turn checks what the cage really got.
	Runtime string `toml:"runtime"`
	// HostnameFmt formats the cage hostname from the task id.
	HostnameFmt string `toml:"hostname_format"`
	// PrepareNext makes every `run` prepare the task's next cage after the
	// turn, off the caller's path (as run --prepare-next does); a next turn
	// that differs in anything discards it.
	PrepareNext bool `toml:"prepare_next"`
	// PreparedTTL is how long a prepared cage waits for its turn: an older
	// one (its conmon, loop device and HOME mount) is removed by `gc` and
	// by the detached teardown of a later turn of any task (those look at
	// most every tenth of the TTL, at most every 5 minutes).
	PreparedTTL Duration `toml:"prepared_ttl"`
	// TeardownLinger is how long a detached teardown stays once its work
	// is done, idle, to take the next turns' teardowns (pkg/teardownd):
	// no process start and no new podman connection per turn. 0: every
	// teardown is a process of its own that exits when done.
	TeardownLinger Duration `toml:"teardown_linger"`
}

func (c *Cage) validate() error {
	switch {
	case c.Image == "":
		return &Error{Key: "cage.image", Msg: "must name an image (e.g. localhost/shrooms-agent:latest)"}
	case c.Memory < 64<<20:
		return &Error{Key: "cage.memory", Msg: fmt.Sprintf("%s is below the 64m minimum", c.Memory)}
	case c.Pids < 16 || c.Pids > 1<<22:
		return &Error{Key: "cage.pids", Msg: fmt.Sprintf("%d is out of range 16..4194304", c.Pids)}
	case c.CPUs <= 0 || c.CPUs > 1024:
		return &Error{Key: "cage.cpus", Msg: fmt.Sprintf("%g is out of range (0, 1024]", c.CPUs)}
	case c.Nofile < 64 || c.Nofile > 1<<20:
		return &Error{Key: "cage.nofile", Msg: fmt.Sprintf("%d is out of range 64..1048576", c.Nofile)}
	case c.Nproc < 16 || c.Nproc > 1<<22:
		return &Error{Key: "cage.nproc", Msg: fmt.Sprintf("%d is out of range 16..4194304", c.Nproc)}
	case c.Timeout.Std() <= 0:
		return &Error{Key: "cage.timeout", Msg: "must be positive"}
	case c.StopGrace.Std() < 0:
		return &Error{Key: "cage.stop_grace", Msg: "must not be negative"}
	case c.PreparedTTL.Std() <= 0:
		return &Error{Key: "cage.prepared_ttl", Msg: "must be positive (prepare_next = false prepares none)"}
	case c.TeardownLinger.Std() < 0 || c.TeardownLinger.Std() > time.Hour:
		return &Error{Key: "cage.teardown_linger", Msg: "must be in 0..1h (0: no teardown lingers)"}
	case c.TmpSize < 1<<20:
		return &Error{Key: "cage.tmp_size", Msg: "must be at least 1m"}
	case c.RunSize < 1<<20:
		return &Error{Key: "cage.run_size", Msg: "must be at least 1m"}
	case !validName(c.SubIDUser):
		return &Error{Key: "cage.subid_user", Msg: fmt.Sprintf("%q is not a user name", c.SubIDUser)}
	case c.User < 1 || c.User > 65535:
		return &Error{Key: "cage.user", Msg: "must be a non-root uid in 1..65535 (the cage's user namespace has 65536 ids)"}
	case c.Seccomp != "shrooms" && c.Seccomp != "podman" && !filepath.IsAbs(c.Seccomp):
		return &Error{Key: "cage.seccomp", Msg: fmt.Sprintf("%q: use \"shrooms\", \"podman\" or an absolute path", c.Seccomp)}
	}
	if err := validateRuntime(c.Runtime); err != nil {
		return err
	}
	if msg := hostnameFormat(c.HostnameFmt); msg != "" {
		return &Error{Key: "cage.hostname_format", Msg: msg}
	}
	return nil
}

// hostnameFormat checks cage.hostname_format: exactly one %s (the task id)
// and no other verb, around at most 16 characters of a-z 0-9 . -, so that
// the result has only hostname characters whatever the task id.
func hostnameFormat(f string) string {
	if strings.Count(f, "%s") != 1 || strings.Count(f, "%") != 1 {
		return fmt.Sprintf("%q must contain %%s (the task id) exactly once and no other %% verb", f)
	}
	lit := strings.Replace(f, "%s", "", 1)
	if len(lit) > 16 {
		return fmt.Sprintf("%q: at most 16 characters besides %%s", f)
	}
	for _, r := range lit {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' || r == '.') {
			return fmt.Sprintf("%q: a hostname has only a-z 0-9 . - besides %%s", f)
		}
	}
	if strings.HasPrefix(f, "-") || strings.HasPrefix(f, ".") || strings.HasSuffix(f, "-") || strings.HasSuffix(f, ".") || strings.Contains(f, "..") {
		return fmt.Sprintf("%q: a hostname neither starts nor ends with - or . and has no empty label", f)
	}
	return ""
}

// StrictSeccomp reports whether cages run under a profile stricter than
// podman's default (shrooms' own, or the owner's file).
func (c *Cage) StrictSeccomp() bool { return c.Seccomp != "podman" }

func validName(s string) bool {
	if s == "" || len(s) > 32 {
		return false
	}
	for i, r := range s {
		ok := r >= 'a' && r <= 'z' || r == '_' || (i > 0 && (r >= '0' && r <= '9' || r == '-'))
		if !ok {
			return false
		}
	}
	return true
}
