package itest

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"

	"gotest.tools/v3/assert"
)

// TestSubnetsAreExclusive: subnets reserved at once differ, their files
// name this process and go at cleanup; a file left by a dead process is
// taken over, one of a live process is not.
func TestSubnetsAreExclusive(t *testing.T) {
	Require(t, Root)
	seen := map[string]bool{}
	var files []string
	t.Run("reserve", func(t *testing.T) {
		for i := 0; i < 20; i++ {
			v4, v6 := Subnets(t)
			assert.Assert(t, !seen[v4] && !seen[v6], "%s %s handed out twice", v4, v6)
			seen[v4], seen[v6] = true, true
		}
		entries, err := os.ReadDir(SubnetDir)
		assert.NilError(t, err)
		for _, e := range entries {
			b, _ := os.ReadFile(filepath.Join(SubnetDir, e.Name()))
			if string(b) == strconv.Itoa(os.Getpid()) {
				files = append(files, e.Name())
			}
		}
		assert.Equal(t, len(files), 20)
	})
	for _, f := range files {
		_, err := os.Stat(filepath.Join(SubnetDir, f))
		assert.Assert(t, os.IsNotExist(err), "%s outlived its test", f)
	}

	// The last index of the range: a file of a process that is gone.
	k := 140*250 - 1
	path := filepath.Join(SubnetDir, strconv.Itoa(k))
	t.Cleanup(func() { _ = os.Remove(path) })
	gone := exec.Command("true")
	assert.NilError(t, gone.Run())
	assert.NilError(t, os.WriteFile(path, []byte(strconv.Itoa(gone.Process.Pid)), 0o644))
	assert.Assert(t, reserve(k), "a dead process's subnet was not taken over")
	b, err := os.ReadFile(path)
	assert.NilError(t, err)
	assert.Equal(t, string(b), strconv.Itoa(os.Getpid()))
	// Now this live process holds it: positive control for the refusal.
	assert.Assert(t, !reserve(k), "a live process's subnet was taken over")
}
