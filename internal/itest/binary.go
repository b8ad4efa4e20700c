package itest

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
)

// binary is the shrooms executable built once per test process.
type binary struct {
	once sync.Once
	path string
	err  error
	out  []byte
}

var built binary

// ShroomsBinary builds cmd/shrooms once per test process, statically
// (CGO_ENABLED=0, podman's remote build tags), for tests that mount shrooms
// into a cage (the probe, prepared cages), and returns its path.
func ShroomsBinary(t testing.TB) string {
	t.Helper()
	built.once.Do(func() {
		dir, err := os.MkdirTemp("", "shrooms-test-bin")
		if err != nil {
			built.err = err
			return
		}
		built.path = filepath.Join(dir, "shrooms")
		_, file, _, _ := runtime.Caller(0)
		root := filepath.Join(filepath.Dir(file), "..", "..")
		cmd := exec.Command("go", "build", "-tags", "remote exclude_graphdriver_btrfs containers_image_openpgp exclude_graphdriver_devicemapper",
			"-o", built.path, "./cmd/shrooms")
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		built.out, built.err = cmd.CombinedOutput()
	})
	if built.err != nil {
		t.Fatalf("build shrooms: %v: %s", built.err, built.out)
	}
	return built.path
}

// RemoveShroomsBinary deletes what ShroomsBinary built (call it from
// TestMain after m.Run).
func RemoveShroomsBinary() {
	if built.path != "" {
		os.RemoveAll(filepath.Dir(built.path))
	}
}
