// Package resolve names, once, the openat2(2) resolve policies shrooms opens
// paths a cage could have written with. Every path below a pinned directory
// fd is resolved with one of these; no link the cage made is followed.
package resolve

import "golang.org/x/sys/unix"

const (
	// Beneath confines a lookup below the directory fd, follows no symlink
	// (not even one pointing inside), no /proc magic link, and does not
	// cross onto another filesystem (a mount the cage or a hostile tree
	// placed below it).
	Beneath = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV
	// BeneathAnyMount is Beneath where the tree may legitimately span
	// mounts (a worktree, git metadata).
	BeneathAnyMount = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS
	// NoLinks follows no symlink or magic link anywhere along a path that
	// is not below a directory fd (an absolute host path shrooms chose).
	NoLinks = unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS
	// InRoot resolves a path as a process whose root is the directory fd
	// would (a cage's, through /proc/PID/root): its links, absolute ones
	// included, stay inside it; no /proc magic link.
	InRoot = unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS
)
