package cagenet

import (
	"context"
	"errors"
	"strings"
	"testing"

	"gotest.tools/v3/assert"

	"github.com/shrooms-cage/shrooms/pkg/config"
	"github.com/shrooms-cage/shrooms/pkg/fault"
	"github.com/shrooms-cage/shrooms/pkg/podman"
)

// nets is an in-memory engine.Networks.
type nets struct {
	have      map[string]*podman.Network
	createErr error
	created   []podman.NetworkSpec
}

func (n *nets) InspectNetwork(_ context.Context, name string) (*podman.Network, error) {
	return n.have[name], nil
}

func (n *nets) CreateNetwork(_ context.Context, s podman.NetworkSpec) error {
	if n.createErr != nil {
		return n.createErr
	}
	n.created = append(n.created, s)
	var subnets []string
	subnets = append(subnets, s.Subnet4.String())
	if s.Subnet6.IsValid() {
		subnets = append(subnets, s.Subnet6.String())
	}
	n.have[s.Name] = &podman.Network{Name: s.Name, Bridge: s.Bridge, Subnets: subnets}
	return nil
}

func netCfg() *config.Config {
	return &config.Config{Network: config.Network{Policy: "internet", Name: "shrooms", Bridge: "shrooms0", Subnet4: "10.89.7.0/24", Subnet6: "fd00:89:7::/64"}}
}

func TestEnsureNetworkCreatesThenChecks(t *testing.T) {
	ctx := context.Background()
	cfg := netCfg()
	assert.Assert(t, cfg.Network.Networked())
	n := &nets{have: map[string]*podman.Network{}}
	created, err := EnsureNetwork(ctx, cfg, n)
	assert.NilError(t, err)
	assert.Assert(t, created)
	assert.Equal(t, len(n.created), 1)
	assert.Equal(t, n.created[0].Gateway4.String(), "10.89.7.1")
	assert.Equal(t, n.created[0].Gateway6.String(), "fd00:89:7::1")
	created, err = EnsureNetwork(ctx, cfg, n)
	assert.NilError(t, err)
	assert.Assert(t, !created, "an existing network is only checked")
	assert.Equal(t, len(n.created), 1)
}

func TestCheckNetworkRefusesADifferentNetwork(t *testing.T) {
	ctx := context.Background()
	cfg := netCfg()
	for name, have := range map[string]*podman.Network{
		"missing":  nil,
		"bridge":   {Name: "shrooms", Bridge: "podman1", Subnets: []string{"10.89.7.0/24", "fd00:89:7::/64"}},
		"subnets":  {Name: "shrooms", Bridge: "shrooms0", Subnets: []string{"10.89.8.0/24", "fd00:89:7::/64"}},
		"internal": {Name: "shrooms", Bridge: "shrooms0", Subnets: []string{"fd00:89:7::/64", "10.89.7.0/24"}, Internal: true},
		"dns":      {Name: "shrooms", Bridge: "shrooms0", Subnets: []string{"fd00:89:7::/64", "10.89.7.0/24"}, DNSEnabled: true},
	} {
		t.Run(name, func(t *testing.T) {
			n := &nets{have: map[string]*podman.Network{}}
			if have != nil {
				n.have["shrooms"] = have
			}
			err := CheckNetwork(ctx, cfg, n)
			assert.Assert(t, errors.Is(err, fault.HostNotReady), "%v", err)
		})
	}
	// The positive control: the same network, subnets in any order.
	n := &nets{have: map[string]*podman.Network{"shrooms": {Name: "shrooms", Bridge: "shrooms0", Subnets: []string{"fd00:89:7::/64", "10.89.7.0/24"}}}}
	assert.NilError(t, CheckNetwork(ctx, cfg, n))
}

func TestEnsureNetworkFailures(t *testing.T) {
	ctx := context.Background()
	cfg := netCfg()
	n := &nets{have: map[string]*podman.Network{}, createErr: errors.New("boom")}
	_, err := EnsureNetwork(ctx, cfg, n)
	assert.Assert(t, errors.Is(err, fault.HostNotReady), "%v", err)

	// An existing network that drifted: the host's, said once.
	drifted := &nets{have: map[string]*podman.Network{"shrooms": {Name: "shrooms", Bridge: "podman1", Subnets: []string{"10.89.7.0/24", "fd00:89:7::/64"}}}}
	_, err = EnsureNetwork(ctx, cfg, drifted)
	assert.Assert(t, errors.Is(err, fault.HostNotReady), "%v", err)
	assert.Assert(t, strings.HasPrefix(err.Error(), "host not ready: podman network") && strings.Count(err.Error(), "host not ready") == 1, "%v", err)

	cfg.Network.Subnet4 = "not-a-prefix"
	_, err = EnsureNetwork(ctx, cfg, &nets{have: map[string]*podman.Network{}})
	assert.Assert(t, errors.Is(err, fault.Input) && !errors.Is(err, fault.HostNotReady), "bad input keeps its kind: %v", err)

	// No network at all is nothing to ensure.
	cfg = netCfg()
	cfg.Network.Policy = "none"
	created, err := EnsureNetwork(ctx, cfg, n)
	assert.NilError(t, err)
	assert.Assert(t, !created)
}
