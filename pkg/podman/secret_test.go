package podman

import (
	"context"
	"testing"

	"gotest.tools/v3/assert"

	"github.com/shrooms-cage/shrooms/internal/itest"
)

// TestPutSecretReplacesLeftover: a secret a killed turn left behind is
// replaced by the task's next turn (found by the soak: on podman 4.3 the
// bindings' Exists answers false for it, and every later turn failed).
func TestPutSecretReplacesLeftover(t *testing.T) {
	itest.Require(t, itest.Root, itest.Podman)
	ctx := context.Background()
	client, err := Connect(ctx, itest.Socket())
	assert.NilError(t, err)
	name := itest.UniqueName("shrooms-secret-test-")
	t.Cleanup(func() { _ = client.RemoveSecret(context.Background(), name) })
	assert.NilError(t, client.PutSecret(ctx, name, []byte("first"), map[string]string{"shrooms.test": "1"}))
	assert.NilError(t, client.PutSecret(ctx, name, []byte("second"), map[string]string{"shrooms.test": "1"}))
	assert.NilError(t, client.RemoveSecret(ctx, name))
	assert.NilError(t, client.RemoveSecret(ctx, name), "a missing secret is not an error")
}
