// Package nixcheck checks, on a machine without a Nix store (Debian's
// nix-bin evaluates and hashes, in a private chroot store), what can be
// checked of the Nix side (flake.nix, nix/): every .nix file parses and keeps
// nixfmt's line width, nix/package.nix's src holds the whole Go tree (built
// and vetted from exactly that tree), the vendorHash is the NAR hash of
// `go mod vendor` for it, flake.lock pins real nixpkgs revisions of the
// branches it names, every file the VM tests use reaches their closure, the
// seal unit's ordering has no cycle, and the VM tests' topology matches
// internal/testbed. The tests do the checking; this file holds helpers.
package nixcheck

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
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

// PackageSource evaluates nix/package.nix's src with nix-instantiate in a
// private chroot store under storeRoot (Nix copies the filtered tree there,
// as a build would) and returns the directory holding that tree. package.nix
// is called with a buildGoModule that returns its arguments and every other
// argument a throw, so src must be computable from builtins alone: the
// filter that runs here is the filter the flake's build runs.
func PackageSource(root, storeRoot string) (string, error) {
	abs, err := filepath.Abs(root)
	if err != nil {
		return "", fmt.Errorf("package source: %w", err)
	}
	expr := `let
  f = import ` + nixString(filepath.Join(abs, "nix/package.nix")) + `;
  args = builtins.mapAttrs (n: _: throw "package.nix: src must not need the argument ${n}") (builtins.functionArgs f);
in "${(f (args // { buildGoModule = a: a; })).src}"`
	return evalStorePath(expr, storeRoot)
}

// FilteredSource copies root into a chroot store under storeRoot through
// builtins.path with the given filter expression (a Nix function of path
// and type) and returns the resulting directory: the tests' control runs
// the old `.go`-only filter through it.
func FilteredSource(root, storeRoot, filter string) (string, error) {
	abs, err := filepath.Abs(root)
	if err != nil {
		return "", fmt.Errorf("filtered source: %w", err)
	}
	expr := `"${builtins.path { name = "filtered-source"; path = ` + nixPath(abs) + `; filter = ` + filter + `; }}"`
	return evalStorePath(expr, storeRoot)
}

func evalStorePath(expr, storeRoot string) (string, error) {
	cmd := exec.Command("nix-instantiate", "--eval", "--json", "--read-write-mode", "--store", storeRoot, "--expr", expr)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("nix-instantiate: %v: %s", err, strings.TrimSpace(stderr.String()))
	}
	var storePath string
	if err := json.Unmarshal(out, &storePath); err != nil || !strings.HasPrefix(storePath, "/nix/store/") {
		return "", fmt.Errorf("nix-instantiate printed %q, not a store path", out)
	}
	return filepath.Join(storeRoot, storePath), nil
}

// nixString quotes s as a Nix string literal.
func nixString(s string) string {
	r := strings.NewReplacer(`\`, `\\`, `"`, `\"`, `${`, `\${`)
	return `"` + r.Replace(s) + `"`
}

// nixPath writes an absolute path as a Nix path value.
func nixPath(abs string) string {
	return "(/. + " + nixString(abs) + ")"
}

// Files lists the regular files under dir, relative and slash-separated,
// sorted.
func Files(dir string) ([]string, error) {
	var out []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			rel, err := filepath.Rel(dir, p)
			if err != nil {
				return err
			}
			out = append(out, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", dir, err)
	}
	sort.Strings(out)
	return out, nil
}

// CopyTree copies the regular files under src into dst (writable, unlike
// the store copy they come from).
func CopyTree(src, dst string) error {
	files, err := Files(src)
	if err != nil {
		return err
	}
	for _, rel := range files {
		if err := copyFile(filepath.Join(src, rel), filepath.Join(dst, rel)); err != nil {
			return fmt.Errorf("copy tree: %w", err)
		}
	}
	return nil
}

// MakeWritable gives the owner write access to everything under dir, so a
// chroot store (whose paths Nix makes read-only) can be removed.
func MakeWritable(dir string) error {
	return filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if d.Type()&fs.ModeSymlink != 0 {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		return os.Chmod(p, info.Mode().Perm()|0o200)
	})
}

// TrackedFiles lists root's files as a flake's source would hold them: the
// files git tracks (and that exist), or, outside a git checkout, every
// regular file below root except .git.
func TrackedFiles(root string) ([]string, error) {
	if _, err := os.Stat(filepath.Join(root, ".git")); err != nil {
		return Files(root)
	}
	b, err := exec.Command("git", "-C", root, "ls-files", "-z", "--cached").Output()
	if err != nil {
		return nil, fmt.Errorf("git ls-files: %w", err)
	}
	var out []string
	for _, rel := range strings.Split(string(b), "\x00") {
		if rel == "" {
			continue
		}
		if fi, err := os.Lstat(filepath.Join(root, rel)); err == nil && fi.Mode().IsRegular() {
			out = append(out, rel)
		}
	}
	sort.Strings(out)
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

// VendorHash runs `go mod vendor` in dir (a writable copy of the package's
// source, see PackageSource and CopyTree) and
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
