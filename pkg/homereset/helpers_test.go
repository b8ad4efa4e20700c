package homereset

import (
	"crypto/sha256"
	"encoding/hex"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"gotest.tools/v3/assert"

	"github.com/shrooms-cage/shrooms/internal/itest"
	"github.com/shrooms-cage/shrooms/pkg/config"
)

// testBase is a host uid base in the shrooms range, per test process.
var testBase = 1879048192 + (30000+os.Getpid()%5000)*65536

const agentUID = 1000

// newTask makes a root-owned task root and a config with a baseline for
// every profile and bootstrap tokens for claude and opencode.
func newTask(t *testing.T, profiles ...string) Task {
	t.Helper()
	itest.Require(t, itest.Root) // chown to the agent's host uid
	dir := t.TempDir()
	root := filepath.Join(dir, "vol")
	assert.NilError(t, os.Mkdir(root, 0o700))
	tok := filepath.Join(dir, "tokens")
	assert.NilError(t, os.Mkdir(tok, 0o700))
	write(t, filepath.Join(tok, "claude"), `{"claudeAiOauth":{"accessToken":"at-1","refreshToken":"rt-1","expiresAt":1}}`)
	write(t, filepath.Join(tok, "opencode"), `{"anthropic":{"type":"api","key":"sk-1"}}`)
	host := filepath.Join(dir, "host")
	assert.NilError(t, os.Mkdir(host, 0o755))
	write(t, filepath.Join(host, "gitconfig"), "[user]\n\tname = agent\n")
	write(t, filepath.Join(host, "profile"), "export PATH=/usr/bin:/bin\n")
	cfg := config.Default()
	cfg.Tokens = map[string]string{"claude": filepath.Join(tok, "claude"), "opencode": filepath.Join(tok, "opencode")}
	cfg.Home.Profile("claude").Settings = map[string]any{"model": "opus", "permissions": map[string]any{"deny": []any{"Read(/etc/shadow)"}}}
	cfg.Home.Profile("claude").Instructions = "Work in /work.\n"
	cfg.Home.Profile("claude").Bootstrap = map[string]string{".claude/.credentials.json": "claude"}
	cfg.Home.Profile("opencode").Settings = map[string]any{"theme": "system"}
	cfg.Home.Profile("opencode").Bootstrap = map[string]string{".local/share/opencode/auth.json": "opencode"}
	cfg.Home.Profile("shell").Files = map[string]string{".gitconfig": filepath.Join(host, "gitconfig"), ".profile": filepath.Join(host, "profile")}
	assert.NilError(t, cfg.Validate())
	return Task{Root: root, UID: testBase + agentUID, GID: testBase + agentUID, Config: cfg, Profiles: profiles}
}

func write(t testing.TB, path, content string) {
	t.Helper()
	assert.NilError(t, os.MkdirAll(filepath.Dir(path), 0o755))
	assert.NilError(t, os.WriteFile(path, []byte(content), 0o644))
}

// treeDigest lists a tree (type, mode, size, content hash, link target) and
// hashes it; links are never followed.
func treeDigest(t testing.TB, root string) (string, []string) {
	t.Helper()
	var lines []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		info, err := d.Info()
		if err != nil {
			return err
		}
		line := rel + " " + info.Mode().String()
		switch {
		case info.Mode().IsRegular():
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			sum := sha256.Sum256(data)
			line += " " + hex.EncodeToString(sum[:8])
		case info.Mode()&fs.ModeSymlink != 0:
			target, _ := os.Readlink(p)
			line += " -> " + target
		}
		lines = append(lines, line)
		return nil
	})
	assert.NilError(t, err)
	sort.Strings(lines)
	sum := sha256.Sum256([]byte(strings.Join(lines, "\n")))
	return hex.EncodeToString(sum[:]), lines
}

// files lists the regular files and symlinks under root, relative.
func files(t testing.TB, root string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			rel, _ := filepath.Rel(root, p)
			out = append(out, rel)
		}
		return nil
	})
	assert.NilError(t, err)
	sort.Strings(out)
	return out
}
