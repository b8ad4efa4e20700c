package podman

import (
	"context"
	"fmt"

	"github.com/containers/podman/v5/pkg/bindings/secrets"
)

// Secret is what shrooms needs of a stored secret (never its value).
type Secret struct {
	Name   string
	Labels map[string]string
}

// ListSecrets lists every secret's name and labels.
func (c *Client) ListSecrets(ctx context.Context) ([]Secret, error) {
	cctx, done := c.scope(ctx)
	defer done()
	rs, err := secrets.List(cctx, nil)
	if err != nil {
		return nil, fmt.Errorf("list secrets: %w", err)
	}
	out := make([]Secret, 0, len(rs))
	for _, r := range rs {
		out = append(out, Secret{Name: r.Spec.Name, Labels: r.Spec.Labels})
	}
	return out, nil
}
