package profile

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Copying the updated trusted.db into the new HOME writes and fsyncs the
// whole file (100 MiB) every turn, although it differs from the turn's file
// only where the turn or the update changed it. updateOpencodeDBInPlace
// instead rewrites the turn's own inode to trusted.db's bytes — only the
// blocks that differ, then the length — and the reset carries that inode.
// What makes it trusted.db's bytes is the comparison of every block with
// trusted.db, not anything the cage could have set up: the result is
// byte for byte the copy the reset would have written. What the inode
// carries besides its bytes goes: every extended attribute a cage can set
// (user.* attributes, ACLs, file capabilities) is removed (RemoveXattrs),
// and the reset sets its owner and mode as for any carried file.
//
// The inode is the old HOME's file, so a crash in the middle leaves it
// half rewritten. Before the first byte is written, the patch mark in the
// state directory names the inode (after trusted.db's transaction
// committed); it goes only once the inode is trusted.db's bytes. A reset
// that finds the mark naming its file knows that file's changes are in
// trusted.db already, and only finishes the rewrite (or, copying, copies
// trusted.db). A -wal beside the file is first folded into it in place
// (foldInPlace). A file with another link (nlink > 1) is not rewritten:
// the reset copies trusted.db as before, and so it does when the fold or
// the rewrite fails (Update then finds the mark naming the file).

// patchMark is the patch mark's name in the state directory.
const patchMark = "patching"

// updateOpencodeDBInPlace is opencode.db's Rule.UpdateInPlace.
func updateOpencodeDBInPlace(ctx context.Context, fd, walFd int, max int64, state string) ([]RowDrop, bool, error) {
	mine, err := patchMarked(fd, state)
	if err != nil {
		return nil, false, err
	}
	if mine {
		// A rewrite that fails is left to Update, which copies.
		return nil, patchInode(fd, state) == nil, nil
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, false, err
	}
	if st.Nlink != 1 || st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, false, nil
	}
	if walFd >= 0 {
		if err := foldInPlace(ctx, fd, walFd, state); err != nil {
			return nil, false, nil // Update folds a private copy
		}
		walFd = -1
	}
	drops, err := refreshTrusted(ctx, fd, walFd, max, state)
	if err != nil {
		return nil, false, err
	}
	return drops, patchInode(fd, state) == nil, nil
}

// foldInPlace checkpoints the -wal (walFd) into the turn's file's own
// inode, as SQLite does at a clean close: both inodes linked into a
// private directory of state (SQLite never resolves a path in the HOME),
// the database left out of WAL mode. A crash in the middle leaves the
// pair as SQLite's recovery expects it (the WAL is truncated only once its
// frames are in the file): the next reset folds again.
func foldInPlace(ctx context.Context, fd, walFd int, state string) error {
	dir := filepath.Join(state, "fold")
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	db := filepath.Join(dir, "turn.db")
	for _, l := range []struct {
		fd   int
		path string
	}{{fd, db}, {walFd, db + "-wal"}} {
		if err := unix.Linkat(l.fd, "", unix.AT_FDCWD, l.path, unix.AT_EMPTY_PATH); err != nil {
			return fmt.Errorf("link: %w", err)
		}
	}
	if err := foldWAL(ctx, db); err != nil {
		return err
	}
	if err := syncFile(db); err != nil {
		return err
	}
	return os.RemoveAll(dir)
}

// markText is the patch mark's content for an inode.
func markText(st *unix.Stat_t) string {
	return fmt.Sprintf("%d %d\n", st.Dev, st.Ino)
}

// patchMarked reports whether the patch mark names fd's inode; a mark
// naming another one (that file is gone) is removed.
func patchMarked(fd int, state string) (bool, error) {
	b, err := os.ReadFile(filepath.Join(state, patchMark))
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return false, err
	}
	if string(b) == markText(&st) {
		return true, nil
	}
	return false, removeSynced(state, patchMark)
}

// patchInode rewrites fd's inode to trusted.db's bytes, under the mark.
func patchInode(fd int, state string) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	if err := writeSynced(state, patchMark, markText(&st)); err != nil {
		return fmt.Errorf("patch mark: %w", err)
	}
	f, err := os.OpenFile("/proc/self/fd/"+strconv.Itoa(fd), os.O_RDWR|unix.O_NONBLOCK|unix.O_NOCTTY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	var fst unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &fst); err != nil {
		return err
	}
	if fst.Dev != st.Dev || fst.Ino != st.Ino || fst.Mode&unix.S_IFMT != unix.S_IFREG {
		return errors.New("file changed while being rewritten")
	}
	if err := RemoveXattrs("/proc/self/fd/" + strconv.Itoa(int(f.Fd()))); err != nil {
		return err
	}
	t, err := os.Open(filepath.Join(state, trustedDB))
	if err != nil {
		return err
	}
	defer t.Close()
	ts, err := t.Stat()
	if err != nil {
		return err
	}
	const block = 1 << 16
	want, have := make([]byte, block), make([]byte, block)
	for off := int64(0); off < ts.Size(); off += block {
		n, err := t.ReadAt(want, off)
		if n == 0 {
			return fmt.Errorf("read trusted copy: %w", err)
		}
		m, _ := f.ReadAt(have[:n], off)
		if m == n && bytes.Equal(want[:n], have[:n]) {
			continue
		}
		if _, err := f.WriteAt(want[:n], off); err != nil {
			return err
		}
	}
	if err := f.Truncate(ts.Size()); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	return removeSynced(state, patchMark)
}

// RemoveXattrs removes every extended attribute of the file at path (a
// /proc/self/fd link for a checked inode) that a cage could have set:
// user.* attributes, ACLs, file capabilities. The host's security labels
// (security.selinux and the like) stay: only the host's policy sets them.
func RemoveXattrs(path string) error {
	names := func() ([]string, error) {
		n, err := unix.Listxattr(path, nil)
		if errors.Is(err, unix.ENOTSUP) || err == nil && n == 0 {
			return nil, nil
		}
		if err != nil {
			return nil, fmt.Errorf("list extended attributes: %w", err)
		}
		buf := make([]byte, n+1)
		if n, err = unix.Listxattr(path, buf); err != nil {
			return nil, fmt.Errorf("list extended attributes: %w", err)
		}
		var out []string
		for _, name := range strings.Split(string(buf[:n]), "\x00") {
			if name != "" && (!strings.HasPrefix(name, "security.") || name == "security.capability") {
				out = append(out, name)
			}
		}
		return out, nil
	}
	list, err := names()
	if err != nil {
		return err
	}
	for _, name := range list {
		if err := unix.Removexattr(path, name); err != nil && !errors.Is(err, unix.ENODATA) {
			return fmt.Errorf("remove extended attribute %q: %w", name, err)
		}
	}
	if left, err := names(); err != nil || len(left) > 0 {
		return fmt.Errorf("extended attributes left (%q): %v", left, err)
	}
	return nil
}

// writeSynced writes dir/name durably (the file and the directory entry).
func writeSynced(dir, name, text string) error {
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
		return err
	}
	if err := syncFile(p); err != nil {
		return err
	}
	return syncFile(dir)
}

// removeSynced removes dir/name durably.
func removeSynced(dir, name string) error {
	if err := os.Remove(filepath.Join(dir, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return syncFile(dir)
}
