// Package nixcheck checks, on a machine without a Nix store, what can be
// checked of the Nix side (flake.nix, nix/): every .nix file parses, the
// vendorHash in nix/package.nix is the NAR hash of `go mod vendor` for the
// current sources, flake.lock pins the nixpkgs revision named in
// reference/nix.md, and the VM tests' topology (nix/tests/topology.json)
// matches internal/testbed. The tests do the checking; this file holds the
// vendor-hash computation they use.
package nixcheck

import (
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
)

// vendorHashRe finds the one vendorHash assignment in nix/package.nix.
var vendorHashRe = regexp.MustCompile(`(?m)^\s*vendorHash = "(sha256-[A-Za-z0-9+/]{43}=)";`)

// VendorHashIn returns the vendorHash literal of a package.nix text.
func VendorHashIn(text string) (string, error) {
	m := vendorHashRe.FindAllStringSubmatch(text, -1)
	if len(m) != 1 {
		return "", fmt.Errorf("want exactly one `vendorHash = \"sha256-…\";` line, found %d", len(m))
	}
	return m[0][1], nil
}

// CopyGoSources copies go.mod, go.sum and every .go file under cmd, pkg
// and internal (what nix/package.nix's source fileset takes) from root into
// dst, so `go mod vendor` there sees the imports the Nix build sees. In a
// git checkout only tracked files count, as in a flake's source.
func CopyGoSources(root, dst string) error {
	files, err := goSources(root)
	if err != nil {
		return fmt.Errorf("list Go sources: %w", err)
	}
	for _, rel := range files {
		if err := copyFile(filepath.Join(root, rel), filepath.Join(dst, rel)); err != nil {
			return fmt.Errorf("copy Go sources: %w", err)
		}
	}
	return nil
}

func goSources(root string) ([]string, error) {
	dirs := []string{"cmd", "pkg", "internal"}
	keep := func(rel string) bool {
		if rel == "go.mod" || rel == "go.sum" {
			return true
		}
		for _, d := range dirs {
			if strings.HasPrefix(rel, d+"/") && strings.HasSuffix(rel, ".go") && !strings.Contains(rel, "/vendor/") {
				return true
			}
		}
		return false
	}
	var out []string
	if _, err := os.Stat(filepath.Join(root, ".git")); err == nil {
		b, err := exec.Command("git", "-C", root, "ls-files", "-z", "--cached").Output()
		if err != nil {
			return nil, fmt.Errorf("git ls-files: %w", err)
		}
		for _, rel := range strings.Split(string(b), "\x00") {
			if keep(rel) {
				if _, err := os.Lstat(filepath.Join(root, rel)); err == nil {
					out = append(out, rel)
				}
			}
		}
		return out, nil
	}
	for _, f := range []string{"go.mod", "go.sum"} {
		out = append(out, f)
	}
	for _, dir := range dirs {
		err := filepath.WalkDir(filepath.Join(root, dir), func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			rel, err := filepath.Rel(root, p)
			if err != nil {
				return err
			}
			if d.Type().IsRegular() && keep(filepath.ToSlash(rel)) {
				out = append(out, rel)
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

func copyFile(src, dst string) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	return os.WriteFile(dst, b, 0o644)
}

// VendorHash runs `go mod vendor` in dir (a copy made by CopyGoSources) and
// returns the SRI NAR hash of the vendor directory, as buildGoModule's
// goModules derivation (its output is that directory, modules.txt
// included) is hashed.
func VendorHash(dir string) (string, error) {
	cmd := exec.Command("go", "mod", "vendor")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go mod vendor: %v: %s", err, out)
	}
	return NARHash(filepath.Join(dir, "vendor"))
}

// NARHash is `nix hash path --sri` of path.
func NARHash(path string) (string, error) {
	out, err := exec.Command("nix", "--extra-experimental-features", "nix-command", "hash", "path", "--sri", path).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("nix hash path %s: %v: %s", path, err, out)
	}
	return strings.TrimSpace(string(out)), nil
}
