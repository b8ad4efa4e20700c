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
