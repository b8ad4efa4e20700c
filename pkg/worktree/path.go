package worktree

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/shrooms-cage/shrooms/pkg/config"
	"github.com/shrooms-cage/shrooms/pkg/fault"
	"github.com/shrooms-cage/shrooms/pkg/mounts"
)

// rootDirs are directories that are never a worktree themselves (their
// subdirectories may be): shared system, temporary and home roots.
var rootDirs = []string{"/", "/tmp", "/var/tmp", "/srv", "/opt", "/mnt", "/media", "/home", "/root", "/var", "/usr/local", "/run/user", "/data"}

// CheckPath validates the worktree path of a turn or a task command under
// cfg (checkPath: a git work tree or inside [worktree] roots, never a
// system or home root, never shrooms' own directories) and returns it
// cleaned; a refusal is fault.Input.
func CheckPath(cfg *config.Config, path string) (string, error) {
	forbidden := []string{cfg.State.Dir, cfg.Outbox.Root, filepath.Dir(strings.TrimPrefix(cfg.Podman.Socket, "unix://"))}
	wt, err := checkPath(path, cfg.Worktree.Roots, forbidden)
	if err != nil {
		return "", fmt.Errorf("%w: %w", fault.Input, err)
	}
	return wt, nil
}

// checkPath validates a worktree: mounts.CheckHostDir's rules, plus an
// allowlist. The directory must be a git work tree (it has .git) or lie
// strictly inside one of roots, and it is never a system, temporary or home
// root (/tmp, /srv, /home, /home/<user>, a user's home directory, /opt, /mnt
// and the like), whose contents are not one task's to rewrite.
func checkPath(path string, roots, forbidden []string) (string, error) {
	clean, err := mounts.CheckHostDir(path, "worktree", forbidden)
	if err != nil {
		return "", err
	}
	if refusedRoot(clean) {
		return "", fmt.Errorf("worktree %q is a system, temporary or home root; use a project directory inside it", path)
	}
	for _, r := range roots {
		r = filepath.Clean(r)
		if clean == r {
			return "", fmt.Errorf("worktree %q is a configured worktree root itself; use a directory inside it", path)
		}
		if within(clean, r) {
			return clean, nil
		}
	}
	if _, err := os.Lstat(filepath.Join(clean, ".git")); err != nil {
		return "", fmt.Errorf("worktree %q is not a git work tree (no .git) and not inside a [worktree] roots directory", path)
	}
	return clean, nil
}

func refusedRoot(p string) bool {
	for _, r := range rootDirs {
		if p == r {
			return true
		}
	}
	if filepath.Dir(p) == "/home" || filepath.Dir(p) == "/run/user" {
		return true
	}
	for _, h := range homeDirs() {
		if p == h {
			return true
		}
	}
	return false
}

// homeDirs are the home directories /etc/passwd names.
func homeDirs() []string {
	f, err := os.Open("/etc/passwd")
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Split(sc.Text(), ":")
		if len(fields) >= 6 && filepath.IsAbs(fields[5]) {
			out = append(out, filepath.Clean(fields[5]))
		}
	}
	return out
}

// within reports whether p is dir or inside it.
func within(p, dir string) bool {
	if dir == "/" {
		return true
	}
	return p == dir || strings.HasPrefix(p, dir+"/")
}
