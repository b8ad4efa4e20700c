// Package profile is what shrooms knows of each agent, one file per agent
// (claude.go, codex.go, gemini.go, opencode.go, shell.go): the HOME paths of its settings and
// instructions, the credential files a token may seed, its keep-list with
// the filters and record-level rebuilds that carry state from one turn to
// the next, its managed policy, how a gateway signs it in, and its default
// agent. Everything else (the HOME reset, config validation, the cage) asks
// Lookup and knows no agent by name. It imports nothing of shrooms.
package profile

import (
	"reflect"
	"slices"
)

// Profile is one HOME profile.
type Profile struct {
	Name string
	// Settings and Instructions are the HOME paths the baseline's user
	// settings file and global instructions go to ("" for none).
	Settings, Instructions string
	// SettingsTOML: the settings file is TOML (Codex), not JSON.
	SettingsTOML bool
	// API is the only gateway API the agent can speak ("" for any).
	API string
	// BootstrapTargets are the keep-list files a token may seed at bootstrap.
	BootstrapTargets []string
	// PolicyDir is the managed policy's subdirectory of the task's policy
	// dir, mounted read-only at PolicyDest in the cage ("" for none).
	PolicyDir, PolicyDest string
	// PolicyRootOwned: the agent ignores policy files not owned by root,
	// so the policy dir and files belong to the cage's root (read-only
	// still: the mount is, and the agent runs as the cage user).
	PolicyRootOwned bool
	// Keep is the keep-list: credentials and sessions, nothing that runs
	// code or instructs the agent. Everything else under HOME is removed
	// every turn.
	Keep []Rule
	// Policy returns the managed policy files (by name, as JSON values) of
	// the owner's extra keys; nil for a profile without managed policy. An
	// owner key that would change an enforced one is an *EnforcedError.
	Policy func(managed map[string]any, gw Gateway) (map[string]any, error)
	// Seeded are kept files (KindFilter) the reset writes in a turn of the
	// profile's own agent when none was kept: the file's filter applied to
	// an empty object, that is the seeds the filter sets itself.
	Seeded []string
	// SignIn is the HOME path of the credentials file a gateway with a
	// subscription sign-in (auth = "oauth") writes ("" for none).
	SignIn string
	// Agent is the built-in agent of the profile's name (nil for none).
	Agent *Agent
}

// Agent is a built-in agent: its command, environment and HOME profiles.
type Agent struct {
	Command []string
	Env     map[string]string
	Home    []string
}

// Gateway is what the managed policy must pin when the turn's model
// requests go through shrooms' gateway.
type Gateway struct {
	// AnthropicBaseURL, when set, is the gateway's Anthropic API base URL.
	AnthropicBaseURL string
	// OpenAIBaseURL, when set, is the gateway's OpenAI API base URL.
	OpenAIBaseURL string
	// GeminiBaseURL, when set, is the gateway's Gemini API base URL.
	GeminiBaseURL string
}

// table's methods are the profiles, one per agent file
// (func (table) Claude() Profile). All finds them by reflection, so adding
// an agent is adding one file: no list to edit, nothing registered at init.
// Methods are listed in name order.
type table struct{}

// All returns every profile, in name order.
func All() []Profile {
	t := reflect.ValueOf(table{})
	out := make([]Profile, 0, t.NumMethod())
	for i := 0; i < t.NumMethod(); i++ {
		out = append(out, t.Method(i).Call(nil)[0].Interface().(Profile))
	}
	return out
}

// Lookup returns the named profile.
func Lookup(name string) (Profile, bool) {
	for _, p := range All() {
		if p.Name == name {
			return p, true
		}
	}
	return Profile{}, false
}

// Names are the profile names an agent's home list may use, in name order.
func Names() []string {
	var names []string
	for _, p := range All() {
		names = append(names, p.Name)
	}
	return names
}

// SignInProfiles are the profiles a subscription-signing gateway can sign in.
func SignInProfiles() []string {
	var names []string
	for _, p := range All() {
		if p.SignIn != "" {
			names = append(names, p.Name)
		}
	}
	return names
}

// SignInPath is the sign-in credentials file of the first of the named
// profiles that has one ("" for none).
func SignInPath(names []string) string {
	for _, name := range names {
		if p, ok := Lookup(name); ok && p.SignIn != "" {
			return p.SignIn
		}
	}
	return ""
}

// IsBootstrapTarget reports whether rel is a credential file of the profile.
func (p Profile) IsBootstrapTarget(rel string) bool {
	return slices.Contains(p.BootstrapTargets, rel)
}
