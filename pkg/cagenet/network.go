// Package cagenet is the cage network and its seal: it ensures the podman
// network the config names, verifies that the nftables seal installed by
// pkg/firewall matches the config before a networked turn, and watches the
// seal while a cage runs. It sits below pkg/turn, which calls it through
// turn.SealChecker and turn.SealWatcher.
package cagenet

import (
	"context"
	"fmt"
	"net/netip"
	"sort"
	"strings"

	"github.com/shrooms-cage/shrooms/pkg/cagelink"
	"github.com/shrooms-cage/shrooms/pkg/config"
	"github.com/shrooms-cage/shrooms/pkg/engine"
	"github.com/shrooms-cage/shrooms/pkg/fault"
	"github.com/shrooms-cage/shrooms/pkg/firewall"
	"github.com/shrooms-cage/shrooms/pkg/podman"
	"github.com/shrooms-cage/shrooms/pkg/sealed"
)

// networkSpec is the podman network cfg asks for.
func networkSpec(n config.Network) (podman.NetworkSpec, error) {
	s := podman.NetworkSpec{Name: n.Name, Bridge: n.Bridge, Labels: map[string]string{sealed.LabelManaged: "1"}}
	var err error
	if s.Subnet4, err = netip.ParsePrefix(n.Subnet4); err != nil {
		return s, fmt.Errorf("network.subnet4: %w", err)
	}
	s.Gateway4 = s.Subnet4.Masked().Addr().Next()
	if n.Subnet6 != "" {
		if s.Subnet6, err = netip.ParsePrefix(n.Subnet6); err != nil {
			return s, fmt.Errorf("network.subnet6: %w", err)
		}
		s.Gateway6 = s.Subnet6.Masked().Addr().Next()
	}
	return s, nil
}

// EnsureNetwork creates the cage network if it is missing and checks an
// existing one against the config. It reports whether it created it. A
// network it cannot inspect or create, or one that differs from the
// config, is the host's to fix; a config it cannot read, bad input.
func EnsureNetwork(ctx context.Context, cfg *config.Config, client engine.Networks) (_ bool, err error) {
	defer fault.Phase(fault.HostNotReady, &err)
	if !cfg.Network.Networked() {
		return false, nil
	}
	have, err := client.InspectNetwork(ctx, cfg.Network.Name)
	if err != nil {
		return false, err
	}
	if have != nil {
		return false, networkDrift(cfg, have)
	}
	spec, err := networkSpec(cfg.Network)
	if err != nil {
		return false, fmt.Errorf("%w: %w", fault.Input, err)
	}
	if err := client.CreateNetwork(ctx, spec); err != nil {
		// Another task's turn may have created it meanwhile: then it only
		// has to be right.
		if again, ierr := client.InspectNetwork(ctx, cfg.Network.Name); ierr == nil && again != nil {
			return false, CheckNetwork(ctx, cfg, client)
		}
		return false, err
	}
	return true, CheckNetwork(ctx, cfg, client)
}

// CheckNetwork verifies that the cage network exists exactly as configured:
// its bridge interface (the one the seal filters) and its subnets. A
// network missing, differing or not inspectable is the host's to fix.
func CheckNetwork(ctx context.Context, cfg *config.Config, client engine.Networks) (err error) {
	defer fault.Phase(fault.HostNotReady, &err)
	have, err := client.InspectNetwork(ctx, cfg.Network.Name)
	if err != nil {
		return err
	}
	if have == nil {
		return fmt.Errorf("podman network %q does not exist (run `shrooms net apply`)", cfg.Network.Name)
	}
	return networkDrift(cfg, have)
}

// networkDrift says how the inspected network differs from the config.
func networkDrift(cfg *config.Config, have *podman.Network) error {
	if have.Bridge != cfg.Network.Bridge {
		return fmt.Errorf("podman network %q uses bridge %q, but the seal guards %q (network.bridge); remove the network or fix the config", have.Name, have.Bridge, cfg.Network.Bridge)
	}
	want := []string{cfg.Network.Subnet4}
	if cfg.Network.Subnet6 != "" {
		want = append(want, cfg.Network.Subnet6)
	}
	got := append([]string{}, have.Subnets...)
	sort.Strings(want)
	sort.Strings(got)
	if strings.Join(got, ",") != strings.Join(want, ",") {
		return fmt.Errorf("podman network %q has subnets %v, the config %v; remove the network or fix the config", have.Name, got, want)
	}
	if have.DNSEnabled {
		// aardvark-dns would be listed first in every cage's resolv.conf,
		// ahead of the cage's own resolver, and the seal drops it: every
		// lookup would wait out a timeout.
		return fmt.Errorf("podman network %q runs podman's DNS server (made by an older shrooms); cages use their own resolver now: remove it (`podman network rm %s`) and shrooms makes it again", have.Name, have.Name)
	}
	if have.Internal {
		return fmt.Errorf("podman network %q is internal; shrooms' seal expects a routed bridge", have.Name)
	}
	return nil
}

// linkNet is the cage network as the shrooms driver makes it, its bridge in
// the network namespace opts names.
func linkNet(cfg *config.Config, opts firewall.Options) (*cagelink.Net, error) {
	n, err := cagelink.FromConfig(cfg.Network, opts.NetNS)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", fault.Input, err)
	}
	return &n, nil
}

// ensureBridge makes the shrooms driver's bridge, its addresses, forwarding
// and NAT right (only checks, when dry: a missing bridge is made by the
// turn itself). One that differs and cannot be mended is the host's to fix.
func ensureBridge(ctx context.Context, n cagelink.Net, dry bool) (err error) {
	defer fault.Phase(fault.HostNotReady, &err)
	if dry {
		_, err := cagelink.CheckBridge(n)
		return err
	}
	return cagelink.EnsureBridge(ctx, n)
}

// Ensure makes the cage network as network.driver says (`shrooms net
// apply`): the podman network, or the shrooms driver's bridge in the
// network namespace opts names.
func Ensure(ctx context.Context, cfg *config.Config, client engine.Networks, opts firewall.Options) error {
	if !cfg.Network.Networked() {
		return nil
	}
	if cfg.Network.Driver == config.DriverPodman {
		_, err := EnsureNetwork(ctx, cfg, client)
		return err
	}
	n, err := linkNet(cfg, opts)
	if err != nil {
		return err
	}
	return ensureBridge(ctx, *n, false)
}
