package podman

import (
	"context"
	"fmt"
	"net"
	"net/netip"

	nettypes "github.com/containers/common/libnetwork/types"
	"github.com/containers/podman/v5/pkg/bindings/network"
)

// NetworkSpec is the cage network as shrooms wants it.
type NetworkSpec struct {
	Name, Bridge string
	Subnet4      netip.Prefix
	Gateway4     netip.Addr
	Subnet6      netip.Prefix // invalid (zero) for no IPv6
	Gateway6     netip.Addr
	Labels       map[string]string
}

// Network is an existing podman network, as far as shrooms checks it.
type Network struct {
	Name, Bridge string
	Subnets      []string
	Internal     bool
	DNSEnabled   bool
	Labels       map[string]string
}

// InspectNetwork returns the named network, or nil if it does not exist.
func (c *Client) InspectNetwork(ctx context.Context, name string) (*Network, error) {
	cctx, done := c.scope(ctx)
	defer done()
	// One call, not exists + inspect: every networked turn makes it.
	r, err := network.Inspect(cctx, name, nil)
	if err != nil {
		if isNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("inspect network %s: %s", name, oneLine(err))
	}
	n := &Network{Name: r.Name, Bridge: r.NetworkInterface, Internal: r.Internal, DNSEnabled: r.DNSEnabled, Labels: r.Labels}
	for _, s := range r.Subnets {
		n.Subnets = append(n.Subnets, s.Subnet.String())
	}
	return n, nil
}

// CreateNetwork creates the cage bridge network: the named bridge interface,
// the given subnets and gateways, IPv6 when a v6 subnet is given, no DNS
// server of podman's (each cage has its own resolver), not internal (the seal, not podman, limits egress).
func (c *Client) CreateNetwork(ctx context.Context, s NetworkSpec) error {
	cctx, done := c.scope(ctx)
	defer done()
	n := &nettypes.Network{
		Name:             s.Name,
		Driver:           "bridge",
		NetworkInterface: s.Bridge,
		DNSEnabled:       false, // cages have their own resolver (pkg/dnsseal)
		Labels:           s.Labels,
		Subnets: []nettypes.Subnet{{
			Subnet:  nettypes.IPNet{IPNet: *prefixNet(s.Subnet4)},
			Gateway: net.IP(s.Gateway4.AsSlice()),
		}},
	}
	if s.Subnet6.IsValid() {
		n.IPv6Enabled = true
		n.Subnets = append(n.Subnets, nettypes.Subnet{
			Subnet:  nettypes.IPNet{IPNet: *prefixNet(s.Subnet6)},
			Gateway: net.IP(s.Gateway6.AsSlice()),
		})
	}
	if _, err := network.Create(cctx, n); err != nil {
		return fmt.Errorf("create network %s: %s", s.Name, oneLine(err))
	}
	return nil
}

func prefixNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: net.IP(p.Addr().AsSlice()), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// RemoveNetwork removes the named network; one that does not exist is not
// an error.
func (c *Client) RemoveNetwork(ctx context.Context, name string) error {
	cctx, done := c.scope(ctx)
	defer done()
	if _, err := network.Remove(cctx, name, nil); err != nil && !isNotFound(err) {
		return fmt.Errorf("remove network %s: %s", name, oneLine(err))
	}
	return nil
}
