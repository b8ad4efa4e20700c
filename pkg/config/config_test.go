package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

func TestDefaultsAreValid(t *testing.T) {
	c, err := Load("")
	assert.NilError(t, err)
	assert.Equal(t, c.Cage.Memory, Size(4<<30))
	assert.Equal(t, c.Network.Policy, "none")
	_, err = c.Agent("claude")
	assert.NilError(t, err)
}

func TestFileOverridesDefaults(t *testing.T) {
	c, err := Parse("t.toml", []byte(`
[podman]
socket = "unix:///run/x.sock"
[cage]
memory = "512m"
pids = 64
cpus = 0.5
timeout = "90s"
[tokens]
anthropic = "/run/secrets/anthropic"
[agents.claude]
command = ["claude", "-p"]
home = ["claude"]
env = { FOO = "bar" }
token_env = { ANTHROPIC_API_KEY = "anthropic" }
`))
	assert.NilError(t, err)
	assert.Equal(t, c.Podman.Socket, "unix:///run/x.sock")
	assert.Equal(t, c.Cage.Memory, Size(512<<20))
	assert.Equal(t, c.Cage.Pids, int64(64))
	assert.Equal(t, c.Cage.Timeout.Std().String(), "1m30s")
	assert.Equal(t, c.Cage.Nofile, int64(8192), "untouched keys keep their defaults")
	a, err := c.Agent("claude")
	assert.NilError(t, err)
	assert.DeepEqual(t, a.Command, []string{"claude", "-p"})
	assert.Equal(t, a.TokenEnv["ANTHROPIC_API_KEY"], "anthropic")
	_, err = c.Agent("opencode")
	assert.NilError(t, err, "other built-in agents stay")
}

func TestErrorsNameKeyAndLine(t *testing.T) {
	cases := []struct {
		name, toml, want string
	}{
		{"unknown key", "[cage]\nimage = \"x\"\nmemroy = \"1g\"\n", "config t.toml:3: cage.memroy: unknown key"},
		{"unknown table", "\n[cagee]\nimage = \"x\"\n", "config t.toml:2: cagee: unknown key"},
		{"wrong type", "[cage]\npids = \"many\"\n", "config t.toml:2: cage.pids: incompatible types"},
		{"bad size", "[cage]\n\nmemory = \"4x\"\n", "config t.toml:3: cage.memory"},
		{"bad value", "[cage]\npids = 1\n", "config t.toml:2: cage.pids: 1 is out of range 16..4194304"},
		{"linger too long", "[cage]\nteardown_linger = \"2h\"\n", "config t.toml:2: cage.teardown_linger: must be in 0..1h"},
		{"negative linger", "[cage]\nteardown_linger = \"-1s\"\n", "config t.toml:2: cage.teardown_linger: must be in 0..1h"},
		{"bad policy", "[network]\npolicy = \"open\"\n", "config t.toml:2: network.policy: unknown policy \"open\""},
		{"bad cidr", "[network]\nsubnet4 = \"10.89.0.0/33\"\n", "config t.toml:2: network.subnet4"},
		{"bad driver", "[network]\ndriver = \"cni\"\n", "config t.toml:2: network.driver: unknown driver \"cni\" (use shrooms or podman)"},
		{"subnet too large for the driver", "[network]\nsubnet4 = \"10.0.0.0/7\"\n", "network.subnet4: \"10.0.0.0/7\" is larger than the shrooms driver allows (/8 at most)"},
		{"bad allow", "[network]\nallow = [\"1.2.3.0/24\", \"bad name!\"]\n", "config t.toml:2: network.allow[1]"},
		{"lan with host bits", "[network]\nlan = [\"198.51.100.0/24\", \"198.51.100.1/24\"]\n", "network.lan[1]: \"198.51.100.1/24\" has host bits set (did you mean 198.51.100.0/24?)"},
		{"lan default route", "[network]\nlan = [\"::/0\"]\n", "network.lan[0]: \"::/0\" covers every address"},
		{"lan host name", "[network]\nlan = [\"nas.local\"]\n", "network.lan[0]: \"nas.local\" is neither a CIDR nor an address"},
		{"unknown profile", "[agents.x]\ncommand = [\"sh\"]\nhome = [\"zsh\"]\n", "config t.toml:3: agents.x.home[0]: unknown HOME profile \"zsh\""},
		{"missing token", "[agents.x]\ncommand = [\"sh\"]\nhome = [\"shell\"]\ntoken_env = { K = \"nope\" }\n", "config t.toml:4: agents.x.token_env.K: names token \"nope\""},
		{"home override", "[agents.x]\ncommand = [\"sh\"]\nhome = [\"shell\"]\nenv = { HOME = \"/\" }\n", "agents.x.env.HOME: not a settable"},
		{"path override", "[agents.x]\ncommand = [\"sh\"]\nhome = [\"shell\"]\nenv = { PATH = \"/home/agent/bin:/usr/bin\" }\n", "agents.x.env.PATH: not a settable"},
		{"path as token", "[agents.x]\ncommand = [\"sh\"]\nhome = [\"shell\"]\ntoken_env = { PATH = \"t\" }\n", "agents.x.token_env.PATH: not a settable"},
		{"empty command", "[agents.x]\ncommand = []\nhome = [\"shell\"]\n", "agents.x.command: must be a non-empty argv list"},
		{"relative token", "[tokens]\nk = \"rel/path\"\n", "config t.toml:2: tokens.k: \"rel/path\" must be an absolute path"},
		{"syntax", "[cage\n", "config t.toml:2: expected"},
		{"socket", "[podman]\nsocket = \"/run/podman.sock\"\n", "config t.toml:2: podman.socket: \"/run/podman.sock\" must be a unix:///absolute/path URL"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse("t.toml", []byte(tc.toml))
			assert.Assert(t, err != nil)
			assert.Assert(t, is.Contains(err.Error(), tc.want))
			assert.Assert(t, !strings.Contains(err.Error(), "\n"), "one line: %q", err.Error())
		})
	}
}

func TestLoadMissingFile(t *testing.T) {
	_, err := Load(filepath.Join(t.TempDir(), "nope.toml"))
	assert.ErrorContains(t, err, "nope.toml: cannot read")
	assert.Assert(t, IsConfigError(err))
}

func TestExampleConfigIsValidAndComplete(t *testing.T) {
	path := filepath.Join("..", "..", "config.example.toml")
	data, err := os.ReadFile(path)
	assert.NilError(t, err)
	_, err = Parse(path, data)
	assert.NilError(t, err)
	// Every key of the schema is documented in the example (commented out or set).
	for _, key := range []string{"socket", "dir", "image", "memory", "pids", "cpus", "nofile", "nproc", "timeout",
		"stop_grace", "tmp_size", "run_size", "tmp_exec", "subid_user", "user", "seccomp", "hostname_format", "prepare_next", "teardown_linger",
		"policy", "driver", "name", "bridge", "subnet4", "subnet6", "allow", "volume_prefix", "root", "command", "env", "home", "token_env", "gateway", "api", "upstream", "token",
		"max_requests", "max_output_tokens", "auth", "token_url", "client_id", "allow_betas", "allow_server_tools"} {
		assert.Assert(t, strings.Contains(string(data), key+" ="), "config.example.toml does not document %q", key)
	}
	assert.Assert(t, strings.Contains(string(data), "\nlan ="), "config.example.toml does not document network.lan")
}

func TestSize(t *testing.T) {
	for in, want := range map[string]Size{"0": 0, "1k": 1024, "512m": 512 << 20, "4G": 4 << 30, "2gb": 2 << 30} {
		got, err := ParseSize(in)
		assert.NilError(t, err, in)
		assert.Equal(t, got, want, in)
	}
	for _, bad := range []string{"", "-1", "1x", "m", "99999999999t"} {
		_, err := ParseSize(bad)
		assert.Assert(t, err != nil, bad)
	}
	assert.Equal(t, Size(512<<20).String(), "512m")
}

func TestFreeformTablesNest(t *testing.T) {
	c, err := Parse("t.toml", []byte(`
[home.opencode]
settings = { provider = { anthropic = { options = { baseURL = "http://x" } } } }
[home.claude]
managed = { permissions = { deny = ["Bash(curl:*)"] } }
[home.claude.settings.hooks]
x = { y = 1 }
`))
	assert.NilError(t, err)
	p := c.Home.Profile("opencode").Settings["provider"].(map[string]any)["anthropic"].(map[string]any)["options"].(map[string]any)
	assert.Equal(t, p["baseURL"], "http://x")
	_, err = Parse("t.toml", []byte("[home.claude]\nsettingz = { a = { b = 1 } }\n"))
	assert.ErrorContains(t, err, "home.claude.settingz", "outside the free-form tables keys stay strict")
}
