package sealed

import (
	"encoding/json"
	"strings"
	"testing"

	spec "github.com/opencontainers/runtime-spec/specs-go"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/golden"

	"github.com/shrooms-cage/shrooms/pkg/config"
	"github.com/shrooms-cage/shrooms/pkg/mounts"
	"github.com/shrooms-cage/shrooms/pkg/taskid"
)

func testTurn(t *testing.T, cfg *config.Config) Turn {
	plan, err := mounts.Build(mounts.Input{
		HomeDir:   "/var/lib/containers/storage/volumes/shrooms-home-golden/_data/home",
		OutboxDir: "/var/lib/shrooms/outbox/golden", TmpSize: 1 << 30, RunSize: 64 << 20,
	})
	assert.NilError(t, err)
	return Turn{
		Task: taskid.Must("golden"), Number: 3, Agent: "claude", Args: []string{"-p", "fix it"}, Stdin: true,
		IDs: IDRange{UID: 1879048192, GID: 1879048192, Size: 65536}, Plan: plan,
		SecretEnv: map[string]string{"ANTHROPIC_API_KEY": "shrooms-golden-anthropic"}, DeadlineSeconds: 7235,
		SeccompPath: "/var/lib/shrooms/seccomp/shrooms-0123456789ab.json",
		ResolvConf:  "/var/lib/shrooms/cagenet/resolv.conf",
	}
}

// TestSpecGolden pins the whole spec: any change to what a cage gets must
// show up in testdata/ (go test ./pkg/sealed -update accepts it).
func TestSpecGolden(t *testing.T) {
	for _, name := range []string{"internet", "internet-podman", "none"} {
		t.Run(name, func(t *testing.T) {
			cfg := config.Default()
			cfg.Network.Policy, _, _ = strings.Cut(name, "-")
			if strings.HasSuffix(name, "-podman") {
				cfg.Network.Driver = config.DriverPodman
			}
			s, err := Spec(cfg, testTurn(t, cfg))
			assert.NilError(t, err)
			got, err := json.MarshalIndent(s, "", "  ")
			assert.NilError(t, err)
			golden.Assert(t, string(got), "spec-"+name+".json")
		})
	}
}

// TestSpecIsSealed asserts each sealing property on the generated spec.
func TestSpecIsSealed(t *testing.T) {
	cfg := config.Default()
	// The networked cage (the built-in default is policy none).
	cfg.Network.Policy = "internet"
	s, err := Spec(cfg, testTurn(t, cfg))
	assert.NilError(t, err)
	assert.DeepEqual(t, s.CapDrop, []string{"ALL"})
	assert.Equal(t, len(s.CapAdd), 0)
	assert.Assert(t, *s.NoNewPrivileges)
	assert.Assert(t, !*s.Privileged)
	assert.Equal(t, s.SeccompProfilePath, "/var/lib/shrooms/seccomp/shrooms-0123456789ab.json")
	assert.Assert(t, *s.ReadOnlyFilesystem)
	assert.Assert(t, !*s.ReadWriteTmpfs)
	assert.Equal(t, string(s.UserNS.NSMode), "private")
	assert.Equal(t, s.IDMappings.UIDMap[0].HostID, 1879048192)
	assert.Equal(t, s.IDMappings.UIDMap[0].ContainerID, 0)
	assert.Equal(t, s.IDMappings.UIDMap[0].Size, 65536)
	assert.Equal(t, s.User, "1000:1000")
	for _, ns := range []string{string(s.PidNS.NSMode), string(s.IpcNS.NSMode), string(s.UtsNS.NSMode), string(s.CgroupNS.NSMode)} {
		assert.Equal(t, ns, "private")
	}
	// The shrooms driver: an empty network namespace shrooms links before
	// the cage starts, and the cage's own resolv.conf over podman's.
	assert.Equal(t, string(s.NetNS.NSMode), "none")
	assert.Equal(t, len(s.Networks), 0)
	assert.Equal(t, len(s.DNSServers), 0)
	var resolv []spec.Mount
	for _, m := range s.Mounts {
		if m.Destination == "/etc/resolv.conf" {
			resolv = append(resolv, m)
		}
	}
	assert.DeepEqual(t, resolv, []spec.Mount{{Destination: "/etc/resolv.conf", Type: "bind", Source: "/var/lib/shrooms/cagenet/resolv.conf",
		Options: []string{"ro", "nosuid", "nodev", "noexec"}}})
	noResolv := testTurn(t, cfg)
	noResolv.ResolvConf = ""
	_, err = Spec(cfg, noResolv)
	assert.ErrorContains(t, err, "needs the cage's resolv.conf")
	// Under driver podman: its bridge network, our resolver named.
	cfg.Network.Driver = config.DriverPodman
	ps, err := Spec(cfg, testTurn(t, cfg))
	assert.NilError(t, err)
	assert.Equal(t, string(ps.NetNS.NSMode), "bridge")
	assert.Equal(t, len(ps.Networks), 1)
	assert.Equal(t, ps.DNSServers[0].String(), "127.0.0.1")
	cfg.Network.Driver = config.DriverShrooms
	assert.Equal(t, len(s.Devices), 0)
	assert.Equal(t, *s.ResourceLimits.Memory.Limit, int64(4<<30))
	assert.Equal(t, *s.ResourceLimits.Memory.Swap, int64(4<<30), "no swap on top of memory")
	assert.Equal(t, s.ResourceLimits.Pids.Limit, int64(1024))
	assert.Equal(t, *s.ResourceLimits.CPU.Quota, int64(200000))
	assert.Equal(t, len(s.Rlimits), 3)
	assert.DeepEqual(t, s.Rlimits[2], spec.POSIXRlimit{Type: "core", Soft: 0, Hard: 0}) // no core dumps
	assert.Equal(t, s.Hostname, "cage-golden")
	assert.Equal(t, s.LogConfiguration.Driver, "none", "no container log: output goes over attach only")
	assert.Equal(t, s.WorkDir, "/work")
	assert.Equal(t, s.Env["HOME"], "/home/agent")
	assert.Equal(t, s.Labels[LabelTask], "golden")
	assert.Equal(t, s.Labels[LabelTurn], "3")
	assert.DeepEqual(t, s.Command, []string{"claude", "--dangerously-skip-permissions", "-p", "fix it"})
	assert.Equal(t, s.EnvSecrets["ANTHROPIC_API_KEY"], "shrooms-golden-anthropic")
	for k, v := range s.Env {
		assert.Assert(t, v != "shrooms-golden-anthropic", "secret name leaked into env %s", k)
	}
	var dests []string
	for _, m := range s.Mounts {
		dests = append(dests, m.Destination)
		assert.Assert(t, m.Source != "/run/podman" && m.Source != "/var/run/docker.sock", "engine socket mounted")
		if m.Type == "bind" {
			assert.Assert(t, is.Contains(m.Options, "nosuid"))
			assert.Assert(t, is.Contains(m.Options, "nodev"))
		}
	}
	// /dev/shm: a tmpfs of the cage's own, not podman's host-side shm mount.
	assert.DeepEqual(t, dests, []string{"/dev/shm", "/tmp", "/run", "/home/agent", "/work", "/outbox", "/etc/resolv.conf"})
	assert.Equal(t, s.Mounts[0].Type, "tmpfs")
	assert.Assert(t, is.Contains(s.Mounts[0].Options, "size=67108864"))
	assert.Assert(t, is.Contains(s.Mounts[0].Options, "noexec"))
	assert.Assert(t, s.ShmSize == nil, "podman would mount a /dev/shm of its own on the host and bind it in")
	assert.Assert(t, *s.UseImageHosts, "the host's /etc/hosts stays out")
	assert.Equal(t, s.Mounts[len(s.Mounts)-1].Source, "/var/lib/shrooms/cagenet/resolv.conf", "the cage's own resolver only (pkg/dnsseal)")
}

func TestSpecRefusesUnsafeIDs(t *testing.T) {
	cfg := config.Default()
	tt := testTurn(t, cfg)
	tt.IDs = IDRange{UID: 0, GID: 0, Size: 65536}
	_, err := Spec(cfg, tt)
	assert.ErrorContains(t, err, "non-root host ids")
	tt.IDs = IDRange{UID: 100000, GID: 100000, Size: 1000}
	_, err = Spec(cfg, tt)
	assert.ErrorContains(t, err, "65536-id range")
}

// A terminal turn: the cage gets a terminal and its stdin; others get
// neither unless asked for stdin.
func TestTerminalSpec(t *testing.T) {
	for _, c := range []struct{ terminal, stdin, wantStdin bool }{
		{false, false, false}, {false, true, true}, {true, false, true}, {true, true, true},
	} {
		cfg := config.Default()
		tt := testTurn(t, cfg)
		tt.Terminal, tt.Stdin = c.terminal, c.stdin
		s, err := Spec(cfg, tt)
		assert.NilError(t, err)
		assert.Equal(t, *s.Terminal, c.terminal)
		assert.Equal(t, *s.Stdin, c.wantStdin)
	}
}
