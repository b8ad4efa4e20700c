package mounts

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// OwnWorktree gives the worktree to the task's agent (host uid, gid) so the
// cage's non-root user can write it, when its root is not already theirs.
// The git metadata (.git) is left as it is: root-owned, the cage cannot
// write it. So are nested git repositories (nested.go): the cage cannot
// change the owner's in place. The walk follows no symbolic link and stays on the worktree's
// filesystem. It reports whether it changed anything.
//
// It runs before the task's cage starts, under the task lock, so no cage of
// the task is writing the tree meanwhile.
func OwnWorktree(dir string, uid, gid int) (bool, error) {
	root, err := os.Lstat(dir)
	if err != nil {
		return false, fmt.Errorf("worktree %s: %w", dir, underlying(err))
	}
	st, ok := root.Sys().(*syscall.Stat_t)
	if !ok {
		return false, fmt.Errorf("worktree %s: no ownership information", dir)
	}
	if int(st.Uid) == uid && int(st.Gid) == gid {
		return false, nil
	}
	dev := st.Dev
	err = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && d.Name() == ".git" && filepath.Dir(path) == dir {
			return fs.SkipDir
		}
		if d.Name() == ".git" && filepath.Dir(path) == dir {
			return nil // a linked worktree's gitdir pointer stays root's
		}
		if nestedRepo(dir, path, d) {
			// The owner's nested repositories stay the owner's: the cage
			// cannot change them in place (nested.go).
			if d.IsDir() {
				return fs.SkipDir
			}
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		if s, ok := info.Sys().(*syscall.Stat_t); ok && s.Dev != dev {
			return fs.SkipDir // another filesystem mounted inside: not ours to change
		}
		return os.Lchown(path, uid, gid)
	})
	if err != nil && !errors.Is(err, fs.SkipDir) {
		return true, fmt.Errorf("worktree %s: give it to the task's user: %w", dir, err)
	}
	return true, nil
}

// nestedRepo reports whether path, below the worktree dir, is a nested git
// repository: an entry named .git, or a directory laid out as a git dir.
func nestedRepo(dir, path string, d fs.DirEntry) bool {
	if path == dir {
		return false
	}
	if d.Name() == ".git" {
		return true
	}
	return d.IsDir() && looksLikeGitDirPath(path)
}
