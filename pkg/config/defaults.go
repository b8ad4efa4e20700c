package config

import "time"

// Default returns the built-in configuration: every key with a safe default.
func Default() *Config {
	return &Config{
		Podman: Podman{Socket: "unix:///run/podman/podman.sock"},
		State:  State{Dir: "/var/lib/shrooms"},
		Cage: Cage{
			Image:       "localhost/shrooms-agent:latest",
			Memory:      4 << 30,
			Pids:        1024,
			CPUs:        2,
			Nofile:      8192,
			Nproc:       2048,
			Timeout:     Duration(2 * time.Hour),
			StopGrace:   Duration(5 * time.Second),
			TmpSize:     1 << 30,
			TmpExec:     false,
			RunSize:     64 << 20,
			SubIDUser:   "shrooms",
			User:        1000,
			Seccomp:     "shrooms",
			PrepareNext: true,
			HostnameFmt: "cage-%s",
		},
		Network:  defaultNetwork(),
		Home:     defaultHome(),
		Outbox:   defaultOutbox(),
		Worktree: Worktree{Roots: []string{}},
		Tokens:   map[string]string{},
		Gateway:  map[string]Gateway{},
		Agents: map[string]Agent{
			"claude": {
				Command:  []string{"claude", "--dangerously-skip-permissions"},
				Env:      map[string]string{"DISABLE_AUTOUPDATER": "1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"},
				Home:     []string{"claude", "shell"},
				TokenEnv: map[string]string{},
			},
			"opencode": {
				Command:  []string{"opencode", "run", "--auto"},
				Env:      map[string]string{"OPENCODE_DISABLE_AUTOUPDATE": "1", "OPENCODE_DISABLE_MODELS_FETCH": "1", "OPENCODE_DISABLE_LSP_DOWNLOAD": "1"},
				Home:     []string{"opencode", "shell"},
				TokenEnv: map[string]string{},
			},
			// Codex: approvals and its own sandbox off (the cage is the
			// boundary); its model is reached through a gateway, whose
			// provider the managed config pins.
			"codex": {
				Command:  []string{"codex", "exec", "--dangerously-bypass-approvals-and-sandbox", "--skip-git-repo-check"},
				Env:      map[string]string{},
				Home:     []string{"codex", "shell"},
				TokenEnv: map[string]string{},
			},
			"shell": {
				Command:  []string{"/bin/sh"},
				Env:      map[string]string{},
				Home:     []string{"shell"},
				TokenEnv: map[string]string{},
			},
		},
	}
}
