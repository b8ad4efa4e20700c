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
}

func (w *Worktree) validate() error {
	for i, r := range w.Roots {
		if !filepath.IsAbs(r) || filepath.Clean(r) == "/" {
			return &Error{Key: fmt.Sprintf("worktree.roots[%d]", i), Msg: fmt.Sprintf("%q must be an absolute path other than /", r)}
		}
	}
	return nil
}
