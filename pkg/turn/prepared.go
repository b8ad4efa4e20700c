package turn

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"github.com/containers/podman/v5/pkg/specgen"
	"golang.org/x/sys/unix"

	"github.com/shrooms-cage/shrooms/pkg/config"
	"github.com/shrooms-cage/shrooms/pkg/home"
	"github.com/shrooms-cage/shrooms/pkg/outbox"
	"github.com/shrooms-cage/shrooms/pkg/podman"
	"github.com/shrooms-cage/shrooms/pkg/sealed"
	"github.com/shrooms-cage/shrooms/pkg/seccomp"
	"github.com/shrooms-cage/shrooms/pkg/taskid"
)

// Where a prepared cage finds shrooms and its argv.
const (
	CageBinary = "/.shrooms/shrooms"
	CageArgv   = "/.shrooms/argv"
)

// Labels of prepared cages.
const (
	LabelPrepared = "io.shrooms.prepared"
	// LabelPreparedAt is when a prepared cage was made (RFC 3339, UTC).
	LabelPreparedAt = "io.shrooms.prepared-at"
	labelSpec       = "io.shrooms.spec"
	labelBaseline   = "io.shrooms.baseline"
	// What a cage takes in when it is created and keeps whatever changes
	// after: the image (podman resolves its name at create), the seccomp
	// profile's content (read at create) and the token secrets' values.
	labelImage   = "io.shrooms.image"
	labelSeccomp = "io.shrooms.seccomp"
	labelTokens  = "io.shrooms.tokens"
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
	in, err := r.check(ctx, req, aheadSteps())
	if err != nil {
		return "", err
	}
	lock, err := in.state.Lock()
	if err != nil {
		return "", Classify(err)
	}
	defer lock.Release()
	return r.prepareNextLocked(ctx, req.Task, in)
}

// prepareNextLocked is PrepareNext with the task lock held.
func (r *Runner) prepareNextLocked(ctx context.Context, task taskid.ID, in *checked) (string, error) {
	id, _, err := r.prepareNextKeeping(ctx, task, in)
	return id, err
}

// prepareNextKeeping is prepareNextLocked leaving the cages in keep (an
// exited one the caller removes itself) alone; it returns those of them
// the leftover listing saw as the task's own.
func (r *Runner) prepareNextKeeping(ctx context.Context, task taskid.ID, in *checked, keep ...string) (string, []podman.Cage, error) {
	_, kept, err := r.cages().RemoveLeftovers(ctx, task, keep...)
	if err != nil {
		return "", nil, fmt.Errorf("%w: remove leftover cages: %w", ErrHostNotReady, err)
	}
	id, err := r.prepareNextClean(ctx, task, in)
	return id, kept, err
}

// prepareNextClean prepares task's next cage once its leftovers are gone.
func (r *Runner) prepareNextClean(ctx context.Context, task taskid.ID, in *checked) (string, error) {
	p, err := r.prepare(ctx, task, in, aheadSteps())
	if err != nil {
		return "", err
	}
	if p.idmap {
		// runc has bound the staging mount once the cage is initialised
		// (or it never will): it goes on every path out.
		defer func() { _ = r.claims().Unstage(in.holder) }()
	}
	hash, err := specHash(p.spec)
	if err != nil {
		return "", err
	}
	p.spec.Labels[LabelPrepared] = "1"
	p.spec.Labels[labelSpec] = hash
	p.spec.Labels[labelBaseline] = p.reset.BaselineDigest
	prov, err := r.provenance(in.dir, in.image.ID, p, true)
	if err != nil {
		r.removeSecrets(p.secrets)
		return "", fmt.Errorf("%w: %w", ErrHostNotReady, err)
	}
	p.spec.Labels[labelImage] = prov.image
	p.spec.Labels[labelSeccomp] = prov.seccomp
	p.spec.Labels[labelTokens] = prov.tokens
	// When it was prepared: it expires after cage.prepared_ttl.
	p.spec.Labels[LabelPreparedAt] = time.Now().UTC().Format(time.RFC3339)
	if r.OnSpec != nil {
		r.OnSpec(p.spec)
	}
	id, err := r.Podman.Create(ctx, p.spec)
	if err != nil {
		_ = r.Podman.Remove(context.WithoutCancel(ctx), p.name)
		r.removeSecrets(p.secrets)
		return "", fmt.Errorf("%w: %w", ErrHostNotReady, err)
	}
	if err := r.Podman.Init(ctx, id); err != nil {
		_ = r.Podman.Remove(context.WithoutCancel(ctx), id)
		r.removeSecrets(p.secrets)
		return "", fmt.Errorf("%w: %w", ErrHostNotReady, err)
	}
	// Its in-cage wall now, off the path of the turn that takes it (which
	// only verifies it).
	if _, err := r.wallCage(ctx, id, p, false); err != nil {
		_ = r.Podman.Remove(context.WithoutCancel(ctx), id)
		r.removeSecrets(p.secrets)
		return "", fmt.Errorf("%w: %w", ErrHostNotReady, err)
	}
	// Its idmapped worktree bound at init (the turn checks it again).
	if p.idmap {
		if err := r.checkWorktreeSeen(ctx, id, p.Plan); err != nil {
			_ = r.Podman.Remove(context.WithoutCancel(ctx), id)
			r.removeSecrets(p.secrets)
			return "", fmt.Errorf("%w: %w", ErrHostNotReady, err)
		}
	}
	// The reset's report belongs to the turn that takes this cage: it is
	// what that turn's HOME was cleaned of. The HOME's fingerprint, taken
	// now that the cage is initialised, is what the turn checks it by.
	fp, err := r.stableFingerprint(ctx, p.home)
	if err != nil {
		_ = r.Podman.Remove(context.WithoutCancel(ctx), id)
		r.removeSecrets(p.secrets)
		return "", fmt.Errorf("%w: %w", ErrHostNotReady, err)
	}
	if err := saveResetReport(in.dir, id, p.reset, fp); err != nil {
		_ = r.Podman.Remove(context.WithoutCancel(ctx), id)
		r.removeSecrets(p.secrets)
		return "", fmt.Errorf("%w: %w", ErrHostNotReady, err)
	}
	// The tree the reset swapped out goes now, not while the turn starts.
	_ = r.host().Cleanup(ctx, p.root)
	return id, nil
}

// fingerprintTries bounds the fingerprints a preparation takes while one
// comes out racy ("": an entry changed within homereset's 50 ms window),
// fingerprintPause apart. Without a fingerprint the turn falls back to a
// dry-run reset, which counts every file the baseline lays down as one to
// remove and so passes over a HOME that only holds the reset's output.
const (
	fingerprintTries = 4
	fingerprintPause = 60 * time.Millisecond
)

// stableFingerprint is HOME's fingerprint once no entry is newer than the
// racy window (off the turn's path: the turn only compares it), "" when
// HOME keeps changing.
func (r *Runner) stableFingerprint(ctx context.Context, t home.Task) (string, error) {
	for try := 1; ; try++ {
		fp, err := r.host().HomeFingerprint(ctx, t)
		if err != nil || fp != "" || try == fingerprintTries {
			return fp, err
		}
		select {
		case <-ctx.Done():
			return "", nil
		case <-time.After(fingerprintPause):
		}
	}
}

// preparedResetFile holds the reset report of the task's prepared cage.
const preparedResetFile = "prepared-reset.json"

type preparedReset struct {
	Cage  string       `json:"cage"`
	Reset *home.Report `json:"reset"`
	// Home is the HOME's fingerprint once the cage was initialised on it
	// (home.Fingerprint), "" when it could not be taken.
	Home string `json:"home,omitempty"`
}

func saveResetReport(taskDir, cage string, rep *home.Report, home string) error {
	b, err := json.Marshal(preparedReset{Cage: cage, Reset: rep, Home: home})
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
// cage and the HOME's fingerprint then, or nil when the file is missing or
// names another cage.
func loadResetReport(taskDir, cage string) *preparedReset {
	b, err := os.ReadFile(filepath.Join(taskDir, preparedResetFile))
	if err != nil {
		return nil
	}
	var pr preparedReset
	if json.Unmarshal(b, &pr) != nil || pr.Cage != cage || pr.Reset == nil {
		return nil
	}
	return &pr
}

// takePrepared returns the id of a prepared cage that runs req exactly as a
// fresh one would, with its argv handed over, or "" when there is none. A
// prepared cage that does not match is left for the leftover sweep; skipped
// then says why (the turn's result reports it).
func (r *Runner) takePrepared(ctx context.Context, task taskid.ID, in *checked) (id string, p *prepared, skipped string, err error) {
	if r.Binary == "" {
		return "", nil, "", nil
	}
	last, err := in.state.LastTurn()
	if err != nil {
		return "", nil, "", fmt.Errorf("%w: %w", ErrHostNotReady, err)
	}
	// The prepared cage has the next turn's name: one inspection, not a
	// listing of every container.
	cage, err := r.Podman.CageNamed(ctx, sealed.Name(task, last+1))
	if err != nil {
		return "", nil, "", fmt.Errorf("%w: %w", ErrHostNotReady, err)
	}
	if cage == nil {
		return "", nil, "", nil
	}
	c := *cage
	switch {
	case !r.ours(c) || c.Labels[LabelPrepared] != "1":
		// A leftover of a crashed turn, not a prepared cage.
		return "", nil, "", nil
	case c.Labels[sealed.LabelTurn] != strconv.Itoa(last+1):
		return "", nil, "prepared for turn " + c.Labels[sealed.LabelTurn] + ", not " + strconv.Itoa(last+1), nil
	case c.State != "initialized" && c.State != "created":
		return "", nil, "not waiting (state " + c.State + ")", nil
	}
	p, skipped, err = r.matchPrepared(ctx, task, in, c)
	if err != nil || p == nil {
		return "", nil, skipped, err
	}
	if c.State == "initialized" {
		p.pid = c.Pid // its wall and resolver need it: no second inspection
	}
	if err := writeArgvFile(in.dir+"/argv", p.argv); err != nil {
		return "", nil, "", fmt.Errorf("%w: %w", ErrHostNotReady, err)
	}
	if err := countTurn(in.state, in.agentName, in.worktree); err != nil {
		return "", nil, "", err
	}
	return c.ID, p, "", nil
}

// Why a waiting prepared cage was not taken (Result.PreparedSkipped).
const (
	SkipSpec        = "spec differs"
	SkipHomeMount   = "HOME not mounted"
	SkipOutbox      = "outbox not ready"
	SkipFingerprint = "HOME fingerprint differs"
	SkipBaseline    = "baseline differs"
	SkipDryRun      = "HOME changed since its reset"
	SkipProvenance  = "image, seccomp profile or tokens differ"
)

// matchPrepared returns the turn's plan when the prepared cage c runs req
// exactly as a fresh one would, and nil with the reason when it does not.
func (r *Runner) matchPrepared(ctx context.Context, task taskid.ID, in *checked, c podman.Cage) (*prepared, string, error) {
	p, err := r.prepare(ctx, task, in, matchSteps())
	if err != nil {
		return nil, "", err
	}
	hash, err := specHash(p.spec)
	if err != nil {
		return nil, "", err
	}
	if hash != c.Labels[labelSpec] {
		return nil, SkipSpec, nil
	}
	// Its HOME must still be the capped filesystem it was reset on (a
	// dry-run reset of the bare volume directory would write there).
	if !r.host().HomeMounted(in.home, p.home.Root) {
		return nil, SkipHomeMount, nil
	}
	// And its outbox the empty capped tmpfs it was given (outbox.go).
	if dev, ok := recordedOutbox(in.dir); !ok || r.host().OutboxReady(r.Cfg.Outbox.Root, task, p.home.UID, p.home.GID, outbox.LimitsFrom(r.Cfg.Outbox), dev) != nil {
		return nil, SkipOutbox, nil
	}
	// Nothing may have changed HOME since it was reset for this cage: its
	// fingerprint is still the one taken then (metadata only; a dry-run
	// reset would rebuild every kept file, a 100 MiB opencode.db in full).
	// Without one (a racy or older preparation) the dry run decides.
	saved := loadResetReport(in.dir, c.ID)
	if saved != nil && saved.Home != "" {
		fp, err := r.host().HomeFingerprint(ctx, p.home)
		switch {
		case err != nil:
			return nil, SkipFingerprint + " (" + err.Error() + ")", nil
		case fp != saved.Home:
			return nil, SkipFingerprint, nil
		case saved.Reset.BaselineDigest != c.Labels[labelBaseline]:
			return nil, SkipBaseline, nil
		}
	} else {
		why := "no fingerprint"
		if saved == nil {
			why = "no reset report for the cage"
		}
		rep, err := r.host().Reset(ctx, home.ResetInput{Task: p.home, DryRun: true})
		switch {
		case err != nil:
			return nil, fmt.Sprintf("%s (%s; dry run: %v)", SkipDryRun, why, err), nil
		case rep.RemovedCount != 0 || rep.Recovered != "" || len(rep.Warnings) != 0:
			return nil, fmt.Sprintf("%s (%s; dry run: %d to remove, %d warnings, recovered %q)", SkipDryRun, why, rep.RemovedCount, len(rep.Warnings), rep.Recovered), nil
		case rep.BaselineDigest != c.Labels[labelBaseline]:
			return nil, SkipBaseline + " (" + why + ")", nil
		}
		saved = &preparedReset{Reset: rep}
	}
	// The cage must run what a fresh one would: the image, seccomp profile
	// and tokens as they are now, not as they were when it was created.
	if !r.sameProvenance(in.dir, in.image.ID, p, c) {
		return nil, SkipProvenance, nil
	}
	p.image, p.runtime = c.Image, c.Runtime
	// The turn reports what the preparation's reset removed.
	p.reset = saved.Reset
	// The secrets were put when the cage was prepared; they go with it.
	p.secrets = slices.Sorted(maps.Keys(p.Plan.secrets))
	return p, "", nil
}

// preparedLabels are the labels a prepared cage gets beyond its spec's.
var preparedLabels = []string{LabelPrepared, labelSpec, labelBaseline, labelImage, labelSeccomp, labelTokens}

// specHash identifies a prepared cage's spec, its own labels aside.
func specHash(s *specgen.SpecGenerator) (string, error) {
	c := *s
	c.Labels = map[string]string{}
	for k, v := range s.Labels {
		if !slices.Contains(preparedLabels, k) {
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

// provenance is what a cage took in when it was created: the image id, the
// seccomp profile's digest and a keyed digest of the token secrets.
type provenance struct{ image, seccomp, tokens string }

// provenance is what a cage created now for p from image (its id) would
// take in. With create, the task's digest key (in the task's directory,
// taskDir) is made when it is missing.
func (r *Runner) provenance(taskDir, image string, p *prepared, create bool) (provenance, error) {
	seccompDigest, err := r.seccompDigest(p.spec.SeccompProfilePath)
	if err != nil {
		return provenance{}, err
	}
	key, err := tokenKey(taskDir, create)
	if err != nil {
		return provenance{}, err
	}
	return provenance{image: image, seccomp: seccompDigest, tokens: tokensDigest(key, p.Plan.secrets)}, nil
}

// sameProvenance reports whether prepared cage c was created from what a
// fresh cage for p would take in now; a mismatch or any doubt discards it.
func (r *Runner) sameProvenance(taskDir, image string, p *prepared, c podman.Cage) bool {
	now, err := r.provenance(taskDir, image, p, false)
	if err != nil || now.image == "" || now.seccomp == "" || now.tokens == "" {
		return false
	}
	// The label says what was checked at preparation, the cage's own image
	// what podman resolved at its create.
	return c.Image == now.image && c.Labels[labelImage] == now.image &&
		c.Labels[labelSeccomp] == now.seccomp && c.Labels[labelTokens] == now.tokens
}

// seccompDigest is the digest of the profile a cage created now gets: the
// built-in one is this binary's (a turn installs it before its create),
// whatever the state dir's copy holds.
func (r *Runner) seccompDigest(path string) (string, error) {
	if r.Cfg.Cage.Seccomp == "shrooms" {
		sum := sha256.Sum256(seccomp.ProfileFor(gvisor(r.Cfg.Cage.Runtime)))
		return "sha256:" + hex.EncodeToString(sum[:]), nil
	}
	return profileDigest(path)
}

// maxProfile bounds the seccomp profile read for its digest.
const maxProfile = 16 << 20

// profileDigest is the sha256 of the seccomp profile file's content
// ("podman-default" for podman's built-in profile).
func profileDigest(path string) (string, error) {
	if path == "" {
		return "podman-default", nil
	}
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return "", fmt.Errorf("seccomp profile: %w", err)
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return "", fmt.Errorf("seccomp profile %s is not a regular file", path)
	}
	h := sha256.New()
	n, err := io.Copy(h, io.LimitReader(f, maxProfile+1))
	if err != nil {
		return "", fmt.Errorf("seccomp profile: %w", err)
	}
	if n > maxProfile {
		return "", fmt.Errorf("seccomp profile %s is larger than %d bytes", path, maxProfile)
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), nil
}

// tokenKeyFile holds the task's key for the token digests on prepared
// cages' labels: a label anyone who can list containers reads must not be
// a plain hash a short token could be guessed from.
const tokenKeyFile = "prepared-token-key"

// tokenKey returns the task's digest key, made (32 random bytes) when it is
// missing and create is set.
func tokenKey(taskDir string, create bool) ([]byte, error) {
	path := filepath.Join(taskDir, tokenKeyFile)
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if errors.Is(err, fs.ErrNotExist) && create {
		key := make([]byte, 32)
		if _, err := rand.Read(key); err != nil {
			return nil, fmt.Errorf("token digest key: %w", err)
		}
		return key, writeKey(path, key)
	}
	if err != nil {
		return nil, fmt.Errorf("token digest key: %w", err)
	}
	defer f.Close()
	key := make([]byte, 33)
	n, err := io.ReadFull(f, key)
	if n != 32 || !errors.Is(err, io.ErrUnexpectedEOF) {
		return nil, fmt.Errorf("token digest key %s: not 32 bytes", path)
	}
	return key[:32], nil
}

func writeKey(path string, key []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("token digest key: %w", err)
	}
	if _, err := f.Write(key); err != nil {
		f.Close()
		return fmt.Errorf("token digest key: %w", err)
	}
	return f.Close()
}

// tokensDigest is an HMAC of the secrets' names and values.
func tokensDigest(key []byte, secrets map[string][]byte) string {
	m := hmac.New(sha256.New, key)
	for _, name := range slices.Sorted(maps.Keys(secrets)) {
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(secrets[name])))
		m.Write([]byte(name))
		m.Write([]byte{0})
		m.Write(n[:])
		m.Write(secrets[name])
	}
	return "hmac-sha256:" + hex.EncodeToString(m.Sum(nil))
}

// ranImage puts the image the cage was created from in the result: podman
// resolves the image's name at create, which may be after the check named
// another image under it. A cage whose image cannot be told fails the turn.
func (r *Runner) ranImage(ctx context.Context, id string, p *prepared, res *Result) error {
	ran := p.image
	if ran == "" {
		c, err := r.Podman.CageNamed(ctx, id)
		if err != nil {
			return fmt.Errorf("%w: %w", ErrHostNotReady, err)
		}
		if c == nil || c.Image == "" {
			return fmt.Errorf("%w: cage %s: podman does not say which image it was created from", ErrHostNotReady, id)
		}
		ran, p.runtime = c.Image, c.Runtime
	}
	if res.Image != nil && res.Image.ID == ran {
		return nil
	}
	img := podman.Image{ID: ran}
	if res.Image != nil {
		img.Name = res.Image.Name
	}
	if i, err := r.Podman.InspectImage(ctx, ran); err == nil {
		img.Digest = i.Digest
	}
	res.Image = &img
	return nil
}

// ranRuntime puts the OCI runtime the cage runs with in the result and,
// when cage.runtime asks for one, refuses a cage that has another: podman
// before 5.x ignores a per-container runtime over its API and would run
// the service's own without a word.
func (r *Runner) ranRuntime(ctx context.Context, id string, p *prepared, res *Result) error {
	res.Runtime = p.runtime
	want := r.Cfg.Cage.Runtime
	if gvisor(p.runtime) && !gvisor(want) {
		// The gVisor seccomp profile (clone3) and the process cap that
		// keeps a fork flood from killing the Sentry are chosen from
		// cage.runtime before podman names the runtime.
		return fmt.Errorf("%w: podman runs cage %s under runsc but cage.runtime is %q: set cage.runtime = %q so the cage gets gVisor's seccomp profile and process cap", ErrHostNotReady, id, want, p.runtime)
	}
	if want == config.RuntimeDefault {
		return nil
	}
	// An explicit runtime is provenance worth its version (the pinned
	// runsc's): podman's info reports its default runtime's.
	info, err := r.Podman.Info(ctx)
	if err != nil {
		return fmt.Errorf("%w: cage.runtime: %w", ErrHostNotReady, err)
	}
	if podman.RuntimeIs(want, p.runtime, info) {
		if info.OCIRuntimePath != "" && podman.RuntimeIs(info.OCIRuntimePath, p.runtime, info) {
			res.RuntimeVersion = info.OCIRuntimeVersion
		}
		return nil
	}
	return fmt.Errorf("%w: cage.runtime is %q but podman runs cage %s with %q (%s): a podman service before 5.x takes no per-cage runtime, start it with --runtime %s", ErrHostNotReady, want, id, p.runtime, info.OCIRuntimePath, want)
}
