package turn

import (
	"context"
	"fmt"

	"github.com/shrooms-cage/shrooms/pkg/cagenet"
	"github.com/shrooms-cage/shrooms/pkg/firewall"
)

// CageWaller puts the in-cage wall in place in the network namespace of a
// created cage's process pid (the cage initialised, not started), from the
// turn's seal state; prepared says the cage was prepared ahead (its wall
// went in then and only needs checking). An error keeps the cage from
// starting.
type CageWaller func(ctx context.Context, seal SealState, pid int, prepared bool) (firewall.WallStatus, error)

// InstallCageWall is the real CageWaller: cagenet.InstallWall for a fresh
// cage, cagenet.CheckWall (verify, reinstall on any difference) for a
// prepared one.
func InstallCageWall(ctx context.Context, seal SealState, pid int, prepared bool) (firewall.WallStatus, error) {
	if prepared {
		return cagenet.CheckWall(ctx, seal, pid)
	}
	return cagenet.InstallWall(ctx, seal, pid)
}

// wallCage links an initialised networked cage to the cage network (the
// shrooms driver) and puts its in-cage wall in place; check says it is a
// prepared cage whose link and wall went in at its preparation. Under policy none there is no interface but loopback and
// nothing to wall.
func (r *Runner) wallCage(ctx context.Context, id string, p *prepared, check bool) (*firewall.WallStatus, error) {
	if !r.Cfg.Network.Networked() {
		return nil, nil
	}
	if r.CageWall == nil {
		return nil, fmt.Errorf("network policy %q needs the in-cage wall and this runner cannot install one", r.Cfg.Network.Policy)
	}
	pid, err := r.cagePid(ctx, id, p)
	if err != nil {
		return nil, err
	}
	// The link first (network.driver "shrooms"): the wall guards an
	// interface that exists.
	if _, err := cagenet.LinkCage(ctx, p.seal, pid, check); err != nil {
		return nil, fmt.Errorf("cage not linked to the cage network, refusing to start it: %w", err)
	}
	st, err := r.CageWall(ctx, p.seal, pid, check)
	if err != nil {
		return nil, fmt.Errorf("in-cage wall not in place, refusing to start the cage: %w", err)
	}
	return &st, nil
}

// cagePid is the host pid of the turn's initialised cage: the one the
// prepared cage's inspection read, else inspected once and kept. The wall,
// the gateway and the resolver all need it, and an initialised cage's
// process keeps its pid until it runs (each inspection is a round trip to
// the podman service in front of the turn).
func (r *Runner) cagePid(ctx context.Context, id string, p *prepared) (int, error) {
	if p.pid <= 0 {
		pid, err := r.Podman.Pid(ctx, id)
		if err != nil {
			return 0, err
		}
		p.pid = pid
	}
	return p.pid, nil
}
