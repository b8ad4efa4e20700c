package perf

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/shrooms-cage/shrooms/internal/itest"
	"github.com/shrooms-cage/shrooms/internal/tbworld"
	"github.com/shrooms-cage/shrooms/pkg/sealed"
	"golang.org/x/sys/unix"
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

// TestCageShmIsItsOwn checks what makes the removals above succeed on the
// first try: a prepared cage (created and initialised) has no mount at its
// host-side userdata/shm in the podman service's mount namespace, as
// podman made and bound in before, and the turn's /dev/shm is a tmpfs in
// the cage (64 MiB, mode 1777, the agent's user can write it). Positive
// control: the same mount table shows the cage's own root filesystem
// (podman's overlay at its MergedDir), so it is the service's table and
// holds the cage's host-side mounts.
func TestCageShmIsItsOwn(t *testing.T) {
	be := newBench(t)
	task := be.Task("shm")
	script := `grep " /dev/shm " /proc/self/mountinfo; stat -c 'mode=%a' /dev/shm; df -k /dev/shm | tail -1; echo x > /dev/shm/w && echo wrote`
	tm, res, err := runTurn(be, task, "shell", script)
	if err != nil {
		t.Fatal(err)
	}
	// The cage's output; the last line is run's --json result.
	out := strings.TrimSpace(tm.stdout.String())
	out = out[:max(strings.LastIndex(out, "\n"), 0)]
	t.Logf("cage %.12s: %s", res.Cage, out)
	for _, want := range []string{" /dev/shm rw,nosuid,nodev,noexec,", " - tmpfs ", "mode=1777", " 65536 ", "wrote"} {
		if !strings.Contains(out, want) {
			t.Errorf("the cage's /dev/shm: %q not in %q", want, out)
		}
	}
	be.WaitIdle(task)
	ctx := context.Background()
	prepared, err := be.Client.ListByLabel(ctx, sealed.LabelTask, task)
	if err != nil || len(prepared) != 1 {
		t.Fatalf("the task's prepared cage: %v, %v", prepared, err)
	}
	id := prepared[0].ID
	merged, err := be.TB.Podman("inspect", "-f", "{{.GraphDriver.Data.MergedDir}}", id)
	if err != nil {
		t.Fatalf("inspect %s: %v: %s", id, err, merged)
	}
	merged = strings.TrimSpace(merged)
	pid := servicePid(t, be.TB.PodmanURL)
	table, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", pid))
	if err != nil {
		t.Fatal(err)
	}
	var rootfs, shm []string
	for _, line := range strings.Split(string(table), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		switch {
		case f[4] == merged:
			rootfs = append(rootfs, line)
		case strings.Contains(f[4], id+"/userdata/shm"):
			shm = append(shm, line)
		}
	}
	t.Logf("service pid %d, prepared cage %.12s (%s): rootfs %q, shm %q", pid, id, prepared[0].State, rootfs, shm)
	if len(rootfs) == 0 {
		t.Fatalf("the service's mount table (pid %d) does not show the prepared cage's root filesystem at %s", pid, merged)
	}
	if len(shm) > 0 {
		t.Fatalf("the prepared cage has a host-side shm mount: %q", shm)
	}
}

// servicePid is the pid of the podman service listening at uri (the
// socket's peer).
func servicePid(t *testing.T, uri string) int {
	t.Helper()
	conn, err := net.Dial("unix", strings.TrimPrefix(uri, "unix://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	raw, err := conn.(*net.UnixConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var cred *unix.Ucred
	var credErr error
	if err := raw.Control(func(fd uintptr) { cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) }); err != nil || credErr != nil {
		t.Fatalf("the service's pid: %v %v", err, credErr)
	}
	return int(cred.Pid)
}
