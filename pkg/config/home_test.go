package config

import (
	"testing"

	"gotest.tools/v3/assert"
)

func TestHomeSizeDecodeAndValidate(t *testing.T) {
	d := Default()
	assert.Equal(t, d.Home.Size, Size(8<<30))
	assert.Equal(t, d.Home.Inodes, int64(1<<20))

	c, err := Parse("t.toml", []byte("[home]\nsize = \"64m\"\ninodes = 16384\n"))
	assert.NilError(t, err)
	assert.Equal(t, c.Home.Size, Size(64<<20))
	assert.Equal(t, c.Home.Inodes, int64(16384))

	cases := []struct{ toml, want string }{
		{"[home]\nsize = \"1m\"\n", "config t.toml:2: home.size: must be between 64m and 16t"},
		{"[home]\nsize = \"17t\"\n", "config t.toml:2: home.size: must be between 64m and 16t"},
		{"[home]\ninodes = 10\n", "config t.toml:2: home.inodes: 10 is out of range 1024..2097152 (at most one per 4 KiB of home.size)"},
		{"[home]\nsize = \"64m\"\ninodes = 16385\n", "config t.toml:3: home.inodes: 16385 is out of range 1024..16384 (at most one per 4 KiB of home.size)"},
	}
	for _, tc := range cases {
		_, err := Parse("t.toml", []byte(tc.toml))
		assert.Error(t, err, tc.want, tc.toml)
		assert.Assert(t, IsConfigError(err))
	}
}

// TestHomeProfilesDecode: [home.<profile>] tables decode into the profile's
// baseline for every profile pkg/profile knows, strictly, and what the
// HOME reset would refuse at the first turn is refused at load.
func TestHomeProfilesDecode(t *testing.T) {
	c, err := Parse("t.toml", []byte("[home.claude]\ninstructions = \"hi\"\n[home.claude.settings]\nmodel = \"m\"\n[home.shell.files]\n\".gitconfig\" = \"/etc/gitconfig\"\n"))
	assert.NilError(t, err)
	assert.Equal(t, c.Home.Profile("claude").Instructions, "hi")
	assert.Equal(t, c.Home.Profile("claude").Settings["model"], "m")
	assert.Equal(t, c.Home.Profile("shell").Files[".gitconfig"], "/etc/gitconfig")
	assert.Assert(t, c.Home.Profile("opencode") != nil && c.Home.Profile("zsh") == nil)

	cases := []struct{ toml, want string }{
		{"[home.claude]\nsetings = {}\n", "config t.toml:2: home.claude.setings: unknown key"},
		{"[home.zsh]\nfiles = {}\n", "config t.toml:1: home.zsh: unknown key"},
		{"[home.claude]\nsettings = \"x\"\n", "config t.toml:2: home.claude.settings: must be a table (e.g. settings = { … } or a [home.claude.settings] section), not a string"},
		{"[home]\nclaude = 1\n", "config t.toml:2: home.claude: must be a table (e.g. claude = { … } or a [home.claude] section), not a integer"},
		// Refused at load now, not at the first turn.
		{"[home.claude.managed]\nallowManagedHooksOnly = false\n", `config t.toml:2: home.claude.managed.allowManagedHooksOnly: is enforced by shrooms (true) and cannot be changed`},
		{"[home.shell.files]\n\".claude.json\" = \"/etc/x\"\n", `config t.toml: home.shell.files.".claude.json": baseline path ".claude.json" overlaps the keep-list; the baseline cannot replace kept state (agent claude keeps it)`},
		{"[home.shell.files]\n\".claude/.credentials.json/x\" = \"/etc/x\"\n", `config t.toml: home.shell.files.".claude/.credentials.json/x": baseline path ".claude/.credentials.json/x" lies under kept file ".claude/.credentials.json" (agent claude keeps it)`},
	}
	for _, tc := range cases {
		_, err := Parse("t.toml", []byte(tc.toml))
		assert.Error(t, err, tc.want, tc.toml)
		assert.Assert(t, IsConfigError(err))
	}
	// A baseline file only another agent's profile keeps is fine for an
	// agent without that profile: the shell agent may lay down .claude.json.
	_, err = Parse("t.toml", []byte("[home.shell.files]\n\".claude.json\" = \"/etc/x\"\n[agents.claude]\ncommand = [\"claude\"]\nhome = [\"claude\"]\n"))
	assert.NilError(t, err)
}
