package config

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/shrooms-cage/shrooms/pkg/profile"
)

// Home is the task HOME: a podman volume per task, reset every turn to the
// profiles' keep-lists plus the baseline declared here.
type Home struct {
	// VolumePrefix names the per-task volume: prefix + task id.
	VolumePrefix string `toml:"volume_prefix"`
	// Size caps the task HOME: the volume is an ext4 filesystem image of
	// this size (sparse, under state.dir), loop-mounted while it is used, so
	// a turn cannot fill the host's disk.
	Size Size `toml:"size"`
	// Inodes caps the number of files and directories that HOME holds.
	Inodes int64 `toml:"inodes"`
	// MaxFileSize caps each kept credential or JSON state file.
	MaxFileSize Size `toml:"max_file_size"`
	// MaxSessionFile caps each kept session file (transcript, database).
	MaxSessionFile Size `toml:"max_session_file"`
	// MaxKeepSize caps the total bytes kept from one turn to the next.
	MaxKeepSize Size `toml:"max_keep_size"`
	// MaxKeepFiles caps the number of files kept from one turn to the next.
	MaxKeepFiles int64 `toml:"max_keep_files"`
	// Profiles are the per-profile baselines, [home.<profile>], one for each
	// of profile.Names() (decoded by decodeHomeProfiles).
	Profiles map[string]*HomeProfile `toml:"-"`
}

// HomeProfile is the owner-declared baseline of one HOME profile, laid down
// fresh at the start of every turn. Settings and Instructions apply to the
// profiles that have them (see pkg/profile).
type HomeProfile struct {
	// Settings is the agent's user settings file as an inline table
	// (claude: ~/.claude/settings.json, opencode:
	// ~/.config/opencode/opencode.json), written as JSON.
	Settings map[string]any `toml:"settings"`
	// SettingsFile is a host JSON file used instead of Settings.
	SettingsFile string `toml:"settings_file"`
	// Instructions is the agent's global instructions (claude:
	// ~/.claude/CLAUDE.md, opencode: ~/.config/opencode/AGENTS.md).
	Instructions string `toml:"instructions"`
	// InstructionsFile is a host file used instead of Instructions.
	InstructionsFile string `toml:"instructions_file"`
	// Managed holds extra managed-policy keys, merged into the read-only
	// policy file (claude: /etc/claude-code/managed-settings.json, opencode:
	// /etc/opencode/opencode.json). Keys shrooms enforces cannot be changed.
	Managed map[string]any `toml:"managed"`
	// Files maps a HOME-relative path to a host file copied there verbatim
	// every turn (e.g. ".gitconfig" = "/etc/shrooms/gitconfig").
	Files map[string]string `toml:"files"`
	// Bootstrap maps a keep-list credential path to a [tokens] name whose
	// file seeds it once per task (see profile.Profile.BootstrapTargets). That the token
	// exists is checked at bootstrap, against [tokens].
	Bootstrap map[string]string `toml:"bootstrap"`
}

// Profile returns the baseline of the named profile (nil for an unknown one).
func (h *Home) Profile(name string) *HomeProfile {
	return h.Profiles[name]
}

func defaultHome() Home {
	h := Home{
		VolumePrefix:   "shrooms-home-",
		Size:           8 << 30,
		Inodes:         1 << 20,
		MaxFileSize:    16 << 20,
		MaxSessionFile: 1 << 30,
		MaxKeepSize:    8 << 30,
		MaxKeepFiles:   100000,
		Profiles:       map[string]*HomeProfile{},
	}
	for _, name := range profile.Names() {
		h.Profiles[name] = &HomeProfile{}
	}
	return h
}

func (h *Home) validate() error {
	if !validVolumePrefix(h.VolumePrefix) {
		return &Error{Key: "home.volume_prefix", Msg: "must be 1-32 of a-z 0-9 _ . - and start with a letter"}
	}
	switch {
	case h.Size < 64<<20 || h.Size > 16<<40:
		return &Error{Key: "home.size", Msg: "must be between 64m and 16t"}
	case h.Inodes < 1024 || h.Inodes > int64(h.Size)/4096:
		return &Error{Key: "home.inodes", Msg: fmt.Sprintf("%d is out of range 1024..%d (at most one per 4 KiB of home.size)", h.Inodes, int64(h.Size)/4096)}
	case h.MaxFileSize < 4<<10:
		return &Error{Key: "home.max_file_size", Msg: "must be at least 4k"}
	case h.MaxSessionFile < h.MaxFileSize:
		return &Error{Key: "home.max_session_file", Msg: "must be at least home.max_file_size"}
	case h.MaxKeepSize < h.MaxSessionFile:
		return &Error{Key: "home.max_keep_size", Msg: "must be at least home.max_session_file"}
	case h.MaxKeepFiles < 1 || h.MaxKeepFiles > 10_000_000:
		return &Error{Key: "home.max_keep_files", Msg: fmt.Sprintf("%d is out of range 1..10000000", h.MaxKeepFiles)}
	}
	for _, name := range profile.Names() {
		if err := h.Profile(name).validate("home."+name, name); err != nil {
			return err
		}
	}
	return nil
}

func (p *HomeProfile) validate(key, name string) error {
	prof, _ := profile.Lookup(name)
	switch {
	case prof.Settings == "" && (p.Settings != nil || p.SettingsFile != ""):
		return &Error{Key: key + ".settings", Msg: fmt.Sprintf("the %s profile has no settings file; use files", name)}
	case prof.Instructions == "" && (p.Instructions != "" || p.InstructionsFile != ""):
		return &Error{Key: key + ".instructions", Msg: fmt.Sprintf("the %s profile has no instructions; use files", name)}
	case prof.Policy == nil && p.Managed != nil:
		return &Error{Key: key + ".managed", Msg: fmt.Sprintf("the %s profile has no managed policy", name)}
	}
	if p.Settings != nil && p.SettingsFile != "" {
		return &Error{Key: key + ".settings_file", Msg: "set settings or settings_file, not both"}
	}
	if p.Instructions != "" && p.InstructionsFile != "" {
		return &Error{Key: key + ".instructions_file", Msg: "set instructions or instructions_file, not both"}
	}
	for _, k := range []struct {
		key string
		v   map[string]any
	}{{key + ".settings", p.Settings}, {key + ".managed", p.Managed}} {
		if k.v == nil {
			continue
		}
		if _, err := json.Marshal(k.v); err != nil {
			return &Error{Key: k.key, Msg: fmt.Sprintf("cannot be written as JSON: %v", err)}
		}
	}
	for _, f := range []struct{ key, path string }{{key + ".settings_file", p.SettingsFile}, {key + ".instructions_file", p.InstructionsFile}} {
		if f.path != "" && !filepath.IsAbs(f.path) {
			return &Error{Key: f.key, Msg: fmt.Sprintf("%q must be an absolute path", f.path)}
		}
	}
	if strings.ContainsRune(p.Instructions, 0) {
		return &Error{Key: key + ".instructions", Msg: "contains a NUL byte"}
	}
	for _, rel := range slices.Sorted(maps.Keys(p.Files)) {
		fk := fmt.Sprintf("%s.files.%q", key, rel)
		if !ValidHomeRel(rel) {
			return &Error{Key: fk, Msg: "must be a clean HOME-relative path (no /, .., or empty parts)"}
		}
		if !filepath.IsAbs(p.Files[rel]) {
			return &Error{Key: fk, Msg: fmt.Sprintf("%q must be an absolute host path", p.Files[rel])}
		}
	}
	for _, rel := range slices.Sorted(maps.Keys(p.Bootstrap)) {
		bk := fmt.Sprintf("%s.bootstrap.%q", key, rel)
		if !prof.IsBootstrapTarget(rel) {
			return &Error{Key: bk, Msg: fmt.Sprintf("not a credential file of the %s profile (use %s)", name, strings.Join(prof.BootstrapTargets, ", "))}
		}
		if !tokenName().MatchString(p.Bootstrap[rel]) {
			return &Error{Key: bk, Msg: fmt.Sprintf("%q is not a token name", p.Bootstrap[rel])}
		}
	}
	if prof.Policy != nil && p.Managed != nil {
		// Refused here rather than at the first turn. (The keys a gateway
		// pins are checked when a turn uses one.)
		if _, err := prof.Policy(p.Managed, profile.Gateway{}); err != nil {
			var ee *profile.EnforcedError
			if errors.As(err, &ee) {
				return &Error{Key: key + ".managed." + ee.Key, Msg: ee.Error()}
			}
			return &Error{Key: key + ".managed", Msg: err.Error()}
		}
	}
	return nil
}

// baselinePaths are the HOME paths the profile's baseline lays down, by
// the config key that declares each.
func (p *HomeProfile) baselinePaths(key string, prof profile.Profile) map[string]string {
	paths := map[string]string{}
	switch {
	case p.Settings != nil:
		paths[key+".settings"] = prof.Settings
	case p.SettingsFile != "":
		paths[key+".settings_file"] = prof.Settings
	}
	switch {
	case p.Instructions != "":
		paths[key+".instructions"] = prof.Instructions
	case p.InstructionsFile != "":
		paths[key+".instructions_file"] = prof.Instructions
	}
	for rel := range p.Files {
		paths[fmt.Sprintf("%s.files.%q", key, rel)] = rel
	}
	return paths
}

// validateBaseline refuses a baseline file of the agent's profiles that the
// keep-list of those profiles would carry or lie over (the HOME reset
// refuses it too, at the first turn).
func (c *Config) validateBaseline(key string, a Agent) error {
	rules, err := profile.KeepList(a.Home)
	if err != nil {
		return &Error{Key: key + ".home", Msg: err.Error()}
	}
	for _, name := range a.Home {
		prof, _ := profile.Lookup(name)
		paths := c.Home.Profile(name).baselinePaths("home."+name, prof)
		for _, k := range slices.Sorted(maps.Keys(paths)) {
			if why := profile.Overlap(rules, paths[k]); why != "" {
				return &Error{Key: k, Msg: fmt.Sprintf("baseline path %q %s (agent %s keeps it)", paths[k], why, strings.TrimPrefix(key, "agents."))}
			}
		}
	}
	return nil
}

// ValidHomeRel reports whether rel is a clean, relative path inside HOME.
func ValidHomeRel(rel string) bool {
	if rel == "" || len(rel) > 1024 || strings.ContainsRune(rel, 0) || strings.HasPrefix(rel, "/") || path.Clean(rel) != rel || rel == "." {
		return false
	}
	for _, part := range strings.Split(rel, "/") {
		if part == ".." || part == "." || part == "" {
			return false
		}
	}
	return true
}

func validVolumePrefix(s string) bool {
	if s == "" || len(s) > 32 || !(s[0] >= 'a' && s[0] <= 'z') {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '_' || r == '.' || r == '-') {
			return false
		}
	}
	return true
}
