// Package guard is the worktree half of invariant 1 (turn
// isolation): the worktree is the one place a turn writes that the next turn
// (and the owner's own tools) read back, and agents load configuration from
// it — opencode.json, .opencode/ plugins, .claude/settings.json hooks,
// .mcp.json servers, CLAUDE.md/AGENTS.md instructions, .envrc, .vscode tasks.
//
// The guard records the owner's versions of those paths (the trusted
// project config, snapshotted into the task's state directory at the task's
// first turn, or by `shrooms trust`), and before every later turn compares
// the worktree with them. Any guarded path that differs is masked in the
// cage: the trusted bytes (or an empty file or directory) are mounted
// read-only over it, and the difference is reported. `shrooms commit` uses
// the same comparison to refuse agent config the owner did not accept.
//
// Trusted files also load other files (invariant 10): the files a trusted
// CLAUDE.md imports (`@path`, recursively), opencode's `instructions` and
// `{file:}` references, the scripts trusted hooks and MCP servers run.
// Those are resolved when the snapshot is taken and trusted by digest too
// (loads, loads.go; the readers in refs.go); a changed one is masked like
// a guarded root. Scripts that host-side tool config runs (.envrc,
// pre-commit, husky, …) are recorded too, for the turn's change report.
//
// Every host-side access to the worktree is fd-relative and never follows a
// link, opens a FIFO or device, or descends into .git.
package guard

import (
	"path"
	"slices"
	"strings"
)

// guarded is one name the agents (or the tools they and the owner run) load
// as configuration, wherever it appears in the worktree.
type guarded struct {
	name string
	// parent, when set, is the name the directory holding name must have:
	// Copilot's hooks live in .github/hooks, and the rest of .github
	// (workflows, templates) is no agent config.
	parent string
	why    string
}

// guardedNames lists what is guarded. Names match one path element at any
// depth (opencode and Claude Code also read nested instruction files and
// config dirs of subprojects; Gemini CLI, Crush, Aider and Amp search from
// the working directory, which may be any subdirectory, upward); a guarded
// directory is compared as a whole. docs/security-model.md says which tool
// loads each and how it searches.
func guardedNames() []guarded {
	return []guarded{
		// opencode: project config, plugins, agents, commands, tools, MCP.
		{"opencode.json", "", "opencode project config (MCP servers, plugins, providers, permissions)"},
		{"opencode.jsonc", "", "opencode project config (MCP servers, plugins, providers, permissions)"},
		{".opencode", "", "opencode project dir (plugins, agents, commands, tools)"},
		{"AGENTS.md", "", "agent instructions (opencode, Codex)"},
		// Claude Code: settings with hooks, MCP servers, skills, commands.
		{".claude", "", "Claude Code project dir (settings hooks, commands, agents, skills, rules)"},
		{".mcp.json", "", "Claude Code project MCP servers"},
		{"CLAUDE.md", "", "Claude Code instructions"},
		{"CLAUDE.local.md", "", "Claude Code instructions"},
		{"CONTEXT.md", "", "agent instructions (opencode)"},
		{".agents", "", "skills shared by agents (opencode, Claude Code)"},
		{".claude-plugin", "", "Claude Code plugin or marketplace (hooks, MCP servers, skills)"},
		{".cursor", "", "Cursor project dir: Cursor's CLI runs hooks.json hooks and mcp.json servers (mcp.json also from parent directories); rules; Claude Code imports it too"},
		{".cursorrules", "", "Cursor rules (agent instructions)"},
		{".windsurfrules", "", "Windsurf rules (agent instructions)"},
		// Other agents that may share the worktree (run by shrooms or by the
		// owner by hand).
		{".gemini", "", "Gemini CLI project dir: settings.json (MCP servers, hooks), .env, commands, extensions (each with MCP servers and context)"},
		{"GEMINI.md", "", "Gemini CLI instructions (found from the working directory up and in subdirectories; @file imports)"},
		{".env", "", "environment file Gemini CLI (searched from the working directory up) and Aider (git root and working directory) load at start: API keys, base URLs, any option"},
		{".codex", "", "Codex project config"},
		{".crushrc", "", "Crush config script: Bash run at start (found from the working directory up to the git root)"},
		{"crushrc", "", "Crush config script: Bash run at start (found from the working directory up to the git root)"},
		{".crush.json", "", "Crush project config (MCP servers, LSP commands, hooks, providers; $(...) runs at load)"},
		{"crush.json", "", "Crush project config (MCP servers, LSP commands, hooks, providers; $(...) runs at load)"},
		// Crush's context files (its defaultContextPaths, in every spelling it
		// tries; besides CLAUDE.md, GEMINI.md, AGENTS.md and .cursorrules).
		{"CRUSH.md", "", "Crush context file (agent instructions, read from the working directory)"},
		{"CRUSH.local.md", "", "Crush context file (agent instructions, read from the working directory)"},
		{"Crush.md", "", "Crush context file (agent instructions, read from the working directory)"},
		{"Crush.local.md", "", "Crush context file (agent instructions, read from the working directory)"},
		{"crush.md", "", "Crush context file (agent instructions, read from the working directory)"},
		{"crush.local.md", "", "Crush context file (agent instructions, read from the working directory)"},
		{"gemini.md", "", "Crush context file (agent instructions, read from the working directory)"},
		{"agents.md", "", "Crush context file (agent instructions, read from the working directory)"},
		{"Agents.md", "", "Crush context file (agent instructions, read from the working directory)"},
		{"copilot-instructions.md", ".github", "GitHub Copilot and Crush instructions (.github/copilot-instructions.md)"},
		{"hooks", ".github", "GitHub Copilot CLI hooks (.github/hooks/*.json from the working directory: shell commands at session and tool events)"},
		{".aider.conf.yml", "", "Aider config (git root and working directory): commands it runs (test-cmd, lint-cmd), API base URLs, files it reads"},
		{".aider.model.settings.yml", "", "Aider model settings (git root and working directory): extra_params passed to every model request (API base, headers)"},
		{".amp", "", "Amp workspace settings (.amp/settings.json, found from the working directory up to the repository root: MCP servers, permissions that delegate to commands)"},
		// Tools that run code when the owner (or an agent) enters the tree.
		{".envrc", "", "direnv script, run on entering the directory"},
		{".vscode", "", "editor tasks and settings that run commands"},
		{".devcontainer", "", "dev container definition (runs commands)"},
		{".husky", "", "git hook scripts installed by husky"},
		{".githooks", "", "git hook scripts"},
		{".pre-commit-config.yaml", "", "pre-commit hooks"},
		{".tool-versions", "", "asdf/mise tool versions (installs and runs tools)"},
		{".mise.toml", "", "mise config (runs tasks and hooks)"},
		{"mise.toml", "", "mise config (runs tasks and hooks)"},
	}
}

// linkWhy is why a link out of the worktree is guarded.
const linkWhy = "a link out of the worktree: agents read what it points to, which the guard cannot see (e.g. a planted /outbox directory)"

// Why says why a guarded path is guarded ("" when rel is not guarded by
// name).
func Why(rel string) string {
	if g, ok := guardedAt(parentName(rel), path.Base(rel)); ok {
		return g.why
	}
	return ""
}

// parentName is the name of the directory holding rel ("" at the root).
func parentName(rel string) string {
	d := path.Dir(rel)
	if d == "." {
		return ""
	}
	return path.Base(d)
}

// isGuardedName reports whether an entry called name, in a directory
// called parent, is guarded.
func isGuardedName(parent, name string) bool {
	_, ok := guardedAt(parent, name)
	return ok
}

func guardedAt(parent, name string) (guarded, bool) {
	// Cheap first test on every worktree entry: each guarded name starts
	// with one of these (TestGuardedNamesPassFirstByteTest keeps it so).
	if name == "" {
		return guarded{}, false
	}
	switch name[0] {
	case '.', 'A', 'C', 'G', 'o', 'm', 'c', 'h', 'a', 'g':
		gs := guardedNames()
		i := slices.IndexFunc(gs, func(g guarded) bool {
			return g.name == name && (g.parent == "" || g.parent == parent)
		})
		if i >= 0 {
			return gs[i], true
		}
	}
	return guarded{}, false
}

// IsOpencode reports whether a guarded path is one opencode loads.
func IsOpencode(rel string) bool {
	switch path.Base(rel) {
	case "opencode.json", "opencode.jsonc", ".opencode", "AGENTS.md", "CLAUDE.md", "CONTEXT.md", ".agents", ".claude":
		return true
	}
	return false
}

// Change is one guarded path that differs from its trusted version.
type Change struct {
	// Path is worktree-relative, slash-separated.
	Path string `json:"path"`
	// Change is "added", "modified", "type-changed" or "deleted".
	Change string `json:"change"`
	// Type is what the path is now ("file", "dir", "symlink", "other",
	// "absent").
	Type string `json:"type"`
	Why  string `json:"why"`
}

// Diff compares the worktree now with the trusted snapshot. Paths are sorted.
func Diff(trusted, now *Snapshot) []Change {
	var out []Change
	why := func(rel string, e Entry) string {
		if w := Why(rel); w != "" {
			return w
		}
		if e.OutOfTree {
			return linkWhy
		}
		return ""
	}
	for _, rel := range now.paths() {
		e := now.Entries[rel]
		t, ok := trusted.Entries[rel]
		switch {
		case !ok:
			out = append(out, Change{Path: rel, Change: "added", Type: e.Type, Why: why(rel, e)})
		case t.Type != e.Type:
			out = append(out, Change{Path: rel, Change: "type-changed", Type: e.Type, Why: why(rel, e)})
		case t.Digest != e.Digest || e.Oversize:
			out = append(out, Change{Path: rel, Change: "modified", Type: e.Type, Why: why(rel, e)})
		}
	}
	for _, rel := range trusted.paths() {
		if _, ok := now.Entries[rel]; !ok {
			out = append(out, Change{Path: rel, Change: "deleted", Type: "absent", Why: why(rel, trusted.Entries[rel])})
		}
	}
	slices.SortFunc(out, func(a, b Change) int { return strings.Compare(a.Path, b.Path) })
	return out
}

// Executable returns the changes that add or alter configuration (deletions
// take configuration away and are only reported).
func Executable(changes []Change) []Change {
	var out []Change
	for _, c := range changes {
		if c.Change != "deleted" {
			out = append(out, c)
		}
	}
	return out
}

// GuardedRoot returns the guarded root a worktree-relative path lies in or
// is (the path up to its first component with a guarded name, as the guard
// matches at any depth), or "" when no component of rel is guarded.
func GuardedRoot(rel string) string {
	end, parent := 0, ""
	for _, comp := range strings.Split(rel, "/") {
		if end > 0 {
			end++
		}
		end += len(comp)
		if isGuardedName(parent, comp) {
			return rel[:end]
		}
		parent = comp
	}
	return ""
}
