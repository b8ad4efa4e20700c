package perf

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/shrooms-cage/shrooms/internal/itest"
	"github.com/shrooms-cage/shrooms/internal/tbworld"
)

// TestPreparedTurnsRemoveOnFirstTry runs prepared turns of one task back
// to back and counts the detached teardown's removals of exited cages that
// podman refused (its log, at level info, records every failed request):
// there must be none. Before a cage's /dev/shm was a tmpfs of its own,
// 2–3 of 8 such removals failed with `unlinkat …/userdata/shm: device or
// resource busy` (podman 4.3 cleans an exited cage up from conmon's own
// mount namespace, so the host-side shm mount stayed; docs/performance.md,
// "The busy delete") and pkg/podman's Remove tried again. The count is
// not a certainty the other way (the failure was a race inside podman's
// storage removal, ~1 in 6), so the positive control is the same test
// against the build before the change (SHROOMS_PERF_BINARY), which
// reported busy removals in the runs docs/performance.md lists.
// SHROOMS_PERF_TURNS changes the count (10).
func TestPreparedTurnsRemoveOnFirstTry(t *testing.T) {
	turns := 10
	if n, err := strconv.Atoi(os.Getenv("SHROOMS_PERF_TURNS")); err == nil && n > 0 {
		turns = n
	}
	be := newBench(t, tbworld.WithService(append(itest.ServiceArgs(), "--log-level=info")...))
	task := be.Task("rm1")
	cages := map[string]bool{}
	for i := 0; i <= turns; i++ { // the first turn makes the first prepared cage
		_, res, err := runTurn(be, task, "shell", "true")
		if err != nil {
			t.Fatalf("turn %d: %v", i, err)
		}
		if i > 0 && !res.Prepared {
			t.Fatalf("turn %d was not a prepared turn: %+v", i, res)
		}
		cages[res.Cage] = true
	}
	be.WaitIdle(task)
	log, err := os.ReadFile(filepath.Join(be.TB.Dir, "podman.log"))
	if err != nil {
		t.Fatal(err)
	}
	// The log's own check: it records requests at all, and our removals.
	removals, busy := 0, 0
	for _, line := range strings.Split(string(log), "\n") {
		id := cageIn(line, cages)
		if id == "" {
			continue
		}
		switch {
		case strings.Contains(line, `"DELETE `):
			removals++
		case strings.Contains(line, "Request Failed") && strings.Contains(line, "busy"):
			busy++
			t.Logf("busy removal of %.12s: %s", id, line)
		}
	}
	t.Logf("%d prepared turns: %d removal requests of their cages, %d refused as busy", turns, removals, busy)
	if removals < turns {
		t.Fatalf("the service's log shows %d removals of the turns' %d cages: it does not record requests (log level info?)", removals, len(cages))
	}
	if busy > 0 {
		t.Fatalf("%d of %d removals of exited cages were refused as busy", busy, removals)
	}
}

// cageIn is the cage of cages that line names, "" for none.
func cageIn(line string, cages map[string]bool) string {
	for id := range cages {
		if id != "" && strings.Contains(line, id) {
			return id
		}
	}
	return ""
}
