package gitseal

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"time"
)

// ErrNothingToCommit is returned when the worktree matches HEAD.
var ErrNothingToCommit = errors.New("nothing to commit: the worktree matches HEAD")

// Author names the author and committer of a commit.
type Author struct {
	Name  string
	Email string
}

// overrides are set on git's command line, where they win over any file:
// whatever a config file says, nothing from it runs.
var overrides = []string{
	"core.hooksPath=/dev/null",
	"core.fsmonitor=false",
	"core.untrackedCache=false",
	"core.pager=cat",
	"core.editor=false",
	"sequence.editor=false",
	"core.askPass=",
	"core.sshCommand=",
	"core.attributesFile=/dev/null",
	"core.excludesFile=/dev/null",
	"credential.helper=",
	"diff.external=",
	"diff.ignoreSubmodules=all",
	"submodule.recurse=false",
	"status.submoduleSummary=false",
	"commit.gpgSign=false",
	"tag.gpgSign=false",
	"protocol.allow=never",
	"gc.auto=0",
	"maintenance.auto=false",
	"advice.detachedHead=false",
}

// allowedKeys are the repository config keys the sealed commit accepts
// (lower-case, "*" for one subsection). Anything else (include, includeIf,
// filter.*, diff.*, merge.*, core.fsmonitor, core.hooksPath, core.worktree,
// gpg.*, credential.*, aliases, url rewrites...) makes Commit refuse: the
// cage cannot write .git, so such a key was put there by something else,
// and the sealed path does not guess which of them are safe.
var allowedKeys = []string{
	"core.repositoryformatversion", "core.filemode", "core.bare", "core.logallrefupdates",
	"core.ignorecase", "core.precomposeunicode", "core.symlinks", "core.autocrlf", "core.eol",
	"core.safecrlf", "core.quotepath", "core.checkstat", "core.trustctime", "core.abbrev",
	"core.compression", "core.loosecompression", "core.sparsecheckout", "core.sparsecheckoutcone",
	"core.commitgraph", "core.multipackindex", "core.splitindex",
	"extensions.worktreeconfig", "extensions.objectformat",
	"remote.*.url", "remote.*.pushurl", "remote.*.fetch", "remote.*.tagopt", "remote.*.prune", "remote.*.mirror",
	"branch.*.remote", "branch.*.merge", "branch.*.rebase", "branch.*.pushremote", "branch.*.description",
	"submodule.*.url", "submodule.*.active",
	"user.name", "user.email", "init.defaultbranch", "pull.rebase", "pull.ff", "push.default",
	"fetch.prune", "gc.auto", "rerere.enabled", "index.version", "lfs.repositoryformatversion",
}

var emailOK = regexp.MustCompile(`^[^<>\s\x00]+$`)

// Commit commits everything in worktree (as `git add -A` sees it) on top of
// HEAD and returns the new commit id. It runs git on the host in a sealed
// environment: no system or global config, no variables from the caller's
// environment, HOME an empty directory, hooks, fsmonitor, pagers, editors,
// credential helpers and ssh commands disabled on the command line, and only
// plumbing (add, write-tree, commit-tree, update-ref), so no porcelain
// status, gc or signing runs. It refuses a worktree whose git metadata
// layout could have been redirected (see Resolve) or whose repository
// config holds a key outside a small allowlist. When run as root, git runs
// as the owner of the git common dir, so the repository gets no root-owned
// files.
func Commit(ctx context.Context, worktree, message string, author Author) (string, error) {
	id, _, err := CommitAs(ctx, worktree, message, author)
	return id, err
}

// DefaultAuthor authors a commit when neither the caller nor the
// repository's config names anyone.
func DefaultAuthor() Author { return Author{Name: "shrooms", Email: "shrooms@localhost"} }

// checkAuthor refuses a name or email git would mangle or misread.
func checkAuthor(author Author) error {
	for _, s := range []string{author.Name, author.Email} {
		if strings.TrimSpace(s) == "" || strings.ContainsAny(s, "<>\n\r\x00") {
			return fmt.Errorf("author %q <%s>: name and email must be non-empty, one line, without < or >", author.Name, author.Email)
		}
	}
	if !emailOK.MatchString(author.Email) {
		return fmt.Errorf("author email %q is not an address", author.Email)
	}
	return nil
}

// CommitAs is Commit that returns the author it used. A zero author means
// the owner's: user.name and user.email as the repository's own config
// files set them (read by the sealed git, no includes, no conditionals, no
// global or system config), else DefaultAuthor.
func CommitAs(ctx context.Context, worktree, message string, author Author) (string, Author, error) {
	if strings.TrimSpace(message) == "" || strings.ContainsRune(message, 0) {
		return "", author, fmt.Errorf("commit message must be non-empty text without NUL bytes")
	}
	owners := author == (Author{})
	if !owners {
		if err := checkAuthor(author); err != nil {
			return "", author, err
		}
	}
	l, err := Resolve(worktree)
	if err != nil {
		return "", author, err
	}
	g, err := newGit(l, author)
	if err != nil {
		return "", author, err
	}
	defer g.close()
	if err := g.checkConfig(ctx); err != nil {
		return "", author, err
	}
	if owners {
		author = DefaultAuthor()
		if checkAuthor(g.identity) == nil {
			author = g.identity
		}
		g.setAuthor(author)
	}
	id, err := g.commit(ctx, message)
	return id, author, err
}

// commit stages, writes and records the commit (CommitAs, once the
// repository passed its checks).
func (g *git) commit(ctx context.Context, message string) (string, error) {
	parent, err := g.run(ctx, nil, "rev-parse", "--verify", "-q", "HEAD^{commit}")
	var ee *exec.ExitError
	if errors.As(err, &ee) && ee.ExitCode() == 1 {
		parent, err = "", nil // unborn branch
	}
	if err != nil {
		return "", err
	}
	if err := g.stage(ctx); err != nil {
		return "", err
	}
	tree, err := g.run(ctx, nil, "write-tree")
	if err != nil {
		return "", err
	}
	args := []string{"commit-tree", "--no-gpg-sign"}
	if parent != "" {
		ptree, err := g.run(ctx, nil, "rev-parse", "--verify", parent+"^{tree}")
		if err != nil {
			return "", err
		}
		if ptree == tree {
			return "", ErrNothingToCommit
		}
		args = append(args, "-p", parent)
	}
	id, err := g.run(ctx, strings.NewReader(message), append(args, tree)...)
	if err != nil {
		return "", err
	}
	// Compare-and-swap: fails if HEAD moved since it was read.
	if _, err := g.run(ctx, nil, "update-ref", "-m", "shrooms commit", "HEAD", id, parent); err != nil {
		return "", err
	}
	// The real index gets the committed tree (without stat data: the
	// owner's next status re-reads the files, with the owner's own config).
	g.tmpIndex = false
	if _, err := g.run(ctx, nil, "read-tree", id); err != nil {
		return id, fmt.Errorf("committed %s, but updating the index failed: %w", id, err)
	}
	return id, nil
}

// stage builds the commit's index in a private copy of the repository's
// index. Host git never reads a repository nested in the worktree: for a
// gitlink, `git add` would read that repository's HEAD and refs, which the
// cage wrote (a FIFO there hangs the commit, a ref symlinked to a root-only
// file lands its bytes in the commit). So the nested repositories are found
// by shrooms' own walk (no link followed, nothing opened), excluded from
// `git add`, and the gitlinks the index already had are put back as they
// were: a submodule's pointer is never changed by a sealed commit. A nested
// repository the index does not know (one the turn created) is refused.
func (g *git) stage(ctx context.Context) error {
	g.tmpIndex = true
	if b, err := os.ReadFile(filepath.Join(g.l.GitDir, "index")); err == nil {
		if err := os.WriteFile(g.index, b, 0o600); err != nil {
			return fmt.Errorf("copy index: %w", err)
		}
		if g.cred != nil {
			if err := os.Chown(g.index, int(g.cred.Uid), int(g.cred.Gid)); err != nil {
				return fmt.Errorf("copy index: %w", err)
			}
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("read index: %w", err)
	}
	ls, err := g.run(ctx, nil, "ls-files", "--stage", "-z")
	if err != nil {
		return err
	}
	links := map[string]string{} // path -> "160000 <sha>"
	for _, e := range strings.Split(ls, "\x00") {
		if meta, path, ok := strings.Cut(e, "\t"); ok && strings.HasPrefix(meta, "160000 ") {
			f := strings.Fields(meta)
			links[path] = f[0] + " " + f[1]
		}
	}
	nested, bare, err := nestedRepos(ctx, g.l.Worktree)
	if err != nil {
		return err
	}
	tracked := map[string]bool{}
	for _, e := range strings.Split(ls, "\x00") {
		if _, path, ok := strings.Cut(e, "\t"); ok {
			tracked[path] = true
		}
	}
	var created []string
	for _, n := range nested {
		if _, ok := links[n]; !ok {
			created = append(created, n+"/.git")
		}
	}
	// A git directory laid out in the tree (a bare repository) that the
	// index does not track: committed, it would be the owner's in every
	// checkout, and git there runs its config.
	for _, b := range bare {
		if !tracked[b+"/HEAD"] {
			created = append(created, b)
		}
	}
	slices.Sort(created)
	if len(created) > 0 {
		return fmt.Errorf("the worktree holds nested repositories the index does not know (%s): the sealed commit never reads a repository the turn made; they stay with the task's user, so the owner's git refuses them too; review them as root, then remove them, or chown them to the owner and commit by hand", strings.Join(created, ", "))
	}
	if len(links) > 0 {
		var in strings.Builder
		for p := range links {
			in.WriteString(p + "\x00")
		}
		if _, err := g.run(ctx, strings.NewReader(in.String()), "update-index", "--force-remove", "-z", "--stdin"); err != nil {
			return err
		}
	}
	args := []string{"add", "-A", "--", "."}
	for p := range links {
		args = append(args, ":(exclude,literal)"+p)
	}
	if _, err := g.run(ctx, nil, args...); err != nil {
		return err
	}
	if len(links) > 0 {
		var in strings.Builder
		for p, meta := range links {
			in.WriteString(meta + "\t" + p + "\x00")
		}
		if _, err := g.run(ctx, strings.NewReader(in.String()), "update-index", "-z", "--index-info"); err != nil {
			return err
		}
	}
	return nil
}

type git struct {
	bin      string
	l        *Layout
	home     string // an empty HOME
	tmp      string // holds the private index
	index    string
	tmpIndex bool // run against the private index
	env      []string
	cred     *syscall.Credential
	// identity is user.name and user.email as the repository's config
	// files set them (checkConfig).
	identity Author
}

// setAuthor makes a the author and committer of the commit.
func (g *git) setAuthor(a Author) {
	env := g.env[:0:0]
	for _, kv := range g.env {
		if !strings.HasPrefix(kv, "GIT_AUTHOR_") && !strings.HasPrefix(kv, "GIT_COMMITTER_") {
			env = append(env, kv)
		}
	}
	g.env = append(env, "GIT_AUTHOR_NAME="+a.Name, "GIT_AUTHOR_EMAIL="+a.Email, "GIT_COMMITTER_NAME="+a.Name, "GIT_COMMITTER_EMAIL="+a.Email)
}

func newGit(l *Layout, a Author) (*git, error) {
	bin, err := exec.LookPath("git")
	if err != nil {
		return nil, fmt.Errorf("git not found: %w", err)
	}
	if bin, err = filepath.Abs(bin); err != nil {
		return nil, err
	}
	home, err := os.MkdirTemp("", "shrooms-git-home-")
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(home, 0o555); err != nil {
		os.Remove(home)
		return nil, err
	}
	tmp, err := os.MkdirTemp("", "shrooms-git-index-")
	if err != nil {
		os.Remove(home)
		return nil, err
	}
	g := &git{bin: bin, l: l, home: home, tmp: tmp, index: filepath.Join(tmp, "index")}
	g.env = []string{
		"PATH=" + filepath.Dir(bin) + ":/usr/bin:/bin",
		"HOME=" + home,
		"LC_ALL=C",
		"GIT_CONFIG_NOSYSTEM=1",
		"GIT_CONFIG_GLOBAL=/dev/null",
		"GIT_DIR=" + l.GitDir,
		"GIT_WORK_TREE=" + l.Worktree,
		"GIT_TERMINAL_PROMPT=0",
		"GIT_NO_REPLACE_OBJECTS=1",
		"GIT_AUTHOR_NAME=" + a.Name, "GIT_AUTHOR_EMAIL=" + a.Email,
		"GIT_COMMITTER_NAME=" + a.Name, "GIT_COMMITTER_EMAIL=" + a.Email,
	}
	if os.Geteuid() == 0 {
		var st syscall.Stat_t
		if err := syscall.Stat(l.CommonDir, &st); err != nil {
			g.close()
			return nil, fmt.Errorf("git common dir: %w", err)
		}
		if st.Uid != 0 {
			g.cred = &syscall.Credential{Uid: st.Uid, Gid: st.Gid, Groups: []uint32{}}
			if err := os.Chown(tmp, int(st.Uid), int(st.Gid)); err != nil {
				g.close()
				return nil, err
			}
		}
	}
	return g, nil
}

func (g *git) close() {
	os.Remove(g.home)
	os.RemoveAll(g.tmp)
}

func (g *git) args(sub ...string) []string {
	a := make([]string, 0, 2*len(overrides)+8+len(sub))
	for _, o := range overrides {
		a = append(a, "-c", o)
	}
	for _, d := range []string{g.l.Worktree, g.l.GitDir, g.l.CommonDir} {
		a = append(a, "-c", "safe.directory="+d)
	}
	return append(a, sub...)
}

// gitCallTimeout bounds every host git call: whatever the worktree holds,
// a commit returns (and releases the task lock).
const gitCallTimeout = 2 * time.Minute

// run runs one git subcommand and returns its trimmed stdout.
func (g *git) run(ctx context.Context, stdin *strings.Reader, sub ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, gitCallTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, g.bin, g.args(sub...)...)
	cmd.Env = g.env
	if g.tmpIndex {
		cmd.Env = append(cmd.Env[:len(cmd.Env):len(cmd.Env)], "GIT_INDEX_FILE="+g.index)
	}
	cmd.Dir = g.l.Worktree
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: g.cred, Setpgid: true}
	cmd.WaitDelay = 5 * time.Second
	if stdin != nil {
		cmd.Stdin = stdin
	}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(errb.String())
		if len(msg) > 2000 {
			msg = msg[:2000] + "…"
		}
		return strings.TrimSpace(out.String()), fmt.Errorf("sealed git %s: %w: %s", sub[0], err, msg)
	}
	return strings.TrimSpace(out.String()), nil
}

// checkConfig reads the repository's config files (without following
// includes) and refuses any key outside allowedKeys.
func (g *git) checkConfig(ctx context.Context) error {
	files := []string{filepath.Join(g.l.CommonDir, "config"), filepath.Join(g.l.CommonDir, "config.worktree")}
	if g.l.GitDir != g.l.CommonDir {
		files = append(files, filepath.Join(g.l.GitDir, "config.worktree"))
	}
	for _, f := range files {
		fi, err := os.Lstat(f)
		if os.IsNotExist(err) {
			continue
		}
		if err != nil || !fi.Mode().IsRegular() {
			return fmt.Errorf("repository config %s is not a regular file (refused)", f)
		}
		out, err := g.run(ctx, nil, "config", "--file", f, "--no-includes", "--null", "--list")
		if err != nil {
			return fmt.Errorf("read repository config %s: %w", f, err)
		}
		for _, kv := range strings.Split(out, "\x00") {
			if kv == "" {
				continue
			}
			key, val, _ := strings.Cut(kv, "\n")
			switch strings.ToLower(key) {
			case "user.name":
				g.identity.Name = val
			case "user.email":
				g.identity.Email = val
			}
			if !allowedKey(key) {
				return fmt.Errorf("repository config %s sets %q, which the sealed commit path does not allow (it could run or redirect code on the host); remove it or commit by hand", f, key)
			}
			if strings.EqualFold(key, "core.bare") && !strings.EqualFold(val, "false") {
				return fmt.Errorf("repository config %s sets core.bare = %s (refused)", f, val)
			}
		}
	}
	return nil
}

// allowedKey matches section.key or section.<subsection>.key against
// allowedKeys; sections and keys are case-insensitive, subsections are not
// compared (any subsection name matches "*").
func allowedKey(key string) bool {
	first := strings.IndexByte(key, '.')
	last := strings.LastIndexByte(key, '.')
	if first < 0 {
		return false
	}
	norm := strings.ToLower(key)
	if first != last {
		norm = strings.ToLower(key[:first]) + ".*." + strings.ToLower(key[last+1:])
	}
	for _, k := range allowedKeys {
		if k == norm {
			return true
		}
	}
	return false
}
