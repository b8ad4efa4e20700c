//go:build runsc

package probe_test

import (
	"context"
	"fmt"
	"gotest.tools/v3/assert"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/shrooms-cage/shrooms/internal/tbworld"
	"github.com/shrooms-cage/shrooms/internal/testbed"
	"github.com/shrooms-cage/shrooms/pkg/config"
	"github.com/shrooms-cage/shrooms/pkg/firewall"
	"github.com/shrooms-cage/shrooms/pkg/turn"

	// The battery's names unqualified: these tests drive it from the host
	// (probedrive), which imports it.
	. "github.com/shrooms-cage/shrooms/pkg/probe"
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
// runsc — with gVisor's own netstack (network=sandbox) and with the
// profile shrooms requires (network=host: the Sentry's sockets are the
// cage netns's) — and fails on any
// verdict that is not the one docs/gvisor.md's table records: a row that
// regresses is never silent. The network rows are judged by the canaries
// (D2: the positive control reached them). The runc column is
// TestBatteryInTestbed's (A4, B10, D9d, D9e residual, nothing else).
func TestBatteryInTestbedRunsc(t *testing.T) {
	runsc := runscPath(t)
	cases := []struct {
		mode                    string
		escaped, errs, residual []string
	}{
		// A3: the gVisor profile allows clone3 (the Sentry's; runsc makes
		// its ENOSYS an EPERM, which breaks glibc). A5, A7, B6, B11 and C3
		// are judged gVisor-aware (the host's runsc ids, the Sentry's
		// cgroupfs unwritable, fuse/tun without mount or TUNSETIFF, the
		// Sentry's socket errnos under the enforced profile) and sealed;
		// D9a: the resolver on the netns loopback is out of the netstack's
		// reach (so D9e has nothing to recurse). docs/gvisor.md.
		{"sandbox", sorted("A3"), sorted("D9a"), sorted("A4", "D9d")},
		{"host", sorted("A3"), nil, sorted("A4", "D9d", "D9e")},
	}
	table := map[string]map[string]Verdict{}
	var ids []string
	for _, tc := range cases {
		t.Run(tc.mode, func(t *testing.T) {
			e := newTBEnv(t, testbed.PodmanFlags(runscService(runsc, "network="+tc.mode)...))
			e.Cfg.Cage.Runtime = runsc
			rep, in, _ := runBattery(t, e, verifiedSeal(e), battery{})
			assert.DeepEqual(t, in.connected, []string(nil))
			assert.Check(t, cmpSlices(rep.IDs(Escaped), tc.escaped), "escaped: %v", rep.IDs(Escaped))
			assert.Check(t, cmpSlices(rep.IDs(Error), tc.errs), "error: %v", rep.IDs(Error))
			assert.Check(t, cmpSlices(rep.IDs(Residual), tc.residual), "residual: %v", rep.IDs(Residual))
			// A5's seal is the host's measurement, never the inside's guess.
			for _, c := range rep.Checks {
				if slices.Contains([]string{"A5", "A7", "B6", "B11", "C3"}, c.ID) {
					t.Logf("%s %s (gVisor-aware): %v", c.ID, c.Verdict, c.Evidence)
				}
				if c.ID == "A5" {
					ev := strings.Join(c.Evidence, "\n")
					assert.Check(t, strings.Contains(ev, "host: runsc-sandbox pid") && strings.Contains(ev, "host: runsc-gofer pid"), "A5 evidence: %s", ev)
				}
			}
			for _, a := range attempts(rep, "D2") {
				assert.Check(t, a.Canary != nil && *a.Canary, "D2 %s: allowed attempt not seen by its canary", a.Target)
			}
			table[tc.mode] = rep.Verdicts()
			if ids == nil {
				for _, c := range rep.Checks {
					ids = append(ids, c.ID)
				}
			}
		})
	}
	var b strings.Builder
	b.WriteString("| row | runsc network=sandbox | runsc network=host |\n|---|---|---|\n")
	for _, id := range ids {
		fmt.Fprintf(&b, "| %s | %s | %s |\n", id, table["sandbox"][id], table["host"][id])
	}
	t.Logf("verdicts side by side:\n%s", b.String())
}

func cmpSlices(a, b []string) bool { return slices.Equal(a, b) }

// verifiedSeal returns the real seal check of the testbed (TestBatteryInTestbed's).
func verifiedSeal(e *tbworld.World) turn.SealChecker {
	return func(ctx context.Context, cfg *config.Config, _ bool) (turn.SealState, error) {
		st, err := firewall.Verify(ctx, cfg.Network, e.FW)
		if err != nil {
			return turn.SealState{}, err
		}
		if !st.OK {
			return turn.SealState{}, fmt.Errorf("%s", st.Reason)
		}
		return sealState(e, cfg, st)
	}
}
