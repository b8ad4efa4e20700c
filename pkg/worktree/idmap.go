package worktree

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/shrooms-cage/shrooms/pkg/podmanpeer"
	"github.com/shrooms-cage/shrooms/pkg/resolve"
	"github.com/shrooms-cage/shrooms/pkg/taskid"
	"github.com/shrooms-cage/shrooms/pkg/taskstate"
)

// Idmapped worktrees. Where the kernel and the worktree's filesystem allow
// it, the cage gets the worktree through an idmapped mount made by shrooms
// on the host (runc 1.1 cannot make one itself): a clone of the worktree's
// mount tree (open_tree), idmapped with the user namespace of a stopped
// child whose map is the owner's uid and gid → the task agent's host ones
// (mount_setattr MOUNT_ATTR_IDMAP, with nosuid and nodev), moved to a
// root-only staging directory, which the cage binds as /work. In the cage
// the owner's files are the agent's and what it writes lands owned by the
// owner on disk: no hand-over chown walk before the turn, no give-back
// chown walk after it. What the chowns gave for free is done here instead:
//
//   - setuid/setgid: a worktree owned by uid or gid 0 is never idmapped (the
//     chown walks run), so the cage cannot make a setuid-root file; during the
//     turn the worktree must be unreachable for other users on the host (a
//     strict ancestor owned by the owner or root that neither its group nor
//     others may search, and no ACL on it: idmapGate at the plan, again by
//     descriptor on the directory staged: openGated), so nobody but the
//     owner (and root) can run a setuid file the cage makes while it runs
//     (the owner gains nothing by it); after the turn the setuid and setgid
//     bits of every regular file the turn changed (ctime from the turn's
//     start) are taken away (idmapHook).
//   - the owner's nested repositories (nested.go) get read-only binds in the
//     staging tree, found by the change scan before the turn (nestedFinder);
//     the root's .git is a read-only bind already (pkg/gitseal).
//   - nested repositories the turn makes (any not among those found before)
//     are given to the task's agent uid after the turn and lose their
//     permissions for others, as the give-back's keep does: the owner's git
//     refuses them.
//   - the staging mount is made in the podman service's mount namespace
//     (inServiceNS) and detached once runc has bound it (right after the
//     start, or a prepared cage's init); a leftover one (a crash) is
//     detached by the next turn of the task, its give-back, gc and forget,
//     and a turn's record (the state directory's idmap/) makes each of them
//     give back what a killed turn left first.

// idmapRoot holds the staging mounts: root-only, a private mount of its own
// (so the staging mounts propagate to no other mount namespace), in /run (a
// reboot leaves none). Each state directory has its own directory in it.
const idmapRoot = "/run/shrooms-idmap"

// idmapDir is the state directory's directory of staging mounts.
func (c Claims) idmapDir() string {
	sum := sha256.Sum256([]byte(filepath.Clean(c.Layout.Dir)))
	return filepath.Join(idmapRoot, hex.EncodeToString(sum[:6]))
}

// recordDir holds the idmapped turns' records, in the state directory (a
// turn's must outlive a reboot: its give-back strips setuid bits).
func (c Claims) recordDir() string { return filepath.Join(c.Layout.Dir, "idmap") }

// A Holder is a task as the claims know it, derived once from its id
// (Claims.Holder): the name its claim files record (the id's string form),
// its state directory (for its id range) and the paths of its idmapped
// worktree's staging mount and records (Idmap). The worktree's steps of a
// turn take it, not the id. The zero Holder is refused as "no task id".
type Holder struct {
	task  taskid.ID // typed, so that tools/walk -carriers counts a Holder as the task
	state taskstate.Dir
	trust string // the task's trust store: the namespace cache's directory
	Idmap
}

// Idmap is where a task's idmapped worktree is staged and recorded, derived
// with its Holder: what the idmap steps that neither write nor compare a
// claim take (tools/walk -derived counts it as the task).
type Idmap struct {
	staging  string
	turn     string // the idmapped turn's record
	prepared string // the record of a cage prepared ahead on an idmapped mount
}

// Holder derives what the claims need of the task.
func (c Claims) Holder(task taskid.ID) (Holder, error) {
	state, err := c.Store.Task(task)
	if err != nil {
		return Holder{}, err
	}
	name := task.String()
	return Holder{task: task, state: state, trust: state.Trust(), Idmap: Idmap{
		staging:  filepath.Join(c.idmapDir(), name),
		turn:     filepath.Join(c.recordDir(), name+".turn.json"),
		prepared: filepath.Join(c.recordDir(), name+".prepared.json"),
	}}, nil
}

// errNoTask refuses the zero Holder (its staging directory is "").
var errNoTask = errors.New("no task id")

// StagingDir is where the task's idmapped worktree is staged for its
// cage's bind (the /work mount's source in idmap mode).
func (m Idmap) StagingDir() string { return m.staging }

// idmapRecord is what an idmapped turn's give-back needs: who the worktree
// was mapped from and to, when the turn began (ctimes from then on are the
// turn's) and the owner's nested repositories found before it (by path and
// inode: read-only in the cage, never given to the task).
type idmapRecord struct {
	Worktree string            `json:"worktree"`
	Owner    [2]uint32         `json:"owner"`
	Agent    [2]uint32         `json:"agent"`
	Start    int64             `json:"start_unix_nano"`
	Nested   map[string]uint64 `json:"nested"`
	// Boot is the boot the record was made in (a prepared cage's staging
	// proved the kernel makes the idmapped mount, in this boot only).
	Boot string `json:"boot,omitempty"`
}

// bootID names this boot of the kernel.
func bootID() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

func writeRecord(path string, rec *idmapRecord) error {
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("idmap record: %w", err)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("idmap record: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("idmap record: %w", err)
	}
	return nil
}

func readRecord(path string) (*idmapRecord, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("idmap record: %w", err)
	}
	rec := &idmapRecord{}
	if err := json.Unmarshal(b, rec); err != nil {
		return nil, fmt.Errorf("idmap record %s: %w", path, err)
	}
	return rec, nil
}

// IdmapReason says why the task's worktree gets the chown walks rather than
// an idmapped mount ("" for an idmapped mount): gVisor cages,
// worktree.idmap = "off", a worktree owned by root, one other users can
// reach, or a kernel or filesystem that refuses MOUNT_ATTR_IDMAP. ids are
// the task's host id range (its agent's ids are these plus User).
func (c Claims) IdmapReason(holder Holder, worktree string, ids taskstate.IDs) string {
	if c.GVisor {
		return "gVisor cages keep the chown walks"
	}
	if c.Cap.Idmap == "off" {
		return `worktree.idmap = "off"`
	}
	agent := c.agentIDs(ids)
	agentUID, agentGID := agent[0], agent[1]
	uid, gid, err := c.owner(holder, worktree, ids.UID)
	if err != nil {
		return err.Error()
	}
	// A cage prepared ahead for this worktree and owner in this boot was
	// staged on an idmapped mount: the trial mount (a child process, slow
	// under load) is not needed to know the kernel makes one.
	if rec, _ := readRecord(holder.prepared); rec != nil && rec.Boot != "" && rec.Boot == bootID() &&
		rec.Worktree == worktree && rec.Owner == [2]uint32{uid, gid} && rec.Agent == [2]uint32{agentUID, agentGID} {
		return idmapOwnerReason(worktree, uid, gid)
	}
	return IdmapHostReason(worktree, uid, gid, agentUID, agentGID)
}

// idmapOwnerReason is IdmapHostReason without the trial mount: the owner
// and the gate.
func idmapOwnerReason(worktree string, uid, gid uint32) string {
	if uid == 0 || gid == 0 {
		return "the worktree is owned by root or group root (an idmapped one could get setuid- or setgid-root files)"
	}
	if err := idmapGate(worktree, uid); err != nil {
		return err.Error()
	}
	return ""
}

// owner is the worktree's owner, as Take records it: its root's owner now,
// or, when that is the task's user namespace (lo its first host uid), the
// claim's.
func (c Claims) owner(holder Holder, worktree string, lo uint32) (uint32, uint32, error) {
	var st unix.Stat_t
	if err := unix.Lstat(worktree, &st); err != nil {
		return 0, 0, fmt.Errorf("worktree %s: %w", worktree, err)
	}
	if st.Uid < lo || st.Uid >= lo+taskstate.SlotSize {
		return st.Uid, st.Gid, nil
	}
	cl, err := c.read(worktree)
	if err != nil {
		return 0, 0, err
	}
	if cl == nil || cl.Task != holder.task.String() {
		return 0, 0, fmt.Errorf("worktree %s is owned by the task's user namespace and shrooms has no record of its owner", worktree)
	}
	return cl.UID, cl.GID, nil
}

// IdmapHostReason is IdmapReason for a worktree owned by uid:gid, the
// config aside: "" when it can be idmapped to agentUID:agentGID here.
func IdmapHostReason(worktree string, uid, gid, agentUID, agentGID uint32) string {
	if r := idmapOwnerReason(worktree, uid, gid); r != "" {
		return r
	}
	fd, err := idmappedTree(worktree, uid, gid, agentUID, agentGID, true)
	if err != nil {
		return "the kernel or filesystem refuses an idmapped mount: " + err.Error()
	}
	unix.Close(fd)
	return ""
}

// IdmapProbe says whether the kernel and the filesystem of dir make an
// idmapped mount of it (nil when they do), for doctor.
func IdmapProbe(dir string) error {
	fd, err := idmappedTree(dir, 65534, 65534, 65533, 65533, false)
	if err != nil {
		return err
	}
	return unix.Close(fd)
}

// idmapGate checks that no other user can reach the worktree on the host
// while a turn runs: a strict ancestor (the cage can chmod the worktree's
// root itself) owned by the owner or root that neither its group nor others
// may search, with no ACL.
func idmapGate(worktree string, owner uint32) error {
	real, err := filepath.EvalSymlinks(worktree)
	if err != nil {
		return fmt.Errorf("worktree %s: %w", worktree, err)
	}
	for p := filepath.Dir(real); ; p = filepath.Dir(p) {
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return fmt.Errorf("worktree %s: %w", worktree, err)
		}
		if (st.Uid == 0 || st.Uid == owner) && st.Mode&0o011 == 0 && !hasACL(p) {
			return nil
		}
		if p == "/" {
			return errors.New("other users can reach the worktree (no parent directory of it is closed to its group and others)")
		}
	}
}

// openGated opens the worktree, following no link anywhere on its path
// (the turn's checks refused any), and checks the gate by descriptor on the
// directory it opened: the tree staged is the one the gate closes, whatever
// was renamed or swapped for a link since the turn's plan checked the path.
func openGated(worktree string, owner uint32) (int, error) {
	fd, err := unix.Openat2(unix.AT_FDCWD, worktree, &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC,
		Resolve: resolve.NoLinks,
	})
	if err != nil {
		return -1, fmt.Errorf("idmap staging: worktree %s: %w", worktree, err)
	}
	if err := gatedAt(fd, owner); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("idmap staging: worktree %s: %w", worktree, err)
	}
	return fd, nil
}

// gatedAt is idmapGate for the open directory fd, walking its real
// parents ("..", across mounts) by descriptor.
func gatedAt(fd int, owner uint32) error {
	var cur unix.Stat_t
	if err := unix.Fstat(fd, &cur); err != nil {
		return err
	}
	dir := fd
	defer func() {
		if dir != fd {
			unix.Close(dir)
		}
	}()
	for {
		parent, err := unix.Openat(dir, "..", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		if dir != fd {
			unix.Close(dir)
		}
		dir = parent
		var st unix.Stat_t
		if err := unix.Fstat(dir, &st); err != nil {
			return err
		}
		// getxattr, not lgetxattr: through the descriptor's magic link.
		n, aerr := unix.Getxattr(fmt.Sprintf("/proc/self/fd/%d", dir), "system.posix_acl_access", nil)
		if (st.Uid == 0 || st.Uid == owner) && st.Mode&0o011 == 0 && (aerr != nil || n == 0) {
			return nil
		}
		if st.Dev == cur.Dev && st.Ino == cur.Ino { // the root: its ".." is itself
			return errors.New("other users can reach the worktree (no parent directory of it is closed to its group and others)")
		}
		cur = st
	}
}

func hasACL(path string) bool {
	n, err := unix.Lgetxattr(path, "system.posix_acl_access", nil)
	return err == nil && n > 0
}

// idmapUserns returns a descriptor of a new user namespace whose map is
// uid → auid, gid → agid: the namespace of a child stopped before it runs
// anything (ptrace stops it at its exec), killed once the descriptor is
// open.
func idmapUserns(uid, gid, auid, agid uint32) (int, error) {
	runtime.LockOSThread() // ptrace ties the child to this thread
	defer runtime.UnlockOSThread()
	cmd := exec.Command("/proc/self/exe")
	cmd.Env = []string{}
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  syscall.CLONE_NEWUSER,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: int(uid), HostID: int(auid), Size: 1}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: int(gid), HostID: int(agid), Size: 1}},
		Ptrace:      true,
		Pdeathsig:   syscall.SIGKILL,
	}
	if err := cmd.Start(); err != nil {
		return -1, fmt.Errorf("user namespace for the idmap: %w", err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	fd, err := unix.Open(fmt.Sprintf("/proc/%d/ns/user", cmd.Process.Pid), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("user namespace for the idmap: %w", err)
	}
	return fd, nil
}

// idmappedTree returns a detached clone of the worktree's mount (with the
// mounts below it when recursive), the worktree's own mount idmapped
// uid:gid → auid:agid, all of it nosuid, nodev and private. The mounts
// below are not idmapped: their owner's files stay out of the cage's
// reach, as with the chown walks, which (like the give-back's setuid strip
// and the change scans) stop at the worktree's filesystem.
func idmappedTree(worktree string, uid, gid, auid, agid uint32, recursive bool) (int, error) {
	return idmappedTreeAt(unix.AT_FDCWD, worktree, uid, gid, auid, agid, recursive)
}

// idmappedTreeAt is idmappedTree of path below dirfd ("": dirfd itself).
func idmappedTreeAt(dirfd int, worktree string, uid, gid, auid, agid uint32, recursive bool) (int, error) {
	ns, err := idmapUserns(uid, gid, auid, agid)
	if err != nil {
		return -1, err
	}
	defer unix.Close(ns)
	flags := unix.OPEN_TREE_CLONE | unix.OPEN_TREE_CLOEXEC | unix.AT_SYMLINK_NOFOLLOW
	if recursive {
		flags |= unix.AT_RECURSIVE
	}
	if worktree == "" {
		flags |= unix.AT_EMPTY_PATH
	}
	fd, err := unix.OpenTree(dirfd, worktree, uint(flags))
	if err != nil {
		return -1, fmt.Errorf("open_tree %s: %w", worktree, err)
	}
	all := &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV, Propagation: unix.MS_PRIVATE}
	if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH|unix.AT_RECURSIVE, all); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("mount_setattr nosuid %s: %w", worktree, err)
	}
	top := &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_IDMAP, Userns_fd: uint64(ns)}
	if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, top); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("mount_setattr idmap %s: %w", worktree, err)
	}
	return fd, nil
}

// privateIdmapDir makes idmapRoot a private mount of its own (once) and
// the state directory's staging and record directories.
func (c Claims) privateIdmapDir() error {
	for _, d := range []string{idmapRoot, c.idmapDir(), c.recordDir()} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return fmt.Errorf("idmap staging: %w", err)
		}
		if err := os.Chmod(d, 0o700); err != nil {
			return fmt.Errorf("idmap staging: %w", err)
		}
	}
	var stx unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, idmapRoot, unix.AT_SYMLINK_NOFOLLOW, unix.STATX_BASIC_STATS, &stx); err != nil {
		return fmt.Errorf("idmap staging: %w", err)
	}
	if stx.Attributes_mask&unix.STATX_ATTR_MOUNT_ROOT == 0 {
		return errors.New("idmap staging: the kernel does not say which directories are mount points")
	}
	if stx.Attributes&unix.STATX_ATTR_MOUNT_ROOT == 0 {
		if err := unix.Mount(idmapRoot, idmapRoot, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("idmap staging: bind %s: %w", idmapRoot, err)
		}
	}
	if err := unix.Mount("", idmapRoot, "", unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("idmap staging: make %s private: %w", idmapRoot, err)
	}
	return nil
}

// Unstage detaches the task's staging mount (all of them, should a crash
// have left one below another); nothing when there is none.
func (c Claims) Unstage(holder Holder) error { return c.UnstageDir(holder.staging) }

// UnstageDir is Unstage of the staging directory dir (StagingDir's).
func (c Claims) UnstageDir(dir string) error {
	if filepath.Dir(dir) != c.idmapDir() {
		return fmt.Errorf("detach idmapped worktree: %s is no staging directory", dir)
	}
	return c.inServiceNS(func() error { return unstage(dir) })
}

func unstage(dir string) error {
	for range 64 {
		err := unix.Unmount(dir, unix.MNT_DETACH)
		switch {
		case errors.Is(err, unix.EINVAL), errors.Is(err, unix.ENOENT):
			return nil // not a mount point (any more), or no directory
		case err != nil:
			return fmt.Errorf("detach idmapped worktree %s: %w", dir, err)
		}
	}
	return fmt.Errorf("detach idmapped worktree %s: still mounted", dir)
}

// inServiceNS runs fn in the podman service's mount namespace, where the
// runtime resolves the cage's bind sources (podmanpeer.InMountNS; here
// when no unix socket is configured).
func (c Claims) inServiceNS(fn func() error) error {
	if path, ok := strings.CutPrefix(c.Socket, "unix://"); !ok || path == "" {
		return fn()
	}
	pid, err := podmanpeer.Pid(c.Socket)
	if err != nil {
		return fmt.Errorf("idmap staging: %w", err)
	}
	if pid == 0 {
		return fmt.Errorf("idmap staging: the podman service at %s is not a process of this pid namespace", c.Socket)
	}
	return podmanpeer.InMountNS(pid, fn)
}

// stage mounts the worktree idmapped at the task's staging directory
// (dir, the Holder's), with read-only binds over the nested repositories
// (worktree-relative paths). On any failure nothing stays mounted.
func (c Claims) stage(dir, worktree string, rec *idmapRecord) error {
	if dir == "" {
		return errNoTask
	}
	// The gate again, on what is staged: the plan checked the path.
	wt, err := openGated(worktree, rec.Owner[0])
	if err != nil {
		return err
	}
	defer unix.Close(wt)
	tree, err := idmappedTreeAt(wt, "", rec.Owner[0], rec.Owner[1], rec.Agent[0], rec.Agent[1], true)
	if err != nil {
		return err
	}
	defer unix.Close(tree)
	return c.inServiceNS(func() error {
		if err := c.privateIdmapDir(); err != nil {
			return err
		}
		if err := unstage(dir); err != nil {
			return err
		}
		// Unmounted, the directory is no one's: a cage bound to it by a
		// runtime that does not see the mount gets nothing it can use.
		if err := os.Mkdir(dir, 0); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("idmap staging: %w", err)
		}
		if err := os.Chmod(dir, 0); err != nil {
			return fmt.Errorf("idmap staging: %w", err)
		}
		if err := moveTo(tree, dir); err != nil {
			return err
		}
		if err := readOnlyBinds(dir, rec.Nested); err != nil {
			_ = unstage(dir)
			return err
		}
		return nil
	})
}

// readOnlyBinds binds each nested repository (worktree-relative) below the
// staging directory dir read-only over itself.
func readOnlyBinds(dir string, nested map[string]uint64) error {
	root, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("idmap staging: %w", err)
	}
	defer unix.Close(root)
	for rel := range nested {
		if err := readOnlyBind(root, rel); err != nil {
			return fmt.Errorf("idmap staging: nested repository %s read-only: %w", rel, err)
		}
	}
	return nil
}

// readOnlyBind binds the entry rel below root over itself, read-only,
// nosuid and nodev, resolving no link on the way.
func readOnlyBind(root int, rel string) error {
	target, err := unix.Openat2(root, rel, &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_NOFOLLOW | unix.O_CLOEXEC,
		Resolve: resolve.Beneath,
	})
	if err != nil {
		return err
	}
	defer unix.Close(target)
	var st unix.Stat_t
	if err := unix.Fstat(target, &st); err != nil {
		return err
	}
	if m := st.Mode & unix.S_IFMT; m != unix.S_IFDIR && m != unix.S_IFREG {
		return nil // a link: the cage can only replace it, which the give-back finds
	}
	clone, err := unix.OpenTree(target, "", unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_EMPTY_PATH|unix.AT_RECURSIVE)
	if err != nil {
		return fmt.Errorf("open_tree: %w", err)
	}
	defer unix.Close(clone)
	attr := &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV}
	if err := unix.MountSetattr(clone, "", unix.AT_EMPTY_PATH|unix.AT_RECURSIVE, attr); err != nil {
		return fmt.Errorf("mount_setattr: %w", err)
	}
	if err := unix.MoveMount(clone, "", target, "", unix.MOVE_MOUNT_F_EMPTY_PATH|unix.MOVE_MOUNT_T_EMPTY_PATH); err != nil {
		return fmt.Errorf("move_mount: %w", err)
	}
	return nil
}

// moveTo attaches the detached mount tree at dir.
func moveTo(tree int, dir string) error {
	if err := unix.MoveMount(tree, "", unix.AT_FDCWD, dir, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("idmap staging: move_mount to %s: %w", dir, err)
	}
	return nil
}

// releaseIdmap removes what an idmapped worktree left of a task that is
// forgotten: its staging mount and directory and its prepared record.
func (c Claims) releaseIdmap(holder Holder) error {
	if err := c.Unstage(holder); err != nil {
		return err
	}
	// The directory itself, in the namespace shrooms sees (the same
	// filesystem as the service's).
	for _, p := range []string{holder.staging, holder.prepared} {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("idmap staging: %w", err)
		}
	}
	_ = os.Remove(c.idmapDir()) // the state directory's, once no task has one
	return nil
}
