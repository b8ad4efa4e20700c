package gitseal

import (
	"context"
	"fmt"
	"golang.org/x/sys/unix"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/shrooms-cage/shrooms/internal/itest"
)

// hostGit runs git for the test's own setup and checks, with no user or
// system config.
func hostGit(t testing.TB, dir string, args ...string) string {
	t.Helper()
	return strings.TrimSpace(hostGitRaw(t, dir, args...))
}

func hostGitRaw(t testing.TB, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", append([]string{"-c", "safe.directory=*", "-c", "init.defaultBranch=main", "-c", "core.hooksPath=/dev/null"}, args...)...)
	cmd.Dir = dir
	cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=/nonexistent", "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null",
		"GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@t", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@t"}
	out, err := cmd.CombinedOutput()
	assert.NilError(t, err, "git %v: %s", args, out)
	return string(out)
}

func newRepo(t *testing.T) string {
	wt := filepath.Join(t.TempDir(), "repo")
	assert.NilError(t, os.Mkdir(wt, 0o755))
	hostGit(t, wt, "init", "-q")
	assert.NilError(t, os.WriteFile(filepath.Join(wt, "README"), []byte("hello\n"), 0o644))
	hostGit(t, wt, "add", "README")
	hostGit(t, wt, "commit", "-q", "-m", "init")
	return wt
}

var author = Author{Name: "Shrooms Test", Email: "shrooms@example.invalid"}

// payload is an executable that records that it ran (marker dir/name) and
// passes its input through, so it works as a filter, pager or driver.
type payloads struct{ dir, markers string }

func newPayloads(t *testing.T) payloads {
	p := payloads{dir: t.TempDir(), markers: t.TempDir()}
	return p
}

func (p payloads) script(t *testing.T, name string) string {
	path := filepath.Join(p.dir, name)
	body := fmt.Sprintf("#!/bin/sh\ntouch %s/%s\ncat 2>/dev/null\nexit 0\n", p.markers, name)
	assert.NilError(t, os.WriteFile(path, []byte(body), 0o755))
	return path
}

func (p payloads) fired(t *testing.T) []string {
	ents, err := os.ReadDir(p.markers)
	assert.NilError(t, err)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

// gitconfigVectors is a config file that sets every execution vector of the
// issue, each pointing at its own payload.
func gitconfigVectors(t *testing.T, p payloads, tag string) string {
	s := func(n string) string { return p.script(t, tag+"-"+n) }
	inc := filepath.Join(p.dir, tag+"-included")
	assert.NilError(t, os.WriteFile(inc, []byte("[core]\n\tfsmonitor = "+s("included-fsmonitor")+"\n"), 0o644))
	hooks := filepath.Join(p.dir, tag+"-hooks")
	assert.NilError(t, os.MkdirAll(hooks, 0o755))
	for _, h := range []string{"pre-commit", "post-commit", "reference-transaction", "post-index-change", "pre-auto-gc"} {
		assert.NilError(t, os.WriteFile(filepath.Join(hooks, h), []byte(fmt.Sprintf("#!/bin/sh\ntouch %s/%s-hookspath-%s\n", p.markers, tag, h)), 0o755))
	}
	return fmt.Sprintf(`[core]
	fsmonitor = %s
	hooksPath = %s
	sshCommand = %s
	pager = %s
	editor = %s
	askPass = %s
	alternateRefsCommand = %s
[filter "evil"]
	clean = %s
	smudge = %s
	process = %s
	required = true
[diff]
	external = %s
[diff "evil"]
	textconv = %s
	command = %s
[merge "evil"]
	driver = %s
[credential]
	helper = %s
[commit]
	gpgSign = true
[gpg]
	program = %s
[include]
	path = %s
[includeIf "gitdir:/"]
	path = %s
[sequence]
	editor = %s
`, s("fsmonitor"), hooks, s("sshcommand"), s("pager"), s("editor"), s("askpass"), s("alternaterefs"),
		s("filter-clean"), s("filter-smudge"), s("filter-process"), s("diff-external"), s("textconv"), s("diff-command"),
		s("merge-driver"), s("credential"), s("gpg"), inc, inc, s("sequence-editor"))
}

// worktreeFiles lists the worktree's files (not .git) and their contents.
func worktreeFiles(t *testing.T, wt string) map[string]string {
	m := map[string]string{}
	assert.NilError(t, filepath.WalkDir(wt, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(wt, p)
		if rel == ".git" && d.IsDir() {
			return filepath.SkipDir
		}
		if rel == ".git" {
			return nil
		}
		if d.Type().IsRegular() {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			m[rel] = string(b)
		}
		return nil
	}))
	return m
}

// treeFiles lists the files of a commit and their blob contents.
func treeFiles(t *testing.T, wt, commit string) map[string]string {
	m := map[string]string{}
	for _, line := range strings.Split(hostGit(t, wt, "ls-tree", "-r", "-z", "--full-tree", commit), "\x00") {
		if line == "" {
			continue
		}
		meta, path, _ := strings.Cut(line, "\t")
		f := strings.Fields(meta)
		if f[0] == "160000" {
			m[path] = "gitlink"
			continue
		}
		m[path] = hostGitRaw(t, wt, "cat-file", "blob", f[2])
	}
	return m
}

// TestCommitExecutesNothingPlanted plants every vector the cage can plant
// (worktree files, its own ~/.gitconfig, the caller's environment) plus hooks
// in .git/hooks, and commits: no payload runs, and the commit holds exactly
// the worktree.
func TestCommitExecutesNothingPlanted(t *testing.T) {
	wt := newRepo(t)
	p := newPayloads(t)
	nested := ownerNestedRepo(t, wt, "sub")
	// Hooks in the repository's own hooks directory.
	for _, h := range []string{"pre-commit", "commit-msg", "post-commit", "reference-transaction", "post-index-change", "pre-auto-gc", "fsmonitor-watchman"} {
		assert.NilError(t, os.WriteFile(filepath.Join(wt, ".git", "hooks", h), []byte(fmt.Sprintf("#!/bin/sh\ntouch %s/githooks-%s\n", p.markers, h)), 0o755))
	}
	// What a turn writes into the worktree.
	files := map[string]string{
		".gitattributes":          "* filter=evil diff=evil merge=evil\n*.txt text eol=crlf\n",
		"code.txt":                "line one\nline two\n",
		"HEAD":                    "ref: refs/heads/evil\n",
		"config":                  gitconfigVectors(t, p, "wtconfig"),
		"hooks/pre-commit":        "#!/bin/sh\ntouch " + p.markers + "/wt-hook\n",
		"objects/info/alternates": "/etc\n",
		"gitdir":                  "/tmp\n",
		".gitmodules":             "[submodule \"x\"]\n\tpath = sub\n\turl = ./x\n\tupdate = !" + p.script(t, "submodule-update") + "\n",
		"README":                  "changed by the turn\n",
		"dir/nested.bin":          "\x00\x01\x02binary\r\n",
	}
	for name, content := range files {
		path := filepath.Join(wt, name)
		assert.NilError(t, os.MkdirAll(filepath.Dir(path), 0o755))
		assert.NilError(t, os.WriteFile(path, []byte(content), 0o755))
	}
	// The owner's submodule-like nested repository (a gitlink in the index);
	// the turn then rewrites its config with every vector.
	assert.NilError(t, os.WriteFile(filepath.Join(nested, ".git", "config"), []byte(gitconfigVectors(t, p, "nested")), 0o644))
	assert.NilError(t, os.WriteFile(filepath.Join(nested, ".gitattributes"), []byte("* filter=evil\n"), 0o644))

	// The cage user's ~/.gitconfig, and a caller environment full of GIT_*.
	home := t.TempDir()
	assert.NilError(t, os.WriteFile(filepath.Join(home, ".gitconfig"), []byte(gitconfigVectors(t, p, "homeconfig")), 0o644))
	assert.NilError(t, os.MkdirAll(filepath.Join(home, ".config", "git"), 0o755))
	assert.NilError(t, os.WriteFile(filepath.Join(home, ".config", "git", "config"), []byte(gitconfigVectors(t, p, "xdgconfig")), 0o644))
	assert.NilError(t, os.WriteFile(filepath.Join(home, ".config", "git", "attributes"), []byte("* filter=evil diff=evil\n"), 0o644))
	t.Setenv("HOME", home)
	t.Setenv("XDG_CONFIG_HOME", filepath.Join(home, ".config"))
	t.Setenv("GIT_CONFIG_GLOBAL", filepath.Join(home, ".gitconfig"))
	t.Setenv("GIT_CONFIG_SYSTEM", filepath.Join(home, ".gitconfig"))
	t.Setenv("GIT_CONFIG_PARAMETERS", "'core.fsmonitor'='"+p.script(t, "env-parameters")+"'")
	t.Setenv("GIT_CONFIG_COUNT", "1")
	t.Setenv("GIT_CONFIG_KEY_0", "core.fsmonitor")
	t.Setenv("GIT_CONFIG_VALUE_0", p.script(t, "env-count"))
	for _, v := range []string{"GIT_EXTERNAL_DIFF", "GIT_PAGER", "GIT_EDITOR", "GIT_SSH_COMMAND", "GIT_ASKPASS", "GIT_SSH", "PAGER", "EDITOR", "VISUAL", "SSH_ASKPASS"} {
		t.Setenv(v, p.script(t, "env-"+strings.ToLower(v)))
	}
	t.Setenv("GIT_DIR", filepath.Join(wt, "sub", ".git"))
	t.Setenv("GIT_INDEX_FILE", filepath.Join(home, "index"))

	id, err := Commit(context.Background(), wt, "turn 1\n\nchanges", author)
	assert.NilError(t, err)
	assert.DeepEqual(t, p.fired(t), []string(nil))

	// Exactly the worktree, contents unfiltered (no CRLF conversion either:
	// eol=crlf only affects checkout), the nested repository as a gitlink.
	want := worktreeFiles(t, wt)
	for k := range want {
		if strings.HasPrefix(k, "sub/") {
			delete(want, k)
		}
	}
	want["sub"] = "gitlink"
	got := treeFiles(t, wt, id)
	assert.DeepEqual(t, got, want)
	assert.Equal(t, hostGit(t, wt, "rev-parse", "HEAD"), id)
	assert.Equal(t, hostGit(t, wt, "log", "-1", "--format=%an <%ae>|%cn|%s"), "Shrooms Test <shrooms@example.invalid>|Shrooms Test|turn 1")
	assert.DeepEqual(t, p.fired(t), []string(nil))

	// Nothing changed: a clear sentinel, HEAD unchanged.
	_, err = Commit(context.Background(), wt, "again", author)
	assert.ErrorIs(t, err, ErrNothingToCommit)
	assert.DeepEqual(t, p.fired(t), []string(nil))

	// Positive control: the planted vectors are live for an unsealed git
	// run with the caller's environment.
	naive := exec.Command("git", "add", "-A")
	naive.Dir = wt
	naive.Env = append(os.Environ(), "GIT_DIR="+filepath.Join(wt, ".git"), "GIT_INDEX_FILE=")
	out, _ := naive.CombinedOutput()
	t.Logf("unsealed git add: %s", out)
	assert.Assert(t, len(p.fired(t)) > 0, "the planted payloads never run, so this test proves nothing")
	t.Logf("fired by unsealed git: %v", p.fired(t))
}

// ownerNestedRepo makes a repository at wt/name with one commit and
// records it in wt's index and HEAD as a gitlink, as an owner's submodule
// checkout is.
func ownerNestedRepo(t *testing.T, wt, name string) string {
	t.Helper()
	nested := filepath.Join(wt, name)
	assert.NilError(t, os.MkdirAll(nested, 0o755))
	hostGit(t, nested, "init", "-q")
	assert.NilError(t, os.WriteFile(filepath.Join(nested, "f"), []byte("n\n"), 0o644))
	hostGit(t, nested, "add", "f")
	hostGit(t, nested, "-c", "user.name=o", "-c", "user.email=o@example.invalid", "commit", "-q", "-m", "n")
	hostGit(t, wt, "add", name)
	hostGit(t, wt, "-c", "user.name=o", "-c", "user.email=o@example.invalid", "commit", "-q", "-m", "submodule")
	return nested
}

// TestCommitNeverReadsNestedRepositories: a FIFO as a nested repository's
// HEAD and a ref symlinked to a root-only file. The owner's gitlink is kept
// as it was without reading the repository (the commit returns at once);
// a nested repository the turn created is refused before git runs. The
// positive control: plain git add hangs on the FIFO.
func TestCommitNeverReadsNestedRepositories(t *testing.T) {
	wt := newRepo(t)
	owned := ownerNestedRepo(t, wt, "owned")
	before := hostGit(t, wt, "ls-files", "--stage", "owned")
	// The turn: the owner's nested repository's HEAD becomes a FIFO.
	assert.NilError(t, os.Remove(filepath.Join(owned, ".git", "HEAD")))
	assert.NilError(t, unix.Mkfifo(filepath.Join(owned, ".git", "HEAD"), 0o644))
	assert.NilError(t, os.WriteFile(filepath.Join(wt, "work.txt"), []byte("done\n"), 0o644))

	done := make(chan error, 1)
	var id string
	go func() {
		var err error
		id, err = Commit(context.Background(), wt, "turn", author)
		done <- err
	}()
	select {
	case err := <-done:
		assert.NilError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("the sealed commit hung on a planted FIFO")
	}
	files := treeFiles(t, wt, id)
	assert.Equal(t, files["owned"], "gitlink")
	assert.Equal(t, files["work.txt"], "done\n")
	assert.Equal(t, hostGit(t, wt, "ls-files", "--stage", "owned"), before, "the gitlink changed")

	// A nested repository the turn made, with a ref symlinked to a file only
	// root may read: refused, nothing read.
	secret := filepath.Join(t.TempDir(), "secret")
	assert.NilError(t, os.WriteFile(secret, []byte("0123456789abcdef0123456789abcdef01234567\n"), 0o600))
	made := filepath.Join(wt, "made", ".git")
	assert.NilError(t, os.MkdirAll(filepath.Join(made, "refs", "heads"), 0o755))
	assert.NilError(t, os.WriteFile(filepath.Join(made, "HEAD"), []byte("ref: refs/heads/main\n"), 0o644))
	assert.NilError(t, os.Symlink(secret, filepath.Join(made, "refs", "heads", "main")))
	_, err := Commit(context.Background(), wt, "turn 2", author)
	assert.ErrorContains(t, err, "nested repositories the index does not know (made/.git)")

	// Positive control: plain git add hangs on the FIFO.
	naive := exec.Command("timeout", "3", "git", "add", "-A")
	naive.Dir = wt
	naive.Env = append(os.Environ(), "GIT_DIR="+filepath.Join(wt, ".git"))
	_ = naive.Run()
	assert.Equal(t, naive.ProcessState.ExitCode(), 124, "positive control: plain git add should hang on the FIFO HEAD")
}

// TestCommitRefusesExecutableRepoConfig plants each vector in .git/config
// (which the cage cannot write: defence in depth): Commit refuses, names the
// key, runs nothing and leaves HEAD alone.
func TestCommitRefusesExecutableRepoConfig(t *testing.T) {
	p := newPayloads(t)
	pl := p.script(t, "payload")
	cases := map[string]string{
		"core.fsmonitor":             "[core]\n\tfsmonitor = " + pl,
		"core.hooksPath":             "[core]\n\thooksPath = " + p.dir,
		"filter.evil.clean":          "[filter \"evil\"]\n\tclean = " + pl,
		"filter.evil.smudge":         "[filter \"evil\"]\n\tsmudge = " + pl,
		"filter.evil.process":        "[filter \"evil\"]\n\tprocess = " + pl,
		"diff.external":              "[diff]\n\texternal = " + pl,
		"diff.evil.textconv":         "[diff \"evil\"]\n\ttextconv = " + pl,
		"merge.evil.driver":          "[merge \"evil\"]\n\tdriver = " + pl,
		"core.sshcommand":            "[core]\n\tsshCommand = " + pl,
		"core.pager":                 "[core]\n\tpager = " + pl,
		"core.editor":                "[core]\n\teditor = " + pl,
		"credential.helper":          "[credential]\n\thelper = " + pl,
		"include.path":               "[include]\n\tpath = /etc/gitconfig",
		"includeif.gitdir:/.path":    "[includeIf \"gitdir:/\"]\n\tpath = /etc/gitconfig",
		"core.worktree":              "[core]\n\tworktree = /etc",
		"gpg.program":                "[commit]\n\tgpgSign = false\n[gpg]\n\tprogram = " + pl,
		"alias.add":                  "[alias]\n\tadd = !" + pl,
		"url.evil.insteadof":         "[url \"evil\"]\n\tinsteadOf = x",
		"core.alternaterefscommand":  "[core]\n\talternateRefsCommand = " + pl,
		"uploadpack.packobjectshook": "[uploadpack]\n\tpackObjectsHook = " + pl,
	}
	for key, snippet := range cases {
		t.Run(key, func(t *testing.T) {
			wt := newRepo(t)
			head := hostGit(t, wt, "rev-parse", "HEAD")
			cfg := filepath.Join(wt, ".git", "config")
			b, err := os.ReadFile(cfg)
			assert.NilError(t, err)
			assert.NilError(t, os.WriteFile(cfg, append(b, []byte("\n"+snippet+"\n")...), 0o644))
			assert.NilError(t, os.WriteFile(filepath.Join(wt, "f.txt"), []byte("x\n"), 0o644))
			assert.NilError(t, os.WriteFile(filepath.Join(wt, ".gitattributes"), []byte("* filter=evil diff=evil merge=evil\n"), 0o644))
			_, err = Commit(context.Background(), wt, "m", author)
			assert.ErrorContains(t, err, "sealed commit path does not allow")
			assert.Assert(t, is.Contains(strings.ToLower(err.Error()), strings.ToLower(key)))
			assert.Equal(t, hostGit(t, wt, "rev-parse", "HEAD"), head)
			assert.DeepEqual(t, p.fired(t), []string(nil))
		})
	}
	// Positive control: the payload does run when git is not sealed.
	wt := newRepo(t)
	hostGit(t, wt, "config", "diff.external", pl)
	assert.NilError(t, os.WriteFile(filepath.Join(wt, "README"), []byte("changed\n"), 0o644))
	hostGit(t, wt, "-c", "core.pager=cat", "diff")
	assert.DeepEqual(t, p.fired(t), []string{"payload"})
}

// TestCommitLinkedWorktree commits in a linked worktree, and refuses a
// rewritten gitdir pointer (into the worktree, or at another worktree).
func TestCommitLinkedWorktree(t *testing.T) {
	main := newRepo(t)
	wt := filepath.Join(t.TempDir(), "wt1")
	hostGit(t, main, "worktree", "add", "-q", "-b", "task1", wt)
	other := filepath.Join(t.TempDir(), "wt2")
	hostGit(t, main, "worktree", "add", "-q", "-b", "task2", other)
	l, err := Resolve(wt)
	assert.NilError(t, err)
	assert.Equal(t, l.CommonDir, filepath.Join(main, ".git"))
	assert.Equal(t, l.GitDir, filepath.Join(main, ".git", "worktrees", "wt1"))
	assert.Assert(t, l.DotGitFile)

	assert.NilError(t, os.WriteFile(filepath.Join(wt, "new.txt"), []byte("from the turn\n"), 0o644))
	id, err := Commit(context.Background(), wt, "turn", author)
	assert.NilError(t, err)
	assert.Equal(t, hostGit(t, main, "rev-parse", "task1"), id)
	assert.Equal(t, hostGit(t, main, "rev-parse", "main"), hostGit(t, main, "rev-parse", "task2"), "other branches untouched")
	assert.DeepEqual(t, treeFiles(t, main, id), worktreeFiles(t, wt))

	// A .git file rewritten to a fake git dir inside the worktree.
	p := newPayloads(t)
	fake := filepath.Join(wt, "fakegit")
	hostGit(t, t.TempDir(), "init", "-q", "--bare", fake)
	assert.NilError(t, os.WriteFile(filepath.Join(fake, "config"), []byte(gitconfigVectors(t, p, "fake")), 0o644))
	dotgit := filepath.Join(wt, ".git")
	orig, err := os.ReadFile(dotgit)
	assert.NilError(t, err)
	assert.NilError(t, os.WriteFile(dotgit, []byte("gitdir: "+fake+"\n"), 0o644))
	_, err = Commit(context.Background(), wt, "m", author)
	assert.ErrorContains(t, err, "points into the worktree")
	// ... relative, too.
	assert.NilError(t, os.WriteFile(dotgit, []byte("gitdir: fakegit\n"), 0o644))
	_, err = Commit(context.Background(), wt, "m", author)
	assert.ErrorContains(t, err, "points into the worktree")
	// ... at another worktree's gitdir.
	assert.NilError(t, os.WriteFile(dotgit, []byte("gitdir: "+filepath.Join(main, ".git", "worktrees", "wt2")+"\n"), 0o644))
	_, err = Commit(context.Background(), wt, "m", author)
	assert.ErrorContains(t, err, "back pointer")
	// ... a symbolic link instead of the file.
	assert.NilError(t, os.Remove(dotgit))
	assert.NilError(t, os.Symlink(fake, dotgit))
	_, err = Commit(context.Background(), wt, "m", author)
	assert.ErrorContains(t, err, "refused")
	assert.DeepEqual(t, p.fired(t), []string(nil))
	assert.NilError(t, os.Remove(dotgit))
	assert.NilError(t, os.WriteFile(dotgit, orig, 0o644))
	assert.NilError(t, os.RemoveAll(fake))
	_, err = Commit(context.Background(), wt, "m", author)
	assert.ErrorIs(t, err, ErrNothingToCommit, "restored pointer works again")
}

func TestCommitBadInput(t *testing.T) {
	wt := newRepo(t)
	ctx := context.Background()
	for _, tc := range []struct {
		wt, msg string
		a       Author
		want    string
	}{
		{wt, "", author, "message must be non-empty"},
		{wt, "m", Author{Name: "x", Email: "a>b"}, "without < or >"},
		{wt, "m", Author{Name: "x\ny", Email: "a@b"}, "one line"},
		{"relative", "m", author, "absolute path"},
		{t.TempDir(), "m", author, "not a git worktree"},
		{filepath.Join(wt, "nope"), "m", author, "no such file"},
	} {
		_, err := Commit(ctx, tc.wt, tc.msg, tc.a)
		assert.ErrorContains(t, err, tc.want)
	}
	// An unborn branch commits without a parent.
	fresh := filepath.Join(t.TempDir(), "fresh")
	assert.NilError(t, os.Mkdir(fresh, 0o755))
	hostGit(t, fresh, "init", "-q")
	assert.NilError(t, os.WriteFile(filepath.Join(fresh, "a"), []byte("a\n"), 0o644))
	id, err := Commit(ctx, fresh, "first", author)
	assert.NilError(t, err)
	assert.Equal(t, hostGit(t, fresh, "rev-list", "--count", id), "1")
	keys := []string{}
	for k := range treeFiles(t, fresh, id) {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	assert.DeepEqual(t, keys, []string{"a"})
}

// TestCommitRunsAsRepoOwner: as root, git runs as the owner of the
// repository, so the commit leaves no root-owned file in it.
func TestCommitRunsAsRepoOwner(t *testing.T) {
	itest.Require(t, itest.Root)
	wt := newRepo(t)
	for d := filepath.Dir(wt); d != os.TempDir() && d != "/"; d = filepath.Dir(d) {
		assert.NilError(t, os.Chmod(d, 0o755))
	}
	const owner = 4242
	assert.NilError(t, filepath.WalkDir(wt, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, owner, owner)
	}))
	assert.NilError(t, os.WriteFile(filepath.Join(wt, "new.txt"), []byte("n\n"), 0o644))
	id, err := Commit(context.Background(), wt, "as owner", author)
	assert.NilError(t, err)
	assert.Equal(t, hostGit(t, wt, "rev-parse", "HEAD"), id)
	assert.NilError(t, filepath.WalkDir(filepath.Join(wt, ".git"), func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		if st := fi.Sys().(*syscall.Stat_t); st.Uid != owner {
			t.Errorf("%s is owned by uid %d, not the repository owner", p, st.Uid)
		}
		return nil
	}))
}

// TestCommitAuthorsAsTheOwner: with no author given, the commit names the
// user.name and user.email the repository's own config sets — read with no
// includes (an include naming another identity is not followed) and no
// global config — else shrooms' default; a given author still wins.
func TestCommitAuthorsAsTheOwner(t *testing.T) {
	wt := newRepo(t)
	other := filepath.Join(t.TempDir(), "other.gitconfig")
	assert.NilError(t, os.WriteFile(other, []byte("[user]\n\tname = Included Impostor\n\temail = impostor@example.invalid\n"), 0o644))
	home := t.TempDir()
	assert.NilError(t, os.WriteFile(filepath.Join(home, ".gitconfig"), []byte("[user]\n\tname = Global Impostor\n\temail = global@example.invalid\n"), 0o644))
	t.Setenv("HOME", home)

	// No identity in the repository: shrooms' default, not the global one.
	assert.NilError(t, os.WriteFile(filepath.Join(wt, "a"), []byte("a\n"), 0o644))
	_, used, err := CommitAs(context.Background(), wt, "a", Author{})
	assert.NilError(t, err)
	assert.Equal(t, used, DefaultAuthor())
	assert.Equal(t, hostGit(t, wt, "log", "-1", "--format=%an <%ae>|%cn <%ce>"), "shrooms <shrooms@localhost>|shrooms <shrooms@localhost>")

	// The owner's identity in .git/config.
	hostGit(t, wt, "config", "user.name", "Owner Name")
	hostGit(t, wt, "config", "user.email", "owner@example.invalid")
	assert.NilError(t, os.WriteFile(filepath.Join(wt, "b"), []byte("b\n"), 0o644))
	_, used, err = CommitAs(context.Background(), wt, "b", Author{})
	assert.NilError(t, err)
	assert.Equal(t, used, Author{Name: "Owner Name", Email: "owner@example.invalid"})
	assert.Equal(t, hostGit(t, wt, "log", "-1", "--format=%an <%ae>|%cn <%ce>"), "Owner Name <owner@example.invalid>|Owner Name <owner@example.invalid>")

	// A given author wins.
	assert.NilError(t, os.WriteFile(filepath.Join(wt, "c"), []byte("c\n"), 0o644))
	_, used, err = CommitAs(context.Background(), wt, "c", author)
	assert.NilError(t, err)
	assert.Equal(t, used, author)
	assert.Equal(t, hostGit(t, wt, "log", "-1", "--format=%an <%ae>"), "Shrooms Test <shrooms@example.invalid>")

	// An include (conditional or not) naming another identity is never
	// followed: the sealed read refuses the repository.
	hostGit(t, wt, "config", "includeIf.gitdir:/.path", other)
	assert.NilError(t, os.WriteFile(filepath.Join(wt, "d"), []byte("d\n"), 0o644))
	_, _, err = CommitAs(context.Background(), wt, "d", Author{})
	assert.ErrorContains(t, err, "includeif")
}
