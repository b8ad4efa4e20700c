package cagenet

import (
	"context"

	"github.com/shrooms-cage/shrooms/pkg/cagelink"
	"github.com/shrooms-cage/shrooms/pkg/config"
	"github.com/shrooms-cage/shrooms/pkg/firewall"
)

// Loss is one time the seal was found missing or changed during a turn.
type Loss struct {
	// AfterMs is when, counted from the cage's start.
	AfterMs   float64 `json:"afterMs"`
	Reason    string  `json:"reason"`
	Reapplied bool    `json:"reapplied"`
	Error     string  `json:"error,omitempty"`
}

// Watcher watches the seal with firewall.Watch every firewall.WatchInterval
// in the network namespace opts names, reporting each loss (the turn's
// turn.SealWatcher).
func Watcher(opts firewall.Options) func(ctx context.Context, cfg *config.Config, onLoss func(Loss)) error {
	return func(ctx context.Context, cfg *config.Config, onLoss func(Loss)) error {
		return firewall.Watch(ctx, cfg.Network, opts, firewall.WatchInterval, func(l firewall.Loss) {
			sl := Loss{Reason: l.Reason, Reapplied: l.Reapplied}
			if l.Err != nil {
				sl.Error = l.Err.Error()
			}
			if l.Reapplied && cfg.Network.Driver == config.DriverShrooms {
				// What took the seal (a ruleset flush, a firewall reload)
				// took the cage network's NAT too: put it back behind the
				// seal, or the running cage has no way out until the next
				// turn. The seal holds either way.
				if err := ensureNAT(ctx, cfg, opts); err != nil {
					sl.Error = "seal reapplied; cage network not restored: " + err.Error()
				}
			}
			onLoss(sl)
		})
	}
}

// ensureNAT makes the shrooms driver's bridge, forwarding and NAT right
// again (cagelink.EnsureBridge: read first, write what differs).
func ensureNAT(ctx context.Context, cfg *config.Config, opts firewall.Options) error {
	n, err := linkNet(cfg, opts)
	if err != nil {
		return err
	}
	return cagelink.EnsureBridge(ctx, *n)
}
