package guard

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/shrooms-cage/shrooms/pkg/mounts"
)

// Load is a worktree file a trusted file loads by reference, trusted by
// digest like a guarded root.
type Load struct {
	// Type is "file", "dir" (agents load nothing from a directory: only
	// its type is trusted) or "absent".
	Type   string `json:"type"`
	Digest string `json:"digest,omitempty"`
	// By says which trusted file loads it, and how.
	By string `json:"by"`
}

// Pattern is an opencode instructions glob (worktree-relative): every file
// it matches is a load, including files created after the trust.
type Pattern struct {
	Glob string `json:"glob"`
	By   string `json:"by"`
}

// Outside is a reference out of the worktree, not followed (see
// docs/residual-risks.md, "What the worktree guard follows").
type Outside struct {
	By   string `json:"by"`
	Spec string `json:"spec"`
}

// loadSet is what the trusted files reference.
type loadSet struct {
	loads    map[string]Load
	patterns []Pattern
	hostRefs map[string]string
	outside  []Outside
	// data holds the bytes of loads captured now, for the store.
	data map[string][]byte
}

// resolver resolves the references of a manifest's trusted entries.
type resolver struct {
	store  Store
	root   *os.File // the worktree
	m      *Manifest
	old    *Manifest
	only   map[string]bool // partial trust: the named paths
	set    *loadSet
	queued map[string]bool
}

// resolveLoads finds every file the trusted entries of m load, captures
// each from the worktree (or, in a partial trust, keeps its earlier
// trusted version unless named) and returns the set. Links on the way to
// a load are refused: the guard does not follow them.
func (s Store) resolveLoads(root *os.File, m, old *Manifest, only map[string]bool) (*resolver, error) {
	r := &resolver{store: s, root: root, m: m, old: old, only: only, queued: map[string]bool{},
		set: &loadSet{loads: map[string]Load{}, hostRefs: map[string]string{}, data: map[string][]byte{}}}
	for _, rel := range slices.Sorted(maps.Keys(m.Entries)) {
		if err := r.entry(rel, m.Entries[rel]); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// entry reads one trusted root's files for references.
func (r *resolver) entry(rel string, e Entry) error {
	if e.Type == "symlink" && !e.OutOfTree {
		return r.linkRoot(rel, e)
	}
	if e.OutOfTree || (e.Type != "file" && e.Type != "dir") {
		return nil
	}
	files, err := r.store.trustedFiles(rel, e)
	if err != nil {
		return err
	}
	for _, f := range files {
		base := path.Base(f.rel)
		switch {
		case base == "opencode.json" || base == "opencode.jsonc":
			for _, rf := range opencodeRefs(f.rel, f.data) {
				if err := r.add(rf, f.rel, f.rel, "an opencode instructions or {file:} reference of the trusted "+f.rel, 0, false); err != nil {
					return err
				}
			}
		case base == "GEMINI.md":
			r.queued[f.rel] = true
			if err := r.gemini(f.rel, f.data, f.rel, 1); err != nil {
				return err
			}
		case base == "CLAUDE.md" || base == "CLAUDE.local.md" || (e.Type == "dir" && strings.HasSuffix(base, ".md") && isMarkdownRoot(rel)):
			r.queued[f.rel] = true
			if err := r.claude(f.rel, f.data, f.rel, 1); err != nil {
				return err
			}
		}
		refs, why := hostRefs(f.rel, f.data)
		for _, rf := range refs {
			r.hostRef(rf, why)
		}
		refs, why = cageCommandRefs(f.rel, f.data)
		for _, rf := range refs {
			if err := r.command(rf, f.rel, why); err != nil {
				return err
			}
		}
	}
	return nil
}

// linkRoot follows a trusted guarded root that is a link within the
// worktree (CLAUDE.md -> AGENTS.md is common): agents read the target, so
// the target is trusted too — from its trusted copy when it is guarded,
// else as a load — and a CLAUDE.md's imports are resolved from the
// target's directory, as Claude Code does. A link to a directory the guard
// does not watch is refused (a load is a file). The link itself is trusted
// by its target string (a turn that re-points it is refused).
func (r *resolver) linkRoot(rel string, e Entry) error {
	target, err := os.Readlink(filepath.Join(r.store.Dir, contentName, digestKey(e.Digest), "node"))
	if err != nil {
		return fmt.Errorf("worktree trust: the trusted copy of %s is missing (%v); run `shrooms trust` to record it again", rel, err)
	}
	t, outside := resolveSpec(ref{spec: target, base: dirOf(rel)})
	if outside || t == "" || r.queued[t] {
		return nil
	}
	r.queued[rel], r.queued[t] = true, true
	claude := path.Base(rel) == "CLAUDE.md" || path.Base(rel) == "CLAUDE.local.md"
	if root := GuardedRoot(t); root != "" {
		data, ok, err := r.store.trustedFile(r.m, root, t)
		if err != nil || !ok || !claude {
			return err
		}
		return r.claude(t, data, rel, 1)
	}
	l, data, err := r.load(t, "the target of the trusted link "+rel+" (agents read it as "+rel+")")
	if err != nil {
		return err
	}
	if l.Type == "dir" {
		return fmt.Errorf("worktree trust: %s links to the directory %s, which the guard does not watch; put the directory itself at %s, or remove the link", rel, t, rel)
	}
	r.set.loads[t] = l
	if !claude || l.Type != "file" {
		return nil
	}
	return r.claude(t, data, rel, 1)
}

// isMarkdownRoot: the guarded directories whose Markdown files the agents
// read as instructions, skills or commands (with `@file` references).
func isMarkdownRoot(root string) bool {
	switch path.Base(root) {
	case ".claude", ".agents", ".opencode":
		return true
	}
	return false
}

// claude follows the imports of one Claude Code instruction file (rel,
// its content data) at depth (its imports are at depth).
func (r *resolver) claude(rel string, data []byte, top string, depth int) error {
	if depth > maxImportDepth {
		return nil
	}
	why := "imported by the trusted " + top + " (Claude Code @import)"
	if rel != top {
		why = "imported by " + rel + ", which the trusted " + top + " imports (Claude Code @import)"
	}
	for _, spec := range claudeImports(data) {
		if err := r.add(ref{spec: spec, base: dirOf(rel)}, rel, top, why, depth, true); err != nil {
			return err
		}
	}
	return nil
}

// gemini records the imports of a trusted GEMINI.md (Gemini CLI's
// `@file`, relative to the file, depth 5 like Claude's); an imported file
// is a load trusted by digest, and its own imports are followed in turn.
func (r *resolver) gemini(rel string, data []byte, top string, depth int) error {
	if depth > maxImportDepth {
		return nil
	}
	why := "imported by the trusted " + top + " (Gemini CLI @import)"
	if rel != top {
		why = "imported by " + rel + ", which the trusted " + top + " imports (Gemini CLI @import)"
	}
	for _, spec := range geminiImports(data) {
		target, outside := resolveSpec(ref{spec: spec, base: dirOf(rel)})
		if err := r.add(ref{spec: spec, base: dirOf(rel)}, rel, top, why, depth, false); err != nil {
			return err
		}
		if outside || target == "" || GuardedRoot(target) != "" {
			continue
		}
		if l, ok := r.set.loads[target]; ok && l.Type == "file" && r.set.data[target] != nil && !r.queued[target+"\x00gemini"] {
			r.queued[target+"\x00gemini"] = true
			if err := r.gemini(target, r.set.data[target], top, depth+1); err != nil {
				return err
			}
		}
	}
	return nil
}

// add resolves one reference of the file by (loaded from the trusted
// file top) and records it; Claude imports are followed into the target.
func (r *resolver) add(rf ref, by, top, why string, depth int, claude bool) error {
	target, outside := resolveSpec(rf)
	if outside {
		spec := rf.spec
		if checkName(spec) != nil {
			spec = strconv.QuoteToASCII(spec)
		}
		if o := (Outside{By: by, Spec: spec}); !slices.Contains(r.set.outside, o) {
			r.set.outside = append(r.set.outside, o)
		}
		return nil
	}
	if target == "" || target == ".git" || strings.HasPrefix(target, ".git/") {
		return nil
	}
	if err := checkName(target); err != nil {
		return err
	}
	if rf.glob {
		r.set.patterns = append(r.set.patterns, Pattern{Glob: target, By: why})
		return nil
	}
	if r.queued[target] {
		return nil // a cycle, or a second reference: already followed
	}
	r.queued[target] = true
	if root := GuardedRoot(target); root != "" {
		// Guarded as part of its root; its own imports still count.
		if !claude {
			return nil
		}
		data, ok, err := r.store.trustedFile(r.m, root, target)
		if err != nil || !ok {
			return err
		}
		return r.claude(target, data, top, depth+1)
	}
	l, data, err := r.load(target, why)
	if err != nil {
		return err
	}
	r.set.loads[target] = l
	if claude && l.Type == "file" {
		return r.claude(target, data, top, depth+1)
	}
	return nil
}

// load is the trusted version of a load: captured from the worktree now,
// or (partial trust, not named) the earlier trusted version, or absent
// when there is none (a reference new with this trust, whose target the
// owner has not reviewed).
func (r *resolver) load(rel, why string) (Load, []byte, error) {
	if r.only != nil && !r.only[rel] {
		old, ok := r.old.loads()[rel]
		if !ok || old.Type != "file" {
			if !ok {
				old = Load{Type: "absent"}
			}
			old.By = why
			return old, nil, nil
		}
		data, err := r.store.content(old.Digest)
		if err != nil {
			return Load{}, nil, err
		}
		old.By = why
		return old, data, nil
	}
	st, data, err := captureLoad(r.root, rel)
	if err != nil {
		return Load{}, nil, err
	}
	switch st.Type {
	case "symlink":
		return Load{}, nil, fmt.Errorf("worktree trust: %s (%s) is a link or leads through one; the guard does not follow links: put the file itself there, or remove the reference", rel, why)
	case "other":
		return Load{}, nil, fmt.Errorf("worktree trust: %s (%s) is a FIFO, device or socket; only files can be trusted", rel, why)
	case "oversize":
		return Load{}, nil, fmt.Errorf("worktree trust: %s (%s) is over %d bytes and cannot be trusted; shrink it or remove the reference", rel, why, maxFileBytes)
	}
	st.By = why
	if st.Type == "file" {
		r.set.data[rel] = data
	}
	return st, data, nil
}

// command records a file a trusted hook or server command names as a
// load, when it is a file in the worktree now (a word that names nothing
// is a program name or an argument).
func (r *resolver) command(rf ref, by, why string) error {
	target, outside := resolveSpec(rf)
	if outside || target == "" || GuardedRoot(target) != "" || target == ".git" || strings.HasPrefix(target, ".git/") || r.queued[target] {
		return nil
	}
	if _, ok := r.old.loads()[target]; !ok {
		st, _, err := captureLoad(r.root, target)
		if err != nil || st.Type != "file" {
			return nil
		}
	}
	return r.add(rf, by, by, why, 0, false)
}

// hostRef records a host-side reference that names a worktree file.
func (r *resolver) hostRef(rf ref, why string) {
	target, outside := resolveSpec(rf)
	if outside || target == "" || GuardedRoot(target) != "" || target == ".git" || strings.HasPrefix(target, ".git/") {
		return
	}
	if _, ok := r.set.hostRefs[target]; ok {
		return
	}
	if !rf.absentOK {
		st, _, err := captureLoad(r.root, target)
		if err != nil || (st.Type != "file" && st.Type != "oversize") {
			return
		}
	}
	r.set.hostRefs[target] = why
}

// captureLoad reads the worktree path rel as a load: never through a link
// (openat2 beneath, no links), never opening a FIFO or device.
func captureLoad(root *os.File, rel string) (Load, []byte, error) {
	parent := root
	if d := path.Dir(rel); d != "." {
		p, l, err := openLoadDir(root, d)
		if p == nil {
			return l, nil, err
		}
		defer p.Close()
		parent = p
	}
	name := path.Base(rel)
	var st unix.Stat_t
	if err := unix.Fstatat(int(parent.Fd()), name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) {
			return Load{Type: "absent"}, nil, nil
		}
		return Load{}, nil, fmt.Errorf("worktree guard: stat %s: %w", rel, err)
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFLNK:
		return Load{Type: "symlink", Digest: linkDigest}, nil, nil
	case unix.S_IFDIR:
		return Load{Type: "dir", Digest: "dir"}, nil, nil
	case unix.S_IFREG:
	default:
		return Load{Type: "other", Digest: "other"}, nil, nil
	}
	if st.Size > maxFileBytes {
		return Load{Type: "oversize", Digest: "oversize"}, nil, nil
	}
	data, err := readFileAt(parent, name, maxFileBytes)
	if errors.Is(err, unix.ENOENT) {
		return Load{Type: "absent"}, nil, nil
	}
	if errors.Is(err, unix.ELOOP) {
		return Load{Type: "symlink", Digest: linkDigest}, nil, nil
	}
	if err != nil {
		return Load{Type: "oversize", Digest: "oversize"}, nil, nil
	}
	return Load{Type: "file", Digest: fileDigest(data, st.Mode&0o111 != 0)}, data, nil
}

const linkDigest = "link"

// openLoadDir opens the directory dir of a load one component at a time,
// each looked at first (fstatat, no follow): a link on the way makes the
// load a "symlink", a missing or non-directory component "absent" (nil
// file, the load's state in l).
func openLoadDir(root *os.File, dir string) (*os.File, Load, error) {
	cur := root
	for _, comp := range strings.Split(dir, "/") {
		var st unix.Stat_t
		err := unix.Fstatat(int(cur.Fd()), comp, &st, unix.AT_SYMLINK_NOFOLLOW)
		var l Load
		switch {
		case errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR):
			l = Load{Type: "absent"}
		case err != nil:
			l, err = Load{}, fmt.Errorf("worktree guard: stat %s: %w", dir, err)
		case st.Mode&unix.S_IFMT == unix.S_IFLNK:
			l = Load{Type: "symlink", Digest: linkDigest}
		case st.Mode&unix.S_IFMT != unix.S_IFDIR:
			l = Load{Type: "absent"}
		}
		if l.Type == "" && err == nil {
			next, oerr := openDirAt(cur, comp)
			switch {
			case oerr == nil:
				if cur != root {
					cur.Close()
				}
				cur = next
				continue
			case errors.Is(oerr, unix.ENOENT):
				l = Load{Type: "absent"}
			default: // replaced under us: a link or not a directory now
				l = Load{Type: "symlink", Digest: linkDigest}
			}
		}
		if cur != root {
			cur.Close()
		}
		return nil, l, err
	}
	return cur, Load{}, nil
}

func fileDigest(data []byte, exec bool) string {
	h := sha256.New()
	fmt.Fprintf(h, "load %t %d\n", exec, len(data))
	h.Write(data)
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}

// trusted is one file of a trusted root, read from the store.
type trusted struct {
	rel  string
	data []byte
}

// trustedFiles reads a trusted root's regular files from the store (its
// content was bounded when it was captured).
func (s Store) trustedFiles(rel string, e Entry) ([]trusted, error) {
	node := filepath.Join(s.Dir, contentName, digestKey(e.Digest), "node")
	if e.Type == "file" {
		data, err := os.ReadFile(node)
		if err != nil {
			return nil, fmt.Errorf("worktree trust: the trusted copy of %s is missing (%v); run `shrooms trust` to record it again", rel, err)
		}
		return []trusted{{rel: rel, data: data}}, nil
	}
	var out []trusted
	err := filepath.WalkDir(node, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.Type().IsRegular() {
			return nil
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		sub, _ := filepath.Rel(node, p)
		out = append(out, trusted{rel: rel + "/" + filepath.ToSlash(sub), data: data})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("worktree trust: read the trusted copy of %s: %w", rel, err)
	}
	return out, nil
}

// trustedFile reads the trusted version of the file target inside the
// trusted root root (false when it has none).
func (s Store) trustedFile(m *Manifest, root, target string) ([]byte, bool, error) {
	e, ok := m.Entries[root]
	if !ok || e.OutOfTree {
		return nil, false, nil
	}
	node := filepath.Join(s.Dir, contentName, digestKey(e.Digest))
	name := "node"
	if target != root {
		name += "/" + strings.TrimPrefix(target, root+"/")
	}
	// The stored copy keeps the root's links as links: read beneath it,
	// following none.
	dir, err := openPlainDir(node)
	if err != nil {
		return nil, false, err
	}
	defer dir.Close()
	data, err := readFileAt(dir, name, maxFileBytes)
	if err != nil {
		return nil, false, nil // not a regular file of the trusted copy
	}
	return data, true, nil
}

// content reads a stored load's bytes.
func (s Store) content(digest string) ([]byte, error) {
	data, err := os.ReadFile(filepath.Join(s.Dir, contentName, digestKey(digest), "node"))
	if err != nil {
		return nil, fmt.Errorf("worktree trust: a trusted copy is missing (%v); run `shrooms trust` to record it again", err)
	}
	return data, nil
}

// storeLoad writes a captured load's bytes to content/<digest>/node.
func (s Store) storeLoad(dir *os.File, digest string, data []byte) error {
	return s.storeContent(dir, digest, func(tdir *os.File) error {
		if err := writeFileAt(tdir, "node", data, 0o644); err != nil {
			return fmt.Errorf("worktree trust: %w", err)
		}
		return nil
	})
}

func (m *Manifest) loads() map[string]Load {
	if m == nil || m.Loads == nil {
		return map[string]Load{}
	}
	return m.Loads
}

// guardLoads compares the manifest's loads (and what its patterns match
// now) with the worktree, and plans their masks.
func (s Store) guardLoads(root *os.File, m *Manifest, matches map[string]string, c *Check) error {
	cur := map[string]Load{}
	for rel, l := range m.loads() {
		cur[rel] = l
	}
	for rel, why := range matches {
		if err := checkName(rel); err != nil {
			return err
		}
		if _, ok := cur[rel]; !ok {
			cur[rel] = Load{Type: "absent", By: why}
		}
	}
	for _, rel := range slices.Sorted(maps.Keys(cur)) {
		t := cur[rel]
		now, _, err := captureLoad(root, rel)
		if err != nil {
			return err
		}
		c.loadState = append(c.loadState, rel+" "+now.Type+" "+now.Digest)
		ch := Change{Path: rel, Type: now.Type, Why: t.By}
		switch {
		case t.Type == now.Type && t.Digest == now.Digest:
			continue
		case now.Type == "absent":
			ch.Change, ch.Type = "deleted", "absent"
		case t.Type == "absent":
			ch.Change = "added"
		case t.Type != now.Type:
			ch.Change = "type-changed"
		default:
			ch.Change = "modified"
		}
		if ch.Type == "oversize" {
			ch.Type = "file"
		}
		c.Changes = append(c.Changes, ch)
		if ch.Change == "deleted" {
			continue // nothing to load: reported only, as for guarded roots
		}
		src, err := s.loadMask(rel, t, now, ch.Why)
		if err != nil {
			return err
		}
		c.Masked = append(c.Masked, rel)
		c.Mounts = append(c.Mounts, maskMount(src, rel))
	}
	return nil
}

// loadMask is what is mounted over a changed load: its trusted copy, or an
// empty stand-in; a link or special file there is refused (a mount would
// follow the link).
func (s Store) loadMask(rel string, t, now Load, why string) (string, error) {
	switch now.Type {
	case "symlink":
		return "", fmt.Errorf("worktree guard: %s (%s) is now a link or leads through one; the guard does not follow links a turn made: remove it before the next turn", rel, why)
	case "other":
		return "", fmt.Errorf("worktree guard: %s (%s) is now a FIFO, device or socket; remove it before the next turn", rel, why)
	case "dir":
		return filepath.Join(s.Dir, emptyDirName), nil
	}
	if t.Type == "file" {
		p := filepath.Join(s.Dir, contentName, digestKey(t.Digest), "node")
		if _, err := os.Lstat(p); err != nil {
			return "", fmt.Errorf("worktree guard: the trusted copy of %s is missing (%v); run `shrooms trust` to record it again", rel, err)
		}
		return p, nil
	}
	if strings.HasSuffix(rel, ".json") || strings.HasSuffix(rel, ".jsonc") {
		return filepath.Join(s.Dir, emptyJSON), nil
	}
	return filepath.Join(s.Dir, emptyName), nil
}

// addMatch records a file an instructions pattern matches as a load.
func (r *resolver) addMatch(rel, why string) error {
	if r.queued[rel] {
		return nil
	}
	if err := checkName(rel); err != nil {
		return err
	}
	r.queued[rel] = true
	l, _, err := r.load(rel, why)
	if err != nil {
		return err
	}
	r.set.loads[rel] = l
	return nil
}

// maskMount is a read-only bind of src over /work/rel.
func maskMount(src, rel string) mounts.Mount {
	return mounts.Mount{
		Kind: mounts.Bind, Source: src, Dest: mounts.WorkDir + "/" + rel, ReadOnly: true,
		Options: []string{"rbind", "nosuid", "nodev"},
	}
}

// Referenced says why a worktree path is agent or tool config by
// reference: a load of the trusted config, a file an instructions pattern
// matches, or a file trusted host-side tool config runs ("" when none).
func (c *Check) Referenced(rel string) string {
	if c == nil {
		return ""
	}
	if why, ok := c.refs[rel]; ok {
		return why
	}
	for _, p := range c.patterns {
		if globMatch(p.Glob, rel) {
			return p.By
		}
	}
	return ""
}
