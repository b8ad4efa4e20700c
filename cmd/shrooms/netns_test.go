package main

import (
	"context"
	"fmt"
	"net/netip"
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
	"github.com/shrooms-cage/shrooms/pkg/config"
	"github.com/shrooms-cage/shrooms/pkg/podman"
	"github.com/shrooms-cage/shrooms/pkg/podmanpeer"
	"github.com/shrooms-cage/shrooms/pkg/sealed"
)

// TestCageNetworkTornDownOnPrivateNetns (network.driver "podman"): the
// testbed's podman service runs in a private mount namespace (no
// systemd), where /run/netns is not shared. A bare user-namespaced container on the cage network leaves its
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
		Network: map[string]any{"policy": "internet", "driver": "podman", "subnet4": sub4, "subnet6": sub6,
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
	netnsMounts := func() int { return serviceNetnsMounts(t, pid) }
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
	// The last turn's cage is removed by its teardown, after the turn.
	for i := 0; i < 100 && live() != 1; i++ {
		time.Sleep(100 * time.Millisecond)
	}
	assert.Equal(t, live(), 1, "the prepared cage")
	settled("after 3 turns", base, live)
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

// TestShroomsDriverLeavesNoNetwork: under network.driver "shrooms" (the
// default) a turn's cage has no podman network: nothing under /run/netns,
// no netavark chains in iptables, no podman network; each cage's veth goes
// with its cage, so after fresh and prepared turns the bridge holds only
// the prepared cage's; and the turns reach the testbed's internet through
// shrooms' own NAT. Control: one container on a podman network in the same
// host namespace shows both probes see netavark's work.
func TestShroomsDriverLeavesNoNetwork(t *testing.T) {
	requireStatic(t)
	itest.Require(t, itest.Root, itest.Podman, itest.Nftables, itest.Netns)
	tb := testbed.New(t)
	tb.StartPodman()
	sub4, sub6 := itest.Subnets(t)
	e := testbedEnv(t, tb, "nd", testcfg.Config{Cage: map[string]any{"stop_grace": "1s"},
		Network: map[string]any{"policy": "internet", "subnet4": sub4, "subnet6": sub6,
			"dns_upstream": []string{"203.0.113.10"}}})
	name := e.Prefix
	task := name + "-t"
	shrooms := inTestbedHost(tb, os.Args[0], e.Config, "SHROOMS_TEST_MAIN=1")
	client, err := podman.Connect(context.Background(), tb.PodmanURL)
	assert.NilError(t, err)
	pid, err := podmanpeer.Pid(tb.PodmanURL)
	assert.NilError(t, err)
	netnsMounts := func() int { return serviceNetnsMounts(t, pid) }
	ports := func(bridge string) int {
		out, err := tb.Exec("host", "sh", "-c", "ip -o link show master "+bridge+" 2>/dev/null")
		assert.NilError(t, err, "%s", out)
		return strings.Count(string(out), "\n")
	}
	netavark := func() int {
		out, err := tb.Exec("host", "iptables-save")
		assert.NilError(t, err, "%s", out)
		return strings.Count(string(out), "NETAVARK")
	}
	live := func() int {
		cages, err := client.ListByLabel(context.Background(), sealed.LabelTask, task)
		assert.NilError(t, err)
		return len(cages)
	}

	code, stdout, stderr := shrooms("net", "apply")
	assert.Equal(t, code, 0, stderr)
	code, stdout, stderr = shrooms("doctor")
	assert.Assert(t, is.Contains(stdout+stderr, "driver shrooms: bridge "+name+" carries"), "doctor (exit %d): %s%s", code, stdout, stderr)
	mounts0 := netnsMounts()
	for i := 0; i < 4; i++ {
		nonce := fmt.Sprintf("nd%d%s", i, name)
		code, stdout, stderr = shrooms("--json", "run", "--task", task, "--agent", "shell", "--no-stdin", "--prepare-next", "--",
			"-c", fmt.Sprintf("echo %s | nc -w 3 %s 80; true", nonce, testbed.InternetAddr4))
		assert.Equal(t, code, 0, stderr)
		assert.Equal(t, lastJSON(t, stdout).Prepared, i > 0, stdout)
		time.Sleep(300 * time.Millisecond) // canaries log asynchronously
		hits := tb.Hits(nonce)
		assert.Assert(t, len(hits) > 0, "turn %d: the internet canary was not reached", i)
		// Masqueraded: the internet sees the testbed host's address, never a cage's.
		for _, h := range hits {
			assert.Assert(t, h.Proto == "tcp" && h.Remote.IsValid() && !netip.MustParsePrefix(sub4).Contains(h.Remote.Addr()), "turn %d: not masqueraded: %+v", i, h)
		}
	}
	var p int
	for i := 0; i < 100; i++ { // the last cage goes after the turn (its teardown), its veth with its netns
		if p = ports(name); p == 1 && live() == 1 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	assert.Equal(t, live(), 1, "the prepared cage")
	assert.Equal(t, p, 1, "the bridge's ports: the prepared cage's only")
	assert.Equal(t, netnsMounts(), mounts0, "a cage's network namespace was bound under /run/netns")
	assert.Equal(t, netavark(), 0, "netavark chains in the host's iptables")
	out, err := tb.Podman("network", "exists", name)
	assert.Assert(t, err != nil, "a podman network exists: %s", out)

	// A prepared cage whose link was changed under it (its veth pulled off
	// the bridge) is refused, not mended; the next turn works.
	out2, err := tb.Exec("host", "sh", "-c", "ip -o link show master "+name+" 2>/dev/null | cut -d: -f2 | cut -d@ -f1")
	assert.NilError(t, err, "%s", out2)
	veth := strings.TrimSpace(string(out2))
	assert.Assert(t, strings.HasPrefix(veth, "sc"), "the prepared cage's veth: %q", veth)
	out2, err = tb.Exec("host", "ip", "link", "set", "dev", veth, "nomaster")
	assert.NilError(t, err, "%s", out2)
	code, _, stderr = shrooms("--json", "run", "--task", task, "--agent", "shell", "--no-stdin", "--prepare-next", "--", "-c", "true")
	assert.Equal(t, code, ExitHostNotReady, stderr)
	assert.Assert(t, is.Contains(stderr, "is not a port of bridge "+name), stderr)
	nonce := "nd-after-" + name
	code, stdout, stderr = shrooms("--json", "run", "--task", task, "--agent", "shell", "--no-stdin", "--", "-c", fmt.Sprintf("echo %s | nc -w 3 %s 80; true", nonce, testbed.InternetAddr4))
	assert.Equal(t, code, 0, stderr)
	time.Sleep(300 * time.Millisecond)
	assert.Assert(t, len(tb.Hits(nonce)) > 0, "the turn after the refused one did not reach the internet")

	// Control: the same probes see a podman network's container.
	ctl := name + "c"
	c4, c6 := itest.Subnets(t)
	cfg, err := config.Load(e.Config)
	assert.NilError(t, err)
	cfg.Network.Driver, cfg.Network.Name, cfg.Network.Bridge, cfg.Network.Subnet4, cfg.Network.Subnet6 = config.DriverPodman, ctl, ctl, c4, c6
	_, err = cagenet.EnsureNetwork(context.Background(), cfg, client)
	assert.NilError(t, err)
	t.Cleanup(func() { _, _ = tb.Podman("network", "rm", "-f", ctl) })
	tb.MustPodman("run", "-d", "--rm", "--label", tb.Label(), "--name", ctl, "--network", ctl, itest.TestImage, "sleep", "30")
	t.Cleanup(func() { _, _ = tb.Podman("rm", "-f", "-t", "0", ctl) })
	assert.Equal(t, ports(ctl), 1, "control: the podman network's container has no veth on its bridge")
	assert.Assert(t, netavark() > 0, "control: no netavark chain seen with a container on a podman network")
}

// serviceNetnsMounts counts the netns bind mounts under /run/netns in the
// mount namespace of the podman service (pid): one per cage whose network
// podman made and has not torn down.
func serviceNetnsMounts(t *testing.T, pid int) int {
	t.Helper()
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
