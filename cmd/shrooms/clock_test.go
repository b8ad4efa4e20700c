package main

import (
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

// TestCageCannotSetTheClock: the namespace scan's ctime rule and the
// idmapped give-back's setuid strip rest on no ctime of the turn's being
// set before the turn's start; the cage cannot step CLOCK_REALTIME (no
// CAP_SYS_TIME, which the kernel asks of the initial user namespace, and
// the seccomp profile allows clock_settime only with it). The positive
// control: the same shell ran and read the clock (date works, the attempt
// reached the kernel and was refused).
func TestCageCannotSetTheClock(t *testing.T) {
	e, _ := integration(t, "")
	task := e.Task("clock")
	before := time.Now()
	code, stdout, stderr := e.Shrooms("run", "--task", task, "--agent", "shell", "--", "-c",
		`grep CapEff /proc/self/status; date -s '2001-01-01 00:00:00' 2>&1; echo "year=$(date +%Y)"`)
	assert.Equal(t, code, 0, stderr)
	assert.Assert(t, is.Contains(stdout, "CapEff:\t0000000000000000"), stdout)
	assert.Assert(t, is.Contains(stdout, "Operation not permitted"), stdout)
	// busybox date says so and exits 0; the year after says the clock
	// did not move, in the cage and here.
	assert.Assert(t, !strings.Contains(stdout, "year=2001"), stdout)
	assert.Assert(t, is.Contains(stdout, "year="+before.Format("2006")), "positive control: the cage read the clock: %s", stdout)
	assert.Assert(t, time.Since(before) >= 0 && time.Now().Year() == before.Year(), "the host clock moved")
	code, _, stderr = e.Shrooms("forget", "--task", task)
	assert.Equal(t, code, 0, stderr)
}
