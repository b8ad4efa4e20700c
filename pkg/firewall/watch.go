package firewall

import (
	"context"
	"fmt"
	"time"

	"github.com/shrooms-cage/shrooms/pkg/config"
)

// WatchInterval is how often Watch checks the seal while cages run. A
// check is one Verify (about 3 ms, 18 ms with 1000 host routes), so a
// seal lost to `nft flush ruleset`, a firewall reload or a new route is
// back within about a quarter of a second.
const WatchInterval = 250 * time.Millisecond

// Loss is one time Watch found the seal missing or changed.
type Loss struct {
	At     time.Time
	Reason string // what Verify found
	// Reapplied is true when the seal was put back; otherwise Err says why
	// it could not be, and the caller must stop its networked cages.
	Reapplied bool
	Err       error
}

// Watch checks the seal of cfg every interval until ctx ends and applies
// it again at once when it is missing or differs from the config; onLoss
// hears of each loss. It returns nil when ctx ends, and the error when the
// seal could not be put back: fail closed, the caller stops its cages.
// Under policy none there is nothing to watch.
func Watch(ctx context.Context, cfg config.Network, opts Options, interval time.Duration, onLoss func(Loss)) error {
	if cfg.Policy == "none" {
		return nil
	}
	if err := checkCfg(cfg); err != nil {
		return err
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		st, err := Verify(ctx, cfg, opts)
		if ctx.Err() != nil {
			return nil
		}
		if err == nil && st.OK {
			continue
		}
		l := Loss{At: time.Now(), Reason: st.Reason}
		if err != nil {
			l.Reason = "cannot read the seal: " + err.Error()
		}
		if aerr := Apply(ctx, cfg, opts); aerr != nil {
			if ctx.Err() != nil {
				return nil
			}
			l.Err = fmt.Errorf("seal lost and not restored: %w", aerr)
			onLoss(l)
			return l.Err
		}
		l.Reapplied = true
		onLoss(l)
	}
}
