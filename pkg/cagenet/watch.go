package cagenet

import (
	"context"

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
			onLoss(sl)
		})
	}
}
