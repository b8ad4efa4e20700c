package nixcheck

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/shrooms-cage/shrooms/internal/itest"
	"github.com/shrooms-cage/shrooms/internal/testbed"
)

// knownPins are nixpkgs revisions known to exist, each with the branch it was
// locked from and its real narHash and lastModified, as public flake.lock
// files carry them (juanfont/headscale, July 2026; boinkor-net/tsnsrv, March
// 2026). flake.lock may lock an input only to one of these, and only under
// the branch it was taken from (a lock names a branch in `original` and a
// commit of that branch in `locked`). Add a row when updating the lock.
var knownPins = []struct {
	Ref, Rev, NarHash string
	LastModified      int64
}{
	{"nixpkgs-unstable", "e80236013dc8b77aa49ca90e7a12d86f5d8d64c9", "sha256-Q8U5VXgrcxmCxPtCCJCIZkcAX3FCZwGh1GNVIXxMND0=", 1773507054},
	{"staging-next-26.05", "62eaae30cd05c04718500ddb44e7ef85cd45ddd5", "sha256-YKn3t7FvaargtyNHbrOw+qzDM+93q5kSCREUPNxeZQs=", 1784421286},
}

const repo = "../.."

// requireNix skips the test without Debian's nix-bin, or fails it when
// SHROOMS_REQUIRE_INTEGRATION=1 (CI installs nix-bin in `make setup`).
func requireNix(t *testing.T) {
	t.Helper()
	requireNixSources(t)
	for _, bin := range []string{"nix", "nix-instantiate"} {
		if _, err := exec.LookPath(bin); err != nil {
			if itest.Required() {
				t.Fatalf("integration prerequisite missing (SHROOMS_REQUIRE_INTEGRATION=1): %s not installed (apt-get install nix-bin)", bin)
			}
			t.Skipf("%s not installed (apt-get install nix-bin; set SHROOMS_REQUIRE_INTEGRATION=1 to fail instead)", bin)
		}
	}
}

// requireNixSources skips the test in a source tree without the Nix files
// (nix/package.nix builds from the Go sources only, so its checkPhase has
// none), or fails it when SHROOMS_REQUIRE_INTEGRATION=1.
func requireNixSources(t *testing.T) {
	t.Helper()
	if _, err := os.Stat(filepath.Join(repo, "flake.nix")); err != nil {
		if itest.Required() {
			t.Fatalf("flake.nix not found beside the Go sources: %v", err)
		}
		t.Skipf("no Nix files in this source tree (%v)", err)
	}
}

// nixFiles lists every .nix file of the repository (flake.nix, nix/…).
func nixFiles(t *testing.T) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(repo, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "vendor" || d.Name() == "result") {
			return fs.SkipDir
		}
		if d.Type().IsRegular() && strings.HasSuffix(p, ".nix") {
			files = append(files, p)
		}
		return nil
	})
	assert.NilError(t, err)
	return files
}

func parse(path string) error {
	out, err := exec.Command("nix-instantiate", "--parse", path).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%v: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

func TestNixFilesParse(t *testing.T) {
	requireNix(t)
	files := nixFiles(t)
	for _, want := range []string{"flake.nix", "nix/package.nix", "nix/module.nix", "nix/image.nix", "nix/tests/breakout.nix", "nix/tests/turns.nix", "nix/tests/module-eval.nix", "nix/tests/common.nix"} {
		assert.Check(t, is.Contains(files, filepath.Join(repo, want)))
	}
	for _, f := range files {
		assert.Check(t, parse(f), "%s does not parse", f)
	}
	// Control: the check does reject a syntax error.
	bad := filepath.Join(t.TempDir(), "bad.nix")
	assert.NilError(t, os.WriteFile(bad, []byte("{ a = 1; b = ; }\n"), 0o644))
	assert.Check(t, parse(bad) != nil, "nix-instantiate --parse accepted a syntax error")
}

func TestVendorHash(t *testing.T) {
	requireNix(t)
	if _, err := exec.LookPath("go"); err != nil {
		t.Fatalf("go not in PATH: %v", err)
	}
	text, err := os.ReadFile(filepath.Join(repo, "nix/package.nix"))
	assert.NilError(t, err)
	have, err := VendorHashIn(string(text))
	assert.NilError(t, err)

	// The vendor tree of exactly the package's source (nix/package.nix's src).
	src := packageSource(t)
	dir := t.TempDir()
	assert.NilError(t, CopyTree(src, dir))
	want, err := VendorHash(dir)
	assert.NilError(t, err)
	assert.Check(t, strings.HasPrefix(want, "sha256-"), want)
	if os.Getenv("SHROOMS_UPDATE_VENDOR_HASH") == "1" && want != have {
		// nix/update-vendor-hash.sh: rewrite the one vendorHash line.
		updated := strings.Replace(string(text), `vendorHash = "`+have+`";`, `vendorHash = "`+want+`";`, 1)
		assert.NilError(t, os.WriteFile(filepath.Join(repo, "nix/package.nix"), []byte(updated), 0o644))
		t.Logf("nix/package.nix: vendorHash %s -> %s", have, want)
		have = want
	}
	assert.Check(t, want == have,
		"nix/package.nix has vendorHash = %q, but `go mod vendor` of the current go.mod/go.sum/imports hashes to %q: run nix/update-vendor-hash.sh (or set vendorHash = %q;)", have, want, want)

	// Control: a changed vendor tree changes the hash.
	assert.NilError(t, os.WriteFile(filepath.Join(dir, "vendor", "modules.txt"), []byte("# changed\n"), 0o644))
	changed, err := NARHash(filepath.Join(dir, "vendor"))
	assert.NilError(t, err)
	assert.Check(t, changed != want, "the NAR hash did not change with the vendor tree")
}

func TestVendorHashIn(t *testing.T) {
	for _, tc := range []struct {
		text, want, err string
	}{
		{text: `  vendorHash = "sha256-h8/b6rVmvUwJ8PAv0bC18hKA0YLDFve15X49KxlDUxM=";`, want: "sha256-h8/b6rVmvUwJ8PAv0bC18hKA0YLDFve15X49KxlDUxM="},
		{text: `  vendorHash = lib.fakeHash;`, err: "found 0"},
		{text: `  vendorHash = null;`, err: "found 0"},
		{text: "  vendorHash = \"sha256-h8/b6rVmvUwJ8PAv0bC18hKA0YLDFve15X49KxlDUxM=\";\n  vendorHash = \"sha256-h8/b6rVmvUwJ8PAv0bC18hKA0YLDFve15X49KxlDUxM=\";", err: "found 2"},
	} {
		got, err := VendorHashIn(tc.text)
		if tc.err != "" {
			assert.Check(t, is.ErrorContains(err, tc.err), tc.text)
			continue
		}
		assert.Check(t, err)
		assert.Check(t, is.Equal(got, tc.want))
	}
}

// TestFlakeLockPin needs no Nix: flake.lock is JSON. Each nixpkgs input is
// locked to a known revision of the branch flake.nix names for it; nothing
// outside the repository is read.
func TestFlakeLockPin(t *testing.T) {
	requireNixSources(t)
	var lock struct {
		Version int    `json:"version"`
		Root    string `json:"root"`
		Nodes   map[string]struct {
			Inputs   map[string]string `json:"inputs"`
			Locked   map[string]any    `json:"locked"`
			Original map[string]any    `json:"original"`
		} `json:"nodes"`
	}
	b, err := os.ReadFile(filepath.Join(repo, "flake.lock"))
	assert.NilError(t, err)
	assert.NilError(t, json.Unmarshal(b, &lock))
	assert.Check(t, is.Equal(lock.Version, 7))
	root, ok := lock.Nodes[lock.Root]
	assert.Assert(t, ok, "flake.lock has no root node %q", lock.Root)
	flake, err := os.ReadFile(filepath.Join(repo, "flake.nix"))
	assert.NilError(t, err)

	assert.Check(t, is.DeepEqual(keys(root.Inputs), []string{"nixpkgs", "nixpkgs-stable"}))
	for input, nodeName := range root.Inputs {
		node := lock.Nodes[nodeName]
		ref, _ := node.Original["ref"].(string)
		assert.Check(t, is.Equal(node.Locked["type"], "github"), input)
		assert.Check(t, is.Equal(node.Locked["owner"], "NixOS"), input)
		assert.Check(t, is.Equal(node.Locked["repo"], "nixpkgs"), input)
		assert.Check(t, is.Equal(node.Original["owner"], "NixOS"), input)
		assert.Check(t, is.Equal(node.Original["repo"], "nixpkgs"), input)
		found := false
		for _, p := range knownPins {
			if p.Rev != node.Locked["rev"] {
				continue
			}
			found = true
			assert.Check(t, is.Equal(ref, p.Ref), "%s: locked to %s, a revision of %s, under the branch %q", input, p.Rev, p.Ref, ref)
			assert.Check(t, is.Equal(node.Locked["narHash"], p.NarHash), input)
			lm, _ := node.Locked["lastModified"].(float64)
			assert.Check(t, is.Equal(int64(lm), p.LastModified), input)
		}
		assert.Check(t, found, "%s: flake.lock locks revision %v, which knownPins does not list", input, node.Locked["rev"])
		assert.Check(t, is.Contains(string(flake), `inputs.`+input+`.url = "github:NixOS/nixpkgs/`+ref+`";`))
	}
}

type topology struct {
	LAN struct {
		Net4, Net6                     string
		Prefix4, Prefix6               int
		Router4, Router6, Host4, Host6 string
	}
	WAN struct {
		Prefix4, Prefix6 int
		Router4, Router6 string
	}
	Internet struct {
		Canary4, Canary6     string
		Canary2_4, Canary2_6 string
	}
	Metadata4, Metadata6 string
	Private              []string
	TCPPorts             []int `json:"tcpPorts"`
	UDPPorts             []int `json:"udpPorts"`
	LoopbackPort         int   `json:"loopbackPort"`
}

// TestTopologyMatchesTestbed: the VM tests and the netns testbed describe one
// topology. topology.json is what the Nix tests read; internal/testbed is
// what the Go tests build.
func TestTopologyMatchesTestbed(t *testing.T) {
	requireNixSources(t)
	b, err := os.ReadFile(filepath.Join(repo, "nix/tests/topology.json"))
	assert.NilError(t, err)
	dec := json.NewDecoder(strings.NewReader(string(b)))
	var raw map[string]json.RawMessage
	assert.NilError(t, json.Unmarshal(b, &raw))
	var top topology
	assert.NilError(t, dec.Decode(&top))

	addr := func(s string) netip.Addr {
		a, err := netip.ParseAddr(s)
		assert.Check(t, err, "topology.json: %q", s)
		return a
	}
	for _, c := range []struct {
		name string
		json string
		go_  netip.Addr
	}{
		{"lan.router4", top.LAN.Router4, testbed.RouterAddr4},
		{"lan.router6", top.LAN.Router6, testbed.RouterAddr6},
		{"lan.host4", top.LAN.Host4, testbed.HostAddr4},
		{"lan.host6", top.LAN.Host6, testbed.HostAddr6},
		{"internet.canary4", top.Internet.Canary4, testbed.InternetAddr4},
		{"internet.canary6", top.Internet.Canary6, testbed.InternetAddr6},
		{"internet.canary2_4", top.Internet.Canary2_4, testbed.Internet2Addr4},
		{"internet.canary2_6", top.Internet.Canary2_6, testbed.Internet2Addr6},
		{"metadata4", top.Metadata4, testbed.Metadata4},
		{"metadata6", top.Metadata6, testbed.Metadata6},
	} {
		assert.Check(t, is.Equal(addr(c.json), c.go_), c.name)
	}
	var private, want []string
	for _, p := range top.Private {
		private = append(private, addr(p).String())
	}
	for _, a := range testbed.Private {
		want = append(want, a.String())
	}
	assert.Check(t, is.DeepEqual(private, want))
	assert.Check(t, is.DeepEqual(top.TCPPorts, testbed.TCPPorts))
	assert.Check(t, is.DeepEqual(top.UDPPorts, testbed.UDPPorts))
	assert.Check(t, is.Equal(top.LoopbackPort, testbed.LoopbackPort))

	// The LAN and WAN prefixes hold the addresses placed in them.
	lan4 := netip.PrefixFrom(addr(top.LAN.Net4), top.LAN.Prefix4)
	lan6 := netip.PrefixFrom(addr(top.LAN.Net6), top.LAN.Prefix6)
	for _, a := range []string{top.LAN.Router4, top.LAN.Host4} {
		assert.Check(t, lan4.Contains(addr(a)), "%s outside %s", a, lan4)
	}
	for _, a := range []string{top.LAN.Router6, top.LAN.Host6} {
		assert.Check(t, lan6.Contains(addr(a)), "%s outside %s", a, lan6)
	}
	wan4 := netip.PrefixFrom(addr(top.WAN.Router4), top.WAN.Prefix4).Masked()
	wan6 := netip.PrefixFrom(addr(top.WAN.Router6), top.WAN.Prefix6).Masked()
	for _, a := range []string{top.Internet.Canary4, top.Internet.Canary2_4} {
		assert.Check(t, wan4.Contains(addr(a)), "%s outside %s", a, wan4)
	}
	for _, a := range []string{top.Internet.Canary6, top.Internet.Canary2_6} {
		assert.Check(t, wan6.Contains(addr(a)), "%s outside %s", a, wan6)
	}

	// Every key of the file is one the test knows (no silently unchecked field).
	var keys []string
	for k := range raw {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	assert.Check(t, is.DeepEqual(keys, []string{"comment", "internet", "lan", "loopbackPort", "metadata4", "metadata6", "private", "tcpPorts", "udpPorts", "wan"}))
}

// TestModuleOptionsDocumented: every option services.shrooms declares has a
// description (the module is evaluated only where nixpkgs is available; this
// reads its text).
func TestModuleOptionsDocumented(t *testing.T) {
	requireNixSources(t)
	b, err := os.ReadFile(filepath.Join(repo, "nix/module.nix"))
	assert.NilError(t, err)
	text := string(b)
	n := 0
	for i := strings.Index(text, "mkOption {"); i >= 0; {
		body, ok := braced(text[i+len("mkOption "):])
		assert.Assert(t, ok, "unbalanced braces after offset %d", i)
		line := strings.Count(text[:i], "\n") + 1
		assert.Check(t, strings.Contains(body, "description ="), "nix/module.nix:%d: an option without a description", line)
		n++
		next := strings.Index(text[i+1:], "mkOption {")
		if next < 0 {
			break
		}
		i += 1 + next
	}
	assert.Check(t, n >= 15, "found only %d options", n)
	for _, want := range []string{"mkEnableOption", "mkPackageOption", "pkgs.formats.toml", "systemd.tmpfiles.settings", "shrooms-seal", "net apply", "br_netfilter", "subUidRanges", "assertions"} {
		assert.Check(t, is.Contains(text, want))
	}
}

// braced returns the text of the {…} block s starts with.
func braced(s string) (string, bool) {
	depth := 0
	for i, r := range s {
		switch r {
		case '{':
			depth++
		case '}':
			depth--
			if depth == 0 {
				return s[:i+1], true
			}
		}
	}
	return "", false
}
