package podman

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"
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

// subnet is a network's subnet as podman's network API spells it.
type subnet struct {
	Subnet  string `json:"subnet"`
	Gateway string `json:"gateway,omitempty"`
}

// network is the part of podman's network record shrooms writes and reads.
type network struct {
	Name             string            `json:"name"`
	Driver           string            `json:"driver,omitempty"`
	NetworkInterface string            `json:"network_interface,omitempty"`
	Subnets          []subnet          `json:"subnets,omitempty"`
	IPv6Enabled      bool              `json:"ipv6_enabled"`
	Internal         bool              `json:"internal"`
	DNSEnabled       bool              `json:"dns_enabled"`
	Labels           map[string]string `json:"labels,omitempty"`
}

// InspectNetwork returns the named network, or nil if it does not exist.
func (c *Client) InspectNetwork(ctx context.Context, name string) (*Network, error) {
	// One call, not exists + inspect: every networked turn makes it.
	var r network
	if err := c.do(ctx, http.MethodGet, nil, nil, &r, "networks", name, "json"); err != nil {
		if isNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("inspect network %s: %s", name, oneLine(err))
	}
	n := &Network{Name: r.Name, Bridge: r.NetworkInterface, Internal: r.Internal, DNSEnabled: r.DNSEnabled, Labels: r.Labels}
	for _, s := range r.Subnets {
		// Canonical CIDR, as the bindings' net.IPNet printed it.
		if p, err := netip.ParsePrefix(s.Subnet); err == nil {
			n.Subnets = append(n.Subnets, p.Masked().String())
		} else {
			n.Subnets = append(n.Subnets, s.Subnet)
		}
	}
	return n, nil
}

// CreateNetwork creates the cage bridge network: the named bridge interface,
// the given subnets and gateways, IPv6 when a v6 subnet is given, no DNS
// server of podman's (each cage has its own resolver), not internal (the seal, not podman, limits egress).
func (c *Client) CreateNetwork(ctx context.Context, s NetworkSpec) error {
	n := network{
		Name:             s.Name,
		Driver:           "bridge",
		NetworkInterface: s.Bridge,
		DNSEnabled:       false, // cages have their own resolver (pkg/dnsseal)
		Labels:           s.Labels,
		Subnets:          []subnet{netSubnet(s.Subnet4, s.Gateway4)},
	}
	if s.Subnet6.IsValid() {
		n.IPv6Enabled = true
		n.Subnets = append(n.Subnets, netSubnet(s.Subnet6, s.Gateway6))
	}
	body, err := jsonBody(n)
	if err != nil {
		return fmt.Errorf("create network %s: %w", s.Name, err)
	}
	if err := c.do(ctx, http.MethodPost, nil, body, nil, "networks", "create"); err != nil {
		return fmt.Errorf("create network %s: %s", s.Name, oneLine(err))
	}
	return nil
}

// netSubnet spells a subnet and its gateway (none when gw is the zero
// value) as the network API reads them; podman refuses an unmasked subnet.
func netSubnet(p netip.Prefix, gw netip.Addr) subnet {
	s := subnet{Subnet: p.String()}
	if gw.IsValid() {
		s.Gateway = gw.String()
	}
	return s
}

// RemoveNetwork removes the named network; one that does not exist is not
// an error.
func (c *Client) RemoveNetwork(ctx context.Context, name string) error {
	if err := c.do(ctx, http.MethodDelete, nil, nil, nil, "networks", name); err != nil && !isNotFound(err) {
		return fmt.Errorf("remove network %s: %s", name, oneLine(err))
	}
	return nil
}
