// Package sealed turns a configuration, a mount plan and one turn into the
// podman spec of that turn's cage. It only computes: the spec is a plain
// value that `shrooms spec` prints and `shrooms run` sends unchanged.
//
// Every cage is sealed the same way: all capabilities dropped,
// no-new-privileges, seccomp, a read-only root with size-capped tmpfs, a
// private user namespace of the task's own host ids, a non-root user,
// resource limits, private namespaces, no devices and no sockets of the host.
package sealed

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"github.com/shrooms-cage/shrooms/pkg/taskid"
	"math"
	"net"
	"net/netip"
	"path/filepath"
	"strconv"
	"syscall"

	nettypes "github.com/containers/common/libnetwork/types"
	"github.com/containers/podman/v5/pkg/specgen"
	"github.com/containers/storage/pkg/idtools"
	storagetypes "github.com/containers/storage/types"
	spec "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/shrooms-cage/shrooms/pkg/config"
	"github.com/shrooms-cage/shrooms/pkg/gitseal"
	"github.com/shrooms-cage/shrooms/pkg/mounts"
)

// Labels every cage carries, so that gc can find cages a crash left behind.
const (
	LabelManaged = "io.shrooms.managed"
	LabelTask    = "io.shrooms.task"
	LabelTurn    = "io.shrooms.turn"
	LabelAgent   = "io.shrooms.agent"
	// LabelState names the state directory of the shrooms that made the
	// cage, so that gc and leftover removal only touch their own cages.
	LabelState = "io.shrooms.state"
	// LabelWorktreeGuard is the digest of the worktree's guarded config the
	// cage was planned against.
	LabelWorktreeGuard = "io.shrooms.worktree-guard"
)

// ShmSize is the size of a cage's /dev/shm (a tmpfs of its own).
const ShmSize = 64 << 20

// StateLabel is the value of LabelState for a state directory.
func StateLabel(stateDir string) string {
	sum := sha256.Sum256([]byte(filepath.Clean(stateDir)))
	return hex.EncodeToString(sum[:8])
}

// Ours reports whether a cage with labels was made by a shrooms with
// state directory stateDir (gc and leftover removal touch no other).
func Ours(stateDir string, labels map[string]string) bool {
	return labels[LabelManaged] == "1" && labels[LabelState] == StateLabel(stateDir)
}

// IDRange is the slice of host uids and gids a task's user namespace maps
// container ids 0..Size-1 onto.
type IDRange struct {
	UID, GID uint32
	Size     uint32
}

// Turn is everything about one turn that the spec depends on.
type Turn struct {
	Task   taskid.ID
	Number int
	Agent  string
	// Command replaces the agent's command when set.
	Command []string
	// Args are appended to the command.
	Args []string
	// Stdin keeps the cage's stdin open for attaching.
	Stdin bool
	// Terminal gives the cage a terminal (run --tty, for a person at one);
	// its stdin is attached too. Only with TIOCSTI closed
	// (seccomp.TIOCSTIClosed).
	Terminal bool
	// IDs is the task's user-namespace range.
	IDs IDRange
	// Plan is the cage's mounts.
	Plan *mounts.Plan
	// SecretEnv maps an environment variable to the podman secret holding
	// its value (tokens never appear in the spec itself).
	SecretEnv map[string]string
	// HostEntries ("name:address") are the allowlisted names the cage's
	// /etc/hosts must resolve (the allowlist policy gives the cage no DNS).
	HostEntries []string
	// SeccompPath is the profile file ("" for podman's default profile).
	SeccompPath string
	// ResolvConf is the cage's resolv.conf (cagenet.InstallResolvConf),
	// bound over podman's under network.driver "shrooms".
	ResolvConf string
	// DeadlineSeconds bounds the cage's life even if shrooms dies: podman
	// kills it after this long.
	DeadlineSeconds uint
	// Env is set by shrooms over the agent's own environment (e.g. the
	// switches that make an agent ignore untrusted project config).
	Env map[string]string
	// WorktreeGuard identifies the worktree's guarded config state (label
	// LabelWorktreeGuard), so a prepared cage never runs on a changed one.
	WorktreeGuard string
	// GVisor is set when the cage runs under gVisor's runsc: its
	// RLIMIT_NPROC is then GVisorNproc's.
	GVisor bool
}

// GVisorNproc is RLIMIT_NPROC for a cage under gVisor's runsc (systrap).
// The Sentry runs each of the cage's processes on about two host tasks
// (its stub and sysmsg thread) besides its own threads, all under the
// cage's host pids limit, and a fork that meets that limit panics the
// Sentry: the whole cage dies (exit 2, no output; measured with pids 128
// at 48 background sleeps, with pids 1024 and nproc 2048 too). The Sentry
// enforces RLIMIT_NPROC, and a fork over it fails with EAGAIN as under
// runc, so the cage gets at most (pids - 64 - pids/16) / 2 (docs/gvisor.md).
func GVisorNproc(pids, nproc int64) int64 {
	return max(1, min(nproc, (pids-64-pids/16)/2))
}

// Name is the cage's container name for a task's turn.
func Name(task taskid.ID, turn int) string {
	return fmt.Sprintf("shrooms-%s-%d", task, turn)
}

// Spec builds the sealed spec of one turn.
func Spec(cfg *config.Config, t Turn) (*specgen.SpecGenerator, error) {
	agent, err := cfg.Agent(t.Agent)
	if err != nil {
		return nil, err
	}
	if t.Plan == nil {
		return nil, fmt.Errorf("sealed spec: no mount plan")
	}
	if t.IDs.Size < 65536 || t.IDs.UID == 0 || t.IDs.GID == 0 {
		return nil, fmt.Errorf("sealed spec: user namespace range %+v is not a 65536-id range of non-root host ids", t.IDs)
	}
	if uint64(cfg.Cage.User) >= uint64(t.IDs.Size) {
		return nil, fmt.Errorf("sealed spec: cage.user %d is outside the task's %d-id user namespace", cfg.Cage.User, t.IDs.Size)
	}
	yes, no := true, false
	s := specgen.NewSpecGenerator(cfg.ImageFor(agent), false)

	// Basic: what runs, as whom, where.
	s.Name = Name(t.Task, t.Number)
	command := agent.Command
	if len(t.Command) > 0 {
		command = t.Command
	}
	s.Command = append(append([]string{}, command...), t.Args...)
	s.Env = environment(agent)
	for k, v := range t.Env {
		s.Env[k] = v
	}
	for k, v := range gitseal.CageEnv() {
		s.Env[k] = v
	}
	s.EnvSecrets = copyMap(t.SecretEnv)
	terminal, stdin := t.Terminal, t.Stdin || t.Terminal
	s.Terminal = &terminal
	s.Stdin = &stdin
	s.Labels = map[string]string{
		LabelManaged: "1",
		LabelTask:    t.Task.String(),
		LabelTurn:    strconv.Itoa(t.Number),
		LabelAgent:   t.Agent,
		LabelState:   StateLabel(cfg.State.Dir),
	}
	if t.WorktreeGuard != "" {
		s.Labels[LabelWorktreeGuard] = t.WorktreeGuard
	}
	stopSignal := syscall.SIGTERM
	s.StopSignal = &stopSignal
	grace := uint(math.Ceil(cfg.Cage.StopGrace.Std().Seconds()))
	s.StopTimeout = &grace
	s.Timeout = t.DeadlineSeconds
	s.Remove = &no
	// No container log: shrooms streams the cage's output over attach, and
	// a log file would be an uncapped copy on the host's disk (agent
	// output, secrets it prints) outliving the turn.
	s.LogConfiguration = &specgen.LogConfig{Driver: "none"}
	s.Systemd = "false"
	// Podman 5.x+ honours it per container; older services ignore it and
	// the turn refuses a cage whose runtime is not this one (turn.ranRuntime).
	if cfg.Cage.Runtime != config.RuntimeDefault {
		s.OCIRuntime = cfg.Cage.Runtime
	}
	s.Hostname = fmt.Sprintf(cfg.Cage.HostnameFmt, t.Task.String())
	s.WorkDir = mounts.WorkDir
	s.User = fmt.Sprintf("%d:%d", cfg.Cage.User, cfg.Cage.User)
	s.Umask = "0022"

	// Namespaces: all private; the network only as policy says.
	s.PidNS = specgen.Namespace{NSMode: specgen.Private}
	s.IpcNS = specgen.Namespace{NSMode: specgen.Private}
	s.UtsNS = specgen.Namespace{NSMode: specgen.Private}
	s.CgroupNS = specgen.Namespace{NSMode: specgen.Private}
	// /etc/hosts and resolv.conf would otherwise copy the host's own lines
	// (its names, host.containers.internal, its resolvers) into the cage.
	s.UseImageHosts = &yes
	if len(t.HostEntries) > 0 {
		s.UseImageHosts = &no
		s.HostAdd = append([]string{}, t.HostEntries...)
	}
	var resolv *spec.Mount // the cage's resolv.conf, after the plan's mounts
	switch {
	case cfg.Network.Networked() && cfg.Network.Driver == config.DriverPodman:
		s.NetNS = specgen.Namespace{NSMode: specgen.Bridge}
		s.Networks = map[string]nettypes.PerNetworkOptions{cfg.Network.Name: {}}
		if _, err := Gateway4(cfg.Network); err != nil {
			return nil, err
		}
		// The only resolver a cage has: shrooms' own on the cage's loopback
		// (pkg/dnsseal, opened by the turn before the agent starts); the
		// seal drops DNS to the gateway and everywhere else.
		s.DNSServers = []net.IP{net.IPv4(127, 0, 0, 1)}
	case cfg.Network.Networked():
		// The shrooms driver: podman gives the cage an empty network
		// namespace (no netavark, nothing under /run/netns) and the turn
		// links it to the bridge before it starts (pkg/cagelink). podman
		// writes an empty resolv.conf for such a cage and refuses DNS
		// servers, so the cage's own (nameserver 127.0.0.1, the resolver
		// above) is bound over it.
		if _, err := Gateway4(cfg.Network); err != nil {
			return nil, err
		}
		if t.ResolvConf == "" {
			return nil, fmt.Errorf("sealed spec: network.driver %q needs the cage's resolv.conf", cfg.Network.Driver)
		}
		s.NetNS = specgen.Namespace{NSMode: specgen.NoNetwork}
		resolv = &spec.Mount{Destination: "/etc/resolv.conf", Type: "bind", Source: t.ResolvConf,
			Options: []string{"ro", "nosuid", "nodev", "noexec"}}
	default:
		s.NetNS = specgen.Namespace{NSMode: specgen.NoNetwork}
		s.UseImageResolvConf = &yes
	}
	s.UserNS = specgen.Namespace{NSMode: specgen.Private}
	s.IDMappings = &storagetypes.IDMappingOptions{
		UIDMap: []idtools.IDMap{{ContainerID: 0, HostID: int(t.IDs.UID), Size: int(t.IDs.Size)}},
		GIDMap: []idtools.IDMap{{ContainerID: 0, HostID: int(t.IDs.GID), Size: int(t.IDs.Size)}},
	}

	// Security: nothing granted.
	s.Privileged = &no
	s.CapDrop = []string{"ALL"}
	s.NoNewPrivileges = &yes
	s.SeccompProfilePath = t.SeccompPath
	s.ReadOnlyFilesystem = &yes
	s.ReadWriteTmpfs = &no // only the tmpfs mounts of the plan, size-capped

	// Limits.
	mem := int64(cfg.Cage.Memory)
	period := uint64(100000)
	quota := int64(cfg.Cage.CPUs * float64(period))
	s.ResourceLimits = &spec.LinuxResources{
		Memory: &spec.LinuxMemory{Limit: &mem, Swap: &mem},
		Pids:   &spec.LinuxPids{Limit: cfg.Cage.Pids},
		CPU:    &spec.LinuxCPU{Quota: &quota, Period: &period},
	}
	nproc := cfg.Cage.Nproc
	if t.GVisor {
		nproc = GVisorNproc(cfg.Cage.Pids, nproc)
	}
	s.Rlimits = []spec.POSIXRlimit{
		{Type: "nofile", Soft: uint64(cfg.Cage.Nofile), Hard: uint64(cfg.Cage.Nofile)},
		{Type: "nproc", Soft: uint64(nproc), Hard: uint64(nproc)},
		// No core dumps: a crash would hand cage memory to the host's
		// core_pattern helper.
		{Type: "core", Soft: 0, Hard: 0},
	}

	// Mounts. /dev/shm is a tmpfs of the cage's own, which runc mounts in
	// the cage's mount namespace: with podman's default (ShmSize), podman
	// mounts a tmpfs at the host's …/userdata/shm and binds it in, and
	// podman 4.3 starts conmon of a cage whose user namespace does not map
	// root in a mount namespace of its own, so where / is not shared the
	// exit cleanup unmounts only its copy and the first removal of the
	// exited cage fails busy (docs/performance.md, "The busy delete").
	s.Mounts = append(s.Mounts, spec.Mount{Destination: "/dev/shm", Type: "tmpfs", Source: "shm",
		Options: []string{"rw", "nosuid", "nodev", "noexec", fmt.Sprintf("size=%d", ShmSize), "mode=1777"}})
	for _, m := range t.Plan.Mounts {
		switch m.Kind {
		case mounts.Tmpfs:
			s.Mounts = append(s.Mounts, spec.Mount{Destination: m.Dest, Type: "tmpfs", Source: "tmpfs", Options: m.Options})
		case mounts.Bind:
			opts := append([]string{}, m.Options...)
			if m.ReadOnly {
				opts = append(opts, "ro")
			} else {
				opts = append(opts, "rw")
			}
			s.Mounts = append(s.Mounts, spec.Mount{Destination: m.Dest, Type: "bind", Source: m.Source, Options: opts})
		case mounts.Volume:
			opts := append([]string{}, m.Options...)
			if m.ReadOnly {
				opts = append(opts, "ro")
			}
			s.Volumes = append(s.Volumes, &specgen.NamedVolume{Name: m.Source, Dest: m.Dest, Options: opts})
		default:
			return nil, fmt.Errorf("sealed spec: mount %s has unknown kind %q", m.Dest, m.Kind)
		}
	}
	if resolv != nil {
		s.Mounts = append(s.Mounts, *resolv)
	}
	return s, nil
}

// Gateway4 is the cage network's IPv4 gateway: the first address of
// network.subnet4, where netavark puts the bridge and its DNS server.
func Gateway4(n config.Network) (netip.Addr, error) {
	p, err := netip.ParsePrefix(n.Subnet4)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("network.subnet4: %w", err)
	}
	return p.Masked().Addr().Next(), nil
}

// environment is the agent's plain environment plus what every cage sets.
func environment(a config.Agent) map[string]string {
	env := map[string]string{
		"HOME":    mounts.HomeDir,
		"USER":    "agent",
		"LOGNAME": "agent",
		// No directory of HOME is on PATH: HOME is the agent's to write.
		"PATH": "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin",
	}
	for k, v := range a.Env {
		env[k] = v
	}
	return env
}

func copyMap(m map[string]string) map[string]string {
	if len(m) == 0 {
		return nil
	}
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}
