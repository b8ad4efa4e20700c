package main

import (
	"bytes"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

// configCheck runs `shrooms [global...] config check [args...]` in-process.
func configCheck(t *testing.T, global []string, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	argv := append(append([]string{"shrooms"}, global...), append([]string{"config", "check"}, args...)...)
	code := run(argv, strings.NewReader(""), &out, &errb)
	return code, out.String(), errb.String()
}

func TestConfigCheck(t *testing.T) {
	dir := t.TempDir()
	// A podman socket that is really listening: config check must not
	// connect to it (it runs at build time, where there is no podman).
	sock := filepath.Join(dir, "podman.sock")
	l, err := net.Listen("unix", sock)
	assert.NilError(t, err)
	defer l.Close()

	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		assert.NilError(t, os.WriteFile(p, []byte(text), 0o600))
		return p
	}
	good := write("good.toml", "[podman]\nsocket = \"unix://"+sock+"\"\n[network]\npolicy = \"allowlist\"\nallow = [\"api.anthropic.com\"]\n[tokens]\nanthropic = \"/run/secrets/does-not-exist\"\n")
	typo := write("typo.toml", "[network]\npolicy = \"internet\"\n\n[netwrok]\npolicy = \"none\"\n")
	badValue := write("bad-value.toml", "[network]\npolicy = \"open\"\n")

	t.Run("good file: ok, exit 0", func(t *testing.T) {
		code, out, stderr := configCheck(t, nil, good)
		assert.Check(t, is.Equal(code, 0), stderr)
		assert.Check(t, is.Equal(out, "ok\n"))
		assert.Check(t, is.Equal(stderr, ""))
	})

	t.Run("--config names the file", func(t *testing.T) {
		code, out, _ := configCheck(t, []string{"--config", good})
		assert.Check(t, is.Equal(code, 0))
		assert.Check(t, is.Equal(out, "ok\n"))
	})

	t.Run("good file, --json", func(t *testing.T) {
		code, out, _ := configCheck(t, []string{"--json"}, good)
		assert.Check(t, is.Equal(code, 0))
		var res map[string]any
		assert.NilError(t, json.Unmarshal([]byte(out), &res))
		assert.Check(t, is.DeepEqual(res, map[string]any{"ok": true, "file": good}))
	})

	t.Run("unknown key: exit 121, one line naming key and line", func(t *testing.T) {
		code, out, stderr := configCheck(t, nil, typo)
		assert.Check(t, is.Equal(code, ExitUsage))
		assert.Check(t, is.Equal(out, ""))
		assert.Check(t, is.Equal(strings.Count(stderr, "\n"), 1), stderr)
		assert.Check(t, is.Contains(stderr, typo+":4: netwrok"), stderr)
		assert.Check(t, is.Contains(stderr, "unknown key"), stderr)
	})

	t.Run("bad value, --json", func(t *testing.T) {
		code, out, stderr := configCheck(t, []string{"--json"}, badValue)
		assert.Check(t, is.Equal(code, ExitUsage))
		var res map[string]any
		assert.NilError(t, json.Unmarshal([]byte(out), &res))
		assert.Check(t, is.Equal(res["ok"], false))
		assert.Check(t, is.Contains(res["error"], "network.policy"))
		assert.Check(t, is.Equal(strings.Count(stderr, "\n"), 1), stderr)
	})

	t.Run("missing file and extra arguments are bad input", func(t *testing.T) {
		code, _, stderr := configCheck(t, nil, filepath.Join(dir, "absent.toml"))
		assert.Check(t, is.Equal(code, ExitUsage), stderr)
		assert.Check(t, is.Contains(stderr, "cannot read"))
		code, _, stderr = configCheck(t, nil, good, typo)
		assert.Check(t, is.Equal(code, ExitUsage), stderr)
	})

	// Nothing connected to the podman socket during any of the checks.
	assert.NilError(t, l.(*net.UnixListener).SetDeadline(time.Now().Add(100*time.Millisecond)))
	c, err := l.Accept()
	if err == nil {
		c.Close()
	}
	assert.Check(t, err != nil, "config check connected to the podman socket")
	// Control: a client connecting is seen by the same Accept.
	go func() {
		if c, err := net.Dial("unix", sock); err == nil {
			time.Sleep(50 * time.Millisecond)
			c.Close()
		}
	}()
	assert.NilError(t, l.(*net.UnixListener).SetDeadline(time.Now().Add(2*time.Second)))
	c, err = l.Accept()
	assert.NilError(t, err, "control: the listener did not see a connecting client")
	c.Close()
}
