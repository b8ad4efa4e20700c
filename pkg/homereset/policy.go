package homereset

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"

	"github.com/shrooms-cage/shrooms/pkg/config"
)

// PolicyMount is one directory of managed policy that the cage must mount
// read-only outside HOME, at Dest, so that settings planted in HOME during a
// turn cannot load hooks or MCP servers in that same turn (where the agent
// honours managed policy).
type PolicyMount struct {
	// Source is the host directory; Dest the cage directory to mount it at.
	Source string `json:"source"`
	Dest   string `json:"dest"`
	// Files maps each file name in Source to the sha256 of its content.
	Files map[string]string `json:"files"`
}

// claudeEnforced are the managed-settings keys shrooms always sets: only
// managed hooks run, only managed (that is: no) MCP servers load, no project
// MCP servers are auto-approved, no plugin marketplace is trusted; and the
// bypass-permissions warning is accepted (the cage, not the prompts, is the
// boundary: an interactive Claude would otherwise ask at every turn, as the
// reset drops the user-level acceptance).
var claudeEnforced = map[string]any{
	"skipDangerousModePermissionPrompt": true,
	"allowManagedHooksOnly":             true,
	"allowManagedMcpServersOnly":        true,
	"allowedMcpServers":                 []any{},
	"enableAllProjectMcpServers":        false,
	"strictKnownMarketplaces":           []any{},
}

// opencodeEnforced are the keys of /etc/opencode/opencode.json shrooms always
// sets. opencode merges user config over nothing it can subtract, so these
// only add safe defaults; the HOME reset is what removes planted plugins.
var opencodeEnforced = map[string]any{
	"$schema":    "https://opencode.ai/config.json",
	"autoupdate": false,
	"share":      "disabled",
	"plugin":     []any{},
	"mcp":        map[string]any{},
}

// Policy is the managed policy of a turn, computed and not yet written.
type Policy struct {
	// Mounts are the read-only mounts the cage needs, with the digests of
	// the files Write puts in their Source directories.
	Mounts []PolicyMount
	// files holds each mount's file contents, by mount then file name.
	files []map[string][]byte
}

// PlanPolicy computes the managed policy of the given profiles in dir (a
// per-task directory under config state.dir), writing nothing:
//
//   - claude:   dir/claude-code → /etc/claude-code with managed-settings.json
//     (claudeEnforced + home.claude.managed) and managed-mcp.json
//     ({"mcpServers":{}}: no MCP server at all, plugin servers included);
//   - opencode: dir/opencode → /etc/opencode with opencode.json
//     (opencodeEnforced + home.opencode.managed, and gw's pins).
//
// The shell profile has no managed policy.
func PlanPolicy(dir string, cfg *config.Config, profiles []string, gw PolicyGateway) (*Policy, error) {
	if !filepath.IsAbs(dir) {
		return nil, fmt.Errorf("policy directory %q must be absolute", dir)
	}
	pol := &Policy{}
	for _, p := range profiles {
		files, sub, dest, err := policyFiles(p, cfg, gw)
		if err != nil {
			return nil, err
		}
		if files == nil {
			continue
		}
		m := PolicyMount{Source: filepath.Join(dir, sub), Dest: dest, Files: map[string]string{}}
		data := map[string][]byte{}
		for _, name := range slices.Sorted(maps.Keys(files)) {
			b, err := json.MarshalIndent(files[name], "", "  ")
			if err != nil {
				return nil, fmt.Errorf("managed policy %s: %w", name, err)
			}
			b = append(b, '\n')
			sum := sha256.Sum256(b)
			m.Files[name] = "sha256:" + hex.EncodeToString(sum[:])
			data[name] = b
		}
		pol.Mounts = append(pol.Mounts, m)
		pol.files = append(pol.files, data)
	}
	return pol, nil
}

// policyFiles is one profile's managed policy files, the subdirectory of
// the policy dir they go to and where the cage mounts it (nil files: none).
func policyFiles(profile string, cfg *config.Config, gw PolicyGateway) (files map[string]any, sub, dest string, err error) {
	prof, ok := config.Profile(profile)
	if !ok {
		return nil, "", "", fmt.Errorf("unknown HOME profile %q", profile)
	}
	switch profile {
	case "claude":
		settings, err := merge(claudeEnforced, cfg.Home.Claude.Managed, "home.claude.managed")
		if err != nil {
			return nil, "", "", err
		}
		files = map[string]any{"managed-settings.json": settings, "managed-mcp.json": map[string]any{"mcpServers": map[string]any{}}}
	case "opencode":
		enforced := opencodeEnforced
		if gw.AnthropicBaseURL != "" {
			enforced = maps.Clone(opencodeEnforced)
			enforced["provider"] = map[string]any{"anthropic": map[string]any{"options": map[string]any{"baseURL": gw.AnthropicBaseURL + "/v1"}}}
		}
		oc, err := merge(enforced, cfg.Home.Opencode.Managed, "home.opencode.managed")
		if err != nil {
			return nil, "", "", err
		}
		files = map[string]any{"opencode.json": oc}
	}
	if files == nil || prof.PolicyDir == "" {
		return nil, "", "", nil
	}
	return files, prof.PolicyDir, prof.PolicyDest, nil
}

// PolicyGateway is what the managed policy must pin when the turn's model
// requests go through shrooms' gateway.
type PolicyGateway struct {
	// AnthropicBaseURL, when set, is pinned as opencode's anthropic provider
	// base URL (Claude Code takes ANTHROPIC_BASE_URL from the environment).
	AnthropicBaseURL string
}

// Write puts the policy's files in place: directories created if needed,
// owned by root; files world-readable (the cage user must read them) and
// replaced atomically.
func (pol *Policy) Write() error {
	for i, m := range pol.Mounts {
		if err := os.MkdirAll(m.Source, 0o755); err != nil {
			return fmt.Errorf("managed policy: %w", err)
		}
		if err := os.Chmod(m.Source, 0o755); err != nil {
			return fmt.Errorf("managed policy: %w", err)
		}
		for _, name := range slices.Sorted(maps.Keys(pol.files[i])) {
			if err := writeAtomic(filepath.Join(m.Source, name), pol.files[i][name]); err != nil {
				return fmt.Errorf("managed policy: %w", err)
			}
		}
	}
	return nil
}

func writeAtomic(path string, data []byte) error {
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".tmp")
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	if err := os.Chmod(tmp, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// merge returns enforced plus the owner's extra keys; an owner key that
// would change an enforced one is a config error.
func merge(enforced, extra map[string]any, key string) (map[string]any, error) {
	out := map[string]any{}
	for k, v := range extra {
		if ev, ok := enforced[k]; ok && !reflect.DeepEqual(normalize(ev), normalize(v)) {
			want, _ := json.Marshal(ev)
			return nil, &config.Error{Key: key + "." + k, Msg: fmt.Sprintf("is enforced by shrooms (%s) and cannot be changed", want)}
		}
		out[k] = v
	}
	for k, v := range enforced {
		out[k] = v
	}
	return out, nil
}

// normalize maps a value through JSON so TOML and Go literals compare equal.
func normalize(v any) any {
	data, err := json.Marshal(v)
	if err != nil {
		return v
	}
	var out any
	_ = json.Unmarshal(data, &out)
	return out
}
