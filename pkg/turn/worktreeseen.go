package turn

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/shrooms-cage/shrooms/pkg/mounts"
	"github.com/shrooms-cage/shrooms/pkg/resolve"
)

// checkWorktreeSeen verifies, before any process of the initialised cage
// id runs, that its /work is the worktree: the root of the mount the cage
// resolves /work to has the worktree root's device and inode, and for an
// idmapped worktree that mount is idmapped, nosuid and nodev. The staging
// mount is made in the mount namespace of the process behind the API
// socket; behind a relay (or any mismatch) the cage would bind the empty
// root-only staging directory instead, and the turn would run on nothing.
func (r *Runner) checkWorktreeSeen(ctx context.Context, id string, p *Plan) error {
	pid, err := r.Podman.Pid(ctx, id)
	if err != nil {
		return err
	}
	return worktreeSeen(pid, p.worktree, p.idmap)
}

func worktreeSeen(pid int, worktree string, idmap bool) error {
	fail := func(why string, args ...any) error {
		return fmt.Errorf("the cage does not see the worktree %s at %s (%s): refusing the turn", worktree, mounts.WorkDir, fmt.Sprintf(why, args...))
	}
	var want unix.Stat_t
	if err := unix.Stat(worktree, &want); err != nil {
		return fail("%v", err)
	}
	root, err := unix.Open(fmt.Sprintf("/proc/%d/root", pid), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fail("cage root: %v", err)
	}
	defer unix.Close(root)
	// Resolved as the cage resolves it: its own root, its own links.
	work, err := unix.Openat2(root, strings.TrimPrefix(mounts.WorkDir, "/"), &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC,
		Resolve: resolve.InRoot,
	})
	if err != nil {
		return fail("%v", err)
	}
	defer unix.Close(work)
	var got unix.Stat_t
	if err := unix.Fstat(work, &got); err != nil {
		return fail("%v", err)
	}
	if got.Dev != want.Dev || got.Ino != want.Ino {
		return fail("its %s is device %d inode %d, the worktree's root device %d inode %d", mounts.WorkDir, got.Dev, got.Ino, want.Dev, want.Ino)
	}
	if !idmap {
		return nil
	}
	opts, err := mountOptions(pid, mounts.WorkDir)
	if err != nil {
		return fail("%v", err)
	}
	for _, o := range []string{"idmapped", "nosuid", "nodev"} {
		if !slices.Contains(opts, o) {
			return fail("its mount is not %s: %s", o, strings.Join(opts, ","))
		}
	}
	return nil
}

// mountOptions are the per-mount options of the topmost mount at dir in
// process pid's mount table (as it sees its root).
func mountOptions(pid int, dir string) ([]string, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/mountinfo", pid))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var opts []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		// id parent major:minor root mountpoint options ...
		fields := strings.Fields(sc.Text())
		if len(fields) >= 6 && fields[4] == dir {
			opts = strings.Split(fields[5], ",") // later lines are mounted over earlier ones
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("mountinfo: %w", err)
	}
	if opts == nil {
		return nil, fmt.Errorf("no mount at %s", dir)
	}
	return opts, nil
}
