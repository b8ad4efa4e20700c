// Package kubecases is the matrix of what `shrooms kube` emits — every agent
// of the built-in and the example config, every network policy, plain and
// agent-sandbox objects — for the tests that hold it against PodSecurity
// (pkg/kube) and a real API server (test/kubeapi). Only tests import it.
package kubecases

import (
	"fmt"
	"maps"
	"slices"

	"github.com/shrooms-cage/shrooms/pkg/config"
	"github.com/shrooms-cage/shrooms/pkg/gateway"
	"github.com/shrooms-cage/shrooms/pkg/kube"
)

// Case is one `shrooms kube` invocation: kube.Build(Config, Input) and
// Objects.YAML are what the command prints.
type Case struct {
	Name   string
	Config *config.Config
	Input  kube.Input
}

// Policies are the network.policy values, with an allowlist that holds a
// CIDR and an address.
var Policies = []config.Network{
	{Policy: "internet"},
	{Policy: "allowlist", Allow: []string{"203.0.113.0/24", "198.51.100.7"}},
	{Policy: "none"},
}

// All returns the cases for the built-in defaults, the example config
// (exampleTOML: config.example.toml, whose agents use a gateway) and the
// defaults with cage.seccomp = "podman" (RuntimeDefault), each agent under
// each policy, plain and agent-sandbox. One case in each set also has a
// worktree claim, a runtime class, cluster CIDRs and a registry image.
func All(exampleTOML []byte) ([]Case, error) {
	example, err := config.Parse("config.example.toml", exampleTOML)
	if err != nil {
		return nil, err
	}
	podmanSeccomp := config.Default()
	podmanSeccomp.Cage.Seccomp = "podman"
	sets := []struct {
		name string
		cfg  *config.Config
	}{{"default", config.Default()}, {"example", example}, {"seccomp-podman", podmanSeccomp}}
	var out []Case
	for _, set := range sets {
		for _, agent := range slices.Sorted(maps.Keys(set.cfg.Agents)) {
			for _, net := range Policies {
				for _, plain := range []bool{true, false} {
					cfg := *set.cfg
					cfg.Network = net
					in := kube.Input{Task: "t1", Agent: agent, Turn: 2, Plain: plain,
						ShroomsImage: "localhost/shrooms:latest", ConfigTOML: []byte("# config\n"), Args: []string{"-p", "hello"}}
					if a := cfg.Agents[agent]; a.Gateway != "" {
						if in.Placeholder, err = gateway.NewPlaceholder(); err != nil {
							return nil, err
						}
					}
					form := "sandbox"
					if plain {
						form = "plain"
					}
					if agent == "shell" && net.Policy == "internet" {
						in.WorktreePVC, in.RuntimeClass = "shrooms-work-t1", "gvisor"
						in.ClusterCIDRs = []string{"10.96.0.0/12", "100.128.0.0/16"}
						in.ShroomsImage = "registry.example/shrooms:1.2"
					}
					out = append(out, Case{Name: fmt.Sprintf("%s/%s/%s/%s", set.name, agent, net.Policy, form), Config: &cfg, Input: in})
				}
			}
		}
	}
	return out, nil
}
