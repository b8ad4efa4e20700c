package guard

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/shrooms-cage/shrooms/pkg/mounts"
)

// manifestVersion changes when the manifest's meaning does (2: loads,
// patterns and host references; a version 1 manifest never followed them).
const manifestVersion = 2

// Manifest is the trusted project config of one task's worktree.
type Manifest struct {
	Version  int    `json:"version"`
	Worktree string `json:"worktree"`
	// Entries are the trusted guarded roots; their bytes are kept in the
	// store under content/<digest>/node.
	Entries map[string]Entry `json:"entries"`
	// Loads are the worktree files the trusted entries load by reference
	// (Claude Code @imports, opencode instructions and {file:}), trusted
	// by digest; their bytes are kept like the entries'.
	Loads map[string]Load `json:"loads,omitempty"`
	// Patterns are opencode instructions globs: what they match later is
	// a load too (trusted absent unless matched now).
	Patterns []Pattern `json:"patterns,omitempty"`
	// HostRefs are the worktree files trusted host-side tool config
	// (.envrc, pre-commit, husky, git hooks, mise, VS Code tasks, dev
	// containers) runs, with why: listed when a turn changes them.
	HostRefs map[string]string `json:"hostRefs,omitempty"`
}

// Snapshot returns the manifest's entries as a snapshot for Diff.
func (m *Manifest) Snapshot() *Snapshot {
	if m == nil {
		return &Snapshot{Entries: map[string]Entry{}}
	}
	return &Snapshot{Entries: m.Entries}
}

// trustLoads resolves what next's entries load, stores the captured
// bytes, and records the loads in next and res. notRoots are named paths
// that are no guarded root: each must be a load.
func (s Store) trustLoads(ctx context.Context, dir *os.File, worktree string, next, old *Manifest, only map[string]bool, notRoots []string, res *TrustResult) error {
	root, err := openPlainDir(worktree)
	if err != nil {
		return err
	}
	defer root.Close()
	r, err := s.resolveLoads(root, next, old, only)
	if err != nil {
		return err
	}
	if len(r.set.patterns) > 0 {
		snap, err := scanWith(ctx, worktree, nil, nil, r.set.patterns)
		if err != nil {
			return err
		}
		for _, rel := range slices.Sorted(maps.Keys(snap.matches)) {
			if err := r.addMatch(rel, snap.matches[rel]); err != nil {
				return err
			}
		}
	}
	for _, p := range notRoots {
		if _, ok := r.set.loads[p]; !ok {
			return fmt.Errorf("worktree trust: %q is not a guarded path of %s, nor a file its trusted config loads (guarded: agent config such as .claude, .opencode, opencode.json, .mcp.json, CLAUDE.md, AGENTS.md, .gemini, GEMINI.md, .env, .crushrc, crush.json, CRUSH.md, .github/hooks, .cursor, .aider.conf.yml, .amp, .envrc, .vscode; see docs/security-model.md)", p, worktree)
		}
		res.Trusted = append(res.Trusted, p)
	}
	for _, rel := range slices.Sorted(maps.Keys(r.set.data)) {
		if err := s.storeLoad(dir, r.set.loads[rel].Digest, r.set.data[rel]); err != nil {
			return err
		}
	}
	next.Loads, next.Patterns, next.HostRefs = r.set.loads, r.set.patterns, r.set.hostRefs
	res.Loads = append(res.Loads, slices.Sorted(maps.Keys(r.set.loads))...)
	res.Outside = append(res.Outside, r.set.outside...)
	return nil
}

// Store is the trust store of one task: Dir (inside shrooms' root-only
// state directory) holds manifest.json, the content of trusted roots, and
// the empty stand-ins masks use.
type Store struct {
	Dir string
}

const (
	manifestName = "manifest.json"
	contentName  = "content"
	emptyDirName = "empty-dir"
	emptyName    = "empty"
	emptyJSON    = "empty.json"
)

// Load returns the trusted manifest, or nil when nothing was trusted yet.
func (s Store) Load() (*Manifest, error) {
	b, err := os.ReadFile(filepath.Join(s.Dir, manifestName))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("worktree trust: %w", err)
	}
	var m Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("worktree trust: %s is corrupt (%v); run `shrooms trust` to record the worktree's config again", filepath.Join(s.Dir, manifestName), err)
	}
	if m.Version != manifestVersion {
		return nil, fmt.Errorf("worktree trust: %s has version %d, this shrooms reads %d; run `shrooms trust` to record it again", filepath.Join(s.Dir, manifestName), m.Version, manifestVersion)
	}
	if m.Entries == nil {
		m.Entries = map[string]Entry{}
	}
	return &m, nil
}

// TrustResult says what Trust recorded.
type TrustResult struct {
	Worktree string   `json:"worktree"`
	Trusted  []string `json:"trusted"`
	// Forgotten are paths trusted before that no longer exist.
	Forgotten []string `json:"forgotten"`
	Entries   int      `json:"entries"`
	// Loads are the files the trusted config loads by reference, now
	// trusted by digest (absent ones included); Outside the references
	// out of the worktree, not followed.
	Loads   []string  `json:"loads"`
	Outside []Outside `json:"outside"`
}

// Trust records the worktree's current guarded config as trusted: all of
// it when paths is empty, else only the given worktree-relative paths (each
// must be a guarded root that exists now or was trusted before). The
// caller holds the task lock.
func (s Store) Trust(ctx context.Context, worktree string, paths []string) (*TrustResult, error) {
	old, err := s.Load()
	if err != nil && len(paths) > 0 {
		return nil, err
	}
	if old != nil && old.Worktree != worktree && len(paths) > 0 {
		return nil, fmt.Errorf("worktree trust: the task's trusted worktree is %s, not %s; trust all of %s (no paths) to move it", old.Worktree, worktree, worktree)
	}
	if err := os.MkdirAll(s.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("worktree trust: %w", err)
	}
	dir, err := openPlainDir(s.Dir)
	if err != nil {
		return nil, err
	}
	defer dir.Close()
	if err := s.ensureStandIns(dir); err != nil {
		return nil, err
	}
	staging := "staging-" + randHex()
	if err := unix.Mkdirat(int(dir.Fd()), staging, 0o700); err != nil {
		return nil, fmt.Errorf("worktree trust: %w", err)
	}
	defer os.RemoveAll(filepath.Join(s.Dir, staging))
	st, err := openDirAt(dir, staging)
	if err != nil {
		return nil, fmt.Errorf("worktree trust: %w", err)
	}
	defer st.Close()

	var only map[string]bool
	if len(paths) > 0 {
		only = map[string]bool{}
		for _, p := range paths {
			only[p] = true
		}
	}
	now, err := scan(ctx, worktree, st, only)
	if err != nil {
		return nil, err
	}
	res := &TrustResult{Worktree: worktree, Trusted: []string{}, Forgotten: []string{}, Loads: []string{}, Outside: []Outside{}}
	var notRoots []string
	next := &Manifest{Version: manifestVersion, Worktree: worktree, Entries: map[string]Entry{}}
	if only == nil {
		next.Entries = now.Entries
		for _, rel := range now.paths() {
			res.Trusted = append(res.Trusted, rel)
		}
		if old != nil {
			for rel := range old.Entries {
				if _, ok := now.Entries[rel]; !ok {
					res.Forgotten = append(res.Forgotten, rel)
				}
			}
		}
	} else {
		for rel, e := range old.Snapshot().Entries {
			next.Entries[rel] = e
		}
		for _, p := range paths {
			e, isNow := now.Entries[p]
			_, wasTrusted := next.Entries[p]
			switch {
			case isNow:
				next.Entries[p] = e
				res.Trusted = append(res.Trusted, p)
			case wasTrusted:
				delete(next.Entries, p)
				res.Forgotten = append(res.Forgotten, p)
			default:
				notRoots = append(notRoots, p) // a load, or an error below
			}
		}
	}
	// Move each newly copied root into the content store by digest.
	for _, rel := range res.Trusted {
		e := next.Entries[rel]
		if e.OutOfTree {
			continue // a link: trusted by its target, no content to keep
		}
		if err := s.store(dir, st, rel, e.Digest); err != nil {
			return nil, err
		}
	}
	if err := s.trustLoads(ctx, dir, worktree, next, old, only, notRoots, res); err != nil {
		return nil, err
	}
	slices.Sort(res.Forgotten)
	b, err := json.MarshalIndent(next, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("worktree trust: %w", err)
	}
	tmp := filepath.Join(s.Dir, manifestName+".tmp")
	if err := os.WriteFile(tmp, append(b, '\n'), 0o600); err != nil {
		return nil, fmt.Errorf("worktree trust: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(s.Dir, manifestName)); err != nil {
		return nil, fmt.Errorf("worktree trust: %w", err)
	}
	s.prune(next)
	res.Entries = len(next.Entries)
	return res, nil
}

// store moves staging/rel into content/<digest>/node unless that exists.
func (s Store) store(dir, staging *os.File, rel, digest string) error {
	return s.storeContent(dir, digest, func(tdir *os.File) error {
		parent, err := mkdirAllAt(staging, path.Dir(rel))
		if err != nil {
			return fmt.Errorf("worktree trust: %w", err)
		}
		if parent != staging {
			defer parent.Close()
		}
		if err := unix.Renameat(int(parent.Fd()), path.Base(rel), int(tdir.Fd()), "node"); err != nil {
			return fmt.Errorf("worktree trust: store %s: %w", rel, err)
		}
		return nil
	})
}

// storeContent makes content/<digest>/ unless it exists: fill puts its node
// into a fresh temporary directory, which is then renamed into place (a
// concurrent store of the same digest wins and this one is discarded).
func (s Store) storeContent(dir *os.File, digest string, fill func(tdir *os.File) error) error {
	key := digestKey(digest)
	if _, err := os.Lstat(filepath.Join(s.Dir, contentName, key, "node")); err == nil {
		return nil
	}
	content, err := mkdirAllAt(dir, contentName)
	if err != nil {
		return fmt.Errorf("worktree trust: %w", err)
	}
	defer content.Close()
	tmp := key + ".tmp-" + randHex()
	if err := unix.Mkdirat(int(content.Fd()), tmp, 0o755); err != nil {
		return fmt.Errorf("worktree trust: %w", err)
	}
	tdir, err := openDirAt(content, tmp)
	if err != nil {
		return fmt.Errorf("worktree trust: %w", err)
	}
	defer tdir.Close()
	if err := unix.Fchmod(int(tdir.Fd()), 0o755); err != nil {
		return fmt.Errorf("worktree trust: %w", err)
	}
	if err := fill(tdir); err != nil {
		return err
	}
	if err := unix.Renameat(int(content.Fd()), tmp, int(content.Fd()), key); err != nil {
		if errors.Is(err, unix.ENOTEMPTY) || errors.Is(err, unix.EEXIST) {
			return os.RemoveAll(filepath.Join(s.Dir, contentName, tmp))
		}
		return fmt.Errorf("worktree trust: store %s: %w", key, err)
	}
	return nil
}

// prune removes content no trusted entry names any more.
func (s Store) prune(m *Manifest) {
	keep := map[string]bool{}
	for _, e := range m.Entries {
		keep[digestKey(e.Digest)] = true
	}
	for _, l := range m.Loads {
		keep[digestKey(l.Digest)] = true
	}
	names, _ := os.ReadDir(filepath.Join(s.Dir, contentName))
	for _, n := range names {
		if !keep[n.Name()] {
			os.RemoveAll(filepath.Join(s.Dir, contentName, n.Name()))
		}
	}
}

// ensureStandIns creates the empty file, "{}" file and empty directory that
// mask paths with no trusted version.
func (s Store) ensureStandIns(dir *os.File) error {
	for _, f := range []struct {
		name string
		data []byte
	}{{emptyName, nil}, {emptyJSON, []byte("{}\n")}} {
		if err := writeFileAt(dir, f.name, f.data, 0o644); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("worktree trust: %w", err)
		}
	}
	if err := unix.Mkdirat(int(dir.Fd()), emptyDirName, 0o755); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("worktree trust: %w", err)
	}
	return nil
}

// Check is the guard's verdict for one turn.
type Check struct {
	// Trusted is false when the task had no trusted record yet (the first
	// turn: the worktree as the owner hands it over becomes the trusted
	// version).
	Trusted bool `json:"trusted"`
	// Recorded is true in the turn that recorded the trusted version.
	Recorded bool `json:"recorded,omitempty"`
	// Changes are every guarded path that differs from its trusted version.
	Changes []Change `json:"changes"`
	// Masked are the paths masked in this turn's cage.
	Masked []string `json:"masked"`
	// Digest identifies the worktree's guarded state (prepared cages match it).
	Digest string `json:"digest"`
	// Visited is the number of worktree entries scanned.
	Visited int `json:"visited"`
	// DirsCached counts the directories whose listing came from the
	// guard's directory cache (unchanged since the last turn), DirsRead
	// those read.
	DirsCached int `json:"dirsCached,omitempty"`
	DirsRead   int `json:"dirsRead,omitempty"`
	// OpencodeProjectConfig is false when opencode must ignore project
	// config (OPENCODE_DISABLE_PROJECT_CONFIG=1): something of it is
	// untrusted, or the owner trusted none.
	OpencodeProjectConfig bool `json:"opencodeProjectConfig"`
	// Mounts mask the changed paths: read-only binds over /work/<path>.
	Mounts []mounts.Mount `json:"-"`
	// loadState is the loads' state now (part of Digest); refs and
	// patterns what Referenced reads.
	loadState []string
	refs      map[string]string
	patterns  []Pattern
	// dirStats are the directory stats the guard's scan took (DirStats).
	dirStats *DirStats
}

// DirStats is the table of the directory stats this check's scan took, for
// the change scan before the same turn (nil-safe; empty once taken).
func (c *Check) DirStats() *DirStats {
	if c == nil {
		return nil
	}
	return c.dirStats
}

// Guard compares worktree with the trusted manifest m (nil: none yet, so
// nothing is masked) and plans the masks. Symbolic links and special files
// at guarded paths that the owner did not trust are refused: a mount over
// them would follow the link.
func (s Store) Guard(ctx context.Context, worktree string, m *Manifest) (*Check, error) {
	var patterns []Pattern
	if m != nil {
		patterns = m.Patterns
	}
	stats := &DirStats{}
	now, err := scanCached(ctx, worktree, nil, nil, patterns, s.Dir, stats)
	if err != nil {
		return nil, err
	}
	c := &Check{Trusted: m != nil, Changes: []Change{}, Masked: []string{}, Visited: now.Visited, DirsCached: now.DirsCached, DirsRead: now.DirsRead, dirStats: stats}
	if m == nil {
		c.Digest = snapshotDigest(now, nil)
		c.OpencodeProjectConfig = hasOpencode(now)
		return c, nil
	}
	if m.Worktree != worktree {
		return nil, fmt.Errorf("worktree guard: the task's trusted worktree is %s, not %s; run `shrooms trust --task TASK --worktree %s` to trust this one", m.Worktree, worktree, worktree)
	}
	c.Changes = Diff(m.Snapshot(), now)
	untrustedOpencode := false
	for _, ch := range Executable(c.Changes) {
		if IsOpencode(ch.Path) {
			untrustedOpencode = true
		}
		src, err := s.maskSource(m, ch)
		if err != nil {
			return nil, err
		}
		c.Masked = append(c.Masked, ch.Path)
		c.Mounts = append(c.Mounts, maskMount(src, ch.Path))
	}
	root, err := openPlainDir(worktree)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	if err := s.guardLoads(root, m, now.matches, c); err != nil {
		return nil, err
	}
	slices.SortFunc(c.Changes, func(a, b Change) int { return strings.Compare(a.Path, b.Path) })
	slices.Sort(c.Masked)
	slices.SortFunc(c.Mounts, func(a, b mounts.Mount) int { return strings.Compare(a.Dest, b.Dest) })
	c.Digest = snapshotDigest(now, c.loadState)
	c.OpencodeProjectConfig = !untrustedOpencode && hasOpencode(m.Snapshot())
	c.refs, c.patterns = map[string]string{}, m.Patterns
	for rel, l := range m.Loads {
		c.refs[rel] = l.By
	}
	for rel, why := range m.HostRefs {
		c.refs[rel] = why
	}
	return c, nil
}

// maskSource is the host path mounted over a changed guarded path: the
// trusted bytes when the trusted version has the path's current type, else
// an empty stand-in of that type.
func (s Store) maskSource(m *Manifest, ch Change) (string, error) {
	switch ch.Type {
	case "file", "dir":
	case "symlink":
		if Why(ch.Path) == "" {
			return "", fmt.Errorf("worktree guard: %s is a symlink out of the worktree the owner did not trust (agents would read what it points to); remove it, or accept it with `shrooms trust --task TASK %s`", ch.Path, ch.Path)
		}
		return "", fmt.Errorf("worktree guard: %s is a symlink the owner did not trust (a mask would follow it); remove it, or accept it with `shrooms trust --task TASK %s`", ch.Path, ch.Path)
	default:
		return "", fmt.Errorf("worktree guard: %s is a FIFO, device or socket the owner did not trust; remove it before the next turn", ch.Path)
	}
	if t, ok := m.Entries[ch.Path]; ok && t.Type == ch.Type {
		p := filepath.Join(s.Dir, contentName, digestKey(t.Digest), "node")
		if _, err := os.Lstat(p); err != nil {
			return "", fmt.Errorf("worktree guard: the trusted copy of %s is missing (%v); run `shrooms trust` to record it again", ch.Path, err)
		}
		return p, nil
	}
	switch {
	case ch.Type == "dir":
		return filepath.Join(s.Dir, emptyDirName), nil
	case strings.HasSuffix(ch.Path, ".json") || strings.HasSuffix(ch.Path, ".jsonc"):
		return filepath.Join(s.Dir, emptyJSON), nil
	}
	return filepath.Join(s.Dir, emptyName), nil
}

func hasOpencode(s *Snapshot) bool {
	for rel := range s.Entries {
		if IsOpencode(rel) {
			return true
		}
	}
	return false
}

func snapshotDigest(s *Snapshot, loads []string) string {
	h := sha256.New()
	for _, rel := range s.paths() {
		e := s.Entries[rel]
		fmt.Fprintf(h, "%q %s %s %t\n", rel, e.Type, e.Digest, e.Oversize)
	}
	for _, l := range loads {
		fmt.Fprintf(h, "load %q\n", l)
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}

func digestKey(d string) string { return strings.TrimPrefix(d, "sha256:") }

func randHex() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func openPlainDir(p string) (*os.File, error) {
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("worktree trust: open %s: %w", p, err)
	}
	return os.NewFile(uintptr(fd), p), nil
}
