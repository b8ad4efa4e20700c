package guard

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

func TestClaudeImportsAsClaudeCodeReadsThem(t *testing.T) {
	md := strings.Join([]string{
		"See @guide/notes.md and @./rel.md , also @~/home.md and @/abs/x.md. (a dot ends the last)",
		"A fragment: @guide/frag.md#section, an escaped space: @guide/my\\ file.md",
		"mail user@example.com is no import; @@twice, @#hash, @/ and @ alone are not either",
		"`@guide/in-span.md` is code; ``a ` @guide/in-double-span.md`` too; \\` @guide/escaped-tick.md",
		"```",
		"@guide/in-fence.md",
		"```",
		"~~~~ text",
		"@guide/in-tilde-fence.md",
		"~~~",
		"still fenced @guide/still-fenced.md",
		"~~~~",
		"    ```not a fence (indented four)",
		"after @guide/after.md",
		"@guide/after.md again, and @types/node",
	}, "\n")
	got := claudeImports([]byte(md))
	assert.DeepEqual(t, got, []string{
		"guide/notes.md", "./rel.md", "~/home.md", "/abs/x.md.",
		"guide/frag.md", "guide/my file.md",
		"guide/escaped-tick.md",
		"guide/after.md", "types/node",
	})
}

func TestResolveSpec(t *testing.T) {
	for _, c := range []struct {
		spec, base, want string
		outside          bool
	}{
		{"guide/a.md", "", "guide/a.md", false},
		{"./a.md", "sub", "sub/a.md", false},
		{"../a.md", "sub", "a.md", false},
		{"../../a.md", "sub", "", true},
		{"~/a.md", "", "", true},
		{"/etc/passwd", "", "", true},
		{"/work/guide/a.md", "sub", "guide/a.md", false},
		{"/work", "", "", false},
		{"/outbox/x", "", "", true},
		{"$HOME/x", "", "", false},
		{"https://example.com/x", "", "", false},
	} {
		got, outside := resolveSpec(ref{spec: c.spec, base: c.base})
		assert.Equal(t, got, c.want, "%+v", c)
		assert.Equal(t, outside, c.outside, "%+v", c)
	}
}

func TestGlob(t *testing.T) {
	for _, c := range []struct {
		pat, rel string
		want     bool
	}{
		{"guide/*.md", "guide/a.md", true},
		{"guide/*.md", "guide/sub/a.md", false},
		{"guide/**/*.md", "guide/a.md", true},
		{"guide/**/*.md", "guide/x/y/a.md", true},
		{"**/*.md", ".hidden/a.md", true},
		{"{docs,notes}/*.md", "notes/a.md", true},
		{"{docs,notes}/*.md", "src/a.md", false},
		{"rules/[ab].md", "rules/b.md", true},
	} {
		assert.Equal(t, globMatch(c.pat, c.rel), c.want, "%+v", c)
	}
	assert.Assert(t, globBelow("guide/**/*.md", "guide/sub"))
	assert.Assert(t, globBelow("guide/*.md", "guide"))
	assert.Assert(t, !globBelow("guide/*.md", "guide/sub"))
	assert.Assert(t, !globBelow("guide/*.md", "src"))
	assert.Equal(t, len(expandBraces(strings.Repeat("{a,b}", 10))), 1, "a brace bomb expands to a catch-all")
}

// importRepo is a worktree whose trusted CLAUDE.md imports a chain.
func importRepo(t *testing.T, files map[string]string) (string, Store) {
	t.Helper()
	wt := t.TempDir()
	tree(t, wt, files)
	return wt, Store{Dir: filepath.Join(t.TempDir(), "trust")}
}

func trustAndGuard(t *testing.T, wt string, store Store) (*TrustResult, func() *Check) {
	t.Helper()
	ctx := context.Background()
	res, err := store.Trust(ctx, wt, nil)
	assert.NilError(t, err)
	return res, func() *Check {
		t.Helper()
		m, err := store.Load()
		assert.NilError(t, err)
		c, err := store.Guard(ctx, wt, m)
		assert.NilError(t, err)
		return c
	}
}

func TestImportsRecursionCyclesDepthAndOutside(t *testing.T) {
	wt, store := importRepo(t, map[string]string{
		"CLAUDE.md": "Read @guide/notes.md\n```\n@guide/fenced.md\n```\n`@guide/span.md`\n" +
			"Home: @~/.claude/mine.md parent: @../up.md root: @/etc/hosts absolute in tree: @/work/guide/abs.md and missing: @guide/missing.md\n",
		"guide/notes.md":        "more in @./deeper/one.md and back to @../CLAUDE.md and @notes.md itself\n",
		"guide/deeper/one.md":   "@two.md\n",
		"guide/deeper/two.md":   "@three.md\n",
		"guide/deeper/three.md": "@four.md\n",
		"guide/deeper/four.md":  "@five.md\n",
		"guide/deeper/five.md":  "@six.md\n",
		"guide/deeper/six.md":   "too deep\n",
		"guide/abs.md":          "absolute\n",
		"guide/fenced.md":       "not imported\n",
		"guide/span.md":         "not imported\n",
		"sub/CLAUDE.md":         "nested: @../guide/sub.md and @.claude/x.md\n",
		"sub/.claude/x.md":      "@/work/guide/via-guarded.md\n",
		"guide/sub.md":          "nested import\n",
		"guide/via-guarded.md":  "through a guarded file\n",
	})
	res, guard := trustAndGuard(t, wt, store)
	assert.DeepEqual(t, res.Loads, []string{
		"guide/abs.md", "guide/deeper/four.md", "guide/deeper/one.md", "guide/deeper/three.md",
		"guide/deeper/two.md", "guide/missing.md", "guide/notes.md", "guide/sub.md", "guide/via-guarded.md",
	})
	var outside []string
	for _, o := range res.Outside {
		outside = append(outside, o.By+": "+o.Spec)
	}
	assert.DeepEqual(t, outside, []string{"CLAUDE.md: ~/.claude/mine.md", "CLAUDE.md: ../up.md", "CLAUDE.md: /etc/hosts"})
	m, err := store.Load()
	assert.NilError(t, err)
	assert.Equal(t, m.Loads["guide/missing.md"].Type, "absent")
	assert.Equal(t, m.Loads["guide/deeper/one.md"].By, "imported by guide/notes.md, which the trusted CLAUDE.md imports (Claude Code @import)")
	c := guard()
	assert.Equal(t, len(c.Changes), 0, "%+v", c.Changes)
	assert.Equal(t, c.Referenced("guide/notes.md"), "imported by the trusted CLAUDE.md (Claude Code @import)")
	// Claude Code 2.1.332 reads imports down to four hops past CLAUDE.md
	// (its loader skips depth 5); the guard follows five.
	assert.Equal(t, c.Referenced("guide/deeper/four.md"), "imported by guide/deeper/three.md, which the trusted CLAUDE.md imports (Claude Code @import)")
	assert.Equal(t, c.Referenced("guide/deeper/five.md"), "", "past the depth")
}

func TestChangedImportIsMaskedWithTheTrustedCopy(t *testing.T) {
	wt, store := importRepo(t, map[string]string{
		"CLAUDE.md":       "@guide/notes.md @guide/new.md @guide/gone.md @guide/linked.md @lnk/x.md\n",
		"guide/notes.md":  "owner's notes\n",
		"guide/gone.md":   "to delete\n",
		"guide/linked.md": "to replace by a link\n",
		"lnk/x.md":        "its directory becomes a link\n",
		"other/x.md":      "planted\n",
	})
	_, guard := trustAndGuard(t, wt, store)
	before := guard().Digest

	// The turn edits, creates, deletes.
	tree(t, wt, map[string]string{"guide/notes.md": "CODEWORD from the turn\n", "guide/new.md": "planted\n"})
	assert.NilError(t, os.Remove(filepath.Join(wt, "guide/gone.md")))
	c := guard()
	assert.Assert(t, c.Digest != before)
	var got []string
	for _, ch := range c.Changes {
		got = append(got, ch.Path+" "+ch.Change+" "+ch.Type)
	}
	assert.DeepEqual(t, got, []string{"guide/gone.md deleted absent", "guide/new.md added file", "guide/notes.md modified file"})
	assert.DeepEqual(t, c.Masked, []string{"guide/new.md", "guide/notes.md"})
	srcs := map[string]string{}
	for _, mt := range c.Mounts {
		srcs[mt.Dest] = mt.Source
		assert.Assert(t, mt.ReadOnly)
	}
	b, err := os.ReadFile(srcs["/work/guide/notes.md"])
	assert.NilError(t, err)
	assert.Equal(t, string(b), "owner's notes\n", "the trusted copy is shown")
	b, err = os.ReadFile(srcs["/work/guide/new.md"])
	assert.NilError(t, err)
	assert.Equal(t, string(b), "", "a target absent when trusted is masked empty")

	// A link in place of a load, or on its way, is refused, not followed.
	assert.NilError(t, os.Remove(filepath.Join(wt, "guide/linked.md")))
	assert.NilError(t, os.Symlink("../other/x.md", filepath.Join(wt, "guide/linked.md")))
	m, _ := store.Load()
	_, err = store.Guard(context.Background(), wt, m)
	assert.ErrorContains(t, err, "guide/linked.md (imported by the trusted CLAUDE.md (Claude Code @import)) is now a link")
	assert.NilError(t, os.Remove(filepath.Join(wt, "guide/linked.md")))
	assert.NilError(t, os.WriteFile(filepath.Join(wt, "guide/linked.md"), []byte("to replace by a link\n"), 0o644))
	assert.NilError(t, os.RemoveAll(filepath.Join(wt, "lnk")))
	assert.NilError(t, os.Symlink("other", filepath.Join(wt, "lnk")))
	_, err = store.Guard(context.Background(), wt, m)
	assert.ErrorContains(t, err, "lnk/x.md (imported by the trusted CLAUDE.md (Claude Code @import)) is now a link or leads through one")

	// A FIFO is reported without being opened.
	assert.NilError(t, os.Remove(filepath.Join(wt, "lnk")))
	assert.NilError(t, os.MkdirAll(filepath.Join(wt, "lnk"), 0o755))
	assert.NilError(t, syscall.Mkfifo(filepath.Join(wt, "lnk/x.md"), 0o644))
	_, err = store.Guard(context.Background(), wt, m)
	assert.ErrorContains(t, err, "lnk/x.md (imported by the trusted CLAUDE.md (Claude Code @import)) is now a FIFO")
}

func TestTrustRefusesALinkOnAnImportPath(t *testing.T) {
	wt, store := importRepo(t, map[string]string{"CLAUDE.md": "@guide/notes.md\n", "real/notes.md": "x\n"})
	assert.NilError(t, os.Symlink("real", filepath.Join(wt, "guide")))
	_, err := store.Trust(context.Background(), wt, nil)
	assert.ErrorContains(t, err, "guide/notes.md (imported by the trusted CLAUDE.md (Claude Code @import)) is a link or leads through one; the guard does not follow links")
}

func TestPartialTrustOfALoad(t *testing.T) {
	wt, store := importRepo(t, map[string]string{"CLAUDE.md": "@guide/notes.md\n", "guide/notes.md": "v1\n"})
	_, guard := trustAndGuard(t, wt, store)
	ctx := context.Background()

	// A turn edits the import and adds a new one to CLAUDE.md.
	tree(t, wt, map[string]string{"guide/notes.md": "v2\n", "CLAUDE.md": "@guide/notes.md @guide/added.md\n", "guide/added.md": "unreviewed\n"})
	_, err := store.Trust(ctx, wt, []string{"guide/elsewhere.md"})
	assert.ErrorContains(t, err, `"guide/elsewhere.md" is not a guarded path`)
	// The owner accepts CLAUDE.md only: the import it newly names is
	// trusted as absent (its content unreviewed), the edited one keeps v1.
	_, err = store.Trust(ctx, wt, []string{"CLAUDE.md"})
	assert.NilError(t, err)
	c := guard()
	assert.DeepEqual(t, c.Masked, []string{"guide/added.md", "guide/notes.md"})
	// Naming the load trusts it.
	res, err := store.Trust(ctx, wt, []string{"guide/notes.md", "guide/added.md"})
	assert.NilError(t, err)
	assert.Assert(t, is.Contains(res.Trusted, "guide/notes.md"))
	assert.Equal(t, len(guard().Changes), 0)
}

func TestOpencodeInstructionsGlobsAndFileSubstitutions(t *testing.T) {
	wt, store := importRepo(t, map[string]string{
		"opencode.jsonc": `{
  // a comment
  "instructions": ["guide/*.md", "rules/main.md", "https://example.com/x.md", "~/mine.md", "/work/abs/*.txt",],
  "agent": {"build": {"prompt": "{file:./prompts/build.txt}"}},
  // "x": "{file:./commented.txt}"
}`,
		"guide/a.md":        "instructions a\n",
		"rules/main.md":     "main rules\n",
		"prompts/build.txt": "prompt\n",
		"abs/one.txt":       "abs\n",
		"guide/sub/deep.md": "not matched by guide/*.md\n",
	})
	res, guard := trustAndGuard(t, wt, store)
	assert.DeepEqual(t, res.Loads, []string{"abs/one.txt", "guide/a.md", "prompts/build.txt", "rules/main.md"})
	m, _ := store.Load()
	assert.DeepEqual(t, m.Patterns, []Pattern{
		{Glob: "guide/*.md", By: "an opencode instructions or {file:} reference of the trusted opencode.jsonc"},
		{Glob: "abs/*.txt", By: "an opencode instructions or {file:} reference of the trusted opencode.jsonc"},
	})
	assert.Equal(t, len(guard().Changes), 0)

	// A turn adds a file the glob matches and edits a literal entry.
	tree(t, wt, map[string]string{"guide/planted.md": "CODEWORD\n", "rules/main.md": "changed\n", "guide/sub/deep.md": "changed\n"})
	c := guard()
	assert.DeepEqual(t, c.Masked, []string{"guide/planted.md", "rules/main.md"})
	assert.Equal(t, c.Referenced("guide/other-new.md"), "an opencode instructions or {file:} reference of the trusted opencode.jsonc")
	assert.Equal(t, c.Referenced("guide/sub/deep.md"), "")

	// A link where the glob would match is refused.
	assert.NilError(t, os.Symlink("../rules/main.md", filepath.Join(wt, "guide/link.md")))
	_, err := store.Guard(context.Background(), wt, m)
	assert.ErrorContains(t, err, "guide/link.md (an opencode instructions or {file:} reference of the trusted opencode.jsonc) is now a link")
}

func TestHostToolReferences(t *testing.T) {
	wt, store := importRepo(t, map[string]string{
		".envrc": "source_env scripts/env.sh\nsource_env_if_exists .envrc.local\nPATH_add bin\n./scripts/setup.sh --fast\nuse flake\nexport X=1 # not/a/file\n",
		".pre-commit-config.yaml": `repos:
- repo: local
  hooks:
  - id: lint
    name: lint
    entry: ./tools/lint.sh --strict
    language: script
- repo: https://github.com/pre-commit/pre-commit-hooks
  rev: v4.0.0
  hooks:
  - id: trailing-whitespace
`,
		".husky/pre-commit":  "#!/bin/sh\nnode tools/check.js\n",
		".vscode/tasks.json": `{"tasks": [{"label": "b", "command": "${workspaceFolder}/tools/build.sh", "args": ["-v"]}]}`,
		"mise.toml":          "[tasks.test]\nrun = \"tools/test.sh\"\n",
		"scripts/env.sh":     "export A=1\n",
		"scripts/setup.sh":   "echo setup\n",
		"tools/lint.sh":      "lint\n",
		"tools/check.js":     "check\n",
		"tools/build.sh":     "build\n",
		"tools/test.sh":      "test\n",
	})
	_, guard := trustAndGuard(t, wt, store)
	m, _ := store.Load()
	var got []string
	for rel := range m.HostRefs {
		got = append(got, rel)
	}
	assert.DeepEqual(t, sortedStrings(got), []string{
		".envrc.local", "flake.lock", "flake.nix", "scripts/env.sh", "scripts/setup.sh",
		"tools/build.sh", "tools/check.js", "tools/lint.sh", "tools/test.sh",
	})
	c := guard()
	assert.Equal(t, c.Referenced("scripts/env.sh"), "run by the trusted .envrc (direnv, on entering the directory)")
	assert.Equal(t, c.Referenced("tools/lint.sh"), "run by a local hook of the trusted .pre-commit-config.yaml (pre-commit)")
	assert.Equal(t, c.Referenced("tools/check.js"), "run by the trusted git hook .husky/pre-commit")
	assert.Equal(t, len(c.Masked), 0, "host-side references are listed, not masked")
}

func TestVersionOneManifestFailsClosed(t *testing.T) {
	store := Store{Dir: t.TempDir()}
	assert.NilError(t, os.WriteFile(filepath.Join(store.Dir, manifestName), []byte(`{"version":1,"worktree":"/x","entries":{}}`), 0o600))
	_, err := store.Load()
	assert.ErrorContains(t, err, "has version 1, this shrooms reads 2; run `shrooms trust`")
}

func sortedStrings(s []string) []string {
	out := append([]string{}, s...)
	for i := range out {
		for j := i + 1; j < len(out); j++ {
			if out[j] < out[i] {
				out[i], out[j] = out[j], out[i]
			}
		}
	}
	return out
}

func TestHookAndServerScriptsAreLoads(t *testing.T) {
	wt, store := importRepo(t, map[string]string{
		".claude/settings.json": `{"permissions": {"allow": ["Read(src/main.go)"]},
  "hooks": {"SessionStart": [{"hooks": [{"type": "command", "command": "sh \"$CLAUDE_PROJECT_DIR\"/scripts/hook.sh --quiet"}]}]},
  "statusLine": {"type": "command", "command": "./scripts/status.sh"}}`,
		".mcp.json":         `{"mcpServers": {"t": {"command": "node", "args": ["tools/server.js", "--config", "tools/mcp.yaml"]}}}`,
		"opencode.json":     `{"mcp": {"o": {"type": "local", "command": ["python3", "tools/oc.py"]}}, "plugin": ["./plugins/p.js", "some-npm-plugin"]}`,
		"scripts/hook.sh":   "echo hook\n",
		"scripts/status.sh": "echo status\n",
		"tools/server.js":   "server\n",
		"tools/mcp.yaml":    "a: 1\n",
		"tools/oc.py":       "oc\n",
		"plugins/p.js":      "export {}\n",
		"src/main.go":       "package main\n",
	})
	res, guard := trustAndGuard(t, wt, store)
	assert.DeepEqual(t, res.Loads, []string{"plugins/p.js", "scripts/hook.sh", "scripts/status.sh", "tools/mcp.yaml", "tools/oc.py", "tools/server.js"})
	tree(t, wt, map[string]string{"tools/server.js": "evil\n", "src/main.go": "package main // edited\n"})
	c := guard()
	assert.DeepEqual(t, c.Masked, []string{"tools/server.js"})
	assert.Equal(t, c.Changes[0].Why, "run in the cage by a hook, MCP server or plugin of the trusted .mcp.json")
}

func TestImportThroughALinkInATrustedRootIsNotFollowed(t *testing.T) {
	outside := t.TempDir()
	tree(t, outside, map[string]string{"secret.md": "@/work/guide/leak.md\n"})
	wt, store := importRepo(t, map[string]string{"CLAUDE.md": "@.claude/link/secret.md\n", ".claude/settings.json": "{}"})
	assert.NilError(t, os.Symlink(outside, filepath.Join(wt, ".claude/link")))
	res, _ := trustAndGuard(t, wt, store)
	// Read through the link, secret.md would name guide/leak.md.
	assert.DeepEqual(t, res.Loads, []string{})
}

func TestClaudeMDLinkedToAnotherFileIsFollowedInTheTree(t *testing.T) {
	wt, store := importRepo(t, map[string]string{
		"AGENTS.md":            "shared rules @guide/notes.md\n",
		"guide/notes.md":       "notes\n",
		"sub/real/claude.md":   "@x.md\n",
		"sub/real/x.md":        "x\n",
		"sub/CLAUDE.local.md/": "",
	})
	assert.NilError(t, os.Symlink("AGENTS.md", filepath.Join(wt, "CLAUDE.md")))
	assert.NilError(t, os.Remove(filepath.Join(wt, "sub/CLAUDE.local.md")))
	assert.NilError(t, os.Symlink("real/claude.md", filepath.Join(wt, "sub/CLAUDE.local.md")))
	res, guard := trustAndGuard(t, wt, store)
	assert.DeepEqual(t, res.Loads, []string{"guide/notes.md", "sub/real/claude.md", "sub/real/x.md"})
	tree(t, wt, map[string]string{"sub/real/claude.md": "@x.md @evil.md\n"})
	assert.DeepEqual(t, guard().Masked, []string{"sub/real/claude.md"})
}

func TestGuardedLinkTargetsAreTrusted(t *testing.T) {
	wt, store := importRepo(t, map[string]string{"guide/rules.md": "rules\n", "config/claude/settings.json": "{}"})
	assert.NilError(t, os.Symlink("guide/rules.md", filepath.Join(wt, "AGENTS.md")))
	res, guard := trustAndGuard(t, wt, store)
	assert.DeepEqual(t, res.Loads, []string{"guide/rules.md"})
	tree(t, wt, map[string]string{"guide/rules.md": "CODEWORD\n"})
	assert.DeepEqual(t, guard().Masked, []string{"guide/rules.md"})

	assert.NilError(t, os.Symlink("config/claude", filepath.Join(wt, ".claude")))
	_, err := store.Trust(context.Background(), wt, nil)
	assert.ErrorContains(t, err, "worktree trust: .claude links to the directory config/claude, which the guard does not watch")
}

// TestGeminiImportsAndCrushrcSources: a trusted GEMINI.md's `@file`
// imports (nested ones too) are loads: a turn's change to one is masked
// with the trusted copy. What a trusted .crushrc sources is listed.
func TestGeminiImportsAndCrushrcSources(t *testing.T) {
	wt, store := ownerRepo(t)
	tree(t, wt, map[string]string{
		"GEMINI.md":       "Read @guide/style.md first.\n",
		"guide/style.md":  "See @./more.md\n",
		"guide/more.md":   "owner's more\n",
		".crushrc":        "source ./crush/extra.sh\n",
		"crush/extra.sh":  "permissions allow view\n",
		"notes/unrelated": "x\n",
	})
	ctx := context.Background()
	res, err := store.Trust(ctx, wt, nil)
	assert.NilError(t, err)
	assert.Check(t, is.Contains(res.Loads, "guide/style.md"))
	assert.Check(t, is.Contains(res.Loads, "guide/more.md"))
	m, _ := store.Load()
	assert.Check(t, is.Contains(m.HostRefs["crush/extra.sh"], "Crush"))
	tree(t, wt, map[string]string{"guide/more.md": "planted\n", "notes/unrelated": "y\n"})
	c, err := store.Guard(ctx, wt, m)
	assert.NilError(t, err)
	assert.DeepEqual(t, c.Masked, []string{"guide/more.md"})
	assert.Check(t, is.Contains(c.Changes[0].Why, "Gemini CLI @import"))
}
