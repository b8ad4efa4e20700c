package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/shrooms-cage/shrooms/internal/itest"
	"github.com/shrooms-cage/shrooms/internal/testbed"
	"github.com/shrooms-cage/shrooms/internal/testcfg"
	"github.com/shrooms-cage/shrooms/pkg/cagelink"
	"github.com/shrooms-cage/shrooms/pkg/config"
	"github.com/shrooms-cage/shrooms/pkg/podman"
)

// TestNetworkedTurnInTestbed runs shrooms itself inside the testbed's host
// namespace: run refuses a networked cage until `net apply`; after it, a
// turn reaches the internet canary (positive control) and not the LAN
// router; after `net flush`, run refuses again.
func TestNetworkedTurnInTestbed(t *testing.T) {
	itest.Require(t, itest.Root, itest.Podman, itest.Nftables, itest.Netns)
	tb := testbed.New(t)
	tb.StartPodman()
	sub4, sub6 := itest.Subnets(t)
	e := testbedEnv(t, tb, "sn", testcfg.Config{Cage: map[string]any{"stop_grace": "1s"},
		Network: map[string]any{"policy": "internet", "subnet4": sub4, "subnet6": sub6,
			"dns_upstream": []string{"203.0.113.10"}}})
	name, configFile := e.Prefix, e.Config
	task := name + "-t"
	shrooms := inTestbedHost(tb, os.Args[0], configFile, "SHROOMS_TEST_MAIN=1")
	probe := func(nonceNet, nonceLAN string) string {
		return fmt.Sprintf("echo %s | nc -w 3 %s 80; echo %s | nc -w 3 %s 80; true", nonceNet, testbed.InternetAddr4, nonceLAN, testbed.RouterAddr4)
	}

	code, _, stderr := shrooms("run", "--task", task, "--agent", "shell", "--no-stdin", "--", "-c", "true")
	assert.Equal(t, code, ExitHostNotReady, stderr)
	assert.Assert(t, is.Contains(stderr, "refusing to start a networked cage"))
	assert.Assert(t, is.Contains(stderr, "is missing: run `shrooms net apply`"))

	// As at boot: the seal first, before podman is asked for anything; the
	// first networked turn then creates the network.
	code, stdout, stderr := shrooms("net", "apply", "--seal-only")
	assert.Equal(t, code, 0, stderr)
	assert.Assert(t, is.Contains(stdout, "sealed: policy internet"))
	out, err := tb.Exec("host", "ip", "link", "show", "dev", name)
	assert.Assert(t, err != nil, "--seal-only created the bridge: %s", out)
	code, stdout, stderr = shrooms("--json", "net", "status")
	assert.Equal(t, code, 0, stderr)
	assert.Assert(t, is.Contains(stdout, `"ok":true`))
	var status struct{ Installed string }
	assert.NilError(t, json.Unmarshal([]byte(stdout), &status))
	assert.Assert(t, len(status.Installed) == 64, stdout)

	net1, lan1 := "n1"+name, "l1"+name
	code, stdout, stderr = shrooms("run", "--json", "--task", task, "--agent", "shell", "--no-stdin", "--", "-c", probe(net1, lan1))
	assert.Equal(t, code, 0, stderr)
	// The result names the seal the turn verified: the one net status saw.
	assert.Equal(t, lastObject(t, stdout)["seal_digest"], status.Installed)
	// And its in-cage wall, verified in the cage's namespace before it
	// started, built from the rule set net status reports.
	wall, _ := lastObject(t, stdout)["cage_wall"].(map[string]any)
	assert.Assert(t, wall != nil && wall["ok"] == true, "turn result: %s", stdout)
	code, stdout2, stderr := shrooms("--json", "net", "status")
	assert.Equal(t, code, 0, stderr)
	var st2 map[string]any
	assert.NilError(t, json.Unmarshal([]byte(stdout2), &st2))
	assert.Equal(t, st2["rules"], wall["rules"], "net status and the turn's wall name different rule sets: %s", stdout2)
	// net check answers without a cage, for both walls.
	code, stdout2, stderr = shrooms("net", "check", "--proto", "udp", testbed.RouterAddr4.String()+":5000")
	assert.Equal(t, code, ExitBlocked, stderr)
	assert.Assert(t, is.Contains(stdout2, "in-cage wall BLOCKED"), stdout2)
	code, stdout2, stderr = shrooms("net", "check", testbed.InternetAddr4.String()+":80")
	assert.Equal(t, code, 0, stderr)
	assert.Assert(t, is.Contains(stdout2, "ALLOWED"), stdout2)
	time.Sleep(300 * time.Millisecond) // canaries log asynchronously
	assert.Assert(t, len(tb.Hits(net1)) > 0, "positive control: the internet canary was not reached")
	assert.Equal(t, len(tb.Hits(lan1)), 0, "the LAN router was reached through the seal: %+v", tb.Hits(lan1))

	// Applying again (now with the network) is idempotent and keeps it:
	// the shrooms driver's bridge with its gateway, its NAT table, and no
	// podman network (netavark has no part in it).
	code, _, stderr = shrooms("net", "apply")
	assert.Equal(t, code, 0, stderr)
	out, err = tb.Exec("host", "ip", "-br", "addr", "show", "dev", name)
	assert.NilError(t, err, out)
	sub := netip.MustParsePrefix(sub4)
	assert.Assert(t, is.Contains(string(out), sub.Addr().Next().String()+"/"+strconv.Itoa(sub.Bits())), "the bridge's gateway: %s", out)
	out, err = tb.Exec("host", "nft", "list", "table", "inet", cagelink.NATTable(name))
	assert.NilError(t, err, out)
	assert.Assert(t, is.Contains(string(out), "masquerade"), "%s", out)
	podOut, err := tb.Podman("network", "exists", name)
	assert.Assert(t, err != nil, "the shrooms driver made a podman network: %s", podOut)

	code, _, stderr = shrooms("net", "flush")
	assert.Equal(t, code, 0, stderr)
	code, _, stderr = shrooms("net", "status")
	assert.Equal(t, code, ExitHostNotReady, stderr)
	assert.Assert(t, is.Contains(stderr, "missing"))
	net2, lan2 := "n2"+name, "l2"+name
	code, _, stderr = shrooms("run", "--task", task, "--agent", "shell", "--no-stdin", "--", "-c", probe(net2, lan2))
	assert.Equal(t, code, ExitHostNotReady, stderr)
	assert.Assert(t, is.Contains(stderr, "refusing to start a networked cage"))
	assert.Assert(t, !strings.Contains(stderr, "\n"+"shrooms:"), "one line: %q", stderr)
	time.Sleep(300 * time.Millisecond)
	assert.Equal(t, len(tb.Hits(net2))+len(tb.Hits(lan2)), 0, "a refused turn sent packets")
}

// inTestbedHost runs shrooms (bin, with configFile and the extra
// environment) as a process in the testbed's host network namespace, and
// returns its exit code, stdout and stderr.
func inTestbedHost(tb *testbed.Testbed, bin, configFile string, env ...string) func(args ...string) (int, string, string) {
	return func(args ...string) (int, string, string) {
		cmd := exec.Command("nsenter", append([]string{"--net=" + tb.NSPath("host"), "--", bin, "--config", configFile}, args...)...)
		cmd.Env = append(os.Environ(), env...)
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		_ = cmd.Run()
		return cmd.ProcessState.ExitCode(), out.String(), errb.String()
	}
}

// testbedEnv is a world on the testbed's podman service whose cage network
// (c.Network, if any) is named after its prefix; its cleanup removes the
// tasks' cages (a prepared next cage too), HOMEs and outboxes, then the
// network and its seal tables.
func testbedEnv(t *testing.T, tb *testbed.Testbed, prefix string, c testcfg.Config) *itest.Env {
	t.Helper()
	e := itest.New(t, prefix, itest.WithSocket(tb.PodmanURL), itest.WithPrepared())
	if c.Network != nil {
		c.Network["name"], c.Network["bridge"] = e.Prefix, e.Prefix
	}
	e.WriteConfig(c.For(e).TOML())
	cfg, err := config.Load(e.Config)
	assert.NilError(t, err)
	client, err := podman.Connect(context.Background(), tb.PodmanURL)
	assert.NilError(t, err)
	e.Release = testcfg.Release(cfg, client)
	e.Finally(func() { removeTestbedNetwork(tb, e.Prefix) })
	return e
}

// removeTestbedNetwork removes the cage network name and its seal tables
// from the testbed (cleanup: errors mean they are gone already).
func removeTestbedNetwork(tb *testbed.Testbed, name string) {
	_, _ = tb.Podman("network", "rm", "-f", name)
	_, _ = tb.Exec("host", "ip", "link", "delete", "dev", name, "type", "bridge")
	_, _ = tb.Exec("host", "nft", "delete", "table", "inet", cagelink.NATTable(name))
	for _, fam := range []string{"inet", "bridge"} {
		_ = exec.Command("nsenter", "--net="+tb.NSPath("host"), "--", "nft", "delete", "table", fam, "shrooms_"+name).Run()
	}
}
