package itest

import (
	"slices"
	"strings"
	"testing"
)

// TestEnvCages: an Env lists the managed cages of the tasks it is asked
// for, not another task's, nor an unmanaged container with a task label.
func TestEnvCages(t *testing.T) {
	Require(t, Root, Podman)
	e := New(t, "ie")
	other := New(t, "ie")
	run := func(name string, labels ...string) string {
		args := []string{"run", "-d", "--name", name}
		for _, l := range labels {
			args = append(args, "--label", l)
		}
		out, err := e.Podman(append(args, TestImage, "sleep", "600")...)
		if err != nil {
			t.Fatalf("podman run: %v: %s", err, out)
		}
		t.Cleanup(func() {
			if out, err := e.podmanRetried("rm", "-f", "-t", "0", name); err != nil {
				t.Errorf("remove %s: %v: %s", name, err, out)
			}
		})
		return strings.TrimSpace(out)[:12]
	}
	ours := run(e.Task("a"), LabelManaged+"=1", LabelTask+"="+e.Task("a"))
	theirs := run(other.Task("a"), LabelManaged+"=1", LabelTask+"="+other.Task("a"))
	unmanaged := run(e.Task("b"), LabelTask+"="+e.Task("b"))
	cages, err := e.Cages(e.Task("a"), e.Task("b"))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(cages, ours) {
		t.Errorf("the env's own cage %s is not listed: %v", ours, cages)
	}
	if slices.Contains(cages, theirs) || slices.Contains(cages, unmanaged) {
		t.Errorf("listed another test's cage %s or an unmanaged one %s: %v", theirs, unmanaged, cages)
	}
}
