package nixcheck

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/shrooms-cage/shrooms/pkg/config"
)

// unitOrder is the ordering part of a unit: what it is After= and Before=,
// and whether it has systemd's default dependencies.
type unitOrder struct {
	After, Before []string
	NoDefaultDeps bool
	Kind          string // service, socket, target
}

// knownUnits are the units the seal unit names or that its default
// dependencies would bring in, ordered as systemd and NixOS order them:
// systemd.special(7) and the units systemd ships (sysinit.target,
// basic.target, sockets.target, systemd-modules-load, systemd-sysctl),
// NixOS's nftables.nix (nftables.service: DefaultDependencies=no,
// After=sysinit.target, Before=network-pre.target) and firewall.nix
// (firewall.service: DefaultDependencies=no, After=systemd-modules-load,
// Before=network-pre.target), and podman's own podman.socket (default
// socket dependencies) and podman.service (Requires/After=podman.socket).
var knownUnits = map[string]unitOrder{
	"sysinit.target":               {NoDefaultDeps: true, Kind: "target", After: []string{"local-fs.target", "systemd-modules-load.service", "systemd-sysctl.service"}},
	"local-fs.target":              {NoDefaultDeps: true, Kind: "target"},
	"basic.target":                 {NoDefaultDeps: true, Kind: "target", After: []string{"sysinit.target", "sockets.target", "paths.target", "slices.target", "timers.target"}},
	"sockets.target":               {NoDefaultDeps: true, Kind: "target"},
	"paths.target":                 {NoDefaultDeps: true, Kind: "target"},
	"slices.target":                {NoDefaultDeps: true, Kind: "target"},
	"timers.target":                {NoDefaultDeps: true, Kind: "target"},
	"network-pre.target":           {NoDefaultDeps: true, Kind: "target"},
	"multi-user.target":            {Kind: "target", After: []string{"basic.target"}},
	"shutdown.target":              {NoDefaultDeps: true, Kind: "target"},
	"systemd-modules-load.service": {NoDefaultDeps: true, Kind: "service", Before: []string{"sysinit.target"}},
	"systemd-sysctl.service":       {NoDefaultDeps: true, Kind: "service", After: []string{"systemd-modules-load.service"}, Before: []string{"sysinit.target"}},
	"nftables.service":             {NoDefaultDeps: true, Kind: "service", After: []string{"sysinit.target"}, Before: []string{"network-pre.target", "shutdown.target"}},
	"firewall.service":             {NoDefaultDeps: true, Kind: "service", After: []string{"systemd-modules-load.service"}, Before: []string{"network-pre.target", "shutdown.target"}},
	"podman.socket":                {Kind: "socket"},
	"podman.service":               {Kind: "service", After: []string{"podman.socket"}},
}

// defaultDeps is what systemd adds for DefaultDependencies=yes
// (systemd.service(5), systemd.socket(5), systemd.target(5)).
func defaultDeps(u unitOrder) (after, before []string) {
	if u.NoDefaultDeps {
		return nil, nil
	}
	switch u.Kind {
	case "service":
		return []string{"sysinit.target", "basic.target"}, []string{"shutdown.target"}
	case "socket":
		return []string{"sysinit.target"}, []string{"sockets.target", "shutdown.target"}
	}
	return nil, []string{"shutdown.target"}
}

// orderingCycle returns a cycle in the After/Before graph of units, or nil.
func orderingCycle(units map[string]unitOrder) []string {
	// edge a -> b: a must start before b.
	edges := map[string][]string{}
	add := func(from, to string) { edges[from] = append(edges[from], to) }
	for name, u := range units {
		after, before := defaultDeps(u)
		for _, a := range append(append([]string{}, u.After...), after...) {
			add(a, name)
		}
		for _, b := range append(append([]string{}, u.Before...), before...) {
			add(name, b)
		}
	}
	names := make([]string, 0, len(edges))
	for n := range edges {
		names = append(names, n)
	}
	sort.Strings(names)
	const (
		white = iota
		grey
		black
	)
	color := map[string]int{}
	var stack []string
	var cycle []string
	var visit func(n string) bool
	visit = func(n string) bool {
		color[n] = grey
		stack = append(stack, n)
		for _, m := range edges[n] {
			switch color[m] {
			case grey:
				for i, s := range stack {
					if s == m {
						cycle = append(append([]string{}, stack[i:]...), m)
					}
				}
				return true
			case white:
				if visit(m) {
					return true
				}
			}
		}
		stack = stack[:len(stack)-1]
		color[n] = black
		return false
	}
	for _, n := range names {
		if color[n] == white && visit(n) {
			return cycle
		}
	}
	return nil
}

type sealOrdering struct {
	UnitConfig struct {
		DefaultDependencies  *bool    `json:"DefaultDependencies"`
		ReloadPropagatedFrom []string `json:"ReloadPropagatedFrom"`
	} `json:"unitConfig"`
	Wants    []string `json:"wants"`
	After    []string `json:"after"`
	Before   []string `json:"before"`
	WantedBy []string `json:"wantedBy"`
	PartOf   []string `json:"partOf"`
	BindsTo  []string `json:"bindsTo"`
	Requires []string `json:"requires"`
}

func evalJSON(t *testing.T, file string, v any) {
	t.Helper()
	out, err := exec.Command("nix-instantiate", "--eval", "--strict", "--json", filepath.Join(repo, file)).Output()
	assert.NilError(t, err, "nix-instantiate --eval %s", file)
	assert.NilError(t, json.Unmarshal(out, v))
}

// TestSealOrdering evaluates nix/seal-ordering.nix (what the module's
// shrooms-seal unit is made of) and checks it against the units it names:
// every one is known, the boot order has no cycle (a normal service ordered
// before podman.socket would be: basic.target is after sockets.target), the
// seal precedes podman and follows nftables, the modules and the sysctls,
// and nothing propagates nftables' stop to it. Control: the old ordering
// (default dependencies, Before=podman.socket) is found to be a cycle.
func TestSealOrdering(t *testing.T) {
	requireNix(t)
	var seal sealOrdering
	evalJSON(t, "nix/seal-ordering.nix", &seal)

	assert.Assert(t, seal.UnitConfig.DefaultDependencies != nil && !*seal.UnitConfig.DefaultDependencies, "the seal needs DefaultDependencies = false")
	for _, l := range [][]string{seal.Wants, seal.After, seal.Before, seal.WantedBy, seal.UnitConfig.ReloadPropagatedFrom} {
		for _, u := range l {
			_, ok := knownUnits[u]
			assert.Check(t, ok, "seal-ordering.nix names %s, whose ordering this test does not know: add it to knownUnits", u)
		}
	}
	for _, want := range []string{"nftables.service", "systemd-modules-load.service", "systemd-sysctl.service", "sysinit.target"} {
		assert.Check(t, is.Contains(seal.After, want))
	}
	for _, want := range []string{"podman.socket", "podman.service"} {
		assert.Check(t, is.Contains(seal.Before, want))
	}
	assert.Check(t, is.Contains(seal.WantedBy, "multi-user.target"))
	assert.Check(t, is.DeepEqual(seal.UnitConfig.ReloadPropagatedFrom, []string{"nftables.service"}))
	// Stopping or restarting nftables must never stop the seal (its ExecStop
	// is `net flush`).
	assert.Check(t, is.Len(seal.PartOf, 0))
	assert.Check(t, is.Len(seal.BindsTo, 0))
	assert.Check(t, is.Len(seal.Requires, 0))

	units := map[string]unitOrder{}
	for k, v := range knownUnits {
		units[k] = v
	}
	units["shrooms-seal.service"] = unitOrder{Kind: "service", NoDefaultDeps: true, After: seal.After, Before: seal.Before}
	assert.Check(t, is.Len(orderingCycle(units), 0), "ordering cycle: %v", orderingCycle(units))

	// Control: the unit as it was (default dependencies) closes a cycle.
	units["shrooms-seal.service"] = unitOrder{Kind: "service", After: seal.After, Before: seal.Before}
	cycle := orderingCycle(units)
	assert.Check(t, len(cycle) > 0, "control: the old ordering was not found to be a cycle")
	assert.Check(t, is.Contains(strings.Join(cycle, " "), "podman.socket"), "%v", cycle)
}

// TestNetworkDefaults: the cage network defaults the module needs at
// evaluation time are pkg/config's.
func TestNetworkDefaults(t *testing.T) {
	requireNix(t)
	var d struct{ Policy, Driver, Bridge, Subnet4, Subnet6 string }
	evalJSON(t, "nix/network-defaults.nix", &d)
	def := config.Default().Network
	// One network default everywhere: the built-in config, the module's
	// option (netDefaults.policy) and the example config.
	assert.Check(t, is.Equal(def.Policy, "none"))
	assert.Check(t, is.Equal(d.Policy, def.Policy))
	module, err := os.ReadFile(filepath.Join(repo, "nix/module.nix"))
	assert.NilError(t, err)
	assert.Check(t, is.Contains(string(module), "default = netDefaults.policy;"))
	example, err := config.Load(filepath.Join(repo, "config.example.toml"))
	assert.NilError(t, err)
	assert.Check(t, is.Equal(example.Network.Policy, def.Policy))
	assert.Check(t, is.Equal(d.Driver, def.Driver))
	assert.Check(t, is.Contains(string(module), "default = netDefaults.driver;"))
	assert.Check(t, is.Equal(example.Network.Driver, def.Driver))
	assert.Check(t, is.Equal(d.Bridge, def.Bridge))
	assert.Check(t, is.Equal(d.Subnet4, def.Subnet4))
	assert.Check(t, is.Equal(d.Subnet6, def.Subnet6))
}
