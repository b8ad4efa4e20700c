//go:build runsc

package turn

import "testing"

func TestZZPids(t *testing.T) {
	script := `n=0; for i in $(seq 300); do sleep 15 2>/dev/null & [ $? = 0 ] && n=$((n+1)); done; sleep 1; echo "procs $(ls -d /proc/[0-9]* | wc -l)"; cat /sys/fs/cgroup/pids/pids.max /sys/fs/cgroup/pids.max 2>/dev/null; kill $(jobs -p) 2>/dev/null; true`
	for name, h := range map[string]*harness{"runc": newHarness(t, ""), "runsc": runscHarness(t)} {
		_, out, errOut, err := h.sh(h.task("pids"), "", script)
		t.Logf("%s: %v\n%s\n%.400s", name, err, out, errOut)
	}
}
