package main

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/shrooms-cage/shrooms/pkg/cagelink"
	"github.com/shrooms-cage/shrooms/pkg/cagenet"
	"github.com/shrooms-cage/shrooms/pkg/config"
	"github.com/shrooms-cage/shrooms/pkg/firewall"
	"github.com/shrooms-cage/shrooms/pkg/gateway"
	"github.com/shrooms-cage/shrooms/pkg/home"
	"github.com/shrooms-cage/shrooms/pkg/mounts"
	"github.com/shrooms-cage/shrooms/pkg/podman"
	"github.com/shrooms-cage/shrooms/pkg/seccomp"
	"github.com/shrooms-cage/shrooms/pkg/taskstate"
	"github.com/shrooms-cage/shrooms/pkg/teardownd"
	"github.com/shrooms-cage/shrooms/pkg/worktree"
	"github.com/shrooms-cage/shrooms/pkg/wtcap"
)

// finding is one doctor check.
type finding struct {
	Check  string `json:"check"`
	Status string `json:"status"` // ok, warn, fail
	Detail string `json:"detail"`
	Fix    string `json:"fix,omitempty"`
}

func doctorCommand() *cli.Command {
	return &cli.Command{
		Name:  "doctor",
		Usage: "check that this host can run sealed turns, and say how to fix what is missing",
		Description: `Loads what a turn loads (as "shrooms config check") and checks the host:
podman (rootful, reachable), the OCI runtime (and runsc's flags under gVisor),
the images, the subuid/subgid ranges, the state directory, the token files'
owner and mode, loop devices, mkfs.ext4, git, TIOCSTI; the worktree cap (a
project quota on the roots' filesystems) and the worktree mode (an idmapped
mount or the chown walks, and why); under a networked policy br_netfilter,
the bridge sysctls, the seal, and the cage network (network.driver
"shrooms": its bridge and any other firewall that drops forwarded packets
by default; "podman": iptables for netavark and /run/netns); each gateway
upstream's DNS and TCP. Each finding is ok, warn or fail, with its fix.`,
		Action: func(c *cli.Context) error {
			cfg, err := loadConfig(c)
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			fs := diagnose(ctx, cfg)
			failed := 0
			for _, f := range fs {
				if f.Status == "fail" {
					failed++
				}
			}
			if jsonMode(c) {
				if err := printJSON(c.App.Writer, map[string]any{"ok": failed == 0, "findings": fs}); err != nil {
					return err
				}
			} else {
				for _, f := range fs {
					textf(c.App.Writer, "%-4s %-14s %s\n", f.Status, f.Check, f.Detail)
					if f.Fix != "" {
						textf(c.App.Writer, "     %-14s fix: %s\n", "", f.Fix)
					}
				}
			}
			if failed > 0 {
				return fail(ExitHostNotReady, fmt.Errorf("%d check(s) failed", failed))
			}
			return nil
		},
	}
}

func diagnose(ctx context.Context, cfg *config.Config) []finding {
	var fs []finding
	add := func(check, status, detail, fix string) {
		fs = append(fs, finding{Check: check, Status: status, Detail: detail, Fix: fix})
	}
	src := cfg.Source
	if src == "" {
		src = "built-in defaults"
	}
	add("config", "ok", "loaded from "+src, "")
	doctorConfig(cfg, add)

	client, err := podman.Connect(ctx, cfg.Podman.Socket)
	if err != nil {
		add("podman", "fail", err.Error(), "start the rootful podman service (NixOS: virtualisation.podman.enable; elsewhere: systemctl enable --now podman.socket) or set podman.socket")
	} else {
		doctorPodman(ctx, cfg, client, add)
	}
	doctorSubIDs(cfg, add)
	doctorState(cfg, add)
	doctorTeardownWorker(cfg, add)
	doctorTokens(cfg, add)
	doctorTools(cfg, add)
	doctorBridge(cfg, add)
	doctorSeal(ctx, cfg, add)
	doctorNetns(cfg, add)
	doctorWorktreeCap(cfg, add)
	doctorWorktreeMode(cfg, add)
	doctorGateways(ctx, cfg, add)
	return fs
}

// doctorWorktreeMode says, in one line, how cages get worktrees on this
// host: an idmapped mount (no chown walks) or the chown walks, and why.
func doctorWorktreeMode(cfg *config.Config, add func(string, string, string, string)) {
	if cfg.Worktree.Idmap == "off" {
		add("worktree mode", "ok", "chown walks before and after every turn (worktree.idmap = \"off\")", "")
		return
	}
	if gvisorRuntime(cfg.Cage.Runtime) {
		add("worktree mode", "ok", "chown walks before and after every turn (gVisor cages keep them)", "")
		return
	}
	dirs := append([]string{cfg.State.Dir}, cfg.Worktree.Roots...)
	for _, d := range dirs {
		for _, err := os.Stat(d); os.IsNotExist(err) && d != "/"; _, err = os.Stat(d) {
			d = filepath.Dir(d) // its filesystem, before it exists
		}
		if err := worktree.IdmapProbe(d); err != nil {
			add("worktree mode", "warn", fmt.Sprintf("chown walks before and after every turn: the kernel or filesystem of %s refuses an idmapped mount (%v)", d, err), "a kernel ≥ 5.12 and a filesystem with idmapped mounts (ext4, xfs, btrfs, tmpfs ≥ 6.3) remove the walks")
			return
		}
	}
	add("worktree mode", "ok", "idmapped mounts (no chown walks) for worktrees not owned by root whose parent directories other users cannot enter; chown walks for the others", "")
}

// doctorWorktreeCap says how worktrees are capped (worktree.max_size and
// max_files by a project quota) and what happens where they cannot be: the
// roots it can check are checked.
func doctorWorktreeCap(cfg *config.Config, add func(string, string, string, string)) {
	w := cfg.Worktree
	limits := fmt.Sprintf("max_size %d bytes, max_files %d", w.MaxSize, w.MaxFiles)
	if w.Uncapped == "allow" {
		add("worktree cap", "warn", limits+" where the filesystem has project quotas; elsewhere turns run UNCAPPED (worktree.uncapped = \"allow\"): a turn can fill that filesystem", "mount worktree filesystems with prjquota (ext4/xfs), then set worktree.uncapped = \"refuse\"")
	} else {
		add("worktree cap", "ok", limits+"; a worktree on a filesystem without project quotas is refused at turn start (worktree.uncapped = \"refuse\")", "")
	}
	for _, r := range w.Roots {
		s, err := wtcap.Probe(r)
		switch {
		case err != nil:
			add("worktree cap", "warn", fmt.Sprintf("root %s: %v", r, err), "")
		case !s.OK && w.Uncapped == "refuse":
			add("worktree cap", "fail", fmt.Sprintf("root %s: %s: its worktrees will be refused", r, s.Reason), "mount it with prjquota (ext4: tune2fs -O quota,project and mount -o prjquota; xfs: -o prjquota), or set worktree.uncapped = \"allow\"")
		case !s.OK:
			add("worktree cap", "warn", fmt.Sprintf("root %s: %s: its worktrees run uncapped", r, s.Reason), "")
		default:
			add("worktree cap", "ok", fmt.Sprintf("root %s: %s %s enforces project quotas", r, s.FSType, s.Device), "")
		}
	}
}

func doctorPodman(ctx context.Context, cfg *config.Config, client *podman.Client, add func(string, string, string, string)) {
	server, api, err := client.Version(ctx)
	if err != nil {
		add("podman", "fail", err.Error(), "check the podman service's log")
		return
	}
	add("podman", "ok", fmt.Sprintf("podman %s (API %s) at %s", server, api, cfg.Podman.Socket), "")
	info, err := client.Info(ctx)
	if err != nil {
		add("oci-runtime", "fail", err.Error(), "check `podman info` on the host")
		return
	}
	if info.Rootless {
		add("rootful", "fail", "the podman service is rootless; shrooms needs rootful podman for per-task user namespaces and the nftables seal", "point podman.socket at the root service (/run/podman/podman.sock)")
	}
	doctorRuntime(ctx, cfg, info, add)
	images := map[string]bool{cfg.Cage.Image: true}
	for _, a := range cfg.Agents {
		images[cfg.ImageFor(a)] = true
	}
	for _, img := range slices.Sorted(maps.Keys(images)) {
		ok, err := client.ImageExists(ctx, img)
		switch {
		case err != nil:
			add("image", "fail", err.Error(), "")
		case !ok:
			add("image", "fail", img+" is not in podman's store (shrooms never pulls)", "build or load it: `podman load` / the flake's cage-image")
		default:
			add("image", "ok", img, "")
		}
	}
}

func doctorSubIDs(cfg *config.Config, add func(string, string, string, string)) {
	files := taskstate.DefaultIDFiles(cfg.Cage.SubIDUser)
	fix := fmt.Sprintf("add `%s:1879048192:268435456` to /etc/subuid and /etc/subgid (NixOS module does this)", cfg.Cage.SubIDUser)
	for _, f := range []string{files.SubUID, files.SubGID} {
		r, err := taskstate.ReadSubIDs(f, files.User)
		if err != nil {
			add("subids", "fail", err.Error(), fix)
			continue
		}
		if r.Count < taskstate.SlotSize {
			add("subids", "fail", fmt.Sprintf("%s: range of %q holds %d ids, fewer than one task's %d", f, files.User, r.Count, taskstate.SlotSize), fix)
			continue
		}
		if other, err := overlapping(f, files.User, r); err != nil {
			add("subids", "fail", err.Error(), "")
		} else if other != "" {
			add("subids", "fail", fmt.Sprintf("%s: range of %q overlaps %s, so another user's containers could share a task's host ids", f, files.User, other), "give shrooms a range of its own")
		} else {
			add("subids", "ok", fmt.Sprintf("%s: %d task slots from %d", f, r.Count/taskstate.SlotSize, r.Start), "")
		}
	}
}

// overlapping names the first other entry of a subid file overlapping r.
func overlapping(path, user string, r taskstate.SubIDRange) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(string(b), "\n") {
		var name string
		var start, count uint64
		if n, _ := fmt.Sscanf(strings.ReplaceAll(line, ":", " "), "%s %d %d", &name, &start, &count); n != 3 || name == user {
			continue
		}
		if start < r.Start+r.Count && r.Start < start+count {
			return fmt.Sprintf("%q (%d+%d)", name, start, count), nil
		}
	}
	return "", nil
}

func doctorState(cfg *config.Config, add func(string, string, string, string)) {
	fi, err := os.Lstat(cfg.State.Dir)
	switch {
	case os.IsNotExist(err):
		add("state-dir", "warn", cfg.State.Dir+" does not exist yet; the first turn creates it", "")
	case err != nil:
		add("state-dir", "fail", err.Error(), "")
	case !fi.IsDir():
		add("state-dir", "fail", cfg.State.Dir+" is not a directory", "remove it or set state.dir")
	case fi.Mode().Perm()&0o022 != 0:
		add("state-dir", "fail", fmt.Sprintf("%s is writable by others (%v)", cfg.State.Dir, fi.Mode().Perm()), "chmod go-w "+cfg.State.Dir)
	default:
		add("state-dir", "ok", cfg.State.Dir, "")
	}
}

// doctorTeardownWorker says whether a turn's teardown lingers to take the
// next turns' (cage.teardown_linger) and names the one that does.
func doctorTeardownWorker(cfg *config.Config, add func(string, string, string, string)) {
	linger := cfg.Cage.TeardownLinger.Std()
	if linger <= 0 {
		add("teardown", "ok", "each turn's teardown is a process of its own (cage.teardown_linger = 0)", "")
		return
	}
	layout := taskstate.Layout{Dir: cfg.State.Dir}
	if pid := teardownd.Running(layout.TeardownWorker()); pid > 0 {
		add("teardown", "ok", fmt.Sprintf("teardown worker pid %d lingers (up to %s idle; it holds a podman connection, no cage or turn file when idle)", pid, linger),
			fmt.Sprintf("to stop it: kill %d", pid))
		return
	}
	if fi, err := os.Lstat(cfg.State.Dir); err == nil && fi.Mode().Perm()&0o077 != 0 {
		add("teardown", "warn", fmt.Sprintf("teardowns cannot linger: %s is open to others (%v)", cfg.State.Dir, fi.Mode().Perm()),
			"chmod 700 "+cfg.State.Dir)
		return
	}
	add("teardown", "ok", fmt.Sprintf("a turn's teardown lingers %s to take the next turns' (none now)", linger), "")
}

func doctorTokens(cfg *config.Config, add func(string, string, string, string)) {
	if len(cfg.Tokens) == 0 {
		add("tokens", "ok", "no tokens configured", "")
	}
	for _, n := range slices.Sorted(maps.Keys(cfg.Tokens)) {
		path := cfg.Tokens[n]
		if _, err := os.Lstat(path); errors.Is(err, os.ErrNotExist) {
			// Only the turns of the agents that use it need it.
			add("tokens", "warn", fmt.Sprintf("token %s: %s does not exist; turns of %s refuse until it does", n, path, agentsUsing(cfg, n)), "create it, owned by root, mode 0600")
			continue
		}
		if err := mounts.CheckHostFile(path, "token "+n); err != nil {
			add("tokens", "fail", err.Error(), "make it a regular file, owned by root, mode 0600")
			continue
		}
		if err := cfg.CheckToken(n); err != nil {
			add("tokens", "fail", err.Error(), fmt.Sprintf("chown root %s && chmod 0600 %s", path, path))
			continue
		}
		add("tokens", "ok", fmt.Sprintf("token %s: %s (root, owner-only)", n, path), "")
	}
}

// doctorConfig loads what a turn would: the files the config names and each
// agent's baseline against the keep-list.
func doctorConfig(cfg *config.Config, add func(string, string, string, string)) {
	if err := cfg.CheckFiles(); err != nil {
		add("config", "fail", err.Error(), "fix the file or the key it names")
		return
	}
	for _, name := range slices.Sorted(maps.Keys(cfg.Agents)) {
		if err := home.CheckBaseline(cfg, cfg.Agents[name].Home); err != nil {
			add("config", "fail", fmt.Sprintf("agent %s: %v", name, err), "drop the baseline file from the keep-list path, or the key it names")
			return
		}
	}
	add("config", "ok", "every file the config names loads, and no baseline file overlaps the keep-list", "")
}

// doctorTools checks what turns run on the host: loop devices and
// mkfs.ext4 (each task HOME is a capped ext4 image on a loop device), git
// (commit and the worktree guard), and TIOCSTI closed (run --tty).
func doctorTools(cfg *config.Config, add func(string, string, string, string)) {
	if fi, err := os.Stat("/dev/loop-control"); err != nil || fi.Mode()&os.ModeCharDevice == 0 {
		add("loop", "fail", "/dev/loop-control is missing: task HOMEs are loop-mounted images", "modprobe loop (NixOS: it is built in)")
	} else {
		add("loop", "ok", "/dev/loop-control", "")
	}
	for _, tool := range []struct{ name, why, fix string }{
		{"mkfs.ext4", "makes each task HOME's capped filesystem", "install e2fsprogs"},
		{"git", "commit and the worktree guard run it, sealed", "install git"},
	} {
		if p, err := lookTool(tool.name); err != nil {
			add(tool.name, "fail", tool.name+" not found ("+tool.why+")", tool.fix)
		} else {
			add(tool.name, "ok", p, "")
		}
	}
	if err := seccomp.TIOCSTIClosed(cfg.Cage.Seccomp, seccomp.LegacyTIOCSTIKnob); err != nil {
		add("tiocsti", "warn", err.Error()+" (only `run --tty` needs it)", "keep cage.seccomp = \"shrooms\", or sysctl dev.tty.legacy_tiocsti=0")
	} else {
		add("tiocsti", "ok", "a cage cannot push input into its terminal", "")
	}
}

// lookTool finds a host tool on PATH or in the sbin directories (root's
// PATH is not always the one shrooms runs with).
func lookTool(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	for _, dir := range []string{"/usr/sbin", "/sbin", "/run/current-system/sw/bin"} {
		p := filepath.Join(dir, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s not found", name)
}

// doctorBridge checks what the seal needs under a networked policy: the
// br_netfilter module with both bridge sysctls on (so bridged cage traffic
// passes the seal's forward hook), and, under network.driver "podman",
// iptables for netavark, which sets up the podman network with it.
func doctorBridge(cfg *config.Config, add func(string, string, string, string)) {
	if !cfg.Network.Networked() {
		return
	}
	for _, k := range []string{"bridge-nf-call-iptables", "bridge-nf-call-ip6tables"} {
		b, err := os.ReadFile("/proc/sys/net/bridge/" + k)
		switch {
		case err != nil:
			add("br_netfilter", "fail", "br_netfilter is not loaded (no /proc/sys/net/bridge): bridged cage traffic would bypass the seal", "modprobe br_netfilter (the shrooms-seal unit and make install load it at boot)")
			return
		case strings.TrimSpace(string(b)) != "1":
			add("br_netfilter", "fail", "net.bridge."+k+" is "+strings.TrimSpace(string(b))+": bridged cage traffic would bypass the seal", "sysctl -w net.bridge."+k+"=1")
			return
		}
	}
	add("br_netfilter", "ok", "loaded, net.bridge.bridge-nf-call-ip{,6}tables = 1", "")
	if cfg.Network.Driver != config.DriverPodman {
		return // the shrooms driver runs no iptables
	}
	if p, err := lookTool("iptables"); err != nil {
		add("iptables", "fail", "iptables not found: netavark sets up the cage network with it", "install iptables (nft backend is fine)")
	} else {
		add("iptables", "ok", p+" (netavark)", "")
	}
}

// doctorGateways checks that each gateway's upstream resolves and accepts
// TCP connections (DNS and TCP only: nothing is sent).
func doctorGateways(ctx context.Context, cfg *config.Config, add func(string, string, string, string)) {
	for _, name := range slices.Sorted(maps.Keys(cfg.Gateway)) {
		u, err := url.Parse(cfg.Gateway[name].Upstream)
		if err != nil {
			add("gateway", "fail", fmt.Sprintf("gateway %s: upstream: %v", name, err), "")
			continue
		}
		dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		addrs, err := net.DefaultResolver.LookupHost(dctx, u.Hostname())
		cancel()
		if err != nil {
			add("gateway", "fail", fmt.Sprintf("gateway %s: cannot resolve %s: %v", name, u.Hostname(), err), "check the host's DNS")
			continue
		}
		if err := gateway.Preflight(ctx, u); err != nil {
			add("gateway", "fail", fmt.Sprintf("gateway %s: %v", name, err), "check the host's route to the upstream")
			continue
		}
		add("gateway", "ok", fmt.Sprintf("gateway %s: %s resolves (%s) and accepts TCP", name, u.Redacted(), strings.Join(addrs, ", ")), "")
	}
}

// doctorNetns reads whether /run/netns is a shared mount in the podman
// service's mount namespace (cagenet.NetnsShared); doctor changes nothing,
// the next networked turn makes it shared.
func doctorNetns(cfg *config.Config, add func(string, string, string, string)) {
	if !cfg.Network.Networked() {
		return
	}
	if cfg.Network.Driver == config.DriverShrooms {
		doctorLink(cfg, add)
		return
	}
	st, err := cagenet.NetnsShared(cfg.Podman.Socket)
	switch {
	case err != nil:
		add("netns", "fail", err.Error()+": every networked turn would be refused", "run shrooms on the podman service's host")
	case st.Shared:
		add("netns", "ok", fmt.Sprintf("%s in the podman service's mount namespace is shared (pid %d): podman tears each cage's network down", cagenet.NetnsDir, st.Pid), "")
	default:
		add("netns", "ok", fmt.Sprintf("%s in the podman service's mount namespace is not shared (pid %d, no systemd?): the next networked turn makes it shared before its cage is created (else podman would never tear a cage's network down), and refuses the cage if it cannot", cagenet.NetnsDir, st.Pid), "")
	}
}

func doctorSeal(ctx context.Context, cfg *config.Config, add func(string, string, string, string)) {
	if !cfg.Network.Networked() {
		add("seal", "ok", "network.policy = none: cages have no network", "")
		return
	}
	st, err := firewall.Verify(ctx, cfg.Network, firewall.Options{})
	switch {
	case err != nil:
		add("seal", "fail", err.Error(), "run `shrooms net apply` as root")
	case !st.OK:
		add("seal", "fail", st.Reason, "run `shrooms net apply` as root (NixOS: the shrooms-seal unit)")
	default:
		add("seal", "ok", fmt.Sprintf("policy %s, digest %.12s", st.Policy, st.Installed), "")
	}
}

// doctorRuntime checks the OCI runtime cages will get against cage.runtime.
// A podman service before 5.x takes no per-cage runtime over its API: the
// service's own runtime is the one every cage gets, and a turn refuses a
// cage whose runtime is not cage.runtime.
func doctorRuntime(ctx context.Context, cfg *config.Config, info *podman.HostInfo, add func(string, string, string, string)) {
	got := fmt.Sprintf("%s at %s (%s), cgroups %s (%s)", info.OCIRuntime, info.OCIRuntimePath, info.OCIRuntimeVersion, info.CgroupVersion, info.CgroupManager)
	want := cfg.Cage.Runtime
	switch {
	case want != config.RuntimeDefault && !podman.RuntimeIs(want, info.OCIRuntime, info):
		add("oci-runtime", "fail", fmt.Sprintf("cage.runtime is %q but the podman service runs %s: every turn would be refused", want, got),
			fmt.Sprintf("start the podman service with --runtime %s (podman before 5.x takes no per-cage runtime), or set cage.runtime = \"default\"", want))
		return
	case strings.HasPrefix(info.OCIRuntimeVersion, "runsc"):
		add("oci-runtime", "ok", got+": gVisor", "")
		doctorRunsc(ctx, cfg, info, add)
		return
	}
	switch info.OCIRuntime {
	case "runc", "crun":
		add("oci-runtime", "ok", got, "")
	default:
		add("oci-runtime", "warn", "untested OCI runtime "+got, "use runc or crun")
	}
}

func gvisorRuntime(runtime string) bool { return filepath.Base(runtime) == "runsc" }

// doctorLink reports the shrooms driver's bridge and any other firewall
// that drops forwarded traffic by default (cages would reach nothing).
func doctorLink(cfg *config.Config, add func(string, string, string, string)) {
	n, err := cagelink.FromConfig(cfg.Network, "")
	if err != nil {
		add("network", "fail", err.Error(), "fix [network]")
		return
	}
	switch exists, err := cagelink.CheckBridge(n); {
	case err != nil:
		add("network", "fail", err.Error(), "remove the interface or set network.bridge to another name")
	case exists:
		add("network", "ok", fmt.Sprintf("driver shrooms: bridge %s carries %s; shrooms links each cage to it before the cage starts (no netavark)", n.Bridge, n.Gateway4()), "")
	default:
		add("network", "ok", fmt.Sprintf("driver shrooms: bridge %s does not exist yet; the next networked turn (or `shrooms net apply`) makes it", n.Bridge), "")
	}
	drops, err := firewall.ForwardDrops(firewall.Options{}, cfg.Network.Name, cfg.Network.Bridge)
	switch {
	case err != nil:
		add("forward", "fail", err.Error(), "run doctor as root")
	case len(drops) > 0:
		add("forward", "warn", fmt.Sprintf("%s drop(s) forwarded packets by default: cages reach nothing unless it accepts %s from %s", strings.Join(drops, ", "), cfg.Network.Subnet4, n.Bridge), "accept the cage subnet from the bridge there, or set network.driver = \"podman\" (netavark adds its rules to iptables' FORWARD)")
	default:
		add("forward", "ok", "no other nftables base chain drops forwarded packets by default (iptables-legacy chains are not seen)", "")
	}
}
