package cagenet

import (
	"context"
	"errors"
	"fmt"

	"github.com/shrooms-cage/shrooms/pkg/cagelink"
	"github.com/shrooms-cage/shrooms/pkg/config"
	"github.com/shrooms-cage/shrooms/pkg/engine"
	"github.com/shrooms-cage/shrooms/pkg/firewall"
)

// State is what a seal check found.
type State struct {
	// Hosts are the allowlisted "name:address" entries for the cage's
	// /etc/hosts (allowlist policy).
	Hosts []string
	// Digest is the digest of the seal verified in the kernel
	// (firewall.Status.Installed; "" when a checker does not report one).
	Digest string
	// Rules is the rule set the seal was checked against; the in-cage
	// wall of the turn's cage is built from the same (InstallWall).
	Rules *firewall.Rules
	// Link is the cage network under network.driver "shrooms": LinkCage
	// links the cage to its bridge before its wall goes in (nil under
	// driver podman).
	Link *cagelink.Net
}

// CheckSeal verifies the nftables seal in the network namespace opts names
// before a networked turn, then makes sure the cage network exists as
// configured (creating it if missing, unless dry). Under the allowlist
// policy it re-applies the seal first (refreshing the resolved names),
// unless dry, and returns the resolved names as "name:address" entries for
// the cage's /etc/hosts, with the digest of the seal it verified.
func CheckSeal(ctx context.Context, cfg *config.Config, client engine.Networks, opts firewall.Options, dry bool) (State, error) {
	var hosts []string
	var r firewall.Resolved
	if cfg.Network.Policy == "allowlist" {
		var err error
		if dry {
			r, err = firewall.Resolve(ctx, cfg.Network, opts)
		} else {
			r, err = firewall.ApplyResolved(ctx, cfg.Network, opts)
		}
		if err != nil {
			return State{}, err
		}
		hosts = r.HostEntries()
	}
	verify := firewall.Refresh // a host route that appeared is added to the seal
	if dry {
		verify = firewall.Verify
	}
	st, err := verify(ctx, cfg.Network, opts)
	if err != nil {
		return State{}, err
	}
	if !st.OK {
		return State{}, errors.New(st.Reason)
	}
	rules, err := firewall.DescribeHost(cfg.Network, r, opts)
	if err != nil {
		return State{}, err
	}
	state := State{Hosts: hosts, Digest: st.Installed, Rules: rules}
	if cfg.Network.Driver == config.DriverShrooms {
		if state.Link, err = linkNet(cfg, opts); err != nil {
			return State{}, err
		}
		if err := ensureBridge(ctx, *state.Link, dry); err != nil || dry {
			return state, err
		}
		return state, firewall.PinBridgeMAC(cfg.Network.Bridge, opts)
	}
	if dry {
		if n, err := client.InspectNetwork(ctx, cfg.Network.Name); err != nil || n == nil {
			return state, err // a missing network is created by the turn itself
		}
		return state, CheckNetwork(ctx, cfg, client)
	}
	if _, err := EnsureNetwork(ctx, cfg, client); err != nil {
		return State{}, err
	}
	// Before this turn's cage joins the bridge, so that it cannot change
	// the gateway's address under the cages already running.
	if err := firewall.PinBridgeMAC(cfg.Network.Bridge, opts); err != nil {
		return State{}, err
	}
	return state, nil
}

// Checker is CheckSeal in shrooms' own network namespace, as the turn's
// seal check (turn.SealChecker).
func Checker(client engine.Networks) func(ctx context.Context, cfg *config.Config, dry bool) (State, error) {
	return func(ctx context.Context, cfg *config.Config, dry bool) (State, error) {
		return CheckSeal(ctx, cfg, client, firewall.Options{}, dry)
	}
}

// InstallWall installs and verifies the in-cage wall (firewall.ApplyWall)
// in the network namespace of the cage whose process is pid, from the rule
// set the turn's seal check described. A cage whose wall is not in place
// must not start: every error is final.
func InstallWall(ctx context.Context, seal State, pid int) (firewall.WallStatus, error) {
	if pid <= 0 {
		return firewall.WallStatus{}, fmt.Errorf("in-cage wall: cage has no process")
	}
	return firewall.ApplyWall(ctx, seal.Rules, firewall.Options{NetNS: CageNetNS(pid)})
}

// CheckWall verifies the wall of a prepared cage against the turn's rule
// set, and installs it again (atomically replacing it) when it differs —
// the host's routes or the allowlist's addresses moved since it was
// prepared. Only a verified wall lets the cage start.
func CheckWall(ctx context.Context, seal State, pid int) (firewall.WallStatus, error) {
	if pid <= 0 {
		return firewall.WallStatus{}, fmt.Errorf("in-cage wall: cage has no process")
	}
	st, err := firewall.VerifyWall(ctx, seal.Rules, firewall.Options{NetNS: CageNetNS(pid)})
	if err == nil && st.OK {
		return st, nil
	}
	return InstallWall(ctx, seal, pid)
}

// LinkCage gives the initialised cage whose process is pid its link to the
// cage bridge under network.driver "shrooms" (seal.Link; nothing under
// driver podman, whose cages podman links). prepared says the cage was
// linked at its preparation: then the link is only checked, and one that
// is gone or differs (the bridge made again meanwhile) is not mended.
// Every error keeps the cage from starting.
func LinkCage(ctx context.Context, seal State, pid int, prepared bool) (*cagelink.Link, error) {
	if seal.Link == nil {
		return nil, nil
	}
	if pid <= 0 {
		return nil, fmt.Errorf("cage link: cage has no process")
	}
	if prepared {
		l, err := cagelink.Check(*seal.Link, CageNetNS(pid))
		if err != nil {
			return nil, fmt.Errorf("prepared cage: %w", err) // "cage link: …" follows
		}
		return &l, nil
	}
	l, err := cagelink.Attach(ctx, *seal.Link, CageNetNS(pid))
	if err != nil {
		return nil, err // "cage link: …"
	}
	return &l, nil
}

// CageNetNS is the network namespace of a cage's process. podman's own
// path for it (inspect's SandboxKey, /run/netns/netns-…) is a bind mount in
// the podman service's mount namespace, which need not be shrooms' (the
// testbed's service has its own); /proc/PID/ns/net is the same namespace
// from anywhere in the host's pid namespace.
func CageNetNS(pid int) string { return fmt.Sprintf("/proc/%d/ns/net", pid) }
