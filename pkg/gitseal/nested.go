package gitseal

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"

	"github.com/shrooms-cage/shrooms/pkg/resolve"
	"golang.org/x/sys/unix"
)

// maxNestedWalk bounds the entries nestedRepos looks at.
const maxNestedWalk = 4_000_000

// nestedRepos lists the worktree-relative directories below the worktree
// that hold an entry named .git (of any type: directory, file, link, FIFO),
// and (bare) those laid out as a git directory themselves (HEAD with
// objects and refs, or with commondir: git discovers such a directory as a
// bare repository and runs its config), without following a link, opening
// a file or descending into them.
func nestedRepos(ctx context.Context, worktree string) (repos, bare []string, err error) {
	fd, err := unix.Open(worktree, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("scan worktree for nested repositories: %w", err)
	}
	root := os.NewFile(uintptr(fd), worktree)
	defer root.Close()
	var out []string
	visited := 0
	var walk func(dir *os.File, rel string, depth int) error
	walk = func(dir *os.File, rel string, depth int) error {
		if depth > 256 {
			return fmt.Errorf("scan worktree: %s is nested too deep", rel)
		}
		ents, err := dir.ReadDir(-1)
		if err != nil {
			return fmt.Errorf("scan worktree: read %s: %w", rel, err)
		}
		for _, e := range ents {
			if visited++; visited%1024 == 0 {
				if err := ctx.Err(); err != nil {
					return err
				}
			}
			if visited > maxNestedWalk {
				return fmt.Errorf("scan worktree: more than %d entries", maxNestedWalk)
			}
			if !e.IsDir() || e.Type()&fs.ModeSymlink != 0 || (rel == "" && e.Name() == ".git") {
				continue
			}
			child := e.Name()
			if rel != "" {
				child = rel + "/" + e.Name()
			}
			has := func(name string) bool {
				var st unix.Stat_t
				return unix.Fstatat(int(dir.Fd()), e.Name()+"/"+name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil
			}
			if has(".git") {
				out = append(out, child)
				continue
			}
			if has("HEAD") && ((has("objects") && has("refs")) || has("commondir")) {
				bare = append(bare, child)
				continue
			}
			sfd, err := unix.Openat2(int(dir.Fd()), e.Name(), &unix.OpenHow{
				Flags:   unix.O_RDONLY | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC,
				Resolve: resolve.BeneathAnyMount,
			})
			if errors.Is(err, unix.ENOENT) {
				continue
			}
			if err != nil {
				return fmt.Errorf("scan worktree: open %s: %w", child, err)
			}
			sub := os.NewFile(uintptr(sfd), child)
			err = walk(sub, child, depth+1)
			sub.Close()
			if err != nil {
				return err
			}
		}
		return nil
	}
	if err := walk(root, "", 0); err != nil {
		return nil, nil, err
	}
	return out, bare, nil
}
