package probe

import (
	"strconv"
	"strings"
)

// sentryIDReason is the reason the inside gives A5 under gVisor: only the
// host side can decide it (JudgeSandbox, which pkg/probedrive calls with
// the runsc processes it watched while the cage ran).
const sentryIDReason = "under gVisor the cage sees the Sentry's id map; only the host sees whether runsc-sandbox and runsc-gofer run as the task's ids"

// SandboxProc is one runsc process (runsc re-executes itself with argv[0]
// runsc-sandbox or runsc-gofer) as the host saw it, last.
type SandboxProc struct {
	Pid      int
	Name     string
	Cmdline  string
	UID, GID []string // real, effective, saved, filesystem
}

// JudgeSandbox decides A5 when the inside left it to the host (the cage
// saw the Sentry's id map): sealed when the cage's runsc-sandbox and
// runsc-gofer were seen running with every uid and gid the task's range
// base (uid, gid: not host root), escaped when one ran with other ids,
// undecided (the inside's error) when the host saw neither or idsErr says
// the task's ids are unknown. It recomputes the summary.
func JudgeSandbox(rep *Report, cage string, procs []SandboxProc, uid32, gid32 uint32, idsErr error) {
	defer rep.Summarize()
	for i := range rep.Checks {
		c := &rep.Checks[i]
		if c.ID != SandboxRow || c.Verdict != Error || c.Reason != sentryIDReason {
			continue
		}
		if cage == "" {
			return
		}
		if idsErr != nil {
			c.ev("host: the task's ids: %v", idsErr)
			return
		}
		uid, gid := strconv.FormatUint(uint64(uid32), 10), strconv.FormatUint(uint64(gid32), 10)
		seen := map[string]bool{}
		bad := false
		for _, p := range procs {
			if !strings.Contains(p.Cmdline, cage) {
				continue
			}
			seen[p.Name] = true
			ok := uid32 != 0 && gid32 != 0 && all(p.UID, uid) && all(p.GID, gid)
			c.ev("host: %s pid %d runs as uid %s gid %s (the task's range base: %s:%s)", p.Name, p.Pid, strings.Join(p.UID, ","), strings.Join(p.GID, ","), uid, gid)
			if !ok {
				bad = true
				c.ev("ESCAPED: %s of the cage runs with host ids other than the task's", p.Name)
			}
		}
		switch {
		case bad:
			c.Verdict, c.Reason = Escaped, ""
		case seen["runsc-sandbox"] && seen["runsc-gofer"]:
			c.Verdict, c.Reason = Sealed, ""
			c.ev("the task's user namespace holds on the host: the Sentry and its gofer run as the task's ids, as the cage's processes do under runc")
		default:
			c.ev("host: no runsc-sandbox and runsc-gofer of cage %.12s seen (%d runsc processes seen): a podman service out of this host's sight", cage, len(procs))
		}
		return
	}
}

func all(vals []string, want string) bool {
	if len(vals) == 0 {
		return false
	}
	for _, v := range vals {
		if v != want {
			return false
		}
	}
	return true
}
