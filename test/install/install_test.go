// Package install tests `make install` into an empty root (DESTDIR): the
// files it writes, the seal unit (systemd-analyze verify, and its keys), and
// the installed config through the installed binary's `config check`.
package install

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/shrooms-cage/shrooms/internal/itest"
)

func TestMain(m *testing.M) {
	code := m.Run()
	itest.RemoveShroomsBinary()
	os.Exit(code)
}

func repoRoot(t *testing.T) string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// makeInstall runs `make install` with bin/shrooms replaced by a binary built
// for the test, so the repository's bin/ is left alone.
func makeInstall(t *testing.T, bin string, vars ...string) string {
	t.Helper()
	cmd := exec.Command("make", append([]string{"-s", "-C", repoRoot(t), "install", "SHROOMS_BIN=" + bin}, vars...)...)
	out, err := cmd.CombinedOutput()
	assert.NilError(t, err, string(out))
	return string(out)
}

// unitKeys parses a systemd unit file: section.key → values in order.
func unitKeys(t *testing.T, path string) map[string][]string {
	t.Helper()
	b, err := os.ReadFile(path)
	assert.NilError(t, err)
	keys := map[string][]string{}
	section := ""
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#"):
		case strings.HasPrefix(line, "["):
			section = strings.Trim(line, "[]")
		default:
			k, v, ok := strings.Cut(line, "=")
			assert.Assert(t, ok, "not key=value: %q", line)
			keys[section+"."+k] = append(keys[section+"."+k], v)
		}
	}
	return keys
}

func verify(t *testing.T, root, unit string) (string, error) {
	out, err := exec.Command("systemd-analyze", "verify", "--root="+root, unit).CombinedOutput()
	return string(out), err
}

func requireSystemdAnalyze(t *testing.T) {
	if _, err := exec.LookPath("systemd-analyze"); err != nil {
		if itest.Required() {
			t.Fatalf("systemd-analyze not installed (make setup installs the systemd package): %v", err)
		}
		t.Skip("systemd-analyze not installed")
	}
}

func TestMakeInstallIntoEmptyRoot(t *testing.T) {
	requireSystemdAnalyze(t)
	bin := itest.ShroomsBinary(t)
	root := t.TempDir()
	makeInstall(t, bin, "DESTDIR="+root)

	mode := func(p string) os.FileMode {
		fi, err := os.Stat(filepath.Join(root, p))
		assert.NilError(t, err)
		return fi.Mode()
	}
	assert.Equal(t, mode("usr/local/bin/shrooms"), os.FileMode(0o755))
	for _, p := range []string{"etc/shrooms/config.toml", "etc/systemd/system/shrooms-seal.service",
		"etc/systemd/system/nftables.service.d/shrooms-seal.conf", "etc/modules-load.d/shrooms.conf", "etc/sysctl.d/50-shrooms.conf"} {
		assert.Equal(t, mode(p), os.FileMode(0o644), p)
	}
	example, err := os.ReadFile(filepath.Join(repoRoot(t), "config.example.toml"))
	assert.NilError(t, err)
	installed, err := os.ReadFile(filepath.Join(root, "etc/shrooms/config.toml"))
	assert.NilError(t, err)
	assert.Assert(t, bytes.Equal(installed, example), "the installed config is config.example.toml")

	// The installed binary accepts the installed config.
	shrooms := filepath.Join(root, "usr/local/bin/shrooms")
	out, err := exec.Command(shrooms, "config", "check", filepath.Join(root, "etc/shrooms/config.toml")).CombinedOutput()
	assert.NilError(t, err, string(out))
	// The example's token file does not exist yet: a note naming the agents
	// that need it, not a failure (a shell turn runs without it).
	assert.Equal(t, string(out), "note: token anthropic: /run/secrets/anthropic-api-key does not exist yet; turns of agent claude, opencode refuse until it does\n"+
		"note: token gemini: /run/secrets/gemini-api-key does not exist yet; turns of agent gemini refuse until it does\n"+
		"note: token openai: /run/secrets/openai-api-key does not exist yet; turns of agent codex refuse until it does\nok\n")

	// The man page and completions come from the binary.
	for _, p := range []string{"usr/local/share/man/man1/shrooms.1", "usr/local/share/bash-completion/completions/shrooms",
		"usr/local/share/zsh/site-functions/_shrooms", "usr/local/share/fish/vendor_completions.d/shrooms.fish"} {
		assert.Equal(t, mode(p), os.FileMode(0o644), p)
	}
	manPage, err := os.ReadFile(filepath.Join(root, "usr/local/share/man/man1/shrooms.1"))
	assert.NilError(t, err)
	assert.Check(t, bytes.HasPrefix(manPage, []byte(".nh\n.TH shrooms 1")))

	// The unit: systemd itself finds nothing to say about it.
	vout, err := verify(t, root, "shrooms-seal.service")
	assert.NilError(t, err, vout)
	assert.Equal(t, vout, "", "systemd-analyze verify warnings")
	u := unitKeys(t, filepath.Join(root, "etc/systemd/system/shrooms-seal.service"))
	assert.DeepEqual(t, u["Service.ExecStart"], []string{"/usr/local/bin/shrooms --config /etc/shrooms/config.toml net apply --seal-only"})
	assert.DeepEqual(t, u["Service.Type"], []string{"oneshot"})
	assert.DeepEqual(t, u["Service.RemainAfterExit"], []string{"yes"})
	assert.DeepEqual(t, u["Unit.DefaultDependencies"], []string{"no"})
	before := strings.Fields(strings.Join(u["Unit.Before"], " "))
	assert.Check(t, is.Contains(before, "podman.socket"))
	assert.Check(t, is.Contains(before, "podman.service"))
	after := strings.Fields(strings.Join(u["Unit.After"], " "))
	for _, a := range []string{"systemd-modules-load.service", "systemd-sysctl.service", "nftables.service"} {
		assert.Check(t, is.Contains(after, a))
	}
	wanted := strings.Fields(strings.Join(u["Install.WantedBy"], " "))
	for _, w := range []string{"multi-user.target", "podman.socket", "podman.service"} {
		assert.Check(t, is.Contains(wanted, w))
	}
	// The command line the unit runs is one the binary takes: the seal
	// without podman.
	out, err = exec.Command(shrooms, "help", "net", "apply").CombinedOutput()
	assert.NilError(t, err, string(out))
	assert.Check(t, is.Contains(string(out), "--seal-only"))

	// What `net apply` checks before it seals, loaded at boot.
	b, err := os.ReadFile(filepath.Join(root, "etc/modules-load.d/shrooms.conf"))
	assert.NilError(t, err)
	assert.Check(t, is.Contains(strings.Fields(string(b)), "br_netfilter"))
	b, err = os.ReadFile(filepath.Join(root, "etc/sysctl.d/50-shrooms.conf"))
	assert.NilError(t, err)
	assert.Check(t, is.Contains(string(b), "net.bridge.bridge-nf-call-iptables = 1\n"))
	assert.Check(t, is.Contains(string(b), "net.bridge.bridge-nf-call-ip6tables = 1\n"))
	d := unitKeys(t, filepath.Join(root, "etc/systemd/system/nftables.service.d/shrooms-seal.conf"))
	assert.DeepEqual(t, d["Service.ExecStartPost"], []string{"-/bin/systemctl --no-block try-reload-or-restart shrooms-seal.service"})

	// An existing config is never overwritten.
	mine := append([]byte("# edited by the owner\n"), example...)
	assert.NilError(t, os.WriteFile(filepath.Join(root, "etc/shrooms/config.toml"), mine, 0o600))
	out2 := makeInstall(t, bin, "DESTDIR="+root)
	assert.Check(t, is.Contains(out2, "kept the existing"))
	installed, err = os.ReadFile(filepath.Join(root, "etc/shrooms/config.toml"))
	assert.NilError(t, err)
	assert.Assert(t, bytes.Equal(installed, mine), "a second make install kept the owner's config")
}

// The negative controls for verify: it does check the unit's command (a
// missing binary fails it) and it does report what it does not know.
func TestSystemdAnalyzeVerifyCatchesBrokenUnits(t *testing.T) {
	requireSystemdAnalyze(t)
	bin := itest.ShroomsBinary(t)
	root := t.TempDir()
	makeInstall(t, bin, "DESTDIR="+root)
	unit := filepath.Join(root, "etc/systemd/system/shrooms-seal.service")
	good, err := os.ReadFile(unit)
	assert.NilError(t, err)

	assert.NilError(t, os.Rename(filepath.Join(root, "usr/local/bin/shrooms"), filepath.Join(root, "shrooms")))
	out, err := verify(t, root, "shrooms-seal.service")
	assert.Assert(t, err != nil, "verify passed without the binary: %s", out)
	assert.Check(t, is.Contains(out, "/usr/local/bin/shrooms is not executable"))
	assert.NilError(t, os.Rename(filepath.Join(root, "shrooms"), filepath.Join(root, "usr/local/bin/shrooms")))

	assert.NilError(t, os.WriteFile(unit, bytes.Replace(good, []byte("Type=oneshot"), []byte("Type=oneshot\nNoSuchKey=1"), 1), 0o644))
	out, err = verify(t, root, "shrooms-seal.service")
	assert.NilError(t, err, out)
	assert.Check(t, is.Contains(out, "Unknown key"))
}

// PREFIX moves the binary, and the unit follows it.
func TestMakeInstallPrefix(t *testing.T) {
	requireSystemdAnalyze(t)
	bin := itest.ShroomsBinary(t)
	root := t.TempDir()
	makeInstall(t, bin, "DESTDIR="+root, "PREFIX=/opt/shrooms")
	_, err := os.Stat(filepath.Join(root, "opt/shrooms/bin/shrooms"))
	assert.NilError(t, err)
	_, err = os.Stat(filepath.Join(root, "usr/local/bin/shrooms"))
	assert.Assert(t, os.IsNotExist(err), "binary also in /usr/local: %v", err)
	u := unitKeys(t, filepath.Join(root, "etc/systemd/system/shrooms-seal.service"))
	assert.DeepEqual(t, u["Service.ExecStart"], []string{"/opt/shrooms/bin/shrooms --config /etc/shrooms/config.toml net apply --seal-only"})
	out, err := verify(t, root, "shrooms-seal.service")
	assert.NilError(t, err, out)
	assert.Equal(t, out, "")
}

// TestMakeUninstall removes everything make install put in the root but
// the owner's config.
func TestMakeUninstall(t *testing.T) {
	bin := itest.ShroomsBinary(t)
	root := t.TempDir()
	makeInstall(t, bin, "DESTDIR="+root)
	var before []string
	assert.NilError(t, filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			before = append(before, strings.TrimPrefix(p, root+"/"))
		}
		return err
	}))
	assert.Check(t, len(before) >= 10, "%v", before)
	cmd := exec.Command("make", "-s", "-C", repoRoot(t), "uninstall", "DESTDIR="+root)
	out, err := cmd.CombinedOutput()
	assert.NilError(t, err, string(out))
	var after []string
	assert.NilError(t, filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			after = append(after, strings.TrimPrefix(p, root+"/"))
		}
		return err
	}))
	assert.DeepEqual(t, after, []string{"etc/shrooms/config.toml"})
	assert.Check(t, is.Contains(string(out), "kept "+root+"/etc/shrooms/config.toml"))
	// The directories install made for shrooms' files go too; their
	// parents (as on a real host, where they exist before) stay.
	for _, d := range []string{"usr/local/share/man/man1", "usr/local/share/bash-completion", "usr/local/share/zsh", "usr/local/share/fish"} {
		_, err := os.Lstat(filepath.Join(root, d))
		assert.Check(t, os.IsNotExist(err), "%s is left: %v", d, err)
	}
	_, err = os.Stat(filepath.Join(root, "usr/local/share/man"))
	assert.Check(t, err, "uninstall removed a parent directory")

	// PURGE acts on this host's state, never with DESTDIR.
	out, err = exec.Command("make", "-s", "-C", repoRoot(t), "uninstall", "DESTDIR="+root, "PURGE=1").CombinedOutput()
	assert.Assert(t, err != nil, "PURGE=1 with DESTDIR ran: %s", out)
	assert.Check(t, is.Contains(string(out), "not with DESTDIR"))
	_, err = os.Stat(filepath.Join(root, "etc/shrooms/config.toml"))
	assert.Check(t, err)
}
