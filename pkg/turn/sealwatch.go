package turn

import (
	"context"
	"sync"
	"time"

	"github.com/shrooms-cage/shrooms/pkg/cagenet"
	"github.com/shrooms-cage/shrooms/pkg/config"
)

// SealWatcher watches the network seal while a networked cage runs: it
// puts back a seal that went missing or changed (a firewall reload, `nft
// flush ruleset`, a new host route), reports each loss, and returns an
// error when it cannot put the seal back; the turn then stops the cage.
type SealWatcher func(ctx context.Context, cfg *config.Config, onLoss func(SealLoss)) error

// SealLoss is one time the seal was found missing or changed during a turn.
type SealLoss = cagenet.Loss

// watchSeal runs r.WatchSeal while a networked cage runs, recording losses
// in res. When the seal cannot be put back it calls stop (the cage must not
// run unsealed) and lost returns why. end stops the watcher and waits for it.
func (r *Runner) watchSeal(ctx context.Context, res *Result, stop context.CancelFunc) (lost func() error, end func()) {
	if r.WatchSeal == nil || !r.Cfg.Network.Networked() {
		return func() error { return nil }, func() {}
	}
	wctx, cancel := context.WithCancel(ctx)
	start := time.Now()
	var mu sync.Mutex
	var failed error
	done := make(chan struct{})
	go func() {
		defer close(done)
		err := r.WatchSeal(wctx, r.Cfg, func(l SealLoss) {
			l.AfterMs = ms(time.Since(start))
			mu.Lock()
			res.SealLosses = append(res.SealLosses, l)
			mu.Unlock()
		})
		if err != nil && wctx.Err() == nil {
			mu.Lock()
			failed = err
			mu.Unlock()
			stop()
		}
	}()
	lost = func() error {
		mu.Lock()
		defer mu.Unlock()
		return failed
	}
	return lost, func() { cancel(); <-done }
}
