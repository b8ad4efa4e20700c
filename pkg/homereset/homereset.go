// Package homereset owns the task HOME: it bootstraps credentials once per
// task, and before every turn rebuilds HOME from the agent profiles'
// keep-lists (credentials, sessions; validated, and every kept file but
// Claude's tool results rebuilt from a field, record or row allowlist: JSON
// files from key allowlists, Claude transcripts record by record,
// opencode.db from the pinned opencode's schema) plus the
// owner's baseline, so that configuration a turn plants in HOME, or inside
// a file HOME keeps, is gone before the next turn starts. What each agent
// keeps and how its files are rebuilt is pkg/profile's; this package knows
// no agent. (The managed policy the cage mounts outside HOME is pkg/home's.)
//
// Layout inside the task's volume directory (Root, e.g. the podman volume's
// _data): Root/home is the live HOME, bind-mounted at /home/agent; Root/.shrooms
// (root-only, never mounted) holds the lock, the bootstrap marker, the reset
// journal, the stage of the next HOME and the trash of old ones. A reset
// renames HOME into the trash, builds the next HOME beside it from the keep-
// list and the baseline, and renames it into place: its cost does not grow
// with the junk the last turn left, which Cleanup deletes off the critical
// path. Every access below Root is fd-relative (openat2 with
// RESOLVE_BENEATH|NO_SYMLINKS|NO_MAGICLINKS|NO_XDEV): no link the cage made is
// followed, no FIFO or device is opened, no other filesystem is entered.
package homereset

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/shrooms-cage/shrooms/pkg/config"
	"github.com/shrooms-cage/shrooms/pkg/profile"
	"golang.org/x/sys/unix"
)

// Names inside Root.
const (
	homeName   = "home"
	metaName   = ".shrooms"
	lockName   = "lock"
	markerName = "bootstrapped"
	journal    = "journal"
	trashName  = "trash"
	stagePfx   = "stage-"
	oldPfx     = "old-"
	// dbStateName holds a KindDatabase rule's state (profile.Rule.Update).
	dbStateName = "kept-db"
)

// Bootstrap results.
const (
	Bootstrapped        = "bootstrapped"
	AlreadyBootstrapped = "already-bootstrapped"
)

// Task names one task's HOME storage and owner.
type Task struct {
	// Root is the host directory of the task's HOME volume (the podman
	// volume <home.volume_prefix><task>'s mountpoint). It must be an
	// existing directory; shrooms' layout lives inside it.
	Root string
	// UID and GID are the host ids that own the agent's files (the task's
	// user namespace base + cage.user).
	UID, GID int
	// Config supplies [home] and [tokens]; Profiles are the agent's HOME
	// profiles (config agents.<name>.home).
	Config   *config.Config
	Profiles []string
	// Kept are the HOME profiles the task bootstrapped or used before that
	// this turn's agent does not use (a shell turn on a Claude task: claude).
	// Their keep-lists are carried over too, validated and rebuilt exactly
	// as in their own agents' turns, so switching agent never deletes
	// another agent's sign-in and sessions; their baseline and policy are
	// not laid down.
	Kept []string
	// APIKey is the model API key the cage's environment holds when it is
	// shrooms' gateway placeholder: a Claude turn's ~/.claude.json approves
	// it, so an interactive Claude Code does not ask (and, answered with
	// its default, turn the gateway off). Never a real key.
	APIKey string
}

// keptProfiles is every profile whose keep-list the reset carries over:
// the turn's own, then the task's others, each once.
func (t Task) keptProfiles() []string {
	all := slices.Clone(t.Profiles)
	for _, p := range t.Kept {
		if !slices.Contains(all, p) {
			all = append(all, p)
		}
	}
	return all
}

// BootstrapResult says what Bootstrap did.
type BootstrapResult struct {
	// Result is Bootstrapped or AlreadyBootstrapped.
	Result string `json:"result"`
	// Seeded are the HOME-relative credential paths written (empty when
	// already bootstrapped).
	Seeded []string `json:"seeded"`
	// Home is the host path of the live HOME.
	Home string `json:"home"`
}

// Report says what a reset kept, rebuilt, removed and laid down. It is the
// "reset" object of `run --json` and `shrooms reset --json`.
type Report struct {
	// Home is the host directory to bind-mount read-write at /home/agent.
	Home   string `json:"home"`
	DryRun bool   `json:"dryRun"`
	// Recovered names an interrupted reset that was completed first (or, in
	// a dry run, would be).
	Recovered string   `json:"recovered,omitempty"`
	Profiles  []string `json:"profiles"`
	// KeptProfiles are the task's other agents' profiles whose kept state
	// was carried over (rebuilt) though this turn's agent does not use them.
	KeptProfiles []string `json:"keptProfiles"`
	// Kept are the keep-list files carried over unchanged, hard-linked
	// (Claude's tool results, and transcripts byte for byte as the last
	// reset rebuilt them); KeptBytes the total size of kept and rebuilt files.
	Kept      []string `json:"kept"`
	KeptCount int      `json:"keptCount"`
	KeptBytes int64    `json:"keptBytes"`
	// Rebuilt are kept files rewritten from a field or row allowlist.
	Rebuilt []string `json:"rebuilt"`
	// Seeded are files shrooms wrote from its own seeds alone, none having
	// been kept (a fresh task's ~/.claude.json for an interactive Claude).
	Seeded []string `json:"seeded"`
	// Removed are the outermost HOME paths not carried over (at most
	// maxListed are listed; RemovedCount counts them all).
	Removed          []string `json:"removed"`
	RemovedCount     int      `json:"removedCount"`
	RemovedTruncated bool     `json:"removedTruncated,omitempty"`
	// Baseline are the files laid down fresh; BaselineDigest identifies them
	// and is the same for every turn of a task under the same config.
	Baseline       []string `json:"baseline"`
	BaselineDigest string   `json:"baselineDigest"`
	// Warnings name keep-list entries dropped (wrong type, too big,
	// unparseable) and keys, tables, columns and rows dropped from rebuilt
	// files. Values never appear.
	Warnings []string `json:"warnings"`
	// Dropped lists the same, one entry per dropped path, key, table or
	// column, with the reason (at most maxListed).
	Dropped []Drop `json:"dropped"`
	// Trash is the old tree left for Cleanup ("" in a dry run).
	Trash    string        `json:"trash,omitempty"`
	Duration time.Duration `json:"durationNs"`
}

// Drop is one thing a reset left out of kept state. Values never appear.
type Drop struct {
	// Path is the HOME-relative kept file (or path) concerned.
	Path string `json:"path"`
	// Item is what was left out of it: a key path ("openai.enterpriseUrl"),
	// "table account", "column session.share_url", "trigger t"; empty when
	// the whole path was dropped.
	Item string `json:"item,omitempty"`
	// Rows counts the database rows concerned.
	Rows   int64  `json:"rows,omitempty"`
	Reason string `json:"reason"`
}

// maxListed bounds the paths a report lists per category.
const maxListed = 200

// HomeDir returns the live HOME directory inside root.
func HomeDir(root string) string { return filepath.Join(root, homeName) }

// volume is an open task root.
type volume struct {
	root, meta *os.File
	dev        uint64
	lock       *os.File
}

func (v *volume) close() {
	for _, f := range []*os.File{v.lock, v.meta, v.root} {
		if f != nil {
			f.Close()
		}
	}
}

// openVolume opens root and its metadata directory and takes the task's
// HOME lock (exclusive unless shared). It refuses a root whose entries are
// not shrooms' layout, so a volume used some other way is never reset.
func openVolume(root string, shared bool) (_ *volume, err error) {
	if !filepath.IsAbs(root) {
		return nil, fmt.Errorf("task HOME root %q must be an absolute path", root)
	}
	fd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open task HOME root %s: %w", root, err)
	}
	v := &volume{root: os.NewFile(uintptr(fd), root)}
	defer func() {
		if err != nil {
			v.close()
		}
	}()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("stat %s: %w", root, err)
	}
	kuid, _ := keeper()
	if int(st.Uid) != kuid || st.Mode&0o022 != 0 {
		return nil, fmt.Errorf("task HOME root %s must be owned by uid %d (the reset's user) and not group/world-writable", root, kuid)
	}
	v.dev = uint64(st.Dev)
	names, err := v.root.Readdirnames(16)
	if err != nil && len(names) > 0 {
		return nil, fmt.Errorf("read %s: %w", root, err)
	}
	for _, n := range names {
		if n != homeName && n != metaName {
			return nil, fmt.Errorf("%s holds %q, which is not shrooms' HOME layout (home/, .shrooms/); refusing to touch it", root, n)
		}
	}
	if err := unix.Mkdirat(fd, metaName, 0o700); err != nil && !errors.Is(err, unix.EEXIST) {
		return nil, fmt.Errorf("create %s/%s: %w", root, metaName, err)
	}
	if v.meta, err = openDir(v.root, metaName, v.dev); err != nil {
		return nil, err
	}
	if err := unix.Fstat(int(v.meta.Fd()), &st); err != nil || int(st.Uid) != kuid {
		return nil, fmt.Errorf("%s/%s must be owned by uid %d (the reset's user)", root, metaName, kuid)
	}
	lfd, err := openat2(v.meta, lockName, unix.O_RDWR|unix.O_CREAT|unix.O_NOFOLLOW)
	if err != nil {
		return nil, fmt.Errorf("open HOME lock: %w", err)
	}
	v.lock = os.NewFile(uintptr(lfd), lockName)
	how := unix.LOCK_EX
	if shared {
		how = unix.LOCK_SH
	}
	if err := unix.Flock(lfd, how); err != nil {
		return nil, fmt.Errorf("lock task HOME: %w", err)
	}
	return v, nil
}

func checkTask(t Task) error {
	if t.Config == nil {
		return errors.New("homereset: no config")
	}
	if t.UID <= 0 || t.GID <= 0 {
		return fmt.Errorf("homereset: agent uid/gid %d:%d must be non-root", t.UID, t.GID)
	}
	if len(t.Profiles) == 0 {
		return errors.New("homereset: no HOME profile")
	}
	_, err := profile.KeepList(t.keptProfiles())
	return err
}

// Bootstrap seeds the task HOME once: it creates the layout and writes the
// credentials that config home.<profile>.bootstrap names (token files,
// validated like keep-list entries). If the HOME is already bootstrapped it
// returns AlreadyBootstrapped and touches nothing, so credentials the agent
// refreshed in turn N are what turn N+1 sees.
func Bootstrap(ctx context.Context, t Task) (*BootstrapResult, error) {
	if err := checkTask(t); err != nil {
		return nil, err
	}
	v, err := openVolume(t.Root, false)
	if err != nil {
		return nil, err
	}
	defer v.close()
	res := &BootstrapResult{Home: HomeDir(t.Root), Seeded: []string{}}
	done, err := exists(v.meta, markerName)
	if err != nil {
		return nil, err
	}
	if done {
		res.Result = AlreadyBootstrapped
		return res, nil
	}
	rules, _ := profile.KeepList(t.Profiles)
	// A baseline error is Reset's to report; here it only means no MCP URLs.
	base, _ := baseline(&t.Config.Home, t.Profiles, rules)
	env := newFilterEnv(base)
	var seeds []baseFile
	for _, p := range t.Profiles {
		prof := t.Config.Home.Profile(p)
		for _, rel := range slices.Sorted(maps.Keys(prof.Bootstrap)) {
			key := fmt.Sprintf("home.%s.bootstrap.%q", p, rel)
			tok := prof.Bootstrap[rel]
			path, ok := t.Config.Tokens[tok]
			if !ok {
				return nil, &config.Error{Key: key, Msg: fmt.Sprintf("names token %q, which [tokens] does not define", tok)}
			}
			ru := profile.FilterRule(rules, rel)
			if ru == nil {
				return nil, &config.Error{Key: key, Msg: "is not a credential file of the profile's keep-list"}
			}
			data, err := config.ReadHostFile(path, int64(t.Config.Home.MaxFileSize))
			if err != nil {
				return nil, fmt.Errorf("bootstrap %s from token %q: %w", rel, tok, err)
			}
			out, _, err := ru.FilterJSON(data, env)
			if err != nil {
				return nil, fmt.Errorf("bootstrap %s from token %q: %v", rel, tok, err)
			}
			seeds = append(seeds, baseFile{rel, out, ru.Mode})
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := unix.Mkdirat(int(v.root.Fd()), homeName, 0o700); err != nil && !errors.Is(err, unix.EEXIST) {
		return nil, fmt.Errorf("create HOME: %w", err)
	}
	home, err := mkdirOwned(v.root, homeName, 0o700, t.UID, t.GID, v.dev)
	if err != nil {
		return nil, err
	}
	defer home.Close()
	for _, s := range seeds {
		if err := placeAt(home, s.rel, t.UID, t.GID, v.dev, func(d *os.File, name string) error {
			return writeFileAt(d, name, s.data, s.mode, t.UID, t.GID)
		}); err != nil {
			return nil, fmt.Errorf("bootstrap %s: %w", s.rel, err)
		}
		res.Seeded = append(res.Seeded, s.rel)
	}
	marker, _ := json.Marshal(map[string]any{"time": time.Now().UTC().Format(time.RFC3339), "seeded": res.Seeded})
	if err := refillReserve(v.meta); err != nil {
		return nil, err
	}
	kuid, kgid := keeper()
	if err := writeFileAt(v.meta, markerName, marker, 0o600, kuid, kgid); err != nil {
		return nil, err
	}
	if err := v.meta.Sync(); err != nil {
		return nil, err
	}
	res.Result = Bootstrapped
	return res, nil
}

// mkdirAll opens (creating as needed, owned by uid:gid) the directory rel
// below dir; "" returns dir itself.
func mkdirAll(dir *os.File, rel string, uid, gid int, dev uint64) (*os.File, error) {
	if rel == "" {
		return dir, nil
	}
	cur := dir
	for _, part := range strings.Split(rel, "/") {
		next, err := openDir(cur, part, dev)
		if errors.Is(err, unix.ENOENT) {
			next, err = mkdirOwned(cur, part, 0o700, uid, gid, dev)
		}
		if cur != dir {
			cur.Close()
		}
		if err != nil {
			return nil, err
		}
		cur = next
	}
	return cur, nil
}

// placeAt runs put on the directory of the HOME-relative path rel below
// dir (created as needed, owned by uid:gid) and rel's last name.
func placeAt(dir *os.File, rel string, uid, gid int, dev uint64, put func(d *os.File, name string) error) error {
	sub, name := "", rel
	if i := strings.LastIndexByte(rel, '/'); i >= 0 {
		sub, name = rel[:i], rel[i+1:]
	}
	d, err := mkdirAll(dir, sub, uid, gid, dev)
	if err != nil {
		return err
	}
	if d != dir {
		defer d.Close()
	}
	return put(d, name)
}

// readJournal returns the id of an interrupted reset, or "".
func readJournal(meta *os.File) (string, error) {
	fd, st, err := openNode(meta, journal)
	if errors.Is(err, unix.ENOENT) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("open reset journal: %w", err)
	}
	defer unix.Close(fd)
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return "", errors.New("reset journal is not a regular file")
	}
	data, err := readNode(fd, 4096)
	if err != nil {
		return "", fmt.Errorf("read reset journal: %w", err)
	}
	var j struct{ ID string }
	err = json.Unmarshal(data, &j)
	if _, perr := strconv.ParseUint(j.ID, 10, 64); err != nil || perr != nil {
		return "", fmt.Errorf("reset journal is corrupt (%q); refusing to guess", data)
	}
	return j.ID, nil
}

// newFilterEnv hands the filters the baseline's contents.
func newFilterEnv(base []baseFile) *profile.FilterEnv {
	files := map[string][]byte{}
	for _, f := range base {
		files[f.rel] = f.data
	}
	return profile.NewFilterEnv(files)
}
