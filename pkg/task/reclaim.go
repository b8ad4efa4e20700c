package task

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/shrooms-cage/shrooms/pkg/config"
	"github.com/shrooms-cage/shrooms/pkg/fault"
	"github.com/shrooms-cage/shrooms/pkg/home"
	"github.com/shrooms-cage/shrooms/pkg/outbox"
	"github.com/shrooms-cage/shrooms/pkg/sealed"
	"github.com/shrooms-cage/shrooms/pkg/taskid"
	"github.com/shrooms-cage/shrooms/pkg/turn"
)

// ErrLeftovers is a forget or gc that could not remove everything.
var ErrLeftovers = errors.New("not everything could be removed")

// leftovers lists what of task is still on the host: cages, HOME volume,
// image, loop devices and mounts (of a deleted image too), token secrets,
// worktree claims, outbox and state dir. forget checks it is empty before
// it reports success.
func (r *Commands) leftovers(ctx context.Context, task taskid.ID, stateGone bool) []string {
	var left []string
	cages, err := r.Podman.ListByLabel(ctx, sealed.LabelTask, task.String())
	if err != nil {
		left = append(left, "cages (cannot list: "+oneLine(err)+")")
	}
	for _, c := range cages {
		if r.ours(c) {
			left = append(left, "cage "+c.Name)
		}
	}
	homes := r.Homes
	name := homes.Name(task)
	if ok, err := r.Podman.VolumeExists(ctx, name); err != nil || ok {
		left = append(left, "volume "+name)
	}
	image := homes.Image(task)
	for _, p := range []string{image, image + ".new"} {
		if fileExists(p) {
			left = append(left, "image "+p)
		}
	}
	atts, err := homes.AttachmentsOf(task)
	if err != nil {
		left = append(left, "loop devices (cannot list: "+oneLine(err)+")")
	}
	for _, a := range atts {
		left = append(left, "loop device "+a.String())
	}
	secrets, err := r.Podman.ListSecrets(ctx)
	if err != nil {
		left = append(left, "secrets (cannot list: "+oneLine(err)+")")
	}
	for _, s := range secrets {
		if r.taskSecret(task, s.Name, s.Labels) {
			left = append(left, "secret "+s.Name)
		}
	}
	for _, c := range r.Worktrees.Files(task) {
		left = append(left, "worktree claim "+c)
	}
	for _, p := range []string{filepath.Join(r.Cfg.Outbox.Root, task.String()), outbox.Pending(r.Cfg.Outbox.Root, task)} {
		if fileExists(p) {
			left = append(left, "outbox "+p)
		}
	}
	if stateGone && fileExists(r.taskDir(task)) {
		left = append(left, "state "+r.taskDir(task))
	}
	return left
}

// taskSecret reports whether a secret carries one of task's tokens: by its
// task label, or by the name a token of the config gives it.
func (r *Commands) taskSecret(task taskid.ID, name string, labels map[string]string) bool {
	if labels[sealed.LabelTask] == task.String() && strings.HasPrefix(name, "shrooms-"+task.String()+"-") {
		return true
	}
	for tok := range r.Cfg.Tokens {
		if name == turn.SecretName(task, tok) {
			return true
		}
	}
	return false
}

func oneLine(err error) string { return strings.Join(strings.Fields(err.Error()), " ") }

// Forget removes everything shrooms keeps of a task: its cages (prepared
// ones too), its HOME (volume, capped filesystem image, every mount and
// loop device of it, one whose image was deleted included), its outbox,
// its token secrets and its state (lock, turn counter, user-namespace
// slot, which becomes free for a new task). The worktree and delivered
// outboxes stay. Each step runs even when an earlier one failed; then what
// is still there is listed (ErrLeftovers) and nothing is reported gone.
func (r *Commands) Forget(ctx context.Context, task taskid.ID) error {
	if err := checkForget(r.Cfg, task); err != nil {
		return err
	}
	id := task
	lock, err := r.Store.LockTask(id)
	if err != nil {
		return turn.Classify(err)
	}
	defer lock.Release()
	return func() error {
		var errs []string
		step := func(what string, err error) {
			if err != nil {
				errs = append(errs, what+": "+oneLine(err))
			}
		}
		_, _, err := r.cages().RemoveLeftovers(ctx, task)
		step("cages", err)
		step("worktree", r.Worktrees.Release(id))
		step("HOME", r.Homes.Remove(ctx, task))
		if _, err := os.Stat(r.Cfg.Outbox.Root); err == nil {
			step("outbox", r.releaseOutbox(task))
		}
		secrets, err := r.Podman.ListSecrets(ctx)
		step("secrets", err)
		for _, s := range secrets {
			if r.taskSecret(task, s.Name, s.Labels) {
				step("secret "+s.Name, r.Podman.RemoveSecret(ctx, s.Name))
			}
		}
		left := r.leftovers(ctx, task, false)
		// A loop device lets go a moment after its last user (udev's probe,
		// a namespace being torn down) closes it.
		for i := 0; i < 20 && len(left) > 0 && len(errs) == 0; i++ {
			time.Sleep(150 * time.Millisecond)
			left = r.leftovers(ctx, task, false)
		}
		if len(left) == 0 {
			// The state (and the lock file in it) goes last, once nothing
			// else of the task is there to be found by it.
			step("state", removeTaskDir(r.taskDir(task)))
		}
		left = r.leftovers(ctx, task, len(left) == 0)
		if len(left) > 0 {
			return fmt.Errorf("%w: %w: forget %s left %s (%s); fix that and run `shrooms forget --task %s` again", fault.HostNotReady, ErrLeftovers, task, strings.Join(left, ", "), strings.Join(errs, "; "), task)
		}
		return nil
	}()
}

// CheckForget refuses, before podman is contacted, a task id that is
// invalid or of which nothing is known: neither state nor a HOME image (a
// task whose state dir was lost can still be forgotten).
func CheckForget(cfg *config.Config, task taskid.ID) error { return checkForget(cfg, task) }

func checkForget(cfg *config.Config, task taskid.ID) error {
	err := CheckTask(cfg, task)
	if err == nil || !errors.Is(err, ErrUnknownTask) {
		return err
	}
	if fileExists(home.NewStore(nil, cfg).Image(task)) {
		return nil
	}
	return err
}

// removeTaskDir removes a task's state directory.
func removeTaskDir(dir string) error {
	if !taskid.Valid(filepath.Base(dir)) {
		return fmt.Errorf("%q is no task's state dir", dir)
	}
	return os.RemoveAll(dir)
}

// releaseOutbox unmounts and removes the task's outbox (in the podman
// service's mount namespace too) and its pending deliveries.
func (r *Commands) releaseOutbox(task taskid.ID) error {
	peers, err := r.Homes.ServiceNamespaces()
	if err != nil {
		return err
	}
	return outbox.Release(r.Cfg.Outbox.Root, task, peers...)
}

// ReleaseIdle releases the HOME mounts and loop devices of tasks with no
// turn running and no prepared cage waiting (a killed shrooms leaves its
// HOME mounted), and those of HOME images that were deleted: one whose
// task still exists is copied back first, one whose task was forgotten is
// let go. It returns what it released and, as an error, what it could not
// (gc's phase kinds it).
func (r *Commands) ReleaseIdle(ctx context.Context) ([]string, error) {
	atts, err := r.Homes.Attachments()
	if err != nil {
		return nil, err
	}
	cages, err := r.managedCages(ctx)
	if err != nil {
		return nil, err
	}
	released := []string{}
	var left []string
	// Token secrets a killed turn left (a turn removes its own at its end).
	secrets, err := r.Podman.ListSecrets(ctx)
	if err != nil {
		return nil, err
	}
	for _, s := range secrets {
		task, ok := r.secretTask(s.Name)
		if !ok {
			continue
		}
		id, err := taskid.Parse(task)
		if err != nil || !r.taskSecret(id, s.Name, nil) {
			continue
		}
		if known, _ := r.Store.Exists(id); !known || len(r.waitingPrepared(cages, id)) > 0 {
			continue // not this state dir's, or a prepared cage waits with it
		}
		lock, err := r.Store.LockTask(id)
		if err != nil {
			continue // its turn runs
		}
		if err := r.Podman.RemoveSecret(ctx, s.Name); err != nil {
			left = append(left, "secret "+s.Name+": "+oneLine(err))
		} else {
			released = append(released, "secret "+s.Name)
		}
		lock.Release()
	}
	for _, a := range atts {
		vol := strings.TrimSuffix(filepath.Base(a.Image), ".img")
		task, ok := strings.CutPrefix(vol, r.Cfg.Home.VolumePrefix)
		if !ok || !taskid.Valid(task) {
			left = append(left, a.String()+" (not a HOME of this config's volume prefix; left alone)")
			continue
		}
		id, err := taskid.Parse(task)
		if err != nil {
			left = append(left, a.String()+" (not a task's HOME; left alone)")
			continue
		}
		known, _ := r.Store.Exists(id)
		if !known {
			// The task was forgotten: nothing of it is to be kept.
			if err := home.LetGo(a); err != nil {
				left = append(left, err.Error())
			} else {
				released = append(released, a.String())
			}
			continue
		}
		lock, err := r.Store.LockTask(id)
		if err != nil {
			continue // a turn runs: its HOME is in use
		}
		err = func() error {
			defer lock.Release()
			if busy, err := r.cages().InUse(ctx, id); err != nil || busy {
				return err // a prepared cage waits on it, or a cage was left
			}
			if a.Deleted {
				if err := home.Salvage(ctx, a); err != nil {
					return fmt.Errorf("%v (or `shrooms forget --task %s` discards it)", err, task)
				}
			}
			if err := home.ReleaseImage(a); err != nil {
				return err
			}
			released = append(released, a.String())
			return nil
		}()
		if err != nil {
			left = append(left, oneLine(err))
		}
	}
	if len(left) > 0 {
		return released, fmt.Errorf("%w: %s", ErrLeftovers, strings.Join(left, "; "))
	}
	return released, nil
}

// secretTask returns the task whose token secret name is (by this config's
// tokens: shrooms-<task>-<token>).
func (r *Commands) secretTask(name string) (string, bool) {
	for tok := range r.Cfg.Tokens {
		if t, ok := strings.CutSuffix(name, "-"+tok); ok {
			if t, ok := strings.CutPrefix(t, "shrooms-"); ok && taskid.Valid(t) {
				return t, true
			}
		}
	}
	return "", false
}

func fileExists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}
