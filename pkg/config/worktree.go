package config

import (
	"fmt"
	"path/filepath"
)

// Worktree says which host directories may be a task's worktree.
type Worktree struct {
	// Roots are directories whose subdirectories may be worktrees even
	// when they are not git work trees (e.g. "/srv/work"). A git work tree
	// (a directory with .git) is accepted anywhere outside the system and
	// home roots shrooms always refuses.
	Roots []string `toml:"roots"`
	// MaxSize and MaxFiles cap what a task's worktree may hold while its
	// turns run: a per-task project quota on the worktree's filesystem
	// (ext4/xfs mounted with prjquota; pkg/wtcap).
	MaxSize  Size  `toml:"max_size"`
	MaxFiles int64 `toml:"max_files"`
	// Uncapped says what a turn does when the worktree's filesystem has no
	// project quota: "refuse" (the default: the turn stops before its cage
	// starts, saying why) or "allow" (it runs uncapped: a cage can fill
	// that filesystem, see docs/residual-risks.md).
	Uncapped string `toml:"uncapped"`
	// Idmap says how the cage gets the worktree: "auto" (the default: an
	// idmapped mount where the kernel, the filesystem and the worktree
	// allow it, no chown walks; otherwise the chown walks) or "off" (always
	// the chown walks). doctor says which one this host gets.
	Idmap string `toml:"idmap"`
}

func defaultWorktree() Worktree {
	// 20 GiB and a million files: a large monorepo with its build output
	// fits; a turn cannot take the host's disk or inodes.
	return Worktree{Roots: []string{}, MaxSize: 20 << 30, MaxFiles: 1_000_000, Uncapped: "refuse", Idmap: "auto"}
}

func (w *Worktree) validate() error {
	if w.MaxSize < 1<<20 {
		return &Error{Key: "worktree.max_size", Msg: fmt.Sprintf("%d bytes is below 1m", w.MaxSize)}
	}
	if w.MaxFiles < 16 {
		return &Error{Key: "worktree.max_files", Msg: fmt.Sprintf("%d is below 16", w.MaxFiles)}
	}
	switch w.Uncapped {
	case "refuse", "allow":
	default:
		return &Error{Key: "worktree.uncapped", Msg: fmt.Sprintf("%q is neither \"refuse\" nor \"allow\"", w.Uncapped)}
	}
	switch w.Idmap {
	case "auto", "off":
	default:
		return &Error{Key: "worktree.idmap", Msg: fmt.Sprintf("%q is neither \"auto\" nor \"off\"", w.Idmap)}
	}
	for i, r := range w.Roots {
		if !filepath.IsAbs(r) || filepath.Clean(r) == "/" {
			return &Error{Key: fmt.Sprintf("worktree.roots[%d]", i), Msg: fmt.Sprintf("%q must be an absolute path other than /", r)}
		}
	}
	return nil
}
