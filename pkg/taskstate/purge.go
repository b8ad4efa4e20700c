package taskstate

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// skeleton is what shrooms itself makes under the state directory and
// makes again when it is gone: empty directories, lock files, the
// generated seccomp profiles, the cages' system git config, the
// teardowns' expiry stamp and a lingering teardown's lock file and socket
// (removing the socket ends that worker). Anything
// else (a task, a HOME image, a worktree claim, a delivery, a gateway's
// refreshed sign-in, a file shrooms does not know) is the owner's, and
// `shrooms purge` refuses while it is there.
var skeletonDirs = []string{"tasks", "homes", "worktrees", "deliveries", "seccomp", "gitseal", "gateway", "cagenet"}

var skeletonFiles = []string{"idslots.lock", "starting.lock", "expire.stamp", teardownWorker, teardownSocket, filepath.Join("gitseal", "gitconfig"), filepath.Join("cagenet", "resolv.conf")}

// Leftovers lists, relative to the state directory, every entry under it
// that is not the skeleton, at most max of them (sorted). A missing state
// directory has none. The directories in skip (absolute: the outbox root,
// which its own package checks) are left out.
func (l Layout) Leftovers(max int, skip ...string) ([]string, error) {
	var left []string
	err := filepath.WalkDir(l.Dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) && p == l.Dir {
				return fs.SkipAll
			}
			return err
		}
		rel, err := filepath.Rel(l.Dir, p)
		if err != nil || rel == "." {
			return err
		}
		for _, s := range skip {
			if d.IsDir() && filepath.Clean(s) == p {
				return fs.SkipDir
			}
		}
		if l.inSkeleton(rel, d) {
			return nil
		}
		left = append(left, rel)
		if d.IsDir() {
			return fs.SkipDir // one line for the whole directory
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("state directory %s: %w", l.Dir, err)
	}
	sort.Strings(left)
	if len(left) > max {
		left = left[:max]
	}
	return left, nil
}

func (l Layout) inSkeleton(rel string, d fs.DirEntry) bool {
	typ := d.Type()
	if typ.IsDir() {
		for _, s := range skeletonDirs {
			if rel == s {
				return true
			}
		}
		return false
	}
	if typ.Type() == fs.ModeSocket {
		return rel == teardownSocket
	}
	if !typ.IsRegular() {
		return false // a symlink or a device is never shrooms'
	}
	for _, s := range skeletonFiles {
		if rel == s {
			return true
		}
	}
	dir, name := filepath.Split(rel)
	return dir == "seccomp"+string(filepath.Separator) && strings.HasPrefix(name, "shrooms-") && strings.HasSuffix(name, ".json")
}

// RemoveSkeleton removes the state directory once it holds nothing but the
// skeleton. It removes only the names the skeleton has (never a whole
// tree), so an entry made meanwhile makes it fail, with that entry kept.
func (l Layout) RemoveSkeleton() error {
	left, err := l.Leftovers(1)
	if err != nil {
		return err
	}
	if len(left) > 0 {
		return fmt.Errorf("state directory %s still holds %s", l.Dir, left[0])
	}
	seccomp, err := filepath.Glob(filepath.Join(l.Dir, "seccomp", "shrooms-*.json"))
	if err != nil {
		return fmt.Errorf("state directory %s: %w", l.Dir, err)
	}
	files := append([]string{}, seccomp...)
	for _, f := range skeletonFiles {
		files = append(files, filepath.Join(l.Dir, f))
	}
	for _, f := range files {
		if err := os.Remove(f); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("remove %s: %w", f, err)
		}
	}
	for _, d := range append(append([]string{}, skeletonDirs...), ".") {
		if err := os.Remove(filepath.Join(l.Dir, d)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("remove %s: %w", filepath.Join(l.Dir, d), err)
		}
	}
	return nil
}
