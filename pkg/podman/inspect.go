package podman

import (
	"context"
	"fmt"
)

// CageNamed returns the container of that name or id as ListByLabel lists
// it, or nil when there is none: one inspection of a known cage instead of a
// listing of all containers.
func (c *Client) CageNamed(ctx context.Context, name string) (*Cage, error) {
	data, err := c.inspect(ctx, name)
	if err != nil {
		if isNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("inspect cage %s: %s", name, oneLine(err))
	}
	cg := &Cage{ID: data.ID, Name: data.Name, Image: data.Image, Runtime: data.OCIRuntime}
	if data.State != nil {
		cg.State, cg.Pid = data.State.Status, data.State.Pid
	}
	if data.Config != nil {
		cg.Labels = data.Config.Labels
	}
	return cg, nil
}
