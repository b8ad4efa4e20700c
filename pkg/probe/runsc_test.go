//go:build runsc

package probe

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strings"
	"testing"

	"github.com/shrooms-cage/shrooms/internal/testbed"
	"github.com/shrooms-cage/shrooms/pkg/cagenet"
	"github.com/shrooms-cage/shrooms/pkg/config"
	"github.com/shrooms-cage/shrooms/pkg/firewall"
	"github.com/shrooms-cage/shrooms/pkg/turn"
)

// runscPath is the static upstream runsc make setup builds, named by
// SHROOMS_TEST_RUNSC (the runsc tag is on only where it is set).
func runscPath(t *testing.T) string {
	p := os.Getenv("SHROOMS_TEST_RUNSC")
	if p == "" {
		t.Fatal("SHROOMS_TEST_RUNSC is unset: name a static upstream runsc (make setup builds one; docs/gvisor.md)")
	}
	return p
}

// runscService are the podman flags of a service running runsc with
// shrooms' profile (docs/gvisor.md) plus extra runsc flags.
func runscService(runsc string, extra ...string) []string {
	args := []string{"--runtime", runsc, "--runtime-flag", "platform=systrap", "--runtime-flag", "oci-seccomp"}
	for _, f := range extra {
		args = append(args, "--runtime-flag", f)
	}
	return args
}

// TestBatteryInTestbedRunsc runs the whole battery in the testbed under
// runsc, next to the same battery under runc, and logs both verdicts row
// by row (docs/gvisor.md's table).
func TestBatteryInTestbedRunsc(t *testing.T) {
	runsc := runscPath(t)
	for _, mode := range []string{"sandbox", "host"} {
		t.Run(mode, func(t *testing.T) {
			e := newTBEnv(t, testbed.PodmanFlags(runscService(runsc, "network="+mode)...))
			e.cfg.Cage.Runtime = runsc
			rep, in := e.run(t, e.verifiedSeal)
			t.Logf("inbound: tried %v connected %v", in.tried, in.connected)
			rows := []string{}
			for _, c := range rep.Checks {
				rows = append(rows, fmt.Sprintf("%s\t%s\t%s\t%s\t%v", c.ID, c.Verdict, c.Observed, c.Reason, c.Evidence))
			}
			sort.Strings(rows)
			t.Logf("verdicts under runsc network=%s:\n%s", mode, strings.Join(rows, "\n"))
		})
	}
}

// verifiedSeal is the real seal check of the testbed (TestBatteryInTestbed's).
func (e *tbEnv) verifiedSeal(ctx context.Context, cfg *config.Config, _ bool) (turn.SealState, error) {
	st, err := firewall.Verify(ctx, cfg.Network, e.fw)
	if err != nil {
		return turn.SealState{}, err
	}
	if !st.OK {
		return turn.SealState{}, fmt.Errorf("%s", st.Reason)
	}
	if _, err := cagenet.EnsureNetwork(ctx, cfg, e.client); err != nil {
		return turn.SealState{}, err
	}
	return e.sealState(cfg, st)
}
