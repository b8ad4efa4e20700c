package turn

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containers/podman/v5/pkg/specgen"
	"gotest.tools/v3/assert"

	"github.com/shrooms-cage/shrooms/pkg/config"
	"github.com/shrooms-cage/shrooms/pkg/engine"
	"github.com/shrooms-cage/shrooms/pkg/home"
	"github.com/shrooms-cage/shrooms/pkg/homereset"
	"github.com/shrooms-cage/shrooms/pkg/outbox"
	"github.com/shrooms-cage/shrooms/pkg/podman"
	"github.com/shrooms-cage/shrooms/pkg/taskid"
	"github.com/shrooms-cage/shrooms/pkg/taskstate"
)

// pipeEngine is an in-memory podman for the pipeline's unit tests: each
// call can be made to fail, and what the runner did is recorded.
type pipeEngine struct {
	engine.Engine
	mu sync.Mutex
	// Failures to inject.
	createErr, initErr, startErr, waitErr, removeErr error
	putErr                                           map[string]error
	putHook                                          func(name string)
	// block keeps the cage running until its context ends.
	block    bool
	exitCode int32
	// started is closed when the cage starts.
	started     chan struct{}
	startedOnce sync.Once
	// Recorded.
	specs   []*specgen.SpecGenerator
	cages   []podman.Cage
	calls   []string
	secrets map[string][]byte
	// everSecrets are all secrets ever put.
	everSecrets []string
	// createdImage, when set, is the image id Create resolves ("-": none).
	createdImage string
}

func newPipeEngine() *pipeEngine {
	return &pipeEngine{secrets: map[string][]byte{}, started: make(chan struct{})}
}

func (f *pipeEngine) call(c string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, c)
}

func (f *pipeEngine) called(c string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, x := range f.calls {
		if x == c {
			n++
		}
	}
	return n
}

func (f *pipeEngine) ImageExists(context.Context, string) (bool, error) { return true, nil }

func (f *pipeEngine) InspectImage(_ context.Context, ref string) (podman.Image, error) {
	return podman.Image{Name: ref, ID: strings.Repeat("ab", 32), Digest: "sha256:" + strings.Repeat("cd", 32)}, nil
}

func (f *pipeEngine) VolumeExists(context.Context, string) (bool, error) { return false, nil }

func (f *pipeEngine) InspectVolume(_ context.Context, name string) (*podman.Volume, error) {
	return nil, fmt.Errorf("inspect volume %s: no such volume", name)
}

func (f *pipeEngine) Info(context.Context) (*podman.HostInfo, error) {
	return &podman.HostInfo{GraphRoot: "/var/lib/containers/storage"}, nil
}

func (f *pipeEngine) ListByLabel(_ context.Context, label, value string) ([]podman.Cage, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []podman.Cage
	for _, c := range f.cages {
		if c.Labels[label] == value {
			out = append(out, c)
		}
	}
	return out, nil
}

func (f *pipeEngine) CageNamed(_ context.Context, name string) (*podman.Cage, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range f.cages {
		if c.Name == name || c.ID == name {
			return &c, nil
		}
	}
	return nil, nil
}

func (f *pipeEngine) Create(_ context.Context, s *specgen.SpecGenerator) (string, error) {
	f.call("create")
	if f.createErr != nil {
		return "", f.createErr
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.specs = append(f.specs, s)
	id := "id-" + s.Name
	image := strings.Repeat("ab", 32)
	switch f.createdImage {
	case "":
	case "-":
		image = ""
	default:
		image = f.createdImage
	}
	f.cages = append(f.cages, podman.Cage{ID: id, Name: s.Name, Labels: s.Labels, State: "created", Image: image})
	return id, nil
}

// Pid is a process of the cage's, for the resolver's network namespace
// (the test's resolvers do not open it).
func (f *pipeEngine) Pid(context.Context, string) (int, error) {
	f.call("pid")
	return os.Getpid(), nil
}

func (f *pipeEngine) Init(_ context.Context, id string) error {
	f.call("init")
	if f.initErr != nil {
		return f.initErr
	}
	f.setState(id, "initialized")
	return nil
}

func (f *pipeEngine) setState(id, state string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i := range f.cages {
		if f.cages[i].ID == id {
			f.cages[i].State = state
		}
	}
}

func (f *pipeEngine) Start(ctx context.Context, id string, _ podman.Streams) (<-chan error, error) {
	f.call("start")
	if f.startErr != nil {
		return nil, f.startErr
	}
	f.startedOnce.Do(func() { close(f.started) })
	ended := make(chan error, 1)
	if !f.block {
		ended <- nil
	}
	return ended, nil
}

func (f *pipeEngine) ExitCode(ctx context.Context, id string) (int32, bool, error) {
	if f.waitErr != nil {
		return -1, false, f.waitErr
	}
	return f.exitCode, true, nil
}

func (f *pipeEngine) Wait(ctx context.Context, id string) (int32, error) {
	f.call("wait")
	if f.block {
		<-ctx.Done()
		return -1, ctx.Err()
	}
	if f.waitErr != nil {
		return -1, f.waitErr
	}
	return f.exitCode, nil
}

// Follow is the real client's wait from the attach stream: it ends with
// the stream (or ctx), then answers as Wait does.
func (f *pipeEngine) Follow(ctx context.Context, id string, _ podman.Streams, attached <-chan error) (int32, error) {
	select {
	case <-attached:
	case <-ctx.Done():
		f.call("wait")
		return -1, ctx.Err()
	}
	return f.Wait(ctx, id)
}

func (f *pipeEngine) Stop(context.Context, string, time.Duration) error {
	f.call("stop")
	return nil
}

func (f *pipeEngine) Remove(_ context.Context, id string) error {
	f.call("remove")
	if f.removeErr != nil {
		return f.removeErr
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, c := range f.cages {
		if c.ID == id || c.Name == id {
			f.cages = append(f.cages[:i], f.cages[i+1:]...)
			break
		}
	}
	return nil
}

func (f *pipeEngine) OOMKilled(context.Context, string) (bool, error) { return false, nil }

func (f *pipeEngine) PutSecret(_ context.Context, name string, data []byte, _ map[string]string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.putHook != nil {
		f.putHook(name)
	}
	if err := f.putErr[name]; err != nil {
		return err
	}
	f.secrets[name] = data
	f.everSecrets = append(f.everSecrets, name)
	return nil
}

func (f *pipeEngine) RemoveSecret(_ context.Context, name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.secrets, name)
	return nil
}

// fakeHost is Host without root: HOME is a plain directory.
type fakeHost struct {
	root     string
	resetErr error
	mu       sync.Mutex
	resets   int
	cleanups int
	outboxes int
}

func (h *fakeHost) OpenHome(context.Context, taskid.ID, bool) (string, bool, error) {
	return h.root, false, nil
}
func (h *fakeHost) ReleaseHome(taskid.ID) error                           { return nil }
func (h *fakeHost) HomeMounted(home.Volume, string) bool                  { return true }
func (h *fakeHost) HomeRoot(context.Context, home.Volume) (string, error) { return h.root, nil }
func (h *fakeHost) DiscardHome(context.Context, home.Volume, string)      {}
func (h *fakeHost) Bootstrap(context.Context, homereset.Task) (*homereset.BootstrapResult, error) {
	return &homereset.BootstrapResult{Result: homereset.AlreadyBootstrapped}, nil
}

func (h *fakeHost) Reset(_ context.Context, in homereset.ResetInput) (*homereset.Report, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !in.DryRun {
		h.resets++
	}
	if h.resetErr != nil {
		return nil, h.resetErr
	}
	return &homereset.Report{Home: homereset.HomeDir(in.Task.Root), DryRun: in.DryRun, BaselineDigest: "sha256:baseline"}, nil
}

func (h *fakeHost) HomeFingerprint(context.Context, homereset.Task) (string, error) {
	return "fp:fake", nil
}

func (h *fakeHost) Cleanup(context.Context, string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.cleanups++
	return nil
}

func (h *fakeHost) PlaceFile(string, string, []byte, uint32, int, int) error { return nil }

func (h *fakeHost) PrepareOutbox(context.Context, string, taskid.ID, int, int, int, outbox.Limits) (uint64, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.outboxes++
	return 1, nil
}

func (h *fakeHost) SettleOutbox(context.Context, string, taskid.ID, int, outbox.Limits) (*outbox.Moved, error) {
	return nil, nil
}

func (h *fakeHost) OutboxReady(string, taskid.ID, int, int, outbox.Limits, uint64) error { return nil }

// pipeRunner is a runner on a fake engine and a fake HOME, with a private
// state dir, subordinate id files and one token, for the claude agent.
func pipeRunner(t *testing.T, e *pipeEngine) (*Runner, *fakeHost) {
	t.Helper()
	dir := t.TempDir()
	cfg := config.Default()
	cfg.State.Dir = filepath.Join(dir, "state")
	cfg.Outbox.Root = filepath.Join(dir, "outbox")
	cfg.Network.Policy = "none"
	cfg.Tokens["anthropic"] = filepath.Join(dir, "anthropic.token")
	assert.NilError(t, os.WriteFile(cfg.Tokens["anthropic"], []byte("sk-test-token\n"), 0o600))
	a := cfg.Agents["claude"]
	a.TokenEnv = map[string]string{"ANTHROPIC_API_KEY": "anthropic"}
	cfg.Agents["claude"] = a
	ids := filepath.Join(dir, "subids")
	assert.NilError(t, os.WriteFile(ids, []byte("shrooms:1879048192:1073741824\n"), 0o600))
	h := &fakeHost{root: filepath.Join(dir, "home")}
	assert.NilError(t, os.MkdirAll(h.root, 0o700))
	return &Runner{
		Cfg: cfg, Podman: e, Host: h,
		Store:   taskstate.Store{Dir: cfg.State.Dir},
		IDFiles: taskstate.IDFiles{SubUID: ids, SubGID: ids, User: "shrooms"},
	}, h
}

var errBoom = errors.New("boom")
