package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/shrooms-cage/shrooms/internal/itest"
	"github.com/shrooms-cage/shrooms/internal/testbed"
	"github.com/shrooms-cage/shrooms/internal/testcfg"
	"github.com/shrooms-cage/shrooms/pkg/cagelink"
)

// TestPurgeRemovesOnlyTheSkeleton is `make uninstall PURGE=1`'s step in
// the testbed's host namespace: after a real networked turn, purge refuses
// (changing nothing) while the task is known and while a file shrooms does
// not know is in the state directory; once the task is forgotten it removes
// the cage network (the shrooms driver's bridge and NAT table), the seal,
// the outbox root and the state directory, and nothing else. A network of the same name shrooms did not make stays.
func TestPurgeRemovesOnlyTheSkeleton(t *testing.T) {
	itest.Require(t, itest.Root, itest.Podman, itest.Nftables, itest.Netns)
	tb := testbed.New(t)
	tb.StartPodman()
	sub4, sub6 := itest.Subnets(t)
	e := testbedEnv(t, tb, "sp", testcfg.Config{Cage: map[string]any{"stop_grace": "1s"},
		Network: map[string]any{"policy": "internet", "subnet4": sub4, "subnet6": sub6,
			"dns_upstream": []string{"203.0.113.10"}}})
	name, dir, configFile := e.Prefix, e.Dir, e.Config
	state, box := filepath.Join(dir, "state"), filepath.Join(dir, "outbox")
	task := name + "-t"
	nft := func(args ...string) error {
		return exec.Command("nsenter", append([]string{"--net=" + tb.NSPath("host"), "--", "nft"}, args...)...).Run()
	}
	shrooms := inTestbedHost(tb, os.Args[0], configFile, "SHROOMS_TEST_MAIN=1")
	networkExists := func() bool { _, err := tb.Podman("network", "exists", name); return err == nil }
	// The shrooms driver's (the default) network: its bridge.
	bridgeExists := func() bool { _, err := tb.Exec("host", "ip", "link", "show", "dev", name); return err == nil }

	code, _, stderr := shrooms("net", "apply")
	assert.Equal(t, code, 0, stderr)
	code, _, stderr = shrooms("run", "--task", task, "--agent", "shell", "--no-stdin", "--", "-c", "echo kept > /home/agent/note")
	assert.Equal(t, code, 0, stderr)

	// The task is known: refused, nothing removed.
	code, _, stderr = shrooms("purge")
	assert.Equal(t, code, ExitBusy, stderr)
	assert.Check(t, is.Contains(stderr, "tasks/"+task))
	assert.Check(t, is.Contains(stderr, "nothing removed"))
	assert.Check(t, bridgeExists(), "a refused purge removed the bridge")
	assert.Check(t, nft("list", "table", "inet", "shrooms_"+name) == nil, "a refused purge removed the seal")
	_, err := os.Stat(filepath.Join(state, "tasks", task))
	assert.Check(t, err, "a refused purge removed the task")

	code, _, stderr = shrooms("forget", "--task", task)
	assert.Equal(t, code, 0, stderr)

	// A file shrooms does not know: refused, kept.
	stray := filepath.Join(state, "owner-notes.txt")
	assert.NilError(t, os.WriteFile(stray, []byte("mine"), 0o600))
	code, _, stderr = shrooms("purge")
	assert.Equal(t, code, ExitBusy, stderr)
	assert.Check(t, is.Contains(stderr, "owner-notes.txt"))
	_, err = os.Stat(stray)
	assert.Check(t, err)
	assert.Check(t, bridgeExists())
	assert.NilError(t, os.Remove(stray))

	code, stdout, stderr := shrooms("purge", "--dry-run")
	assert.Equal(t, code, 0, stderr)
	assert.Check(t, is.Contains(stdout, "would remove bridge "+name+" and its NAT table"))
	assert.Check(t, !strings.Contains(stdout, "podman network"), "the shrooms driver made no podman network: %s", stdout)
	assert.Check(t, is.Contains(stdout, "would remove state directory "+state))
	assert.Check(t, bridgeExists(), "--dry-run removed the bridge")

	// A firewall reload took the NAT table meanwhile: the bridge is still
	// the cage network's (a bridge with its gateway) and goes.
	assert.NilError(t, nft("delete", "table", "inet", cagelink.NATTable(name)))
	code, stdout, stderr = shrooms("purge")
	assert.Equal(t, code, 0, stderr)
	assert.Check(t, is.Contains(stdout, "removed bridge "+name+" and its NAT table"))
	assert.Check(t, !bridgeExists(), "the bridge is still there")
	assert.Check(t, nft("list", "table", "inet", cagelink.NATTable(name)) != nil, "the NAT table is still there")
	assert.Check(t, nft("list", "table", "inet", "shrooms_"+name) != nil, "the inet seal table is still there")
	assert.Check(t, nft("list", "table", "bridge", "shrooms_"+name) != nil, "the bridge seal table is still there")
	for _, p := range []string{state, box} {
		_, err := os.Lstat(p)
		assert.Check(t, os.IsNotExist(err), "%s is still there: %v", p, err)
	}
	_, err = os.Stat(dir)
	assert.Check(t, err, "purge removed more than the state directory")

	// A network of that name shrooms did not make is left alone.
	out, err := tb.Podman("network", "create", "--label", "owner=someone-else", name)
	assert.NilError(t, err, out)
	code, stdout, stderr = shrooms("purge")
	assert.Equal(t, code, 0, stderr)
	assert.Check(t, is.Contains(stdout, "kept podman network "+name+": shrooms did not make it"))
	assert.Check(t, networkExists(), "purge removed a network shrooms did not make")

}
