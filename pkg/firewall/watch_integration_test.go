package firewall

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"gotest.tools/v3/assert"

	"github.com/shrooms-cage/shrooms/internal/testbed"
)

// TestWatchRestoresSeal: a cage streams datagrams at the LAN router (one
// every 10 ms) while someone runs `nft flush ruleset` on the host. Without
// a watcher the stream gets through from the flush on and keeps getting
// through (positive control: the flush opens a real hole); with Watch
// running, the seal is back and the router sees nothing more within a
// second of the flush.
func TestWatchRestoresSeal(t *testing.T) {
	tb, cfg := newEnv(t)
	opts := hostOpts(tb)
	ctx := context.Background()
	cage := "stb" + tb.ID + "-a"
	target := net.JoinHostPort(testbed.RouterAddr4.String(), "5000")
	var streams sync.WaitGroup
	t.Cleanup(streams.Wait)
	stream := func(nonce string, secs int) {
		streams.Add(1)
		go func() {
			defer streams.Done()
			tb.Podman("exec", cage, "/tbprobe", "stream", target, nonce, fmt.Sprint(secs))
		}()
	}
	// flush returns when it started: the kernel may drop the seal before
	// the nft command has returned.
	flush := func() time.Time {
		at := time.Now()
		out, err := tb.Exec("host", "nft", "flush", "ruleset")
		assert.NilError(t, err, string(out))
		return at
	}
	split := func(nonce string, at time.Time, grace time.Duration) (before, after, late int, last time.Duration) {
		for _, h := range tb.Hits(nonce) {
			switch d := h.At.Sub(at); {
			case d < 0:
				before++
			case d <= grace:
				after++
				last = max(last, d)
			default:
				late++
				last = max(last, d)
			}
		}
		return
	}

	t.Run("positive control: without a watcher the flush opens the seal for good", func(t *testing.T) {
		assert.NilError(t, Apply(ctx, cfg, opts))
		nonce := fmt.Sprintf("w%s-ctl", tb.ID)
		stream(nonce, 4)
		time.Sleep(1500 * time.Millisecond)
		at := flush()
		time.Sleep(2 * time.Second)
		before, after, late, _ := split(nonce, at, time.Second)
		assert.Equal(t, before, 0, "the sealed stream reached the router before the flush")
		assert.Assert(t, after > 0 && late > 0, "the flush did not open the seal (hits within 1 s: %d, later: %d): the test could not see the hole", after, late)
		streams.Wait()
	})

	t.Run("Watch puts the seal back within a second", func(t *testing.T) {
		assert.NilError(t, Apply(ctx, cfg, opts))
		wctx, cancel := context.WithCancel(ctx)
		var mu sync.Mutex
		var losses []Loss
		done := make(chan error, 1)
		go func() {
			done <- Watch(wctx, cfg, opts, WatchInterval, func(l Loss) { mu.Lock(); losses = append(losses, l); mu.Unlock() })
		}()
		nonce := fmt.Sprintf("w%s-watch", tb.ID)
		stream(nonce, 5)
		time.Sleep(1500 * time.Millisecond)
		at := flush()
		time.Sleep(3 * time.Second)
		cancel()
		assert.NilError(t, <-done)
		streams.Wait()
		before, after, late, last := split(nonce, at, time.Second)
		t.Logf("after the flush: %d datagrams reached the router, the last %v after it", after+late, last)
		assert.Equal(t, before, 0, "the sealed stream reached the router before the flush")
		assert.Equal(t, late, 0, "SEAL NOT RESTORED: %d datagrams reached the router more than 1 s after the flush", late)
		mu.Lock()
		defer mu.Unlock()
		assert.Assert(t, len(losses) >= 1, "Watch reported no loss")
		assert.Assert(t, losses[0].Reapplied, "%+v", losses[0])
		// The flush may land while a check is reading one of the seal's
		// sets: the table is then "missing", or a set "unreadable" (ENOENT).
		r := losses[0].Reason
		assert.Assert(t, strings.Contains(r, "missing") || strings.Contains(r, "unreadable"), r)
		t.Logf("loss seen %v after the flush: %s", losses[0].At.Sub(at), losses[0].Reason)
		st, err := Verify(ctx, cfg, opts)
		assert.NilError(t, err)
		assert.Assert(t, st.OK, st.Reason)
	})
}
