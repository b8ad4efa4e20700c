// Package config is shrooms' TOML schema: built-in defaults, strict decoding
// (an unknown key or a wrong type is an error), and validation whose errors
// name the key path and the line it stands on.
package config

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/BurntSushi/toml"
	"github.com/shrooms-cage/shrooms/internal/lazyre"
	"github.com/shrooms-cage/shrooms/pkg/profile"
)

// Config is the whole of shrooms' configuration. Load fills every field that
// has a safe default, so a config file is optional.
type Config struct {
	Podman  Podman  `toml:"podman"`
	State   State   `toml:"state"`
	Cage    Cage    `toml:"cage"`
	Network Network `toml:"network"`
	Home    Home    `toml:"home"`
	Outbox  Outbox  `toml:"outbox"`
	// Worktree limits where a task's worktree may be.
	Worktree Worktree           `toml:"worktree"`
	Tokens   map[string]string  `toml:"tokens"`
	Gateway  map[string]Gateway `toml:"gateway"`
	Agents   map[string]Agent   `toml:"agents"`

	// Source is the file the config was read from, "" for built-in defaults.
	Source string `toml:"-"`
	// raw is the file's text, to name lines in errors found after Load.
	raw []byte
}

// Podman says how to reach the podman service.
type Podman struct {
	// Socket is the podman API URL, unix:///path.
	Socket string `toml:"socket"`
}

// State is where shrooms keeps its own host-side state.
type State struct {
	// Dir holds task locks, uid-range allocations and turn counters.
	Dir string `toml:"dir"`
}

// Agent is one agent CLI that a turn can run.
type Agent struct {
	// Command is the argv run in the cage; run's trailing ARGS are appended.
	Command []string `toml:"command"`
	// Env is extra environment for the cage (not secrets: see TokenEnv).
	Env map[string]string `toml:"env"`
	// Home lists the HOME profiles (claude, opencode, shell) the turn's HOME
	// reset applies.
	Home []string `toml:"home"`
	// TokenEnv maps an environment variable to a token name of [tokens]; the
	// cage gets the token file's contents in that variable.
	TokenEnv map[string]string `toml:"token_env"`
	// Image overrides cage.image for this agent.
	Image string `toml:"image"`
	// Gateway names a [gateway.NAME] provider: the agent's model requests
	// go through shrooms' per-turn gateway and the cage gets a placeholder
	// instead of the key (the recommended mode; token_env is the weaker one).
	Gateway string `toml:"gateway"`
}

// Error is a configuration error tied to a key path and, where known, a line.
type Error struct {
	File string
	Line int
	Key  string
	Msg  string
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("config")
	if e.File != "" {
		b.WriteString(" " + e.File)
		if e.Line > 0 {
			fmt.Fprintf(&b, ":%d", e.Line)
		}
	}
	b.WriteString(": ")
	if e.Key != "" {
		b.WriteString(e.Key + ": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// IsConfigError reports whether err is (or wraps) a configuration error.
func IsConfigError(err error) bool {
	var ce *Error
	return errors.As(err, &ce)
}

var decodeErr = lazyre.New(`^toml: line (\d+) \(last key "([^"]*)"\): (.*)$`)

// Load reads path over the built-in defaults and validates the result. An
// empty path means defaults only.
func Load(path string) (*Config, error) {
	c := Default()
	if path == "" {
		return c, c.Validate()
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, &Error{File: path, Msg: fmt.Sprintf("cannot read: %v", errors.Unwrap(err))}
	}
	return parse(path, data, c)
}

// Parse decodes TOML text over the defaults; name is used in errors.
func Parse(name string, data []byte) (*Config, error) {
	return parse(name, data, Default())
}

func parse(name string, data []byte, c *Config) (*Config, error) {
	c.Source = name
	c.raw = data
	md, err := toml.Decode(string(data), c)
	if err != nil {
		var pe toml.ParseError
		if errors.As(err, &pe) {
			return nil, &Error{File: name, Line: pe.Position.Line, Key: pe.LastKey, Msg: pe.Message}
		}
		// Type mismatches come as "toml: line N (last key "k"): msg".
		if m := decodeErr().FindStringSubmatch(err.Error()); m != nil {
			line, _ := strconv.Atoi(m[1])
			return nil, &Error{File: name, Line: line, Key: m[2], Msg: m[3]}
		}
		return nil, &Error{File: name, Msg: strings.TrimPrefix(err.Error(), "toml: ")}
	}
	if e := unknownKeys(md, data); e != nil {
		e.File = name
		return nil, e
	}
	if e := tableKeys(md, data); e != nil {
		e.File = name
		return nil, e
	}
	if e := decodeHomeProfiles(data, c); e != nil {
		e.File = name
		return nil, e
	}
	if err := c.Validate(); err != nil {
		var ce *Error
		if errors.As(err, &ce) {
			ce.File = name
			if ce.Line == 0 {
				ce.Line = lineOf(data, ce.Key)
			}
		}
		return nil, err
	}
	return c, nil
}

// freeform reports whether k lies inside a table decoded as free-form data:
// home.<profile>.settings and home.<profile>.managed.
func freeform(k toml.Key) bool {
	return len(k) > 3 && k[0] == "home" && (k[2] == "settings" || k[2] == "managed")
}

// homeProfileKey reports whether k lies inside a [home.<profile>] table,
// which decodeHomeProfiles decodes.
func homeProfileKey(k toml.Key) bool {
	if len(k) < 2 || k[0] != "home" {
		return false
	}
	_, ok := profile.Lookup(k[1])
	return ok
}

// unknownKeys refuses the first key (in sorted order) the decoder did not
// use. Free-form tables (agent settings, managed policy) are decoded whole
// into maps; the decoder still lists their nested keys.
func unknownKeys(md toml.MetaData, data []byte) *Error {
	var keys []string
	for _, k := range md.Undecoded() {
		if freeform(k) || homeProfileKey(k) {
			continue
		}
		keys = append(keys, k.String())
	}
	if len(keys) == 0 {
		return nil
	}
	sort.Strings(keys)
	return &Error{Line: lineOf(data, keys[0]), Key: keys[0], Msg: "unknown key"}
}

// decodeHomeProfiles decodes each [home.<profile>] table into its baseline:
// the profiles are pkg/profile's, not fields of Home.
func decodeHomeProfiles(data []byte, c *Config) *Error {
	var raw struct {
		Home map[string]toml.Primitive `toml:"home"`
	}
	md, err := toml.Decode(string(data), &raw)
	if err != nil {
		return &Error{Msg: strings.TrimPrefix(err.Error(), "toml: ")}
	}
	for _, name := range slices.Sorted(maps.Keys(raw.Home)) {
		if _, ok := profile.Lookup(name); !ok {
			continue
		}
		if err := md.PrimitiveDecode(raw.Home[name], c.Home.Profile(name)); err != nil {
			key := "home." + name
			return &Error{Line: lineOf(data, key), Key: key, Msg: strings.TrimPrefix(err.Error(), "toml: ")}
		}
	}
	var keys []string
	for _, k := range md.Undecoded() {
		if homeProfileKey(k) && !freeform(k) {
			keys = append(keys, k.String())
		}
	}
	if len(keys) > 0 {
		sort.Strings(keys)
		return &Error{Line: lineOf(data, keys[0]), Key: keys[0], Msg: "unknown key"}
	}
	return nil
}

// Agent returns the named agent or an error listing the known ones.
func (c *Config) Agent(name string) (Agent, error) {
	a, ok := c.Agents[name]
	if !ok {
		names := make([]string, 0, len(c.Agents))
		for n := range c.Agents {
			names = append(names, n)
		}
		sort.Strings(names)
		return Agent{}, fmt.Errorf("unknown agent %q (configured: %s)", name, strings.Join(names, ", "))
	}
	return a, nil
}

// ImageFor returns the image an agent's turns run.
func (c *Config) ImageFor(a Agent) string {
	if a.Image != "" {
		return a.Image
	}
	return c.Cage.Image
}

// Digest identifies the configuration a command ran with: "sha256:" over
// the config file's bytes as read, or, for the built-in defaults (no
// file), over their canonical JSON encoding.
func (c *Config) Digest() string {
	data := c.raw
	if data == nil {
		b, err := json.Marshal(c)
		if err != nil {
			// A Config always encodes; say so rather than hash nothing.
			return "sha256:unavailable"
		}
		data = b
	}
	sum := sha256.Sum256(data)
	return "sha256:" + hex.EncodeToString(sum[:])
}
