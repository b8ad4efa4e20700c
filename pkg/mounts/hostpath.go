package mounts

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// systemDirs are host directories that are never mounted into a cage, nor any
// directory inside them, nor any directory that contains them.
var systemDirs = []string{
	"/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/proc", "/run",
	"/sbin", "/sys", "/usr", "/var/lib/containers", "/var/run", "/nix",
	"/var/lib/docker", "/var/log",
}

// userRoots hold users' own directories: a worktree may live inside them but
// may not be one of them or above them (that would expose ~/.ssh and more).
var userRoots = []string{"/root", "/home"}

// CheckHostDir validates a host directory that will be bind-mounted
// read-write into a cage and returns its cleaned path. what names it in
// errors ("worktree", "outbox"). The path must be absolute, exist, be a
// directory reached through no symbolic link, and be neither a system
// directory, nor inside or above one, nor inside or above forbidden.
func CheckHostDir(path, what string, forbidden []string) (string, error) {
	if path == "" {
		return "", fmt.Errorf("%s path is empty", what)
	}
	if !filepath.IsAbs(path) {
		return "", fmt.Errorf("%s %q must be an absolute path", what, path)
	}
	clean := filepath.Clean(path)
	if clean == "/" {
		return "", fmt.Errorf("%s %q: the root directory is never mounted into a cage", what, path)
	}
	if err := noSymlinkComponents(clean); err != nil {
		return "", fmt.Errorf("%s %q: %w", what, path, err)
	}
	fi, err := os.Lstat(clean)
	if err != nil {
		return "", fmt.Errorf("%s %q: %w", what, path, underlying(err))
	}
	if !fi.IsDir() {
		return "", fmt.Errorf("%s %q is not a directory", what, path)
	}
	for _, dir := range append(append([]string{}, systemDirs...), forbidden...) {
		if dir == "" {
			continue
		}
		d := filepath.Clean(dir)
		if within(clean, d) || within(d, clean) {
			return "", fmt.Errorf("%s %q overlaps the protected host directory %s", what, path, d)
		}
	}
	for _, d := range userRoots {
		if within(d, clean) {
			return "", fmt.Errorf("%s %q contains %s; mount a project directory, not a home root", what, path, d)
		}
	}
	return clean, nil
}

// CheckHostFile validates a host file that shrooms itself reads (a token):
// absolute, a regular file reached through no symbolic link.
func CheckHostFile(path, what string) error {
	if !filepath.IsAbs(path) {
		return fmt.Errorf("%s %q must be an absolute path", what, path)
	}
	if err := noSymlinkComponents(filepath.Clean(path)); err != nil {
		return fmt.Errorf("%s %q: %w", what, path, err)
	}
	fi, err := os.Lstat(path)
	if err != nil {
		return fmt.Errorf("%s %q: %w", what, path, underlying(err))
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("%s %q is not a regular file", what, path)
	}
	return nil
}

// noSymlinkComponents fails if any component of the absolute path p is a
// symbolic link (a planted link must never redirect a mount).
func noSymlinkComponents(p string) error {
	cur := "/"
	for _, part := range strings.Split(strings.TrimPrefix(p, "/"), "/") {
		if part == "" {
			continue
		}
		cur = filepath.Join(cur, part)
		fi, err := os.Lstat(cur)
		if err != nil {
			return underlying(err)
		}
		if fi.Mode()&os.ModeSymlink != 0 {
			return fmt.Errorf("%s is a symbolic link (use the real path)", cur)
		}
	}
	return nil
}

// within reports whether p is dir or inside it.
func within(p, dir string) bool {
	if dir == "/" {
		return true
	}
	return p == dir || strings.HasPrefix(p, dir+"/")
}

// underlying strips *PathError's operation and path, which the caller's
// message already names.
func underlying(err error) error {
	if pe, ok := err.(*os.PathError); ok {
		return pe.Err
	}
	return err
}
