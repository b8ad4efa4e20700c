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
		// A token file that does not exist yet is a note: only the turns
		// of the agents that use it need it.
		assert.Check(t, is.Equal(out, "note: token anthropic: /run/secrets/does-not-exist does not exist yet; turns of no agent refuse until it does\nok\n"))
		assert.Check(t, is.Equal(stderr, ""))
	})

	t.Run("--config names the file", func(t *testing.T) {
		code, out, _ := configCheck(t, []string{"--config", good})
		assert.Check(t, is.Equal(code, 0))
		assert.Check(t, is.Equal(out, "note: token anthropic: /run/secrets/does-not-exist does not exist yet; turns of no agent refuse until it does\nok\n"))
	})

	t.Run("global flags after the command", func(t *testing.T) {
		code, out, _ := configCheck(t, nil, "--config", good, "--json")
		assert.Check(t, is.Equal(code, 0))
		assert.Check(t, is.Contains(out, `"ok":true`))
	})

	t.Run("good file, --json", func(t *testing.T) {
		code, out, _ := configCheck(t, []string{"--json"}, good)
		assert.Check(t, is.Equal(code, 0))
		var res map[string]any
		assert.NilError(t, json.Unmarshal([]byte(out), &res))
		assert.Check(t, is.DeepEqual(res, map[string]any{"ok": true, "file": good, "schema": float64(jsonSchema),
			"notes": []any{"token anthropic: /run/secrets/does-not-exist does not exist yet; turns of no agent refuse until it does"}}))
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

// TestConfigCheckLoadsWhatATurnLoads: `config check` (and `doctor`, and
// every turn before podman) refuses, as bad config (121), what used to pass
// the check and fail every turn: a missing settings_file, a baseline file
// that overlaps the keep-list, a token file others can read or that root
// does not own. A token file that does not exist yet is only a note, and a
// turn of an agent that does not use it is not refused for it.
func TestConfigCheckLoadsWhatATurnLoads(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		assert.NilError(t, os.WriteFile(p, []byte(text), mode))
		assert.NilError(t, os.Chmod(p, mode))
		return p
	}
	token := write("token", "sk-test\n", 0o600)
	loose := write("loose-token", "sk-test\n", 0o644)
	notRoot := write("other-token", "sk-test\n", 0o600)
	assert.NilError(t, os.Chown(notRoot, 4242, 4242))
	kept := write("creds.json", "{}\n", 0o644)
	base := "[podman]\nsocket = \"" + downSocket + "\"\n[state]\ndir = \"" + filepath.Join(dir, "state") + "\"\n[network]\npolicy = \"none\"\n"
	claude := "[agents.c]\ncommand = [\"claude\"]\nhome = [\"claude\", \"shell\"]\ntoken_env = { ANTHROPIC_API_KEY = \"anthropic\" }\n"
	for _, tc := range []struct {
		name, text, want string
	}{
		{"missing settings_file", base + "[home.claude]\nsettings_file = \"" + filepath.Join(dir, "absent.json") + "\"\n", "home.claude.settings_file: cannot read"},
		{"baseline file on the keep-list", base + claude + "[tokens]\nanthropic = \"" + token + "\"\n[home.claude.files]\n\".claude/.credentials.json\" = \"" + kept + "\"\n", "overlaps the keep-list"},
		{"world-readable token", base + "[tokens]\nanthropic = \"" + loose + "\"\n", "has mode 0644"},
		{"token not owned by root", base + "[tokens]\nanthropic = \"" + notRoot + "\"\n", "owned by uid 4242"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := write(strings.ReplaceAll(tc.name, " ", "-")+".toml", tc.text, 0o600)
			code, out, stderr := configCheck(t, nil, cfg)
			assert.Check(t, is.Equal(code, ExitUsage), "out %q stderr %q", out, stderr)
			assert.Check(t, is.Contains(stderr, tc.want))
			// The same config stops a turn with the same code, before podman.
			code, _, stderr = shroomsCLI("--config", cfg, "run", "--task", "t1", "--agent", "shell")
			if tc.name == "baseline file on the keep-list" {
				code, _, stderr = shroomsCLI("--config", cfg, "run", "--task", "t1", "--agent", "c")
			}
			if strings.Contains(tc.name, "token") {
				// A token only the config names stops no shell turn: it
				// reaches podman (down here: 122).
				assert.Check(t, is.Equal(code, ExitHostNotReady), stderr)
				assert.Check(t, is.Contains(stderr, "podman"), stderr)
				return
			}
			assert.Check(t, is.Equal(code, ExitUsage), stderr)
			assert.Check(t, is.Contains(stderr, tc.want))
		})
	}
	t.Run("controls", func(t *testing.T) {
		// The 0600 root-owned token passes, and so does a 0400 one.
		good := write("good.toml", base+claude+"[tokens]\nanthropic = \""+token+"\"\n", 0o600)
		code, out, stderr := configCheck(t, nil, good)
		assert.Check(t, is.Equal(code, 0), stderr)
		assert.Check(t, is.Equal(out, "ok\n"))
		assert.NilError(t, os.Chmod(token, 0o400))
		code, _, stderr = configCheck(t, nil, good)
		assert.Check(t, is.Equal(code, 0), stderr)
		// A missing token file: a note naming the agents that need it; a
		// turn of one of them is refused (121), a shell turn is not.
		missing := write("missing.toml", base+claude+"[tokens]\nanthropic = \""+filepath.Join(dir, "absent-token")+"\"\n", 0o600)
		code, out, stderr = configCheck(t, nil, missing)
		assert.Check(t, is.Equal(code, 0), stderr)
		assert.Check(t, is.Contains(out, "turns of agent c refuse until it does"))
		code, _, stderr = shroomsCLI("--config", missing, "run", "--task", "t1", "--agent", "c")
		assert.Check(t, is.Equal(code, ExitUsage), stderr)
		assert.Check(t, is.Contains(stderr, "absent-token"))
		code, _, stderr = shroomsCLI("--config", missing, "run", "--task", "t1", "--agent", "shell")
		assert.Check(t, is.Equal(code, ExitHostNotReady), stderr)
		// --syntax (the Nix build) loads none of the files.
		loosecfg := write("loose.toml", base+"[tokens]\nanthropic = \""+loose+"\"\n", 0o600)
		code, _, stderr = configCheck(t, nil, "--syntax", loosecfg)
		assert.Check(t, is.Equal(code, 0), stderr)
	})
}
