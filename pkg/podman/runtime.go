package podman

import (
	"path/filepath"
)

// RuntimeIs reports whether a cage podman runs with runtime got (as its
// inspect names it) runs the runtime want (cage.runtime: a name or an
// absolute path). A name must match exactly; a path matches the same file
// (symlinks followed), whether the service names the runtime by that path
// or by the name of its default runtime at that path.
func RuntimeIs(want, got string, info *HostInfo) bool {
	if want == got {
		return true
	}
	if !filepath.IsAbs(want) {
		return false
	}
	path := got
	if !filepath.IsAbs(got) {
		if info == nil || info.OCIRuntime != got || info.OCIRuntimePath == "" {
			return false
		}
		path = info.OCIRuntimePath
	}
	a, errA := filepath.EvalSymlinks(want)
	b, errB := filepath.EvalSymlinks(path)
	return errA == nil && errB == nil && a == b
}
