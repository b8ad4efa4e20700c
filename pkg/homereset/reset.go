package homereset

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/shrooms-cage/shrooms/pkg/profile"
	"golang.org/x/sys/unix"
)

// ResetInput is a Task plus reset options.
type ResetInput struct {
	Task
	// DryRun reports what a reset would do and changes nothing.
	DryRun bool
}

// Reset runs before every turn. It first completes any reset that was
// interrupted (kill -9, power loss), then replaces HOME with a fresh tree
// holding only the keep-list (validated; mixed files rebuilt) and the
// baseline, owned by UID:GID. On success Report.Home is the directory to
// bind-mount at /home/agent; on error no turn may start. The old tree is left
// in the trash for Cleanup. The HOME must have been bootstrapped.
func Reset(ctx context.Context, in ResetInput) (*Report, error) {
	start := time.Now()
	if err := checkTask(in.Task); err != nil {
		return nil, err
	}
	all := in.keptProfiles()
	rules, _ := profile.KeepList(all)
	base, err := baseline(&in.Config.Home, in.Profiles, rules)
	if err != nil {
		return nil, fmt.Errorf("HOME baseline: %w", err)
	}
	// The filters read the owner's config of every kept profile (opencode's
	// MCP server URLs), also in a turn whose agent does not lay it down.
	envBase := base
	if len(all) > len(in.Profiles) {
		if b, err := baseline(&in.Config.Home, all, rules); err == nil {
			envBase = b
		}
	}
	v, err := openVolume(in.Root, in.DryRun)
	if err != nil {
		return nil, err
	}
	defer v.close()
	if ok, err := exists(v.meta, markerName); err != nil {
		return nil, err
	} else if !ok {
		return nil, fmt.Errorf("task HOME %s is not bootstrapped; run bootstrap first", in.Root)
	}
	rep := &Report{Home: HomeDir(in.Root), DryRun: in.DryRun, Profiles: in.Profiles, KeptProfiles: all[len(in.Profiles):],
		Kept: []string{}, Rebuilt: []string{}, Seeded: []string{}, Removed: []string{}, Warnings: []string{}, Dropped: []Drop{}, Baseline: []string{}}
	for _, f := range base {
		rep.Baseline = append(rep.Baseline, f.rel)
	}
	rep.BaselineDigest = digest(base)
	if !in.DryRun {
		if err := releaseReserveIfShort(v.meta); err != nil {
			return nil, err
		}
		if err := unix.Mkdirat(int(v.meta.Fd()), trashName, 0o700); err != nil && !errors.Is(err, unix.EEXIST) {
			return nil, fmt.Errorf("create trash: %w", err)
		}
	}
	trash, err := openDir(v.meta, trashName, v.dev)
	if errors.Is(err, unix.ENOENT) && in.DryRun {
		trash, err = openDir(v.meta, ".", v.dev)
	}
	if err != nil {
		return nil, err
	}
	defer trash.Close()
	s := &resetter{in: in, v: v, trash: trash, rules: rules, base: base, env: newFilterEnv(envBase), lines: loadLineCache(v.meta)}
	s.env.Own, s.env.APIKey = in.Profiles, in.APIKey

	id, err := readJournal(v.meta)
	if err != nil {
		return nil, err
	}
	if in.DryRun {
		src := homeName
		dir := v.root
		if id != "" {
			rep.Recovered = "would complete interrupted reset " + id
			if ok, _ := exists(trash, oldPfx+id); ok {
				if hok, _ := exists(v.root, homeName); !hok {
					src, dir = oldPfx+id, trash
				}
			}
		}
		if err := s.build(ctx, dir, src, nil, rep); err != nil {
			return nil, err
		}
		rep.Duration = time.Since(start)
		return rep, nil
	}
	if id != "" {
		what, err := s.recover(ctx, id)
		if err != nil {
			return nil, fmt.Errorf("complete interrupted reset %s: %w", id, err)
		}
		rep.Recovered = what
	}
	id = strconv.FormatInt(time.Now().UnixNano(), 10)
	if err := s.run(ctx, id, rep); err != nil {
		return nil, err
	}
	rep.Duration = time.Since(start)
	return rep, nil
}

type resetter struct {
	in    ResetInput
	v     *volume
	trash *os.File
	rules []profile.Rule
	base  []baseFile
	env   *profile.FilterEnv
	// lines is what the last reset wrote of each rebuilt JSONL file;
	// nextLines what this one writes (cctranscache.go).
	lines, nextLines lineCache
}

// Crash protocol for reset <id>:
//  1. write journal {id}            (durable before anything moves)
//  2. rename home → trash/old-<id>  (if home exists)
//  3. build stage-<id> from trash/old-<id> + baseline
//  4. rename stage-<id> → home
//  5. remove journal
//
// Recovery reads the journal: old-<id> absent → step 2 never happened (home
// is untouched): drop stage and journal. old-<id> and home present → step 4
// happened: drop the journal. old-<id> present, home absent → redo 3-5 from
// a fresh stage (the stage holds only links and copies; old-<id> is intact).
func (s *resetter) run(ctx context.Context, id string, rep *Report) error {
	j, _ := json.Marshal(map[string]string{"id": id})
	kuid, kgid := keeper()
	if err := writeFileAt(s.v.meta, journal, j, 0o600, kuid, kgid); err != nil {
		return fmt.Errorf("write reset journal: %w", err)
	}
	if err := s.v.meta.Sync(); err != nil {
		return err
	}
	hasHome, err := exists(s.v.root, homeName)
	if err != nil {
		return err
	}
	if hasHome {
		if err := unix.Renameat(int(s.v.root.Fd()), homeName, int(s.trash.Fd()), oldPfx+id); err != nil {
			return fmt.Errorf("move old HOME aside: %w", err)
		}
		rep.Trash = oldPfx + id
	}
	return s.finish(ctx, id, rep)
}

// finish does steps 3-5.
func (s *resetter) finish(ctx context.Context, id string, rep *Report) error {
	stage := stagePfx + id
	if _, err := removeAll(ctx, s.v.meta, stage, s.v.dev); err != nil {
		return fmt.Errorf("clear stale stage: %w", err)
	}
	if err := unix.Mkdirat(int(s.v.meta.Fd()), stage, 0o700); err != nil {
		return fmt.Errorf("create stage: %w", err)
	}
	sd, err := mkdirOwned(s.v.meta, stage, 0o700, s.in.UID, s.in.GID, s.v.dev)
	if err != nil {
		return err
	}
	defer sd.Close()
	hasOld, err := exists(s.trash, oldPfx+id)
	if err != nil {
		return err
	}
	if hasOld {
		if err := s.build(ctx, s.trash, oldPfx+id, sd, rep); err != nil {
			return err
		}
	}
	if err := s.layBaseline(sd); err != nil {
		return err
	}
	if err := s.laySeeds(sd, rep); err != nil {
		return err
	}
	if err := sd.Sync(); err != nil {
		return err
	}
	if err := unix.Renameat(int(s.v.meta.Fd()), stage, int(s.v.root.Fd()), homeName); err != nil {
		return fmt.Errorf("move new HOME into place: %w", err)
	}
	if err := s.v.root.Sync(); err != nil {
		return err
	}
	if err := s.saveLineCache(); err != nil {
		return err
	}
	if err := unix.Unlinkat(int(s.v.meta.Fd()), journal, 0); err != nil {
		return fmt.Errorf("remove reset journal: %w", err)
	}
	return s.v.meta.Sync()
}

func (s *resetter) recover(ctx context.Context, id string) (string, error) {
	hasOld, err := exists(s.trash, oldPfx+id)
	if err != nil {
		return "", err
	}
	hasHome, err := exists(s.v.root, homeName)
	if err != nil {
		return "", err
	}
	switch {
	case hasOld && !hasHome:
		scratch := &Report{}
		if err := s.finish(ctx, id, scratch); err != nil {
			return "", err
		}
		return "completed interrupted reset " + id + " (rebuilt HOME from the old tree)", nil
	default:
		if _, err := removeAll(ctx, s.v.meta, stagePfx+id, s.v.dev); err != nil {
			return "", err
		}
		if err := unix.Unlinkat(int(s.v.meta.Fd()), journal, 0); err != nil {
			return "", fmt.Errorf("remove reset journal: %w", err)
		}
		if hasOld {
			return "completed interrupted reset " + id + " (new HOME was already in place)", nil
		}
		return "discarded interrupted reset " + id + " (HOME had not been moved)", nil
	}
}

// laySeeds writes the seeded files of the turn's own profiles that the
// HOME did not keep (a fresh task's ~/.claude.json): their filters' seeds
// alone (profile.Profile.Seeded).
func (s *resetter) laySeeds(stage *os.File, rep *Report) error {
	for _, name := range s.in.Profiles {
		p, _ := profile.Lookup(name)
		for _, rel := range p.Seeded {
			ru := profile.FilterRule(s.rules, rel)
			if ru == nil {
				return fmt.Errorf("seed %s: not a filtered file of the keep-list", rel)
			}
			if err := placeAt(stage, rel, s.in.UID, s.in.GID, s.v.dev, func(d *os.File, name string) error {
				if ok, err := exists(d, name); err != nil || ok {
					return err
				}
				data, _, err := ru.FilterJSON([]byte("{}"), s.env)
				if err == nil {
					err = writeFileAt(d, name, data, ru.Mode, s.in.UID, s.in.GID)
				}
				if err == nil {
					rep.Seeded = append(rep.Seeded, rel)
				}
				return err
			}); err != nil {
				return fmt.Errorf("seed %s: %w", rel, err)
			}
		}
	}
	return nil
}

func (s *resetter) layBaseline(stage *os.File) error {
	for _, f := range s.base {
		if err := placeAt(stage, f.rel, s.in.UID, s.in.GID, s.v.dev, func(d *os.File, name string) error {
			return writeFileAt(d, name, f.data, f.mode, s.in.UID, s.in.GID)
		}); err != nil {
			return fmt.Errorf("baseline %s: %w", f.rel, err)
		}
	}
	return nil
}

// walkFrame is one directory of the old HOME being walked, and its
// counterpart in the stage (created only when something is kept below it).
type walkFrame struct {
	dir     *os.File
	segs    []string
	pending []string
	stage   *os.File
	parent  *walkFrame
}

// build walks the old HOME (srcParent/srcName) along the keep-list and, unless
// stage is nil (dry run), carries kept entries into stage. Only directories
// that may hold kept files are listed; everything else is counted as removed
// by name, never opened.
func (s *resetter) build(ctx context.Context, srcParent *os.File, srcName string, stage *os.File, rep *Report) error {
	root, err := openDir(srcParent, srcName, s.v.dev)
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return fmt.Errorf("open old HOME: %w", err)
	}
	b := &builder{ctx: ctx, s: s, rep: rep, dry: stage == nil, src: filepath.Join(s.in.Root, homeName)}
	if srcParent == s.trash {
		b.src = filepath.Join(s.in.Root, metaName, trashName, srcName)
	}
	top := &walkFrame{dir: root, stage: stage}
	stack := []*walkFrame{top}
	defer func() {
		for _, f := range stack {
			f.close(stage)
		}
	}()
	if err := b.list(top); err != nil {
		return err
	}
	n := 0
	for len(stack) > 0 {
		if n++; n%256 == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		fr := stack[len(stack)-1]
		if len(fr.pending) == 0 {
			if fr.stage != nil && fr.stage != stage {
				if err := fr.stage.Sync(); err != nil {
					return err
				}
			}
			fr.close(stage)
			stack = stack[:len(stack)-1]
			continue
		}
		name := fr.pending[0]
		fr.pending = fr.pending[1:]
		segs := append(append([]string{}, fr.segs...), name)
		rel := strings.Join(segs, "/")
		ru := profile.Match(s.rules, segs)
		descend := profile.MayContain(s.rules, segs)
		if ru == nil && !descend {
			b.removed(rel)
			continue
		}
		fd, st, err := openNode(fr.dir, name)
		if err != nil {
			b.drop(rel, fmt.Sprintf("cannot be opened safely (%v)", errors.Unwrap(err)))
			continue
		}
		typ := st.Mode & unix.S_IFMT
		switch {
		case typ == unix.S_IFDIR && descend:
			unix.Close(fd)
			if len(stack) >= maxDepth {
				b.drop(rel, "nested too deep")
				continue
			}
			d, err := openDir(fr.dir, name, s.v.dev)
			if err != nil {
				b.drop(rel, fmt.Sprintf("cannot be opened safely (%v)", errors.Unwrap(err)))
				continue
			}
			child := &walkFrame{dir: d, segs: segs, parent: fr}
			if err := b.list(child); err != nil {
				d.Close()
				return err
			}
			stack = append(stack, child)
		case typ == unix.S_IFREG && ru != nil:
			err := b.keep(fd, st, fr, name, rel, ru)
			unix.Close(fd)
			if err != nil {
				return err
			}
		default:
			unix.Close(fd)
			b.drop(rel, "is a "+typeName(typ)+", not what the keep-list expects")
		}
	}
	return nil
}

func (f *walkFrame) close(stage *os.File) {
	if f.dir != nil {
		f.dir.Close()
		f.dir = nil
	}
	if f.stage != nil && f.stage != stage {
		f.stage.Close()
	}
	f.stage = nil
}

type builder struct {
	ctx context.Context
	// src is the host path of the tree being walked, for messages.
	src   string
	s     *resetter
	rep   *Report
	dry   bool
	files int64
}

func (b *builder) list(fr *walkFrame) error {
	names, err := readNames(fr.dir)
	if err != nil {
		return fmt.Errorf("read directory %s: %w", strings.Join(fr.segs, "/"), err)
	}
	fr.pending = names
	return nil
}

func (b *builder) removed(rel string) {
	b.rep.RemovedCount++
	if len(b.rep.Removed) < maxListed {
		b.rep.Removed = append(b.rep.Removed, rel)
	} else {
		b.rep.RemovedTruncated = true
	}
}

func (b *builder) drop(rel, why string) {
	b.removed(rel)
	b.dropped(Drop{Path: rel, Reason: why}, "dropped "+rel+": "+why)
}

// unrebuilt drops rel after its rebuild failed, or returns what fails the
// reset instead: the turn's cancellation, or (stageFatal) a stage file that
// could not be created.
func (b *builder) unrebuilt(rel string, err error, stageFatal bool) error {
	if cerr := b.ctx.Err(); cerr != nil {
		return cerr
	}
	var pe *os.PathError
	if stageFatal && errors.As(err, &pe) && pe.Op == "create" {
		return fmt.Errorf("stage %s: %w", rel, err)
	}
	if u := errors.Unwrap(err); u != nil {
		err = u
	}
	b.drop(rel, fmt.Sprintf("cannot be rebuilt (%v)", err))
	return nil
}

// droppedRows records what a record or row rebuild of rel left out; rows
// names the unit counted ("" for the bare count, always shown).
func (b *builder) droppedRows(rel string, drops []profile.RowDrop, rows string) {
	for _, d := range drops {
		w := fmt.Sprintf("rebuilt %s without %s: %s", rel, d.Item, d.Reason)
		if d.Rows > 0 || rows == "" {
			w = fmt.Sprintf("rebuilt %s without %s (%d%s): %s", rel, d.Item, d.Rows, rows, d.Reason)
		}
		b.dropped(Drop{Path: rel, Item: d.Item, Rows: d.Rows, Reason: d.Reason}, w)
	}
}

// dropped records something left out of kept state, with a warning line.
func (b *builder) dropped(d Drop, warning string) {
	if len(b.rep.Warnings) < maxListed {
		b.rep.Warnings = append(b.rep.Warnings, warning)
	}
	if len(b.rep.Dropped) < maxListed {
		b.rep.Dropped = append(b.rep.Dropped, d)
	}
}

// stageDir returns fr's directory in the stage, creating the chain.
func (b *builder) stageDir(fr *walkFrame) (*os.File, error) {
	if fr.stage != nil {
		return fr.stage, nil
	}
	parent, err := b.stageDir(fr.parent)
	if err != nil {
		return nil, err
	}
	d, err := mkdirOwned(parent, fr.segs[len(fr.segs)-1], 0o700, b.s.in.UID, b.s.in.GID, b.s.v.dev)
	if err != nil {
		return nil, err
	}
	fr.stage = d
	return d, nil
}

// keep validates one kept regular file (fd is its O_PATH descriptor) and
// carries it into the stage. Validation failures drop the entry with a
// warning; only failures to write the stage are errors.
func (b *builder) keep(fd int, st unix.Stat_t, fr *walkFrame, name, rel string, ru *profile.Rule) error {
	h := &b.s.in.Config.Home
	limit := int64(h.MaxFileSize)
	if ru.Kind != profile.KindFilter {
		limit = int64(h.MaxSessionFile)
	}
	switch {
	case uint64(st.Dev) != b.s.v.dev:
		b.drop(rel, "is on another filesystem")
		return nil
	case st.Size > limit:
		b.drop(rel, fmt.Sprintf("is %d bytes, over the %d-byte cap", st.Size, limit))
		return nil
	case b.rep.KeptBytes+st.Size > int64(h.MaxKeepSize):
		b.drop(rel, "would exceed home.max_keep_size")
		return nil
	case b.files+1 > h.MaxKeepFiles:
		b.drop(rel, "would exceed home.max_keep_files")
		return nil
	}
	if ru.Kind == profile.KindLines {
		return b.keepLines(fd, st, fr, name, rel, ru, limit)
	}
	var data []byte
	var dropped []profile.FieldDrop
	if ru.Kind != profile.KindBlob || ru.Magic != "" {
		read := func() ([]byte, error) { return readHead(fd, int64(len(ru.Magic))) }
		if ru.Kind == profile.KindFilter {
			read = func() ([]byte, error) { return readNode(fd, limit) }
		}
		raw, err := read()
		if err != nil {
			b.drop(rel, fmt.Sprintf("cannot be read (%v)", err))
			return nil
		}
		if ru.Kind != profile.KindFilter {
			if (st.Size > 0 || ru.Kind == profile.KindDatabase) && string(raw) != ru.Magic {
				b.drop(rel, "does not start with the expected file signature")
				return nil
			}
		} else {
			data, dropped, err = ru.FilterJSON(raw, b.s.env)
			if err != nil {
				b.drop(rel, err.Error())
				return nil
			}
		}
	}
	if ru.Kind == profile.KindDatabase {
		return b.keepDatabase(fd, st, fr, name, rel, ru, limit)
	}
	if ru.Kind == profile.KindFilter {
		b.rebuilt(rel, st.Size)
		for _, d := range dropped {
			b.dropped(Drop{Path: rel, Item: d.Key, Reason: d.Reason}, fmt.Sprintf("rebuilt %s without key %q: %s", rel, d.Key, d.Reason))
		}
	} else {
		b.carried(rel, st.Size)
	}
	if b.dry {
		return nil
	}
	if ru.Kind == profile.KindBlob {
		return b.link(fd, fr, name, rel, ru.Mode)
	}
	dir, err := b.stageDir(fr)
	if err != nil {
		return fmt.Errorf("stage %s: %w", rel, err)
	}
	return writeFileAt(dir, name, data, ru.Mode, b.s.in.UID, b.s.in.GID)
}

// link puts exactly the inode that was checked (AT_EMPTY_PATH on its O_PATH
// fd) into fr's stage directory, and gives it to the agent with the
// keep-list's mode.
func (b *builder) link(fd int, fr *walkFrame, name, rel string, mode uint32) error {
	// The bytes were checked, not what else the cage set on the inode.
	if err := profile.RemoveXattrs("/proc/self/fd/" + strconv.Itoa(fd)); err != nil {
		return fmt.Errorf("stage %s: %w", rel, err)
	}
	dir, err := b.stageDir(fr)
	if err != nil {
		return fmt.Errorf("stage %s: %w", rel, err)
	}
	if err := unix.Linkat(fd, "", int(dir.Fd()), name, unix.AT_EMPTY_PATH); err != nil {
		return fmt.Errorf("stage %s: link: %w", rel, err)
	}
	if err := unix.Fchownat(fd, "", b.s.in.UID, b.s.in.GID, unix.AT_EMPTY_PATH); err != nil {
		return fmt.Errorf("stage %s: chown: %w", rel, err)
	}
	if err := unix.Chmod("/proc/self/fd/"+strconv.Itoa(fd), mode); err != nil {
		return fmt.Errorf("stage %s: chmod: %w", rel, err)
	}
	return nil
}

// keepDatabase rebuilds an SQLite database (fd, already checked for type,
// size and signature; opencode.db) with its -wal folded in, into the stage. A database of an
// unknown schema fails the reset; one SQLite cannot read is dropped.
func (b *builder) keepDatabase(fd int, st unix.Stat_t, fr *walkFrame, name, rel string, ru *profile.Rule, limit int64) error {
	walFd := -1
	wfd, wst, err := openNode(fr.dir, name+"-wal")
	switch {
	case errors.Is(err, unix.ENOENT):
	case err != nil:
		b.dropped(Drop{Path: rel + "-wal", Reason: "cannot be opened safely; rebuilt without it"}, fmt.Sprintf("dropped %s-wal: cannot be opened safely (%v)", rel, errors.Unwrap(err)))
	default:
		defer unix.Close(wfd)
		typ := wst.Mode & unix.S_IFMT
		switch {
		case typ != unix.S_IFREG:
			b.dropped(Drop{Path: rel + "-wal", Reason: "is a " + typeName(typ) + "; rebuilt without it"}, "dropped "+rel+"-wal: is a "+typeName(typ))
		case uint64(wst.Dev) != b.s.v.dev:
			b.dropped(Drop{Path: rel + "-wal", Reason: "is on another filesystem; rebuilt without it"}, "dropped "+rel+"-wal: is on another filesystem")
		case wst.Size > limit:
			b.dropped(Drop{Path: rel + "-wal", Reason: "over the size cap; rebuilt without it"}, fmt.Sprintf("dropped %s-wal: is %d bytes, over the %d-byte cap", rel, wst.Size, limit))
		default:
			walFd = wfd
		}
	}
	// keep checked the file against the caps already.
	var size int64
	var write func(func(io.Writer) error) error
	state := ""
	if !b.dry {
		dir, err := b.stageDir(fr)
		if err == nil && ru.Update != nil {
			state, err = b.dbState(rel)
		}
		if err != nil {
			return fmt.Errorf("stage %s: %w", rel, err)
		}
		write = func(fill func(io.Writer) error) error {
			return writeFileFrom(dir, name, ru.Mode, b.s.in.UID, b.s.in.GID, func(w io.Writer) error {
				cw := &countWriter{w: w}
				defer func() { size = cw.n }()
				return fill(cw)
			})
		}
	}
	drops, how, inPlace, err := ru.CarryDatabase(b.ctx, fd, walFd, limit, state, write)
	if how != profile.Written {
		if err != nil {
			return fmt.Errorf("stage %s: %w", rel, err)
		}
		if how == profile.CarriedUnchanged {
			b.carried(rel, st.Size) // byte for byte what the last reset wrote
			return b.link(fd, fr, name, rel, ru.Mode)
		}
		if err := b.link(fd, fr, name, rel, ru.Mode); err != nil {
			return err
		}
		size = inPlace
	}
	var se *profile.SchemaError
	if errors.As(err, &se) {
		return fmt.Errorf("%s: %s (to start this task without its sessions, delete %s/%s*)", rel, se.Error(), b.src, rel)
	}
	if err != nil {
		return b.unrebuilt(rel, err, false)
	}
	what := rel
	if walFd >= 0 {
		what += " (with -wal folded in)"
	}
	b.rebuilt(what, size)
	b.droppedRows(rel, drops, " rows")
	return nil
}

type countWriter struct {
	w io.Writer
	n int64
}

// ReadFrom lets io.Copy reach the file underneath (copy_file_range).
func (c *countWriter) ReadFrom(r io.Reader) (int64, error) {
	n, err := io.Copy(c.w, r)
	c.n += n
	return n, err
}

// dbState returns the root-only directory (in the volume's metadata, on
// HOME's filesystem, never mounted in a cage) a KindDatabase rule's Update
// keeps its state for rel in, creating it.
func (b *builder) dbState(rel string) (string, error) {
	kuid, kgid := keeper()
	d, err := mkdirOwned(b.s.v.meta, dbStateName, 0o700, kuid, kgid, b.s.v.dev)
	if err != nil {
		return "", err
	}
	defer d.Close()
	sum := sha256.Sum256([]byte(rel))
	name := hex.EncodeToString(sum[:8])
	sd, err := mkdirOwned(d, name, 0o700, kuid, kgid, b.s.v.dev)
	if err != nil {
		return "", err
	}
	sd.Close()
	return filepath.Join(b.s.in.Root, metaName, dbStateName, name), nil
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// readHead reads the first max bytes of the regular file behind an O_PATH fd.
func readHead(fd int, max int64) ([]byte, error) {
	f, err := openRegular(fd)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	buf := make([]byte, max)
	n, err := io.ReadFull(f, buf)
	if err != nil && err != io.ErrUnexpectedEOF && err != io.EOF {
		return nil, err
	}
	return buf[:n], nil
}

// carried counts a kept file carried as it is (hard-linked).
func (b *builder) carried(rel string, size int64) {
	b.files++
	b.rep.KeptBytes += size
	b.rep.KeptCount++
	b.rep.Kept = appendCapped(b.rep.Kept, rel)
}

// rebuilt counts a kept file rewritten from an allowlist (what is listed).
func (b *builder) rebuilt(what string, size int64) {
	b.files++
	b.rep.KeptBytes += size
	b.rep.Rebuilt = appendCapped(b.rep.Rebuilt, what)
}

func appendCapped(list []string, s string) []string {
	if len(list) < maxListed {
		return append(list, s)
	}
	return list
}

func typeName(t uint32) string {
	switch t {
	case unix.S_IFDIR:
		return "directory"
	case unix.S_IFLNK:
		return "symlink"
	case unix.S_IFIFO:
		return "FIFO"
	case unix.S_IFSOCK:
		return "socket"
	case unix.S_IFCHR, unix.S_IFBLK:
		return "device"
	case unix.S_IFREG:
		return "regular file"
	}
	return "special file"
}

// CleanupReport says what Cleanup deleted.
type CleanupReport struct {
	Trees  []string `json:"trees"`
	Files  int64    `json:"files"`
	Dirs   int64    `json:"dirs"`
	Errors []string `json:"errors"`
}

// Cleanup deletes the old HOME trees that resets left in the trash (and any
// stale stage), off the turn's critical path: call it after the cage has
// started, or from `shrooms gc`. It never touches the tree of a reset in
// progress or interrupted, and is safe to run concurrently with Reset.
func Cleanup(ctx context.Context, root string) (*CleanupReport, error) {
	v, err := openVolume(root, false)
	if err != nil {
		return nil, err
	}
	defer v.close()
	rep := &CleanupReport{Trees: []string{}, Errors: []string{}}
	// Under the lock: what may go. The lock is released before deleting, so
	// a Reset never waits for the deletion.
	id, err := readJournal(v.meta)
	if err != nil {
		return nil, err
	}
	var victims [][2]string // {dir, name}
	trash, err := openDir(v.meta, trashName, v.dev)
	if err == nil {
		names, _ := trash.Readdirnames(-1)
		for _, n := range names {
			if id == "" || n != oldPfx+id {
				victims = append(victims, [2]string{trashName, n})
			}
		}
		trash.Close()
	} else if !errors.Is(err, unix.ENOENT) {
		return nil, err
	}
	metaNames, _ := v.meta.Readdirnames(-1)
	for _, n := range metaNames {
		if strings.HasPrefix(n, stagePfx) && (id == "" || n != stagePfx+id) {
			victims = append(victims, [2]string{"", n})
		}
	}
	unix.Flock(int(v.lock.Fd()), unix.LOCK_UN)
	for _, vic := range victims {
		dir := v.meta
		if vic[0] != "" {
			d, err := openDir(v.meta, vic[0], v.dev)
			if err != nil {
				rep.Errors = append(rep.Errors, err.Error())
				continue
			}
			defer d.Close()
			dir = d
		}
		st, err := removeAll(ctx, dir, vic[1], v.dev)
		rep.Files += st.Files
		rep.Dirs += st.Dirs
		if err != nil {
			if ctx.Err() != nil {
				return rep, ctx.Err()
			}
			rep.Errors = append(rep.Errors, fmt.Sprintf("%s: %v", vic[1], err))
			continue
		}
		rep.Trees = append(rep.Trees, vic[1])
	}
	if err := refillReserve(v.meta); err != nil {
		rep.Errors = append(rep.Errors, err.Error())
	}
	return rep, nil
}
