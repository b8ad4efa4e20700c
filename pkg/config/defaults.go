package config

import (
	"maps"
	"slices"
	"time"

	"github.com/shrooms-cage/shrooms/pkg/profile"
)

// Default returns the built-in configuration: every key with a safe default.
func Default() *Config {
	return &Config{
		Podman: Podman{Socket: "unix:///run/podman/podman.sock"},
		State:  State{Dir: "/var/lib/shrooms"},
		Cage: Cage{
			Image:          "localhost/shrooms-agent:latest",
			Memory:         4 << 30,
			Pids:           1024,
			CPUs:           2,
			Nofile:         8192,
			Nproc:          2048,
			Timeout:        Duration(2 * time.Hour),
			StopGrace:      Duration(5 * time.Second),
			TmpSize:        1 << 30,
			TmpExec:        false,
			RunSize:        64 << 20,
			SubIDUser:      "shrooms",
			User:           1000,
			Seccomp:        "shrooms",
			Runtime:        RuntimeDefault,
			PrepareNext:    true,
			PreparedTTL:    Duration(time.Hour),
			TeardownLinger: Duration(time.Minute),
			HostnameFmt:    "cage-%s",
		},
		Network:  defaultNetwork(),
		Home:     defaultHome(),
		Outbox:   defaultOutbox(),
		Worktree: defaultWorktree(),
		Tokens:   map[string]string{},
		Gateway:  map[string]Gateway{},
		Agents:   defaultAgents(),
	}
}

// defaultAgents are the profiles' built-in agents, by profile name.
func defaultAgents() map[string]Agent {
	agents := map[string]Agent{}
	for _, p := range profile.All() {
		if p.Agent == nil {
			continue
		}
		agents[p.Name] = Agent{
			Command:  slices.Clone(p.Agent.Command),
			Env:      maps.Clone(p.Agent.Env),
			Home:     slices.Clone(p.Agent.Home),
			TokenEnv: map[string]string{},
		}
	}
	return agents
}
