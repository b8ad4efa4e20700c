package itest

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// A test skipped under runsc is skipped only there, is a real test of the
// repository, and is listed in docs/gvisor.md with its reason.
func TestRuntimeSkipsOnlyUnderRunscAndDocumented(t *testing.T) {
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..", "..")
	doc, err := os.ReadFile(filepath.Join(root, "docs", "gvisor.md"))
	if err != nil {
		t.Fatal(err)
	}
	skips := runscSkips()
	if len(skips) == 0 {
		t.Fatal("no runsc skips: drop this test or the list")
	}
	for name := range skips {
		if _, ok := runtimeSkip("", name); ok {
			t.Errorf("%s is skipped under the default runtime", name)
		}
		if _, ok := runtimeSkip("runsc", name); !ok {
			t.Errorf("%s is not skipped under runsc", name)
		}
		if !strings.Contains(string(doc), "`"+name+"`") {
			t.Errorf("%s is skipped under runsc but not listed in docs/gvisor.md", name)
		}
		out, err := exec.Command("grep", "-rlq", "--include=*_test.go", "^func "+name+"(t \\*testing.T)", filepath.Join(root, "cmd"), filepath.Join(root, "pkg"), filepath.Join(root, "test")).CombinedOutput()
		if err != nil {
			t.Errorf("%s is skipped under runsc but no such test exists: %v %s", name, err, out)
		}
	}
	if _, ok := runtimeSkip("runsc", "TestExitCodeAndHomeReset"); ok {
		t.Error("a test not in the list is skipped")
	}
}
