package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"

	"github.com/shrooms-cage/shrooms/internal/itest"
	"github.com/shrooms-cage/shrooms/internal/testbed"
	"github.com/shrooms-cage/shrooms/internal/testcfg"
	"github.com/shrooms-cage/shrooms/pkg/probe"
)

// TestProbeWithoutTargetsInTestbed runs `shrooms probe` in the testbed's
// host namespace with no targets file: every row decides on what discovery
// finds (the internet control through example.com as the cage's resolver
// answers it, the host's and public resolvers, the host's addresses, LAN
// and metadata, a peer cage of its own): nothing escapes, nothing errs.
// The run's wall time is compared with one given a targets file.
func TestProbeWithoutTargetsInTestbed(t *testing.T) {
	itest.Require(t, itest.Root, itest.Podman, itest.Nftables, itest.Netns)
	tb := testbed.New(t)
	tb.StartPodman()
	sub4, sub6 := itest.Subnets(t)
	e := testbedEnv(t, tb, "sq", testcfg.Config{Cage: map[string]any{"timeout": "90s", "stop_grace": "1s"},
		Network: map[string]any{"policy": "internet", "subnet4": sub4, "subnet6": sub6,
			"dns_upstream": []string{"203.0.113.10"}}})
	dir, configFile := e.Dir, e.Config
	bin := itest.ShroomsBinary(t)
	shrooms := inTestbedHost(tb, bin, configFile)
	code, _, stderr := shrooms("net", "apply")
	assert.Equal(t, code, 0, stderr)

	report := func(args ...string) (*probe.Report, time.Duration) {
		t.Helper()
		start := time.Now()
		_, stdout, stderr := shrooms(append([]string{"--json", "probe"}, args...)...)
		took := time.Since(start)
		var rep probe.Report
		assert.NilError(t, json.Unmarshal([]byte(stdout), &rep), "stdout %q stderr %q", stdout, stderr)
		for _, c := range rep.Checks {
			if c.Verdict == probe.Error || c.Verdict == probe.Escaped {
				t.Logf("%s %s: %s %s", c.ID, c.Verdict, c.Observed, c.Reason)
			}
		}
		return &rep, took
	}

	// Resolvers: the testbed's own, never the machine's or public ones
	// (their packets could not leave the testbed, but none is sent).
	rep, discovered := report("--task", "pd", "--resolvers", testbed.InternetAddr4.String())
	assert.DeepEqual(t, rep.IDs(probe.Escaped), []string(nil))
	errs := rep.IDs(probe.Error)
	assert.DeepEqual(t, errs, []string(nil))
	t.Logf("without a targets file: %d errors %v (%v)", len(errs), errs, discovered.Round(time.Millisecond))

	// The same battery with the testbed's targets file, for the wall time.
	gw4 := strings.TrimSuffix(sub4, "0/24") + "1"
	targets, err := json.Marshal(probe.Params{
		Internet: []string{testbed.InternetAddr4.String(), testbed.InternetAddr6.String()},
		Gateway:  []string{gw4}, Host: []string{testbed.HostAddr4.String(), testbed.HostAddr6.String()},
		LAN:       []string{testbed.RouterAddr4.String(), testbed.RouterAddr6.String(), testbed.PublicLAN4.String()},
		Metadata:  []string{testbed.Metadata4.String(), testbed.Metadata6.String(), testbed.WireServer.String()},
		Resolvers: []string{testbed.InternetAddr4.String()}, DNSZone: "canary.test", Multicast: true,
	})
	assert.NilError(t, err)
	file := filepath.Join(dir, "targets.json")
	assert.NilError(t, os.WriteFile(file, targets, 0o600))
	rep, given := report("--task", "pt", "--targets", file)
	assert.DeepEqual(t, rep.IDs(probe.Escaped), []string(nil))
	t.Logf("wall time: %v without a targets file, %v with one (ratio %.2f)", discovered.Round(time.Millisecond), given.Round(time.Millisecond), discovered.Seconds()/given.Seconds())
}
