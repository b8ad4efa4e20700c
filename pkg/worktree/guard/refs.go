package guard

import (
	"encoding/json"
	"path"
	"regexp"
	"slices"
	"strings"

	"github.com/BurntSushi/toml"
	"github.com/tailscale/hujson"
	"sigs.k8s.io/yaml"
)

// What trusted files load by reference. A guarded file names other files:
// Claude Code's CLAUDE.md pulls in `@path` imports (recursively), opencode's
// opencode.json pulls in its `instructions` (paths and globs) and
// `{file:path}` substitutions. Those files reach the agent as instructions
// just as the guarded file does, so the guard trusts them by digest too
// (loads). Host-side tool config (.envrc, pre-commit, husky, git hooks,
// mise, VS Code tasks, dev containers) runs worktree scripts on the host:
// those references are listed when a turn changes them (hostRefs).

// maxImportDepth bounds the import chain the guard follows, in hops from
// the trusted file: five, as Claude Code documents it (2.1.332's loader
// skips depth 5 counted from CLAUDE.md at 0, so it reads four: the guard
// follows one hop more than it needs).
const maxImportDepth = 5

// ref is one reference found in a trusted file, before resolution.
type ref struct {
	// spec is the path as written (after unescaping), relative to base.
	spec string
	// base is the worktree-relative directory a relative spec is read from.
	base string
	// glob marks an opencode instructions pattern.
	glob bool
	// absentOK: record the path even when it does not exist (a directive
	// such as direnv's source_env_if_exists loads it once it does).
	absentOK bool
}

// claudeImportRe is Claude Code 2.1.332's import pattern (IQr): an `@`
// at the start or after white space, then non-space characters, `\ `
// standing for a space.
var claudeImportRe = regexp.MustCompile(`(?:^|\s)@((?:[^\s\\]|\\ )+)`)

var claudeSpecialStart = regexp.MustCompile(`^[#%^&*()]+`)
var claudeWordStart = regexp.MustCompile(`^[a-zA-Z0-9._-]`)

// claudeImports returns the import specs of a CLAUDE.md-style file, as
// Claude Code reads them: outside fenced code blocks and code spans, with
// a `#fragment` cut off and `\ ` read as a space. Where this reading of
// Markdown is looser than Claude's own (HTML comments, link targets,
// indented code), it finds more imports, never fewer: a spare import is
// one more file guarded.
func claudeImports(content []byte) []string {
	var out []string
	for _, line := range proseLines(string(content)) {
		for _, m := range claudeImportRe.FindAllStringSubmatch(line, -1) {
			h := m[1]
			if i := strings.IndexByte(h, '#'); i >= 0 {
				h = h[:i]
			}
			h = strings.ReplaceAll(h, `\ `, " ")
			if h == "" {
				continue
			}
			ok := strings.HasPrefix(h, "./") || strings.HasPrefix(h, "~/") ||
				(strings.HasPrefix(h, "/") && h != "/") ||
				(!strings.HasPrefix(h, "@") && !claudeSpecialStart.MatchString(h) && claudeWordStart.MatchString(h))
			if ok && !slices.Contains(out, h) {
				out = append(out, h)
			}
		}
	}
	return out
}

// geminiImports returns the import specs of a GEMINI.md as Gemini CLI
// finds them (memoryImportProcessor.ts: `@` at the start or after white
// space, the path up to white space, starting with `.`, `/` or a letter),
// together with Claude's reading, and in code too: a spare import is one
// more file guarded, never one fewer.
func geminiImports(content []byte) []string {
	out := claudeImports(content)
	for _, f := range strings.Fields(string(content)) {
		if !strings.HasPrefix(f, "@") || len(f) < 2 {
			continue
		}
		h := f[1:]
		c := h[0]
		if (c == '.' || c == '/' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) && !slices.Contains(out, h) {
			out = append(out, h)
		}
	}
	return out
}

// proseLines returns the lines of a Markdown text outside fenced code
// blocks, with code spans blanked out.
func proseLines(s string) []string {
	var out []string
	fence := ""
	for _, line := range strings.Split(s, "\n") {
		line = strings.TrimSuffix(line, "\r")
		if fence != "" {
			if closesFence(line, fence) {
				fence = ""
			}
			continue
		}
		if f := opensFence(line); f != "" {
			fence = f
			continue
		}
		out = append(out, blankCodeSpans(line))
	}
	return out
}

// opensFence returns the fence (``` or ~~~, at least three) a line opens,
// or "" (CommonMark: at most three spaces of indentation; a backtick
// fence's info string has no backtick).
func opensFence(line string) string {
	t := strings.TrimLeft(line, " ")
	if len(line)-len(t) > 3 || len(t) < 3 || (t[0] != '`' && t[0] != '~') {
		return ""
	}
	n := 0
	for n < len(t) && t[n] == t[0] {
		n++
	}
	if n < 3 || (t[0] == '`' && strings.Contains(t[n:], "`")) {
		return ""
	}
	return t[:n]
}

func closesFence(line, fence string) bool {
	t := strings.TrimLeft(line, " ")
	if len(line)-len(t) > 3 || !strings.HasPrefix(t, fence) {
		return false
	}
	rest := strings.TrimLeft(t, fence[:1])
	return strings.TrimSpace(rest) == ""
}

// blankCodeSpans replaces code spans (a backtick run, closed by the next
// run of the same length on the line) with spaces; an unclosed run is
// literal text, as is a backslash-escaped backtick.
func blankCodeSpans(line string) string {
	b := []byte(line)
	for i := 0; i < len(b); i++ {
		if b[i] == '\\' {
			i++
			continue
		}
		if b[i] != '`' {
			continue
		}
		n := 0
		for i+n < len(b) && b[i+n] == '`' {
			n++
		}
		end := -1
		for j := i + n; j < len(b); {
			if b[j] != '`' {
				j++
				continue
			}
			m := 0
			for j+m < len(b) && b[j+m] == '`' {
				m++
			}
			if m == n {
				end = j + m
				break
			}
			j += m
		}
		if end < 0 {
			i += n - 1
			continue
		}
		for k := i; k < end; k++ {
			b[k] = ' '
		}
		i = end - 1
	}
	return string(b)
}

// opencodeConfig is the part of opencode.json that names files.
type opencodeConfig struct {
	Instructions []string `json:"instructions"`
}

// fileSubstRe is opencode 1.18.33's `{file:path}` substitution in config
// text (ConfigVariable.substitute).
var fileSubstRe = regexp.MustCompile(`\{file:[^}]+\}`)

// opencodeRefs returns what an opencode.json(c) at rel loads: its
// `instructions` entries (read from the worktree root, the cage's working
// directory: opencode globs them upwards from there to the git root) and
// `{file:path}` substitutions (relative to the config file's directory).
// URLs are fetched, not read from the worktree: left out. An unreadable
// config is read for substitutions only (opencode would fail to start on
// it).
func opencodeRefs(rel string, content []byte) []ref {
	var out []ref
	text := string(content)
	for _, loc := range fileSubstRe.FindAllStringIndex(text, -1) {
		// opencode skips a substitution on a line commented out with //.
		start := strings.LastIndexByte(text[:loc[0]], '\n') + 1
		if strings.HasPrefix(strings.TrimLeft(text[start:loc[0]], " \t"), "//") {
			continue
		}
		spec := strings.TrimSuffix(strings.TrimPrefix(text[loc[0]:loc[1]], "{file:"), "}")
		out = append(out, ref{spec: spec, base: dirOf(rel), absentOK: true})
	}
	var cfg opencodeConfig
	if err := json.Unmarshal(jsoncToJSON(content), &cfg); err == nil {
		for _, in := range cfg.Instructions {
			if strings.HasPrefix(in, "https://") || strings.HasPrefix(in, "http://") {
				continue
			}
			out = append(out, ref{spec: in, base: "", glob: hasGlobMeta(in), absentOK: true})
		}
	}
	return out
}

// jsoncToJSON turns JSONC (comments, trailing commas) into JSON, as opencode
// reads opencode.jsonc; input it cannot parse is returned as is, so the
// caller's json.Unmarshal fails on it.
func jsoncToJSON(b []byte) []byte {
	out, err := hujson.Standardize(slices.Clone(b))
	if err != nil {
		return b
	}
	return out
}

func hasGlobMeta(s string) bool { return strings.ContainsAny(s, "*?[{") }

func dirOf(rel string) string {
	d := path.Dir(rel)
	if d == "." {
		return ""
	}
	return d
}

// cageCommandRefs returns the worktree files a trusted agent config at rel
// runs in the cage: Claude Code hook, status line and helper commands
// (.claude/settings*.json), MCP server commands and args (.mcp.json,
// opencode's mcp), opencode formatter and LSP commands and plugin paths.
// Each word of a command is a candidate, relative to the worktree root
// (the cage's working directory, where hooks and servers start);
// `$CLAUDE_PROJECT_DIR` reads as the root. Only those fields: a word in
// a permission rule or a prompt is not a command.
func cageCommandRefs(rel string, content []byte) ([]ref, string) {
	var v map[string]any
	if json.Unmarshal(jsoncToJSON(content), &v) != nil {
		return nil, ""
	}
	var cmds []string
	base := path.Base(rel)
	switch {
	case strings.HasPrefix(base, "settings") && strings.HasSuffix(base, ".json") && strings.HasSuffix(GuardedRoot(rel), ".claude"):
		if hooks, ok := v["hooks"].(map[string]any); ok {
			for _, groups := range hooks {
				for _, g := range asList(groups) {
					gm, _ := g.(map[string]any)
					for _, h := range asList(gm["hooks"]) {
						hm, _ := h.(map[string]any)
						cmds = append(cmds, asStrings(hm["command"])...)
					}
				}
			}
		}
		for _, k := range []string{"statusLine", "fileSuggestion"} {
			if m, ok := v[k].(map[string]any); ok {
				cmds = append(cmds, asStrings(m["command"])...)
			}
		}
		for _, k := range []string{"apiKeyHelper", "awsCredentialExport", "awsAuthRefresh", "otelHeadersHelper"} {
			cmds = append(cmds, asStrings(v[k])...)
		}
	case base == ".mcp.json":
		cmds = append(cmds, mcpCommands(v["mcpServers"])...)
	case base == "opencode.json" || base == "opencode.jsonc":
		cmds = append(cmds, mcpCommands(v["mcp"])...)
		for _, k := range []string{"formatter", "lsp"} {
			if m, ok := v[k].(map[string]any); ok {
				for _, e := range m {
					em, _ := e.(map[string]any)
					cmds = append(cmds, asStrings(em["command"])...)
				}
			}
		}
		cmds = append(cmds, asStrings(v["plugin"])...)
	default:
		return nil, ""
	}
	var out []ref
	for _, c := range cmds {
		c = strings.NewReplacer("${CLAUDE_PROJECT_DIR}", ".", "$CLAUDE_PROJECT_DIR", ".", "file://", "").Replace(c)
		for _, w := range shellWords(c) {
			out = append(out, ref{spec: w})
		}
	}
	return out, "run in the cage by a hook, MCP server or plugin of the trusted " + rel
}

func mcpCommands(servers any) []string {
	m, _ := servers.(map[string]any)
	var out []string
	for _, s := range m {
		sm, _ := s.(map[string]any)
		out = append(out, asStrings(sm["command"])...)
		out = append(out, asStrings(sm["args"])...)
	}
	return out
}

func asList(v any) []any {
	l, _ := v.([]any)
	return l
}

// asStrings reads a string or a list of strings.
func asStrings(v any) []string {
	switch x := v.(type) {
	case string:
		return []string{x}
	case []any:
		var out []string
		for _, e := range x {
			if s, ok := e.(string); ok {
				out = append(out, s)
			}
		}
		return out
	}
	return nil
}

// Host-side tool config: what each guarded tool file runs, as far as it
// can be read. Every word of a command that names a worktree file is a
// reference; so is every path a direnv directive loads.

// direnvLoaders are .envrc commands whose argument is a file direnv reads
// (or sources) when it exists.
var direnvLoaders = map[string]bool{
	"source_env": true, "source_env_if_exists": true, "dotenv": true, "dotenv_if_exists": true,
	"source": true, ".": true, "watch_file": true,
}

// hostRefs returns what a host-side tool file at rel (guarded by name)
// runs or sources, with why it is listed.
func hostRefs(rel string, content []byte) ([]ref, string) {
	base := path.Base(rel)
	root := GuardedRoot(rel)
	switch {
	case base == ".crushrc" || base == "crushrc":
		// Bash that Crush runs at start: what it sources or runs is read
		// as direnv's loaders are (source and . name files to record).
		return shellRefs(rel, string(content), true), "run or sourced by the trusted " + rel + " (Crush, at start)"
	case base == ".envrc":
		return shellRefs(rel, string(content), true), "run by the trusted " + rel + " (direnv, on entering the directory)"
	case base == ".pre-commit-config.yaml":
		return preCommitRefs(content), "run by a local hook of the trusted " + rel + " (pre-commit)"
	case strings.HasSuffix(root, ".husky") || strings.HasSuffix(root, ".githooks"):
		// Hooks run from the repository root.
		return shellRefsFrom(string(content), ""), "run by the trusted git hook " + rel
	case base == ".mise.toml" || base == "mise.toml":
		return stringRefs(tomlStrings(content), dirOf(rel)), "run by the trusted " + rel + " (mise tasks, hooks, env sources)"
	case strings.HasSuffix(root, ".vscode") && path.Base(rel) == "tasks.json",
		strings.HasSuffix(root, ".devcontainer") && strings.HasSuffix(rel, ".json"):
		return stringRefs(jsonStrings(jsoncToJSON(content)), ""), "run by the trusted " + rel
	}
	return nil, ""
}

// shellRefs reads a shell script's words: with directives, direnv's
// loaders (and `use flake`/`use nix`) name files to record even when absent.
func shellRefs(rel, script string, directives bool) []ref {
	dir := dirOf(rel)
	var out []ref
	for _, line := range strings.Split(script, "\n") {
		words := shellWords(line)
		for i, w := range words {
			if i == 0 || w == "" {
				continue
			}
			if directives && direnvLoaders[words[0]] {
				out = append(out, ref{spec: w, base: dir, absentOK: true})
				continue
			}
			out = append(out, ref{spec: w, base: dir})
		}
		if directives && len(words) >= 2 && words[0] == "use" {
			switch words[1] {
			case "flake":
				out = append(out, ref{spec: "flake.nix", base: dir, absentOK: true}, ref{spec: "flake.lock", base: dir, absentOK: true})
			case "nix":
				out = append(out, ref{spec: "shell.nix", base: dir, absentOK: true}, ref{spec: "default.nix", base: dir, absentOK: true})
			}
		}
		if len(words) > 0 {
			out = append(out, ref{spec: words[0], base: dir})
		}
	}
	return out
}

func shellRefsFrom(script, base string) []ref {
	var out []ref
	for _, line := range strings.Split(script, "\n") {
		for _, w := range shellWords(line) {
			out = append(out, ref{spec: w, base: base})
		}
	}
	return out
}

// shellWords splits a line into words, quotes removed, a comment cut
// off, `;|&()` as separators. It is a reading for references, not a shell.
func shellWords(line string) []string {
	var words []string
	var cur strings.Builder
	quote := byte(0)
	flush := func() {
		if cur.Len() > 0 {
			words = append(words, cur.String())
			cur.Reset()
		}
	}
	for i := 0; i < len(line); i++ {
		c := line[i]
		switch {
		case quote != 0:
			if c == quote {
				quote = 0
			} else {
				cur.WriteByte(c)
			}
		case c == '\'' || c == '"':
			quote = c
		case c == '#' && cur.Len() == 0:
			flush()
			return words
		case strings.IndexByte(" \t;|&()`<>", c) >= 0:
			flush()
		default:
			cur.WriteByte(c)
		}
	}
	flush()
	return words
}

// preCommitRefs reads the entries (and args) of `repo: local` hooks; they
// run from the repository root.
func preCommitRefs(content []byte) []ref {
	var cfg struct {
		Repos []struct {
			Repo  string `json:"repo"`
			Hooks []struct {
				Entry string   `json:"entry"`
				Args  []string `json:"args"`
			} `json:"hooks"`
		} `json:"repos"`
	}
	if err := yaml.Unmarshal(content, &cfg); err != nil {
		// Unreadable: every word of the file is a candidate.
		return shellRefsFrom(string(content), "")
	}
	var out []ref
	for _, r := range cfg.Repos {
		if r.Repo != "local" && r.Repo != "meta" {
			continue
		}
		for _, h := range r.Hooks {
			out = append(out, shellRefsFrom(h.Entry, "")...)
			for _, a := range h.Args {
				out = append(out, shellRefsFrom(a, "")...)
			}
		}
	}
	return out
}

// stringRefs reads every word of every string as a reference.
func stringRefs(strs []string, base string) []ref {
	var out []ref
	for _, s := range strs {
		s = strings.ReplaceAll(s, "${workspaceFolder}", ".")
		s = strings.ReplaceAll(s, "${localWorkspaceFolder}", ".")
		s = strings.ReplaceAll(s, "${containerWorkspaceFolder}", ".")
		for _, w := range shellWords(s) {
			out = append(out, ref{spec: w, base: base})
		}
	}
	return out
}

func jsonStrings(b []byte) []string {
	var v any
	if json.Unmarshal(b, &v) != nil {
		return shellWords(string(b))
	}
	return collectStrings(v, nil)
}

func tomlStrings(b []byte) []string {
	var v map[string]any
	if _, err := toml.Decode(string(b), &v); err != nil {
		return shellWords(string(b))
	}
	return collectStrings(v, nil)
}

func collectStrings(v any, out []string) []string {
	switch x := v.(type) {
	case string:
		out = append(out, x)
	case []any:
		for _, e := range x {
			out = collectStrings(e, out)
		}
	case map[string]any:
		for k, e := range x {
			out = append(out, k)
			out = collectStrings(e, out)
		}
	}
	return out
}

// resolveSpec maps a reference to a worktree-relative path. outside is set
// for one that leads out of the worktree (`~/`, an absolute path not under
// /work, `..` past the root); "" with !outside means no path at all.
func resolveSpec(r ref) (rel string, outside bool) {
	s := r.spec
	switch {
	case s == "" || s == "." || s == "/":
		return "", false
	case strings.HasPrefix(s, "~"):
		return "", true
	case strings.Contains(s, "://") || strings.Contains(s, "$") || strings.ContainsRune(s, 0):
		return "", false // a URL or an expansion: nothing to resolve here
	case path.IsAbs(s):
		c := path.Clean(s)
		if c == "/work" {
			return "", false
		}
		if !strings.HasPrefix(c, "/work/") {
			return "", true
		}
		return strings.TrimPrefix(c, "/work/"), false
	}
	c := path.Clean(path.Join("/work", r.base, s))
	if c == "/work" {
		return "", false
	}
	if !strings.HasPrefix(c, "/work/") {
		return "", true
	}
	return strings.TrimPrefix(c, "/work/"), false
}
