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
// MCP servers are auto-approved, no plugin marketplace is trusted.
var claudeEnforced = map[string]any{
	"allowManagedHooksOnly":      true,
	"allowManagedMcpServersOnly": true,
	"allowedMcpServers":          []any{},
	"enableAllProjectMcpServers": false,
	"strictKnownMarketplaces":    []any{},
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

// WritePolicy writes the managed policy of the given profiles into dir (a
// per-task directory under config state.dir, created if needed, owned by
// root) and returns the read-only mounts the cage needs:
//
//   - claude:   dir/claude-code → /etc/claude-code with managed-settings.json
//     (claudeEnforced + home.claude.managed) and managed-mcp.json
//     ({"mcpServers":{}}: no MCP server at all, plugin servers included);
//   - opencode: dir/opencode → /etc/opencode with opencode.json
//     (opencodeEnforced + home.opencode.managed).
//
// The shell profile has no managed policy. Files are world-readable (the
// cage user must read them) and replaced atomically.
func WritePolicy(dir string, cfg *config.Config, profiles []string) ([]PolicyMount, error) {
	return WritePolicyWith(dir, cfg, profiles, PolicyGateway{})
}

// PolicyGateway is what the managed policy must pin when the turn's model
// requests go through shrooms' gateway.
type PolicyGateway struct {
	// AnthropicBaseURL, when set, is pinned as opencode's anthropic provider
	// base URL (Claude Code takes ANTHROPIC_BASE_URL from the environment).
	AnthropicBaseURL string
}

// WritePolicyWith is WritePolicy with the gateway's settings pinned too.
func WritePolicyWith(dir string, cfg *config.Config, profiles []string, gw PolicyGateway) ([]PolicyMount, error) {
	if !filepath.IsAbs(dir) {
		return nil, fmt.Errorf("policy directory %q must be absolute", dir)
	}
	var mounts []PolicyMount
	for _, p := range profiles {
		var files map[string]any
		var sub, dest string
		switch p {
		case "claude":
			settings, err := merge(claudeEnforced, cfg.Home.Claude.Managed, "home.claude.managed")
			if err != nil {
				return nil, err
			}
			files = map[string]any{"managed-settings.json": settings, "managed-mcp.json": map[string]any{"mcpServers": map[string]any{}}}
			sub, dest = "claude-code", "/etc/claude-code"
		case "opencode":
			enforced := opencodeEnforced
			if gw.AnthropicBaseURL != "" {
				enforced = maps.Clone(opencodeEnforced)
				enforced["provider"] = map[string]any{"anthropic": map[string]any{"options": map[string]any{"baseURL": gw.AnthropicBaseURL + "/v1"}}}
			}
			oc, err := merge(enforced, cfg.Home.Opencode.Managed, "home.opencode.managed")
			if err != nil {
				return nil, err
			}
			files = map[string]any{"opencode.json": oc}
			sub, dest = "opencode", "/etc/opencode"
		case "shell":
			continue
		default:
			return nil, fmt.Errorf("unknown HOME profile %q", p)
		}
		src := filepath.Join(dir, sub)
		if err := os.MkdirAll(src, 0o755); err != nil {
			return nil, fmt.Errorf("managed policy: %w", err)
		}
		if err := os.Chmod(src, 0o755); err != nil {
			return nil, fmt.Errorf("managed policy: %w", err)
		}
		m := PolicyMount{Source: src, Dest: dest, Files: map[string]string{}}
		for _, name := range slices.Sorted(maps.Keys(files)) {
			data, err := json.MarshalIndent(files[name], "", "  ")
			if err != nil {
				return nil, fmt.Errorf("managed policy %s: %w", name, err)
			}
			data = append(data, '\n')
			tmp := filepath.Join(src, "."+name+".tmp")
			if err := os.WriteFile(tmp, data, 0o644); err != nil {
				return nil, fmt.Errorf("managed policy: %w", err)
			}
			if err := os.Chmod(tmp, 0o644); err != nil {
				return nil, fmt.Errorf("managed policy: %w", err)
			}
			if err := os.Rename(tmp, filepath.Join(src, name)); err != nil {
				return nil, fmt.Errorf("managed policy: %w", err)
			}
			sum := sha256.Sum256(data)
			m.Files[name] = "sha256:" + hex.EncodeToString(sum[:])
		}
		mounts = append(mounts, m)
	}
	return mounts, nil
}

// PolicyMounts returns the mounts WritePolicy would return for profiles,
// without writing anything and without the file digests (for `spec`).
func PolicyMounts(dir string, profiles []string) []PolicyMount {
	var out []PolicyMount
	for _, p := range profiles {
		switch p {
		case "claude":
			out = append(out, PolicyMount{Source: filepath.Join(dir, "claude-code"), Dest: "/etc/claude-code"})
		case "opencode":
			out = append(out, PolicyMount{Source: filepath.Join(dir, "opencode"), Dest: "/etc/opencode"})
		}
	}
	return out
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
