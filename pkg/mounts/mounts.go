// Package mounts decides what a cage sees of the host: the worktree at /work,
// the task HOME volume at /home/agent, the outbox at /outbox, and nothing
// else. It validates every host path before it is used, so that a bad or
// planted path is an error that names it rather than a mount.
package mounts

import (
	"fmt"
	"path/filepath"
)

// Where things appear inside the cage.
const (
	WorkDir   = "/work"
	HomeDir   = "/home/agent"
	OutboxDir = "/outbox"
)

// Kind is what backs a mount.
type Kind string

const (
	Bind   Kind = "bind"   // a host path
	Volume Kind = "volume" // a named podman volume
	Tmpfs  Kind = "tmpfs"  // memory, size-capped
)

// Mount is one thing mounted into the cage. Source is a host path (Bind) or a
// volume name (Volume); Options are extra mount options (e.g. "size=64m").
type Mount struct {
	Kind     Kind     `json:"kind"`
	Source   string   `json:"source,omitempty"`
	Dest     string   `json:"dest"`
	ReadOnly bool     `json:"readOnly"`
	Options  []string `json:"options,omitempty"`
}

// Plan is the full set of mounts of one turn's cage.
type Plan struct {
	Mounts []Mount `json:"mounts"`
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// Input is what a turn asks to mount: host paths (the task's own ones
// derived by the caller), never the task id.
type Input struct {
	Worktree string // host path; "" means no worktree (an empty tmpfs /work)
	// Staging, when set, is the /work bind's source instead of Worktree:
	// the worktree's idmapped mount (pkg/worktree's idmap.go).
	Staging string
	// HomeDir is the host directory of the task's live HOME (inside its
	// volume, laid out by the HOME reset); OutboxDir the task's outbox ("" for
	// none). shrooms computes and prepares both itself, refusing planted
	// links, so they are not checked again here.
	HomeDir   string
	OutboxDir string
	TmpSize   int64
	RunSize   int64
	TmpExec   bool
}

// Build validates the host paths of in and returns the cage's mount plan.
func Build(in Input) (*Plan, error) {
	if !filepath.IsAbs(in.HomeDir) {
		return nil, fmt.Errorf("task HOME %q is not an absolute host path", in.HomeDir)
	}
	p := &Plan{}
	tmpOpts := []string{"rw", "nosuid", "nodev", fmt.Sprintf("size=%d", in.TmpSize), "mode=1777"}
	if !in.TmpExec {
		tmpOpts = append(tmpOpts, "noexec")
	}
	p.Mounts = append(p.Mounts,
		Mount{Kind: Tmpfs, Dest: "/tmp", Options: tmpOpts},
		Mount{Kind: Tmpfs, Dest: "/run", Options: []string{"rw", "nosuid", "nodev", "noexec", fmt.Sprintf("size=%d", in.RunSize), "mode=0755"}},
		Mount{Kind: Bind, Source: in.HomeDir, Dest: HomeDir, Options: []string{"rbind", "nosuid", "nodev"}},
	)
	if in.Worktree != "" {
		wt, err := CheckHostDir(in.Worktree, "worktree", nil)
		if err != nil {
			return nil, err
		}
		if in.Staging != "" {
			if !filepath.IsAbs(in.Staging) {
				return nil, fmt.Errorf("worktree staging %q is not an absolute host path", in.Staging)
			}
			wt = filepath.Clean(in.Staging)
		}
		p.Mounts = append(p.Mounts, Mount{Kind: Bind, Source: wt, Dest: WorkDir, Options: []string{"rbind", "nosuid", "nodev"}})
	} else {
		p.Mounts = append(p.Mounts, Mount{Kind: Tmpfs, Dest: WorkDir, Options: []string{"rw", "nosuid", "nodev", fmt.Sprintf("size=%d", in.TmpSize), "mode=0777"}})
	}
	if in.OutboxDir != "" {
		if !filepath.IsAbs(in.OutboxDir) {
			return nil, fmt.Errorf("outbox %q is not an absolute host path", in.OutboxDir)
		}
		p.Mounts = append(p.Mounts, Mount{Kind: Bind, Source: filepath.Clean(in.OutboxDir), Dest: OutboxDir, Options: []string{"rbind", "nosuid", "nodev", "noexec"}})
	}
	return p, nil
}
