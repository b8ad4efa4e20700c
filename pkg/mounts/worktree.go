package mounts

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// rootDirs are directories that are never a worktree themselves (their
// subdirectories may be): shared system, temporary and home roots.
var rootDirs = []string{"/", "/tmp", "/var/tmp", "/srv", "/opt", "/mnt", "/media", "/home", "/root", "/var", "/usr/local", "/run/user", "/data"}

// CheckWorktree validates a worktree: CheckHostDir's rules, plus an
// allowlist. The directory must be a git work tree (it has .git) or lie
// strictly inside one of roots, and it is never a system, temporary or home
// root (/tmp, /srv, /home, /home/<user>, a user's home directory, /opt, /mnt
// and the like), whose contents are not one task's to rewrite.
func CheckWorktree(path string, roots, forbidden []string) (string, error) {
	clean, err := CheckHostDir(path, "worktree", forbidden)
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
