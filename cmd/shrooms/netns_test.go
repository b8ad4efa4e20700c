package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/shrooms-cage/shrooms/internal/itest"
	"github.com/shrooms-cage/shrooms/internal/testbed"
	"github.com/shrooms-cage/shrooms/internal/testcfg"
	"github.com/shrooms-cage/shrooms/pkg/cagenet"
	"github.com/shrooms-cage/shrooms/pkg/podman"
	"github.com/shrooms-cage/shrooms/pkg/podmanpeer"
	"github.com/shrooms-cage/shrooms/pkg/sealed"
)

// TestCageNetworkTornDownOnPrivateNetns: the testbed's podman service runs
// in a private mount namespace (no systemd), where /run/netns is not
// shared. A bare user-namespaced container on the cage network leaves its
// netns mount and veth behind there (positive control: podman 4.3's
// setupNetNS); shrooms' networked turns (fresh and prepared) make
// /run/netns shared first and leave nothing beyond the live cages.
func TestCageNetworkTornDownOnPrivateNetns(t *testing.T) {
	requireStatic(t)
	itest.Require(t, itest.Root, itest.Podman, itest.Nftables, itest.Netns)
	tb := testbed.New(t)
	tb.StartPodman()
	sub4, sub6 := itest.Subnets(t)
	e := testbedEnv(t, tb, "nn", testcfg.Config{Cage: map[string]any{"stop_grace": "1s"},
		Network: map[string]any{"policy": "internet", "subnet4": sub4, "subnet6": sub6,
			"dns_upstream": []string{"203.0.113.10"}}})
	name := e.Prefix
	task := name + "-t"
	shrooms := inTestbedHost(tb, os.Args[0], e.Config, "SHROOMS_TEST_MAIN=1")
	client, err := podman.Connect(context.Background(), tb.PodmanURL)
	assert.NilError(t, err)
	pid, err := podmanpeer.Pid(tb.PodmanURL)
	assert.NilError(t, err)
	// What a cage's network leaves: its netns bind mount in the service's
	// namespace and its veth on the cage bridge.
	netnsMounts := func() int {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", pid))
		assert.NilError(t, err)
		n := 0
		for _, l := range strings.Split(string(b), "\n") {
			if f := strings.Fields(l); len(f) > 4 && strings.HasPrefix(f[4], cagenet.NetnsDir+"/netns-") {
				n++
			}
		}
		return n
	}
	veths := func() int {
		// iproute2 complains of each veth's peer netns (not ours) on stderr.
		out, err := tb.Exec("host", "sh", "-c", "ip -o link show master "+name+" 2>&1 >/dev/null | grep -v 'Peer netns' >&2; ip -o link show master "+name+" 2>/dev/null")
		if err != nil && strings.Contains(string(out), "Device does not exist") {
			return 0 // netavark makes the bridge with its first container
		}
		assert.NilError(t, err, "%s", out)
		return strings.Count(string(out), "\n")
	}
	live := func() int {
		cages, err := client.ListByLabel(context.Background(), sealed.LabelTask, task)
		assert.NilError(t, err)
		return len(cages)
	}
	// settled waits for the counts to reach base + want (the exit command
	// tears down after the turn returns).
	settled := func(what string, base [2]int, want func() int) {
		t.Helper()
		var m, v, w int
		for i := 0; i < 100; i++ {
			m, v, w = netnsMounts()-base[0], veths()-base[1], want()
			if m == w && v == w {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
		t.Fatalf("%s: %d netns mounts and %d veths beyond the start, %d expected", what, m, v, w)
	}

	st, err := cagenet.NetnsShared(tb.PodmanURL)
	assert.NilError(t, err)
	assert.Assert(t, !st.Shared, "the testbed's service namespace must start with a private /run/netns")
	code, stdout, stderr := shrooms("doctor")
	assert.Assert(t, is.Contains(stdout+stderr, "/run/netns in the podman service's mount namespace is not shared"), "doctor (exit %d): %s%s", code, stdout, stderr)
	code, _, stderr = shrooms("net", "apply")
	assert.Equal(t, code, 0, stderr)

	// Positive control: a bare user-namespaced container on the cage
	// network leaks its network here.
	base := [2]int{netnsMounts(), veths()}
	for i := 0; i < 2; i++ {
		tb.MustPodman("run", "--rm", "--label", tb.Label(), "--network", name, "--uidmap", "0:300000:65536", "--gidmap", "0:300000:65536", itest.TestImage, "true")
	}
	time.Sleep(time.Second) // time for a teardown that would come
	assert.Equal(t, netnsMounts()-base[0], 2, "positive control: the bare containers' netns mounts were torn down")
	assert.Equal(t, veths()-base[1], 2, "positive control: the bare containers' veths were torn down")

	// shrooms' turns: a fresh cage, then prepared ones.
	base = [2]int{netnsMounts(), veths()}
	for i := 0; i < 3; i++ {
		code, stdout, stderr = shrooms("--json", "run", "--task", task, "--agent", "shell", "--no-stdin", "--prepare-next", "--", "-c", "true")
		assert.Equal(t, code, 0, stderr)
		assert.Equal(t, lastJSON(t, stdout).Prepared, i > 0, stdout)
	}
	settled("after 3 turns", base, live)
	assert.Equal(t, live(), 1, "the prepared cage")
	st, err = cagenet.NetnsShared(tb.PodmanURL)
	assert.NilError(t, err)
	assert.Assert(t, st.Shared, "no turn made /run/netns shared")
	code, stdout, stderr = shrooms("doctor")
	assert.Assert(t, is.Contains(stdout+stderr, "/run/netns in the podman service's mount namespace is shared"), "doctor (exit %d): %s%s", code, stdout, stderr)

	// And a bare container now tears down too: it was the sharing.
	base = [2]int{netnsMounts(), veths()}
	tb.MustPodman("run", "--rm", "--label", tb.Label(), "--network", name, "--uidmap", "0:300000:65536", "--gidmap", "0:300000:65536", itest.TestImage, "true")
	settled("after a bare container on the shared /run/netns", base, func() int { return 0 })
}
