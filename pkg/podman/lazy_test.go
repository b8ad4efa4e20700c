package podman

import (
	"context"
	"errors"
	"net"
	"net/http"
	"path/filepath"
	"sync"
	"testing"

	"gotest.tools/v3/assert"

	"github.com/shrooms-cage/shrooms/internal/itest"
)

// TestLazyConnectsOnFirstUse: a Lazy client on a socket where nothing
// listens is made without error and fails its calls as Connect would; once
// a service listens, a new Lazy client's first call connects (the ping)
// and goes through, and nothing is asked before that call.
func TestLazyConnectsOnFirstUse(t *testing.T) {
	ctx := context.Background()
	sock := filepath.Join(t.TempDir(), "podman.sock")
	down := Lazy("unix://" + sock)
	_, err := down.VolumeExists(ctx, "x")
	assert.Assert(t, errors.Is(err, ErrUnreachable), "%v", err)
	_, err = Connect(ctx, "unix://"+sock)
	assert.Assert(t, errors.Is(err, ErrUnreachable), "Connect fails the same way: %v", err)
	_, err = Lazy("tcp://nowhere").VolumeExists(ctx, "x")
	assert.Assert(t, errors.Is(err, ErrUnreachable), "a bad uri fails the first call: %v", err)

	var mu sync.Mutex
	var asked []string
	l, err := net.Listen("unix", sock)
	assert.NilError(t, err)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		asked = append(asked, r.URL.Path)
		mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	})}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })

	up := Lazy("unix://" + sock)
	mu.Lock()
	assert.Equal(t, len(asked), 0, "Lazy asks nothing until its first call")
	mu.Unlock()
	ok, err := up.VolumeExists(ctx, "x")
	assert.NilError(t, err)
	assert.Assert(t, ok)
	_, err = up.VolumeExists(ctx, "y")
	assert.NilError(t, err)
	mu.Lock()
	defer mu.Unlock()
	assert.DeepEqual(t, asked, []string{"/v" + apiVersion + "/libpod/_ping", "/v" + apiVersion + "/libpod/volumes/x/exists", "/v" + apiVersion + "/libpod/volumes/y/exists"})
}

// TestLazyOnTheService: a Lazy client on the real service answers.
func TestLazyOnTheService(t *testing.T) {
	itest.Require(t, itest.Podman)
	_, err := Lazy(itest.Socket()).Info(context.Background())
	assert.NilError(t, err)
}
