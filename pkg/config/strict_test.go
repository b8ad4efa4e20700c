package config

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"gotest.tools/v3/assert"
)

const agentX = "[agents.x]\ncommand = [\"sh\"]\nhome = [\"shell\"]\n"

// TestScalarWhereTableBelongs: a scalar or array for a table is an error
// naming the key and its line, not a silently dropped setting.
func TestScalarWhereTableBelongs(t *testing.T) {
	for _, tc := range []struct{ name, toml, want string }{
		{"env", agentX + "env = \"FOO=1\"\n", `config t.toml:4: agents.x.env: must be a table`},
		{"token_env", agentX + "token_env = \"KEY\"\n", `config t.toml:4: agents.x.token_env: must be a table`},
		{"settings", "[home.claude]\nsettings = \"{}\"\n", `config t.toml:2: home.claude.settings: must be a table`},
		{"managed", "[home.claude]\n\nmanaged = [1]\n", `config t.toml:3: home.claude.managed: must be a table`},
		{"files", "[home.shell]\nfiles = \"/etc/x\"\n", `config t.toml:2: home.shell.files: must be a table`},
		{"tokens", "tokens = \"x\"\n", `config t.toml:1: tokens: must be a table`},
		{"section", "cage = 1\n", `config t.toml:1: cage: type mismatch`},
		{"agent", "[agents]\nx = \"sh\"\n", `config t.toml:2: agents.x: type mismatch`},
	} {
		_, err := Parse("t.toml", []byte(tc.toml))
		assert.ErrorContains(t, err, tc.want, tc.name)
	}
	// Positive controls: the same keys as tables, inline or as sections.
	c, err := Parse("t.toml", []byte(agentX+"env = { FOO = \"1\" }\n[agents.x.token_env]\n[home.claude.settings]\nmodel = \"m\"\n"))
	assert.NilError(t, err)
	assert.Equal(t, c.Agents["x"].Env["FOO"], "1")
	assert.Equal(t, c.Home.Profile("claude").Settings["model"], "m")
}

func TestHostnameFormat(t *testing.T) {
	for _, ok := range []string{"cage-%s", "%s", "%s.cage", "x-%s-y"} {
		_, err := Parse("t.toml", []byte("[cage]\nhostname_format = \""+ok+"\"\n"))
		assert.NilError(t, err, ok)
	}
	for _, bad := range []string{"cage", "cage-%d", "%s-%s", "%s%%", "Cage-%s", "cage_%s", "-%s", "%s.", "a..%s", "averyveryverylongprefix-%s", "%v"} {
		_, err := Parse("t.toml", []byte("[cage]\nhostname_format = \""+bad+"\"\n"))
		assert.ErrorContains(t, err, "t.toml:2: cage.hostname_format:", bad)
	}
}

func TestAllowEntries(t *testing.T) {
	good := `["api.anthropic.com", "203.0.113.0/24", "203.0.113.10", "2001:db8::/32", "1.1.1.1"]`
	c, err := Parse("t.toml", []byte("[network]\npolicy = \"allowlist\"\nallow = "+good+"\n"))
	assert.NilError(t, err)
	assert.Equal(t, len(c.Network.Allow), 5)
	for _, tc := range []struct{ entry, want string }{
		{"10.1.2.3", "overlaps blocked range 10.0.0.0/8"},
		{"192.168.1.0/24", "overlaps blocked range 192.168.0.0/16"},
		{"169.254.169.254", "overlaps blocked range 169.254.0.0/16"},
		{"0.0.0.0/0", "overlaps blocked range"},
		{"::/0", "overlaps blocked range"},
		{"fd00::1", "overlaps blocked range fc00::/7"},
		{"203.0.113.1/24", "has host bits set (did you mean 203.0.113.0/24?)"},
		{"localhost", "not a fully qualified public host name"},
		{"intranet", "not a fully qualified public host name"},
		{"a..b", "neither a CIDR"},
		{"http://x.org", "neither a CIDR"},
		{"fe80::1%eth0", "zone"},
	} {
		_, err := Parse("t.toml", []byte("[network]\npolicy = \"allowlist\"\nallow = [\"api.anthropic.com\", \""+tc.entry+"\"]\n"))
		assert.ErrorContains(t, err, "t.toml:3: network.allow[1]: ", tc.entry)
		assert.ErrorContains(t, err, tc.want, tc.entry)
	}
	// An empty list under the allowlist policy is valid: the seal then
	// opens nothing (the forward chain drops every address not in the empty
	// allow sets); it never means "no seal".
	c, err = Parse("t.toml", []byte("[network]\npolicy = \"allowlist\"\nallow = []\n"))
	assert.NilError(t, err)
	assert.Assert(t, c.Network.Networked())
}

func TestCheckFiles(t *testing.T) {
	dir := t.TempDir()
	tok := filepath.Join(dir, "tok")
	assert.NilError(t, os.WriteFile(tok, []byte("secret\n"), 0o600))
	settings := filepath.Join(dir, "settings.json")
	assert.NilError(t, os.WriteFile(settings, []byte(`{"model": "m"}`), 0o600))
	notJSON := filepath.Join(dir, "not.json")
	assert.NilError(t, os.WriteFile(notJSON, []byte(`[1]`), 0o600))
	fifo := filepath.Join(dir, "fifo")
	assert.NilError(t, syscall.Mkfifo(fifo, 0o600))
	empty := filepath.Join(dir, "empty")
	assert.NilError(t, os.WriteFile(empty, []byte("\n"), 0o600))
	load := func(body string) *Config {
		t.Helper()
		c, err := Parse("t.toml", []byte(body))
		assert.NilError(t, err)
		return c
	}
	good := load("[tokens]\nk = \"" + tok + "\"\n[home.claude]\nsettings_file = \"" + settings + "\"\n")
	assert.NilError(t, good.CheckFiles(), "positive control")
	assert.NilError(t, good.CheckToken("k"), "positive control")
	loose := filepath.Join(dir, "loose")
	assert.NilError(t, os.WriteFile(loose, []byte("sk\n"), 0o644))
	assert.NilError(t, os.Chmod(loose, 0o644))

	for _, tc := range []struct{ name, toml, want string }{
		{"missing token", "[tokens]\n\nk = \"" + filepath.Join(dir, "nope") + "\"\n", "config t.toml:3: tokens.k: cannot read " + filepath.Join(dir, "nope") + ": no such file or directory"},
		{"empty token", "[tokens]\nk = \"" + empty + "\"\n", "config t.toml:2: tokens.k: " + empty + " is empty"},
		{"fifo token", "[tokens]\nk = \"" + fifo + "\"\n", "config t.toml:2: tokens.k: " + fifo + " is not a regular file"},
		{"directory seccomp", "[cage]\nseccomp = \"" + dir + "\"\n", "config t.toml:2: cage.seccomp: " + dir + " is not a regular file"},
		{"settings not an object", "[home.claude]\nsettings_file = \"" + notJSON + "\"\n", "config t.toml:2: home.claude.settings_file: " + notJSON + " is not a JSON object"},
		{"missing instructions", "[home.opencode]\ninstructions_file = \"/nonexistent/AGENTS.md\"\n", "home.opencode.instructions_file: cannot read /nonexistent/AGENTS.md"},
		{"missing file", "[home.shell.files]\n\".gitconfig\" = \"/nonexistent/gitconfig\"\n", `home.shell.files.".gitconfig": cannot read /nonexistent/gitconfig`},
		{"world-readable token", "[tokens]\nk = \"" + loose + "\"\n", "config t.toml:2: tokens.k: " + loose + " has mode 0644"},
	} {
		c := load(tc.toml)
		err := c.CheckFiles()
		if strings.Contains(tc.name, "token") {
			// Token files are checked for the agents that use them only.
			assert.NilError(t, err, tc.name)
			err = c.CheckToken("k")
		}
		assert.ErrorContains(t, err, tc.want, tc.name)
		assert.Assert(t, IsConfigError(err), tc.name)
	}
}

func TestWorktreeRoots(t *testing.T) {
	c, err := Parse("t.toml", []byte("[worktree]\nroots = [\"/srv/work\"]\n"))
	assert.NilError(t, err)
	assert.DeepEqual(t, c.Worktree.Roots, []string{"/srv/work"})
	_, err = Parse("t.toml", []byte("[worktree]\nroots = [\"/\"]\n"))
	assert.ErrorContains(t, err, "t.toml:2: worktree.roots[0]: ")
	_, err = Parse("t.toml", []byte("[worktree]\nroots = [\"srv\"]\n"))
	assert.ErrorContains(t, err, "must be an absolute path")
}
