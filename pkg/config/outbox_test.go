package config

import (
	"testing"

	"gotest.tools/v3/assert"
)

func TestOutboxLimitsDecodeAndValidate(t *testing.T) {
	c, err := Parse("t.toml", []byte("[outbox]\nsize = \"8m\"\nmax_files = 3\nmax_file_size = \"1k\"\nallow_exec = true\n"))
	assert.NilError(t, err)
	assert.Equal(t, c.Outbox.Size, Size(8<<20))
	assert.Equal(t, c.Outbox.MaxFiles, 3)
	assert.Equal(t, c.Outbox.MaxFileSize, Size(1024))
	assert.Equal(t, c.Outbox.AllowExec, true)
	assert.Equal(t, c.Outbox.MaxDepth, 16, "untouched limits keep their defaults")

	cases := []struct{ toml, want string }{
		{"[outbox]\nroot = \"rel\"\n", "config t.toml:2: outbox.root: must be an absolute path other than /"},
		{"[outbox]\nsize = \"1k\"\n", "config t.toml:2: outbox.size: must be at least 1m"},
		{"[outbox]\ninodes = 2\n", "config t.toml:2: outbox.inodes: 2 is out of range 16..16777216"},
		{"[outbox]\nmax_files = 0\n", "config t.toml:2: outbox.max_files: 0 is out of range 1..1048576"},
		{"[outbox]\nmax_total_size = \"1m\"\nmax_file_size = \"2m\"\n", "config t.toml:3: outbox.max_file_size: 2m exceeds outbox.max_total_size (1m)"},
		{"[outbox]\nmax_depth = 100\n", "config t.toml:2: outbox.max_depth: 100 is out of range 1..64"},
		{"[outbox]\nmax_name_length = 256\n", "config t.toml:2: outbox.max_name_length: 256 is out of range 1..255"},
		{"[outbox]\ncollect_timeout = \"0s\"\n", "config t.toml:2: outbox.collect_timeout: must be positive"},
		{"[outbox]\nmax_pending = \"1m\"\n", "config t.toml:2: outbox.max_pending: 1m is below outbox.size (256m): one turn's outbox could not wait to be collected"},
	}
	for _, tc := range cases {
		_, err := Parse("t.toml", []byte(tc.toml))
		assert.Error(t, err, tc.want, tc.toml)
		assert.Assert(t, IsConfigError(err))
	}
}
