package probe

import (
	"errors"
	"testing"

	"golang.org/x/sys/unix"
	"gotest.tools/v3/assert"
)

// TestJudgeSandbox: A5 under gVisor is sealed only by the host's sight of
// the cage's runsc-sandbox and runsc-gofer running as the task's ids; host
// root (a service without the task's mapping) is an escape, and nothing
// seen leaves it undecided. Other cages' processes do not count.
func TestJudgeSandbox(t *testing.T) {
	const cage = "0123456789abcdef"
	const base = 1879048192
	proc := func(name, cage, id string) SandboxProc {
		return SandboxProc{Pid: 7, Name: name, Cmdline: name + " --root=/var/run/runsc boot --bundle=/x/" + cage + "/userdata " + cage,
			UID: []string{id, id, id, id}, GID: []string{id, id, id, id}}
	}
	task := "1879048192"
	for _, tc := range []struct {
		name  string
		procs []SandboxProc
		err   error
		want  Verdict
	}{
		{"task ids", []SandboxProc{proc("runsc-sandbox", cage, task), proc("runsc-gofer", cage, task)}, nil, Sealed},
		{"host root", []SandboxProc{proc("runsc-sandbox", cage, task), proc("runsc-gofer", cage, "0")}, nil, Escaped},
		{"only the sandbox seen", []SandboxProc{proc("runsc-sandbox", cage, task)}, nil, Error},
		{"another cage's", []SandboxProc{proc("runsc-sandbox", "fedcba9876543210", task), proc("runsc-gofer", "fedcba9876543210", task)}, nil, Error},
		{"no task ids", []SandboxProc{proc("runsc-sandbox", cage, task), proc("runsc-gofer", cage, task)}, errors.New("no slot"), Error},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rep := &Report{Checks: []Check{{ID: SandboxRow, Verdict: Error, Reason: sentryIDReason}}}
			JudgeSandbox(rep, cage, tc.procs, base, base, tc.err)
			assert.Equal(t, rep.Checks[0].Verdict, tc.want, "%v", rep.Checks[0].Evidence)
		})
	}
	// A row the inside decided is never the host's to change.
	rep := &Report{Checks: []Check{{ID: SandboxRow, Verdict: Escaped}}}
	JudgeSandbox(rep, cage, []SandboxProc{proc("runsc-sandbox", cage, task), proc("runsc-gofer", cage, task)}, base, base, nil)
	assert.Equal(t, rep.Checks[0].Verdict, Escaped)
}

// TestSentrySocket: under gVisor the profile's EPERM and the Sentry's "no
// such family" are sealed, EINVAL reached the Sentry's family, anything
// else is undecided.
func TestSentrySocket(t *testing.T) {
	for _, tc := range []struct {
		err         error
		reached, ok bool
	}{
		{unix.EPERM, false, true}, {unix.EAFNOSUPPORT, false, true}, {unix.EPROTONOSUPPORT, false, true},
		{unix.ESOCKTNOSUPPORT, false, true}, {unix.EINVAL, true, true}, {unix.ENOSYS, false, false}, {nil, false, false},
	} {
		r, ok := sentrySocket(tc.err)
		assert.Check(t, r == tc.reached && ok == tc.ok, "%v: reached %v ok %v", tc.err, r, ok)
	}
}

// TestSentryNeedsTheHostKernel: without the host's release (a bare `probe
// inside`) or on the host's own kernel, no row judges as under gVisor.
func TestSentryNeedsTheHostKernel(t *testing.T) {
	assert.Check(t, !sentry(Params{}))
	assert.Check(t, !sentry(Params{HostKernel: kernelRelease()}))
}

// TestJudgeIDMaps: A5 is left to the host only when both maps are the
// Sentry's identity; an identity map beside another one is host root, an
// escape, under gVisor as under runc. The positive control: the task's
// range maps, sealed.
func TestJudgeIDMaps(t *testing.T) {
	const ident = "         0          0 4294967295\n"
	const task = "         0 1879048192      65536\n"
	for _, tc := range []struct {
		name     string
		gv       bool
		uid, gid string
		want     Verdict
		reason   string
	}{
		{"the Sentry's maps", true, ident, ident, Error, sentryIDReason},
		{"identity uid map beside another gid map", true, ident, task, Escaped, ""},
		{"identity gid map beside another uid map", true, task, ident, Escaped, ""},
		{"identity maps without gVisor", false, ident, ident, Escaped, ""},
		{"the task's range", false, task, task, Sealed, ""},
		{"the task's range under gVisor", true, task, task, Sealed, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &Check{ID: SandboxRow}
			judgeIDMaps(c, tc.gv, [2]string{tc.uid, tc.gid})
			assert.Equal(t, c.Verdict, tc.want, "%v", c.Evidence)
			assert.Equal(t, c.Reason, tc.reason)
		})
	}
}
