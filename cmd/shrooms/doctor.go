package main

import (
	"context"
	"fmt"
	"maps"
	"os"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/shrooms-cage/shrooms/pkg/config"
	"github.com/shrooms-cage/shrooms/pkg/firewall"
	"github.com/shrooms-cage/shrooms/pkg/mounts"
	"github.com/shrooms-cage/shrooms/pkg/podman"
	"github.com/shrooms-cage/shrooms/pkg/taskstate"
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

	client, err := podman.Connect(ctx, cfg.Podman.Socket)
	if err != nil {
		add("podman", "fail", err.Error(), "start the rootful podman service (NixOS: virtualisation.podman.enable; elsewhere: systemctl enable --now podman.socket) or set podman.socket")
	} else {
		doctorPodman(ctx, cfg, client, add)
	}
	doctorSubIDs(cfg, add)
	doctorState(cfg, add)
	doctorTokens(cfg, add)
	doctorSeal(ctx, cfg, add)
	doctorWorktreeCap(cfg, add)
	return fs
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
	switch info.OCIRuntime {
	case "runc", "crun":
		add("oci-runtime", "ok", fmt.Sprintf("%s, cgroups %s (%s)", info.OCIRuntime, info.CgroupVersion, info.CgroupManager), "")
	default:
		add("oci-runtime", "warn", fmt.Sprintf("untested OCI runtime %q", info.OCIRuntime), "use runc or crun")
	}
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

func doctorTokens(cfg *config.Config, add func(string, string, string, string)) {
	if len(cfg.Tokens) == 0 {
		add("tokens", "ok", "no tokens configured", "")
	}
	names := make([]string, 0, len(cfg.Tokens))
	for n := range cfg.Tokens {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		path := cfg.Tokens[n]
		if err := mounts.CheckHostFile(path, "token "+n); err != nil {
			add("tokens", "fail", err.Error(), "create the file, readable by root only")
			continue
		}
		f, err := os.Open(path)
		if err != nil {
			add("tokens", "fail", fmt.Sprintf("token %s: cannot read %s", n, path), "")
			continue
		}
		f.Close()
		add("tokens", "ok", fmt.Sprintf("token %s: %s readable", n, path), "")
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
