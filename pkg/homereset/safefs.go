package homereset

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"

	"github.com/shrooms-cage/shrooms/pkg/resolve"
	"golang.org/x/sys/unix"
)

// maxDepth bounds the directories held open while walking or deleting; the
// deleter flattens anything deeper, the keep-list walk drops it.
const maxDepth = 64

func openat2(dir *os.File, name string, flags uint64) (int, error) {
	how := unix.OpenHow{Flags: flags | unix.O_CLOEXEC, Resolve: resolve.Beneath}
	if flags&unix.O_CREAT != 0 {
		// The owner's alone; readable by it, so a reset without
		// CAP_DAC_OVERRIDE can open again what it made (the lock).
		how.Mode = 0o600
	}
	for {
		fd, err := unix.Openat2(int(dir.Fd()), name, &how)
		if err == unix.EINTR || err == unix.EAGAIN {
			continue
		}
		return fd, err
	}
}

// openDir opens dir/name as a directory on device dev. A symlink, FIFO,
// device or mount point is an error; nothing is followed or opened.
func openDir(dir *os.File, name string, dev uint64) (*os.File, error) {
	fd, err := openat2(dir, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_NONBLOCK)
	if err != nil {
		return nil, &os.PathError{Op: "open directory", Path: name, Err: err}
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, &os.PathError{Op: "stat", Path: name, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR || uint64(st.Dev) != dev {
		unix.Close(fd)
		return nil, &os.PathError{Op: "open directory", Path: name, Err: errors.New("not a directory on the HOME filesystem")}
	}
	return os.NewFile(uintptr(fd), name), nil
}

// openNode returns an O_PATH descriptor of dir/name itself (never what a link
// points at) and its stat. O_PATH opens nothing: a FIFO cannot block, a
// device is not touched.
func openNode(dir *os.File, name string) (int, unix.Stat_t, error) {
	var st unix.Stat_t
	fd, err := openat2(dir, name, unix.O_PATH|unix.O_NOFOLLOW)
	if err != nil {
		return -1, st, err
	}
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return -1, st, err
	}
	return fd, st, nil
}

// readNode reads at most max bytes of the regular file behind an O_PATH fd.
// Reopening through /proc/self/fd reaches exactly that inode.
func readNode(fd int, max int64) ([]byte, error) {
	f, err := openRegular(fd)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > max {
		return nil, fmt.Errorf("larger than %d bytes", max)
	}
	return data, nil
}

// openRegular opens the regular file behind an O_PATH fd for reading,
// refusing it if it is no longer that inode.
func openRegular(fd int) (*os.File, error) {
	f, err := os.OpenFile("/proc/self/fd/"+strconv.Itoa(fd), os.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY, 0)
	if err != nil {
		return nil, err
	}
	var st, pst unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		f.Close()
		return nil, err
	}
	if err := unix.Fstat(fd, &pst); err != nil || st.Ino != pst.Ino || st.Dev != pst.Dev || st.Mode&unix.S_IFMT != unix.S_IFREG {
		f.Close()
		return nil, errors.New("not the regular file that was checked")
	}
	return f, nil
}

// exists reports whether dir/name exists (of any type), without following it.
func exists(dir *os.File, name string) (bool, error) {
	var st unix.Stat_t
	err := unix.Fstatat(int(dir.Fd()), name, &st, unix.AT_SYMLINK_NOFOLLOW)
	if err == nil {
		return true, nil
	}
	if errors.Is(err, unix.ENOENT) {
		return false, nil
	}
	return false, fmt.Errorf("stat %s: %w", name, err)
}

// mkdirOwned creates dir/name (or opens it if it is already a directory) and
// gives it to uid:gid with mode.
func mkdirOwned(dir *os.File, name string, mode uint32, uid, gid int, dev uint64) (*os.File, error) {
	if err := unix.Mkdirat(int(dir.Fd()), name, mode); err != nil && !errors.Is(err, unix.EEXIST) {
		return nil, &os.PathError{Op: "mkdir", Path: name, Err: err}
	}
	d, err := openDir(dir, name, dev)
	if err != nil {
		return nil, err
	}
	if err := unix.Fchown(int(d.Fd()), uid, gid); err != nil {
		d.Close()
		return nil, &os.PathError{Op: "chown", Path: name, Err: err}
	}
	if err := unix.Fchmod(int(d.Fd()), mode); err != nil {
		d.Close()
		return nil, &os.PathError{Op: "chmod", Path: name, Err: err}
	}
	return d, nil
}

// writeFileAt atomically replaces dir/name with data (temp file + rename),
// owned by uid:gid. The rename replaces a link or FIFO at name, never follows it.
func writeFileAt(dir *os.File, name string, data []byte, mode uint32, uid, gid int) error {
	return writeFileFrom(dir, name, mode, uid, gid, func(w io.Writer) error {
		_, err := w.Write(data)
		return err
	})
}

// writeFileFrom is writeFileAt with the content written by fill.
func writeFileFrom(dir *os.File, name string, mode uint32, uid, gid int, fill func(io.Writer) error) error {
	tmp := ".shrooms-tmp-" + name
	if len(tmp) > 255 {
		tmp = tmp[:255]
	}
	_ = unix.Unlinkat(int(dir.Fd()), tmp, 0)
	fd, err := openat2(dir, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW)
	if err != nil {
		return &os.PathError{Op: "create", Path: name, Err: err}
	}
	f := os.NewFile(uintptr(fd), tmp)
	err = func() error {
		if err := fill(f); err != nil {
			return err
		}
		if err := f.Chown(uid, gid); err != nil {
			return err
		}
		if err := f.Chmod(os.FileMode(mode)); err != nil {
			return err
		}
		return f.Sync()
	}()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = unix.Renameat(int(dir.Fd()), tmp, int(dir.Fd()), name)
	}
	if err != nil {
		_ = unix.Unlinkat(int(dir.Fd()), tmp, 0)
		return &os.PathError{Op: "write", Path: name, Err: err}
	}
	return nil
}

// removeStats counts what removeAll deleted.
type removeStats struct {
	Files int64 `json:"files"`
	Dirs  int64 `json:"dirs"`
}

type rmFrame struct {
	dir     *os.File
	name    string
	pending []string
	eof     bool
}

// removeAll deletes dir/name and everything below it without following any
// link, opening any file, or leaving the filesystem: files go by unlinkat,
// directories are opened with openat2 (RESOLVE_BENEATH|NO_SYMLINKS|NO_XDEV)
// and emptied iteratively. A directory deeper than maxDepth is renamed up
// into dir and deleted from there, so depth costs neither stack nor fds.
func removeAll(ctx context.Context, dir *os.File, name string, dev uint64) (removeStats, error) {
	var stats removeStats
	queue := []string{name}
	n := 0
	for len(queue) > 0 {
		top := queue[len(queue)-1]
		queue = queue[:len(queue)-1]
		err := unix.Unlinkat(int(dir.Fd()), top, 0)
		if err == nil {
			stats.Files++
			continue
		}
		if errors.Is(err, unix.ENOENT) {
			continue
		}
		if !errors.Is(err, unix.EISDIR) {
			return stats, &os.PathError{Op: "unlink", Path: top, Err: err}
		}
		for attempt := 0; ; attempt++ {
			err := unix.Unlinkat(int(dir.Fd()), top, unix.AT_REMOVEDIR)
			if err == nil || errors.Is(err, unix.ENOENT) {
				if err == nil {
					stats.Dirs++
				}
				break
			}
			if !errors.Is(err, unix.ENOTEMPTY) && !errors.Is(err, unix.EEXIST) || attempt > 8 {
				return stats, &os.PathError{Op: "rmdir", Path: top, Err: err}
			}
			ownDirWritable(dir, top)
			d, err := openDir(dir, top, dev)
			if err != nil {
				return stats, err
			}
			stack := []*rmFrame{{dir: d, name: top}}
			for len(stack) > 0 {
				if n++; n%1024 == 0 {
					if err := ctx.Err(); err != nil {
						closeFrames(stack)
						return stats, err
					}
				}
				fr := stack[len(stack)-1]
				if len(fr.pending) == 0 && !fr.eof {
					names, err := fr.dir.Readdirnames(1024)
					if err != nil && err != io.EOF {
						closeFrames(stack)
						return stats, fmt.Errorf("read directory %s: %w", fr.name, err)
					}
					fr.pending, fr.eof = names, len(names) == 0
				}
				if len(fr.pending) == 0 {
					fr.dir.Close()
					stack = stack[:len(stack)-1]
					if len(stack) > 0 {
						parent := stack[len(stack)-1]
						err := unix.Unlinkat(int(parent.dir.Fd()), fr.name, unix.AT_REMOVEDIR)
						if err == nil {
							stats.Dirs++
						} else if !errors.Is(err, unix.ENOENT) {
							// Not empty after all (entries missed by getdents
							// while deleting): read the parent again.
							parent.eof = false
							if _, serr := parent.dir.Seek(0, io.SeekStart); serr != nil {
								closeFrames(stack)
								return stats, fmt.Errorf("rewind %s: %w", parent.name, serr)
							}
						}
					}
					continue
				}
				child := fr.pending[0]
				fr.pending = fr.pending[1:]
				err := unix.Unlinkat(int(fr.dir.Fd()), child, 0)
				if err == nil {
					stats.Files++
					continue
				}
				if errors.Is(err, unix.ENOENT) {
					continue
				}
				if !errors.Is(err, unix.EISDIR) {
					closeFrames(stack)
					return stats, &os.PathError{Op: "unlink", Path: child, Err: err}
				}
				if len(stack) >= maxDepth {
					flat := fmt.Sprintf("%s.deep%d", name, n)
					if err := unix.Renameat(int(fr.dir.Fd()), child, int(dir.Fd()), flat); err != nil {
						closeFrames(stack)
						return stats, &os.PathError{Op: "rename", Path: child, Err: err}
					}
					queue = append(queue, flat)
					continue
				}
				ownDirWritable(fr.dir, child)
				cd, err := openDir(fr.dir, child, dev)
				if err != nil {
					closeFrames(stack)
					return stats, err
				}
				stack = append(stack, &rmFrame{dir: cd, name: child})
			}
		}
	}
	return stats, nil
}

func closeFrames(stack []*rmFrame) {
	for _, f := range stack {
		f.dir.Close()
	}
}
