package nixcheck

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

const goTags = "remote exclude_graphdriver_btrfs containers_image_openpgp exclude_graphdriver_devicemapper"

// chrootStore is a private Nix store for one test, removed afterwards.
func chrootStore(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "shrooms-nixcheck-store-")
	assert.NilError(t, err)
	t.Cleanup(func() {
		if err := MakeWritable(dir); err != nil {
			t.Errorf("chroot store: %v", err)
		}
		if err := os.RemoveAll(dir); err != nil {
			t.Errorf("chroot store: %v", err)
		}
	})
	return dir
}

// packageSource is nix/package.nix's src, as Nix copies it for a build.
func packageSource(t *testing.T) string {
	t.Helper()
	src, err := PackageSource(repo, chrootStore(t))
	assert.NilError(t, err)
	return src
}

// goRun runs the go command in dir, as the Nix build does (module mode,
// CGO off, no integration tests).
func goRun(dir string, args ...string) (string, error) {
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "SHROOMS_REQUIRE_INTEGRATION=") && !strings.HasPrefix(kv, "SHROOMS_TEST_PODMAN_SOCKET=") {
			env = append(env, kv)
		}
	}
	// As in the Nix build's sandbox there is no podman: the podman tests
	// skip there (the main run has them), the data-file tests run.
	cmd.Env = append(env, "CGO_ENABLED=0", "GOWORK=off", "GOFLAGS=-mod=mod", "SHROOMS_TEST_PODMAN_SOCKET=unix:///nonexistent/shrooms-nix-sandbox/podman.sock")
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// inGoTree says whether a repository file belongs to the package's source:
// the Go module tree and the one file outside it that tests read.
func inGoTree(rel string) bool {
	switch rel {
	case "go.mod", "go.sum", "config.example.toml":
		return true
	}
	return strings.HasPrefix(rel, "cmd/") || strings.HasPrefix(rel, "pkg/") || strings.HasPrefix(rel, "internal/")
}

// TestPackageSource evaluates nix/package.nix's src with nix-instantiate
// (the real builtins.path filter, into a private store) and checks that it
// is the whole Go tree: every tracked file under cmd/, pkg/ and internal/
// (embedded files, testdata, golden files), go.mod, go.sum and
// config.example.toml, and nothing else. Then it builds, vets and runs the
// unit tests of the packages with data files from exactly that tree, as the
// Nix build does. Control: the old `.go`-only source set fails to build
// pkg/seccomp (its embed is missing).
func TestPackageSource(t *testing.T) {
	requireNix(t)
	src := packageSource(t)
	kept, err := Files(src)
	assert.NilError(t, err)
	tracked, err := TrackedFiles(repo)
	assert.NilError(t, err)

	keptSet := map[string]bool{}
	for _, f := range kept {
		keptSet[f] = true
	}
	var missing, want []string
	dataDirs := map[string]bool{"pkg/config": true} // reads ../../config.example.toml
	for _, f := range tracked {
		if !inGoTree(f) {
			continue
		}
		want = append(want, f)
		if !keptSet[f] {
			missing = append(missing, f)
		}
		if (strings.HasPrefix(f, "pkg/") || strings.HasPrefix(f, "cmd/") || strings.HasPrefix(f, "internal/")) && !strings.HasSuffix(f, ".go") {
			dir := filepath.ToSlash(filepath.Dir(f))
			if i := strings.Index(dir, "/testdata"); i >= 0 {
				dir = dir[:i]
			}
			dataDirs[dir] = true
		}
	}
	assert.Check(t, is.Len(missing, 0), "nix/package.nix's src leaves out %q", missing)
	var extra []string
	for _, f := range kept {
		if !inGoTree(f) {
			extra = append(extra, f)
		}
	}
	assert.Check(t, is.Len(extra, 0), "nix/package.nix's src holds files outside the Go tree: %q", extra)
	// The data files this test exists for are really there.
	for _, f := range []string{"pkg/seccomp/shrooms.json", "pkg/probe/testdata/schema.golden", "pkg/sealed/testdata/spec-internet.json"} {
		assert.Check(t, keptSet[f], "%s not in the package source", f)
	}
	t.Logf("package source: %d files, %d of them Go tree files tracked by git; packages with data files: %v", len(kept), len(want), keys(dataDirs))

	dir := t.TempDir()
	assert.NilError(t, CopyTree(src, dir))
	out, err := goRun(dir, "build", "-tags", goTags, "./...")
	assert.NilError(t, err, "go build ./... of the package source:\n%s", out)
	out, err = goRun(dir, "vet", "-tags", goTags, "./...")
	assert.NilError(t, err, "go vet ./... of the package source:\n%s", out)
	var pkgs []string
	for d := range dataDirs {
		pkgs = append(pkgs, "./"+d)
	}
	out, err = goRun(dir, append([]string{"test", "-tags", goTags, "-count=1", "-p", "1"}, pkgs...)...)
	assert.NilError(t, err, "go test %v in the package source:\n%s", pkgs, out)

	// Control: the source set this replaced (only .go files) does not build.
	old, err := FilteredSource(repo, chrootStore(t), `path: type: type == "directory" || builtins.match ".*\\.go|.*/go\\.(mod|sum)" path != null`)
	assert.NilError(t, err)
	oldDir := t.TempDir()
	assert.NilError(t, CopyTree(old, oldDir))
	out, err = goRun(oldDir, "build", "-tags", goTags, "./pkg/seccomp/")
	assert.Check(t, err != nil, "control: a .go-only source built pkg/seccomp")
	assert.Check(t, is.Contains(out, "pattern shrooms.json: no matching files found"))
}
