package podman

import (
	"context"
	"fmt"
)

// OOMKilled reports whether the kernel's OOM killer ended a process of the
// container (podman inspect's State.OOMKilled).
func (c *Client) OOMKilled(ctx context.Context, id string) (bool, error) {
	// The exit Follow just read says it: no second inspection.
	if oom, ok := c.exited.get(id); ok {
		return oom, nil
	}
	data, err := c.inspect(ctx, id)
	if err != nil {
		return false, fmt.Errorf("inspect cage: %s", oneLine(err))
	}
	if data.State == nil {
		return false, fmt.Errorf("inspect cage: no state")
	}
	return data.State.OOMKilled, nil
}
