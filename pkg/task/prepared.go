package task

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sort"
	"syscall"
	"time"

	"github.com/shrooms-cage/shrooms/pkg/fault"
	"github.com/shrooms-cage/shrooms/pkg/podman"
	"github.com/shrooms-cage/shrooms/pkg/sealed"
	"github.com/shrooms-cage/shrooms/pkg/taskid"
	"github.com/shrooms-cage/shrooms/pkg/taskstate"
	"github.com/shrooms-cage/shrooms/pkg/turn"
)

// PreparedCage is a task's cage prepared ahead, waiting for its turn.
type PreparedCage struct {
	Task string `json:"task"`
	Name string `json:"name"`
	// PreparedAt is when it was made (RFC 3339, UTC; "" for a cage made
	// before shrooms labelled it); AgeS its age in seconds.
	PreparedAt string  `json:"preparedAt,omitempty"`
	AgeS       float64 `json:"ageS"`
	// Expired is true once it is older than cage.prepared_ttl.
	Expired bool `json:"expired"`
}

// waiting reports whether c is a prepared cage that has not started.
func waiting(c podman.Cage) bool {
	return c.Labels[turn.LabelPrepared] == "1" && (c.State == "initialized" || c.State == "created")
}

// PreparedCages lists the waiting prepared cages of this state dir, by
// task, from podman (cages: what a listing of managed cages returned).
func (r *Commands) PreparedCages(cages []podman.Cage, now time.Time) []PreparedCage {
	out := []PreparedCage{}
	for _, c := range cages {
		if !r.ours(c) || !waiting(c) {
			continue
		}
		p := PreparedCage{Task: c.Labels[sealed.LabelTask], Name: c.Name, PreparedAt: c.Labels[turn.LabelPreparedAt], Expired: true}
		if at, err := time.Parse(time.RFC3339, p.PreparedAt); err == nil {
			age := now.Sub(at)
			p.AgeS = float64(age.Milliseconds()) / 1000
			p.Expired = age >= r.Cfg.Cage.PreparedTTL.Std()
		}
		out = append(out, p)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Task < out[j].Task })
	return out
}

// ExpireEvery is how often the turns' teardowns sweep for expired prepared
// cages: a tenth of the TTL, at most every 5 minutes.
func ExpireEvery(ttl time.Duration) time.Duration { return min(ttl/10, 5*time.Minute) }

// ExpireDue reports whether a teardown should sweep for expired prepared
// cages now (ExpirePrepared), and marks the sweep when it should. The
// sweep lists every container on the engine, which costs the podman
// service CPU in proportion to all of them (other users' too), so the
// teardowns of this state directory sweep at most once per ExpireEvery: a
// prepared cage goes at most that long after its TTL. `gc` always sweeps.
// A stamp that cannot be read or written means a sweep, as before.
func (r *Commands) ExpireDue(now time.Time) bool {
	path := taskstate.Layout{Dir: r.Cfg.State.Dir}.ExpireStamp()
	if st, err := os.Lstat(path); err == nil && st.Mode().IsRegular() {
		if age := now.Sub(st.ModTime()); age >= 0 && age < ExpireEvery(r.Cfg.Cage.PreparedTTL.Std()) {
			return false
		}
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0o600)
	if err == nil {
		f.Close()
		_ = os.Chtimes(path, now, now)
	}
	return true
}

// ExpirePrepared removes the prepared cages older than cage.prepared_ttl
// (with dryRun, only lists them), each under its task's lock: a task whose
// turn runs keeps its cage. Its HOME mount and token secrets go with the
// next ReleaseIdle (gc), or the task's next turn.
func (r *Commands) ExpirePrepared(ctx context.Context, dryRun bool) (_ []string, err error) {
	defer fault.Phase(fault.HostNotReady, &err)
	cages, err := r.managedCages(ctx)
	if err != nil {
		return nil, err
	}
	expired := []string{}
	for _, p := range r.PreparedCages(cages, time.Now()) {
		if !p.Expired {
			continue
		}
		id, err := taskid.Parse(p.Task)
		if err != nil {
			continue // a label that is no task id is not ours to trust
		}
		if dryRun {
			expired = append(expired, p.Name)
			continue
		}
		lock, err := r.Store.LockTask(id)
		if errors.Is(err, taskstate.ErrBusy) {
			continue // its turn runs (and takes or discards it)
		}
		if err != nil {
			return expired, turn.Classify(err)
		}
		removed, _, err := r.cages().RemoveLeftovers(ctx, id)
		lock.Release()
		expired = append(expired, removed...)
		if err != nil {
			return expired, fmt.Errorf("expire prepared cage of %s: %w", p.Task, err)
		}
	}
	return expired, nil
}

// ShowPrepared adds each task's waiting prepared cage (and its age) to
// sts, from the engine when it answers; without it, sts stay as they are.
func (r *Commands) ShowPrepared(ctx context.Context, sts []TaskStatus) {
	if r.Podman == nil {
		return
	}
	cages, err := r.Podman.ListByLabel(ctx, sealed.LabelManaged, "1")
	if err != nil {
		return
	}
	byTask := map[string]PreparedCage{}
	for _, p := range r.PreparedCages(cages, time.Now()) {
		byTask[p.Task] = p
	}
	for i := range sts {
		if p, ok := byTask[sts[i].Task]; ok {
			sts[i].Prepared, sts[i].PreparedAgeS, sts[i].PreparedAt = true, p.AgeS, p.PreparedAt
		}
	}
}
