package seccomp

import (
	"os"
	"path/filepath"
	"testing"

	"gotest.tools/v3/assert"
)

func TestTIOCSTIClosed(t *testing.T) {
	dir := t.TempDir()
	knob := func(v string) string {
		p := filepath.Join(dir, "knob-"+v)
		assert.NilError(t, os.WriteFile(p, []byte(v+"\n"), 0o644))
		return p
	}
	missing := filepath.Join(dir, "absent")
	// shrooms' profile denies TIOCSTI whatever the kernel does.
	for _, k := range []string{knob("0"), knob("1"), missing} {
		assert.NilError(t, TIOCSTIClosed("shrooms", k))
	}
	// Other profiles: only the kernel can close it.
	for _, setting := range []string{"podman", "/etc/shrooms/seccomp.json"} {
		assert.NilError(t, TIOCSTIClosed(setting, knob("0")))
		assert.ErrorContains(t, TIOCSTIClosed(setting, knob("1")), "sysctl -w dev.tty.legacy_tiocsti=0")
		assert.ErrorContains(t, TIOCSTIClosed(setting, missing), `before Linux 6.2 TIOCSTI is always allowed) and cage.seccomp = "`+setting+`" does not deny it: set cage.seccomp = "shrooms"`)
	}
}
