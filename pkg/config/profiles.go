package config

// AgentProfile is what shrooms knows of one HOME profile, in one place for
// config validation, the HOME reset, the managed policy and the kube pod.
// The keep-lists' rules (code, not data) are homereset's, by the same names.
type AgentProfile struct {
	Name string
	// Settings and Instructions are the HOME paths the baseline's user
	// settings file and global instructions go to ("" for none).
	Settings, Instructions string
	// SettingsTOML: the settings file is TOML (Codex), not JSON.
	SettingsTOML bool
	// BootstrapTargets are the keep-list files a token may seed at bootstrap.
	BootstrapTargets []string
	// PolicyDir is the managed policy's subdirectory of the task's policy
	// dir, mounted read-only at PolicyDest in the cage ("" for none).
	PolicyDir, PolicyDest string
}

// agentProfiles is the table of HOME profiles, in the order they are listed.
func agentProfiles() []AgentProfile {
	return []AgentProfile{
		{
			Name:             "claude",
			Settings:         ".claude/settings.json",
			Instructions:     ".claude/CLAUDE.md",
			BootstrapTargets: []string{".claude/.credentials.json", ".claude.json"},
			PolicyDir:        "claude-code",
			PolicyDest:       "/etc/claude-code",
		},
		{
			Name:             "opencode",
			Settings:         ".config/opencode/opencode.json",
			Instructions:     ".config/opencode/AGENTS.md",
			BootstrapTargets: []string{".local/share/opencode/auth.json", ".local/share/opencode/mcp-auth.json"},
			PolicyDir:        "opencode",
			PolicyDest:       "/etc/opencode",
		},
		{
			Name:             "codex",
			Settings:         ".codex/config.toml",
			SettingsTOML:     true,
			Instructions:     ".codex/AGENTS.md",
			BootstrapTargets: []string{".codex/auth.json"},
			PolicyDir:        "codex",
			PolicyDest:       "/etc/codex",
		},
		// Generic dotfiles: a baseline of files only; no keep-list, no policy.
		{Name: "shell", BootstrapTargets: []string{}},
	}
}

// Profile returns the named HOME profile's entry of the table.
func Profile(name string) (AgentProfile, bool) {
	for _, p := range agentProfiles() {
		if p.Name == name {
			return p, true
		}
	}
	return AgentProfile{}, false
}

// HomeProfiles are the profile names an agent's home list may use.
var HomeProfiles = profileNames()

func profileNames() []string {
	var names []string
	for _, p := range agentProfiles() {
		names = append(names, p.Name)
	}
	return names
}

// HomeBootstrapTargets are, per profile, the keep-list files a token may
// seed at bootstrap.
var HomeBootstrapTargets = bootstrapTargets()

func bootstrapTargets() map[string][]string {
	m := map[string][]string{}
	for _, p := range agentProfiles() {
		m[p.Name] = p.BootstrapTargets
	}
	return m
}
