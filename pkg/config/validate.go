package config

import (
	"bufio"
	"bytes"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"

	"github.com/shrooms-cage/shrooms/internal/lazyre"
	"github.com/shrooms-cage/shrooms/pkg/profile"
)

var (
	envName   = lazyre.New(`^[A-Za-z_][A-Za-z0-9_]*$`)
	tokenName = lazyre.New(`^[a-z0-9][a-z0-9_-]{0,62}$`)
	agentName = lazyre.New(`^[a-z0-9][a-z0-9_-]{0,62}$`)
)

// reservedEnv are variables the cage sets itself; an agent may not override
// them. PATH among them: no directory the agent can write (its HOME) may
// come before the image's own.
var reservedEnv = map[string]bool{"HOME": true, "USER": true, "LOGNAME": true, "HOSTNAME": true, "PATH": true, "container": true,
	// The cage's git configuration (safe.directory=/work) comes from the
	// environment; an agent's env may neither replace nor extend it.
	"GIT_CONFIG_COUNT": true, "GIT_CONFIG_PARAMETERS": true}

// reserved reports whether the cage sets variable k itself.
func reserved(k string) bool {
	return reservedEnv[k] || strings.HasPrefix(k, "GIT_CONFIG_KEY_") || strings.HasPrefix(k, "GIT_CONFIG_VALUE_")
}

// Validate checks every value; the first problem is returned as *Error.
func (c *Config) Validate() error {
	if !strings.HasPrefix(c.Podman.Socket, "unix:///") {
		return &Error{Key: "podman.socket", Msg: fmt.Sprintf("%q must be a unix:///absolute/path URL", c.Podman.Socket)}
	}
	if !filepath.IsAbs(c.State.Dir) || filepath.Clean(c.State.Dir) == "/" {
		return &Error{Key: "state.dir", Msg: "must be an absolute path other than /"}
	}
	for _, v := range []interface{ validate() error }{&c.Cage, &c.Network, &c.Home, &c.Outbox, &c.Worktree} {
		if err := v.validate(); err != nil {
			return err
		}
	}
	for _, name := range slices.Sorted(maps.Keys(c.Tokens)) {
		path := c.Tokens[name]
		if !tokenName().MatchString(name) {
			return &Error{Key: "tokens." + name, Msg: "token names are 1-63 of a-z 0-9 _ -"}
		}
		if !filepath.IsAbs(path) {
			return &Error{Key: "tokens." + name, Msg: fmt.Sprintf("%q must be an absolute path", path)}
		}
	}
	if err := c.validateGateways(); err != nil {
		return err
	}
	if len(c.Agents) == 0 {
		return &Error{Key: "agents", Msg: "no agent configured"}
	}
	for _, name := range slices.Sorted(maps.Keys(c.Agents)) {
		if err := c.validateAgent(name, c.Agents[name]); err != nil {
			return err
		}
	}
	return nil
}

func (c *Config) validateAgent(name string, a Agent) error {
	key := "agents." + name
	if !agentName().MatchString(name) {
		return &Error{Key: key, Msg: "agent names are 1-63 of a-z 0-9 _ -"}
	}
	if len(a.Command) == 0 || a.Command[0] == "" {
		return &Error{Key: key + ".command", Msg: "must be a non-empty argv list"}
	}
	for i, arg := range a.Command {
		if strings.ContainsRune(arg, 0) {
			return &Error{Key: fmt.Sprintf("%s.command[%d]", key, i), Msg: "contains a NUL byte"}
		}
	}
	if len(a.Home) == 0 {
		return &Error{Key: key + ".home", Msg: fmt.Sprintf("must list at least one HOME profile (%s)", strings.Join(profile.Names(), ", "))}
	}
	seen := map[string]bool{}
	for i, p := range a.Home {
		if _, ok := profile.Lookup(p); !ok {
			return &Error{Key: fmt.Sprintf("%s.home[%d]", key, i), Msg: fmt.Sprintf("unknown HOME profile %q (use %s)", p, strings.Join(profile.Names(), ", "))}
		}
		if seen[p] {
			return &Error{Key: fmt.Sprintf("%s.home[%d]", key, i), Msg: fmt.Sprintf("profile %q listed twice", p)}
		}
		seen[p] = true
	}
	for _, k := range slices.Sorted(maps.Keys(a.Env)) {
		if !envName().MatchString(k) || reserved(k) {
			return &Error{Key: key + ".env." + k, Msg: "not a settable environment variable name"}
		}
		if strings.ContainsRune(a.Env[k], 0) {
			return &Error{Key: key + ".env." + k, Msg: "value contains a NUL byte"}
		}
	}
	for _, k := range slices.Sorted(maps.Keys(a.TokenEnv)) {
		tok := a.TokenEnv[k]
		if !envName().MatchString(k) || reserved(k) {
			return &Error{Key: key + ".token_env." + k, Msg: "not a settable environment variable name"}
		}
		if _, dup := a.Env[k]; dup {
			return &Error{Key: key + ".token_env." + k, Msg: "also set in env; a variable has one source"}
		}
		if _, ok := c.Tokens[tok]; !ok {
			return &Error{Key: key + ".token_env." + k, Msg: fmt.Sprintf("names token %q, which [tokens] does not define", tok)}
		}
	}
	if err := c.validateAgentGateway(key, a); err != nil {
		return err
	}
	if err := c.validateBaseline(key, a); err != nil {
		return err
	}
	if a.Image != "" && strings.ContainsAny(a.Image, " \t\n") {
		return &Error{Key: key + ".image", Msg: "is not an image reference"}
	}
	return nil
}

// lineOf finds the line that sets a dotted key path (e.g. "cage.memory" or
// "agents.claude.env.FOO"), tracking [table] headers; 0 when not found.
// Index suffixes such as "[2]" are ignored.
func lineOf(data []byte, key string) int {
	if key == "" {
		return 0
	}
	if i := strings.IndexByte(key, '['); i >= 0 {
		key = key[:i]
	}
	want := strings.Split(key, ".")
	table := []string{}
	best := 0
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		if line[0] == '[' {
			h := strings.Trim(strings.SplitN(line, "]", 2)[0], "[ ")
			table = splitKey(h)
			if hasPrefix(want, table) && len(table) == len(want) && best == 0 {
				best = n
			}
			continue
		}
		eq := strings.IndexByte(line, '=')
		if eq < 0 {
			continue
		}
		full := append(append([]string{}, table...), splitKey(line[:eq])...)
		if hasPrefix(want, full) {
			return n
		}
		if best == 0 && hasPrefix(full, want) {
			best = n
		}
	}
	return best
}

func splitKey(s string) []string {
	parts := strings.Split(s, ".")
	for i, p := range parts {
		parts[i] = strings.Trim(strings.TrimSpace(p), `"'`)
	}
	return parts
}

// hasPrefix reports whether prefix is a prefix of full.
func hasPrefix(full, prefix []string) bool {
	if len(prefix) > len(full) {
		return false
	}
	for i := range prefix {
		if full[i] != prefix[i] {
			return false
		}
	}
	return true
}
