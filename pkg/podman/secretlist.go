package podman

import (
	"context"
	"fmt"
	"net/http"
)

// Secret is what shrooms needs of a stored secret (never its value).
type Secret struct {
	Name   string
	Labels map[string]string
}

// ListSecrets lists every secret's name and labels.
func (c *Client) ListSecrets(ctx context.Context) ([]Secret, error) {
	var rs []struct {
		Spec struct {
			Name   string            `json:"Name"`
			Labels map[string]string `json:"Labels"`
		} `json:"Spec"`
	}
	if err := c.do(ctx, http.MethodGet, nil, nil, &rs, "secrets", "json"); err != nil {
		return nil, fmt.Errorf("list secrets: %w", err)
	}
	out := make([]Secret, 0, len(rs))
	for _, r := range rs {
		out = append(out, Secret{Name: r.Spec.Name, Labels: r.Spec.Labels})
	}
	return out, nil
}
