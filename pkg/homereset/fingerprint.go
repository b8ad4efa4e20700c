package homereset

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"sort"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shrooms-cage/shrooms/pkg/profile"
)

// racyWindow is how close to the fingerprint's walk an entry may have
// changed and still be told apart from a later change: the kernel stamps
// ctime from a clock that ticks every few milliseconds, so a change made in
// the same tick as the stamp a fingerprint recorded would leave it equal.
// An entry that new makes the fingerprint "" ("racy", as git calls it).
const racyWindow = 50 * time.Millisecond

// Fingerprint identifies a reset HOME together with everything its reset
// read besides it: every entry of the live tree (name, type, mode, owner,
// size, inode, link count, mtime and ctime — no process but the kernel
// sets a ctime, and any change to an entry or to a directory's names
// changes one), an interrupted reset's journal, the baseline's digest, the
// profiles, ids and the [home] and [tokens] config. A HOME whose
// fingerprint is the one taken right after its reset is still that reset's
// output: a prepared turn checks this instead of dry-running the reset (a
// dry run rebuilds a kept opencode.db in full). Nothing is read but
// metadata; no link is followed.
//
// It returns "" when an entry changed within racyWindow of the walk (its
// change could not be told from a later one): such a HOME is checked the
// long way.
func Fingerprint(ctx context.Context, t Task) (string, error) {
	if err := checkTask(t); err != nil {
		return "", err
	}
	rules, _ := profile.KeepList(t.Profiles)
	base, err := baseline(&t.Config.Home, t.Profiles, rules)
	if err != nil {
		return "", fmt.Errorf("HOME baseline: %w", err)
	}
	h := sha256.New()
	cfg, err := json.Marshal(struct {
		Home, Tokens any
		Profiles     []string
		UID, GID     int
		Baseline     string
	}{t.Config.Home, t.Config.Tokens, t.Profiles, t.UID, t.GID, digest(base)})
	if err != nil {
		return "", fmt.Errorf("HOME fingerprint: %w", err)
	}
	h.Write(cfg)
	v, err := openVolume(t.Root, true)
	if err != nil {
		return "", err
	}
	defer v.close()
	start := time.Now().Add(-racyWindow)
	racy := false
	node := func(dir int, name, rel string) (unix.Stat_t, bool, error) {
		var st unix.Stat_t
		if err := unix.Fstatat(dir, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			if errors.Is(err, unix.ENOENT) {
				fmt.Fprintf(h, "%q absent\n", rel)
				return st, false, nil
			}
			return st, false, fmt.Errorf("HOME fingerprint: stat %s: %w", rel, err)
		}
		fmt.Fprintf(h, "%q %o %d:%d %d %d %d %d.%d %d.%d %d\n", rel, st.Mode, st.Uid, st.Gid, st.Size, st.Ino, st.Nlink,
			st.Mtim.Sec, st.Mtim.Nsec, st.Ctim.Sec, st.Ctim.Nsec, st.Rdev)
		for _, ts := range []unix.Timespec{st.Mtim, st.Ctim} {
			if !time.Unix(ts.Unix()).Before(start) {
				racy = true
			}
		}
		return st, true, nil
	}
	if _, _, err := node(int(v.meta.Fd()), journal, metaName+"/"+journal); err != nil {
		return "", err
	}
	st, ok, err := node(int(v.root.Fd()), homeName, homeName)
	if err != nil || !ok {
		return "", err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return "", fmt.Errorf("HOME fingerprint: %s is not a directory", homeName)
	}
	if err := walkMeta(ctx, h, v, node); err != nil {
		return "", err
	}
	if racy {
		return "", nil
	}
	return "fp1:" + hex.EncodeToString(h.Sum(nil)), nil
}

// walkMeta stats every entry below the live HOME, directories in name
// order, depth first.
func walkMeta(ctx context.Context, h hash.Hash, v *volume, node func(int, string, string) (unix.Stat_t, bool, error)) error {
	root, err := openDir(v.root, homeName, v.dev)
	if err != nil {
		return fmt.Errorf("HOME fingerprint: %w", err)
	}
	type frame struct {
		dir   *os.File
		rel   string
		names []string
	}
	open := func(d *os.File, rel string) (*frame, error) {
		names, err := readNames(d)
		if err != nil {
			d.Close()
			return nil, fmt.Errorf("HOME fingerprint: read %s: %w", rel, err)
		}
		fmt.Fprintf(h, "%q lists %d\n", rel, len(names))
		return &frame{dir: d, rel: rel, names: names}, nil
	}
	top, err := open(root, homeName)
	if err != nil {
		return err
	}
	stack := []*frame{top}
	defer func() {
		for _, f := range stack {
			f.dir.Close()
		}
	}()
	for n := 0; len(stack) > 0; n++ {
		if n%256 == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		fr := stack[len(stack)-1]
		if len(fr.names) == 0 {
			fr.dir.Close()
			stack = stack[:len(stack)-1]
			continue
		}
		name := fr.names[0]
		fr.names = fr.names[1:]
		rel := fr.rel + "/" + name
		st, ok, err := node(int(fr.dir.Fd()), name, rel)
		if err != nil {
			return err
		}
		if !ok || st.Mode&unix.S_IFMT != unix.S_IFDIR {
			continue
		}
		if len(stack) >= maxDepth {
			return fmt.Errorf("HOME fingerprint: %s nested too deep", rel)
		}
		d, err := openDir(fr.dir, name, v.dev)
		if err != nil {
			return fmt.Errorf("HOME fingerprint: %w", err)
		}
		child, err := open(d, rel)
		if err != nil {
			return err
		}
		stack = append(stack, child)
	}
	return nil
}

// readNames lists a directory, in name order.
func readNames(d *os.File) ([]string, error) {
	var names []string
	for {
		batch, err := d.Readdirnames(4096)
		names = append(names, batch...)
		if err == io.EOF || (err == nil && len(batch) == 0) {
			sort.Strings(names)
			return names, nil
		}
		if err != nil {
			return nil, err
		}
	}
}
