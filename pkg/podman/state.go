package podman

import (
	"context"
	"fmt"

	"github.com/containers/podman/v5/pkg/bindings/containers"
)

// OOMKilled reports whether the kernel's OOM killer ended a process of the
// container (podman inspect's State.OOMKilled).
func (c *Client) OOMKilled(ctx context.Context, id string) (bool, error) {
	cctx, done := c.scope(ctx)
	defer done()
	data, err := containers.Inspect(cctx, id, new(containers.InspectOptions).WithSize(false))
	if err != nil {
		return false, fmt.Errorf("inspect cage: %s", oneLine(err))
	}
	if data.State == nil {
		return false, fmt.Errorf("inspect cage: no state")
	}
	return data.State.OOMKilled, nil
}
