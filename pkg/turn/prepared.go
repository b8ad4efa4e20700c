package turn

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"

	"github.com/containers/podman/v5/pkg/specgen"
	"golang.org/x/sys/unix"

	"github.com/shrooms-cage/shrooms/pkg/homereset"
	"github.com/shrooms-cage/shrooms/pkg/podman"
	"github.com/shrooms-cage/shrooms/pkg/sealed"
)

// Where a prepared cage finds shrooms and its argv.
const (
	CageBinary = "/.shrooms/shrooms"
	CageArgv   = "/.shrooms/argv"
)

// Labels of prepared cages.
const (
	LabelPrepared = "io.shrooms.prepared"
	labelSpec     = "io.shrooms.spec"
	labelBaseline = "io.shrooms.baseline"
)

// PrepareNext does everything of the task's next turn that can be done
// before it is asked for: HOME reset, mounts, secrets, and the cage created
// and initialised (namespaces, mounts, network) but not started. A later
// Run with the same request (up to its argv) only hands over the argv and
// starts it; any difference — config, worktree, agent, stdin, baseline, or
// anything found in HOME — discards the prepared cage and runs as usual.
//
// No code of the cage runs before its Run: the HOME a prepared cage sees is
// the one reset here, and Run verifies it is still exactly that.
func (r *Runner) PrepareNext(ctx context.Context, req Request) (string, error) {
	in, err := r.check(ctx, req, modeAhead)
	if err != nil {
		return "", err
	}
	lock, err := r.Store.LockTask(in.task)
	if err != nil {
		return "", Classify(err)
	}
	defer lock.Release()
	return r.prepareNextLocked(ctx, req, in)
}

// prepareNextLocked is PrepareNext with the task lock held.
func (r *Runner) prepareNextLocked(ctx context.Context, req Request, in *checked) (string, error) {
	if _, err := r.RemoveLeftovers(ctx, req.Task); err != nil {
		return "", fmt.Errorf("%w: remove leftover cages: %w", ErrHostNotReady, err)
	}
	p, err := r.prepare(ctx, req, in, modeAhead)
	if err != nil {
		return "", err
	}
	hash, err := specHash(p.spec)
	if err != nil {
		return "", err
	}
	p.spec.Labels[LabelPrepared] = "1"
	p.spec.Labels[labelSpec] = hash
	p.spec.Labels[labelBaseline] = p.reset.BaselineDigest
	if r.OnSpec != nil {
		r.OnSpec(p.spec)
	}
	id, err := r.Podman.Create(ctx, p.spec)
	if err != nil {
		_ = r.Podman.Remove(context.WithoutCancel(ctx), sealed.Name(req.Task, p.turn))
		r.removeSecrets(p.secrets)
		return "", fmt.Errorf("%w: %w", ErrHostNotReady, err)
	}
	if err := r.Podman.Init(ctx, id); err != nil {
		_ = r.Podman.Remove(context.WithoutCancel(ctx), id)
		r.removeSecrets(p.secrets)
		return "", fmt.Errorf("%w: %w", ErrHostNotReady, err)
	}
	// The reset's report belongs to the turn that takes this cage: it is
	// what that turn's HOME was cleaned of.
	if err := saveResetReport(r.TaskDir(req.Task), id, p.reset); err != nil {
		_ = r.Podman.Remove(context.WithoutCancel(ctx), id)
		r.removeSecrets(p.secrets)
		return "", fmt.Errorf("%w: %w", ErrHostNotReady, err)
	}
	// The tree the reset swapped out goes now, not while the turn starts.
	_ = r.host().Cleanup(ctx, p.root)
	return id, nil
}

// preparedResetFile holds the reset report of the task's prepared cage.
const preparedResetFile = "prepared-reset.json"

type preparedReset struct {
	Cage  string            `json:"cage"`
	Reset *homereset.Report `json:"reset"`
}

func saveResetReport(taskDir, cage string, rep *homereset.Report) error {
	b, err := json.Marshal(preparedReset{Cage: cage, Reset: rep})
	if err != nil {
		return fmt.Errorf("prepared cage's reset report: %w", err)
	}
	tmp := filepath.Join(taskDir, "."+preparedResetFile+".tmp")
	_ = os.Remove(tmp)
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("prepared cage's reset report: %w", err)
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return fmt.Errorf("prepared cage's reset report: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("prepared cage's reset report: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(taskDir, preparedResetFile)); err != nil {
		return fmt.Errorf("prepared cage's reset report: %w", err)
	}
	return nil
}

// loadResetReport returns the report of the reset made for prepared cage
// cage, or nil when the file is missing or names another cage.
func loadResetReport(taskDir, cage string) *homereset.Report {
	b, err := os.ReadFile(filepath.Join(taskDir, preparedResetFile))
	if err != nil {
		return nil
	}
	var pr preparedReset
	if json.Unmarshal(b, &pr) != nil || pr.Cage != cage {
		return nil
	}
	return pr.Reset
}

// takePrepared returns the id of a prepared cage that runs req exactly as a
// fresh one would, with its argv handed over, or "" when there is none. A
// prepared cage that does not match is left for RemoveLeftovers.
func (r *Runner) takePrepared(ctx context.Context, req Request, in *checked) (string, *prepared, error) {
	if r.Binary == "" {
		return "", nil, nil
	}
	last, err := r.Store.LastTurn(in.task)
	if err != nil {
		return "", nil, fmt.Errorf("%w: %w", ErrHostNotReady, err)
	}
	// The prepared cage has the next turn's name: one inspection, not a
	// listing of every container.
	cage, err := r.Podman.CageNamed(ctx, sealed.Name(req.Task, last+1))
	if err != nil {
		return "", nil, fmt.Errorf("%w: %w", ErrHostNotReady, err)
	}
	if cage == nil {
		return "", nil, nil
	}
	for _, c := range []podman.Cage{*cage} {
		if !r.Ours(c) || c.Labels[LabelPrepared] != "1" || c.Labels[sealed.LabelTurn] != strconv.Itoa(last+1) {
			continue
		}
		if c.State != "initialized" && c.State != "created" {
			continue
		}
		p, err := r.matchPrepared(ctx, req, in, c)
		if err != nil || p == nil {
			return "", nil, err
		}
		if err := writeArgvFile(r.TaskDir(req.Task)+"/argv", p.argv); err != nil {
			return "", nil, fmt.Errorf("%w: %w", ErrHostNotReady, err)
		}
		if err := r.countTurn(req, in); err != nil {
			return "", nil, err
		}
		return c.ID, p, nil
	}
	return "", nil, nil
}

// matchPrepared returns the turn's plan when the prepared cage c runs req
// exactly as a fresh one would, and nil when it does not.
func (r *Runner) matchPrepared(ctx context.Context, req Request, in *checked, c podman.Cage) (*prepared, error) {
	p, err := r.prepare(ctx, req, in, modeMatch)
	if err != nil {
		return nil, err
	}
	hash, err := specHash(p.spec)
	if err != nil || hash != c.Labels[labelSpec] {
		return nil, err
	}
	// Its HOME must still be the capped filesystem it was reset on (a
	// dry-run reset of the bare volume directory would write there).
	if !r.host().HomeMounted(req.Task, p.home.Root) {
		return nil, nil
	}
	// And its outbox the empty capped tmpfs it was given (outbox.go).
	if !r.preparedOutboxReady(req.Task, p.Plan) {
		return nil, nil
	}
	// Nothing may have changed HOME since it was reset for this cage.
	rep, err := r.host().Reset(ctx, homereset.ResetInput{Task: p.home, DryRun: true})
	if err != nil || rep.RemovedCount != 0 || rep.Recovered != "" || len(rep.Warnings) != 0 || rep.BaselineDigest != c.Labels[labelBaseline] {
		return nil, nil
	}
	// The turn reports what the preparation's reset removed (this
	// check's dry run finds nothing by construction).
	p.reset = rep
	if saved := loadResetReport(r.TaskDir(req.Task), c.ID); saved != nil {
		p.reset = saved
	}
	// The secrets were put when the cage was prepared; they go with it.
	p.secrets = slices.Sorted(maps.Keys(p.Plan.secrets))
	return p, nil
}

// TaskDir is the task's directory in the state directory.
func (r *Runner) TaskDir(task string) string { return r.Cfg.State.Dir + "/tasks/" + task }

// specHash identifies a prepared cage's spec, its own labels aside.
func specHash(s *specgen.SpecGenerator) (string, error) {
	c := *s
	c.Labels = map[string]string{}
	for k, v := range s.Labels {
		if k != LabelPrepared && k != labelSpec && k != labelBaseline {
			c.Labels[k] = v
		}
	}
	b, err := json.Marshal(&c)
	if err != nil {
		return "", fmt.Errorf("spec hash: %w", err)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:16]), nil
}

// writeArgvFile rewrites the argv file in place: a prepared cage has the
// file's inode bind-mounted, so it must stay the same file.
func writeArgvFile(path string, argv []string) error {
	if argv == nil {
		argv = []string{}
	}
	b, err := json.Marshal(argv)
	if err != nil {
		return fmt.Errorf("argv file: %w", err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o644)
	if err != nil {
		return fmt.Errorf("argv file: %w", err)
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return fmt.Errorf("argv file: %w", err)
	}
	return f.Close()
}
