package config

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// RuntimeDefault leaves the OCI runtime to the podman service's own choice.
const RuntimeDefault = "default"

// runtimeNames are the OCI runtimes cage.runtime may name (podman resolves
// a name through containers.conf's [engine.runtimes]).
var runtimeNames = map[string]bool{"runc": true, "crun": true, "runsc": true, "kata": true}

// validateRuntime checks cage.runtime: "default", a known runtime name, or
// the absolute path of an executable only root can change. A runtime runs
// as root on the host with the cage's whole spec in hand, so a path anyone
// else can write is refused before any cage is made.
func validateRuntime(v string) error {
	if v == RuntimeDefault || runtimeNames[v] {
		return nil
	}
	if !filepath.IsAbs(v) {
		return &Error{Key: "cage.runtime", Msg: fmt.Sprintf("%q: use \"default\", one of runc, crun, runsc, kata, or an absolute path", v)}
	}
	if msg := rootOwnedExecutable(v); msg != "" {
		return &Error{Key: "cage.runtime", Msg: msg}
	}
	return nil
}

// rootOwnedExecutable says what is wrong with path as a root-run program:
// the file (symlinks followed) must be a regular executable owned by root,
// writable by no group or other, in directories likewise held by root.
func rootOwnedExecutable(path string) string {
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		return fmt.Sprintf("%q: %v", path, err)
	}
	fi, err := os.Stat(real)
	if err != nil {
		return fmt.Sprintf("%q: %v", path, err)
	}
	switch {
	case !fi.Mode().IsRegular():
		return fmt.Sprintf("%q (%s) is not a regular file", path, real)
	case fi.Mode().Perm()&0o111 == 0:
		return fmt.Sprintf("%q (%s) is not executable", path, real)
	case fi.Mode().Perm()&0o022 != 0:
		return fmt.Sprintf("%q (%s) is writable by group or others (mode %o)", path, real, fi.Mode().Perm())
	case owner(fi) != 0:
		return fmt.Sprintf("%q (%s) is owned by uid %d, not root", path, real, owner(fi))
	}
	for dir := filepath.Dir(real); ; dir = filepath.Dir(dir) {
		di, err := os.Stat(dir)
		if err != nil {
			return fmt.Sprintf("%q: %v", path, err)
		}
		// A sticky world-writable directory (/tmp) still lets its users
		// replace nothing of root's, but a runtime has no business there.
		if di.Mode().Perm()&0o022 != 0 || owner(di) != 0 {
			return fmt.Sprintf("%q: directory %s is not root's alone (owner uid %d, mode %o)", path, dir, owner(di), di.Mode().Perm())
		}
		if dir == "/" {
			return ""
		}
	}
}

func owner(fi os.FileInfo) int64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return int64(st.Uid)
	}
	return -1
}
