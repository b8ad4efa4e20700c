// Package gitseal is the commit path of invariant 6 (sanctioned exits): it lays out a task's
// git metadata read-only for the cage, and commits the worktree on the host
// in a sealed git environment, so that nothing a hostile turn wrote (hooks,
// config, attributes naming filters, a rewritten gitdir pointer, files named
// like git internals) is executed or followed by the host.
package gitseal

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/shrooms-cage/shrooms/pkg/mounts"
	"github.com/shrooms-cage/shrooms/pkg/taskstate"
)

// CageCommonDir is where a linked worktree's (or separate git dir's) common
// git directory appears, read-only, in the cage.
const CageCommonDir = "/git-common"

// CageEnv is the git configuration every cage gets, from its environment
// (git's command-line scope, which git honours for safe.directory): the
// worktree's .git is root-owned and read-only by design, so in the cage it
// belongs to an unmapped uid and git refuses it as "dubious ownership"
// unless /work (and the common dir a linked worktree's .git names) is a
// safe directory. Nothing in HOME or the worktree is needed for it, so no
// file a turn can change decides it; writes to .git still fail (read-only
// mounts). The agent's own processes could change their environment, but
// only for themselves: every turn's cage starts with this again.
func CageEnv() map[string]string {
	return map[string]string{
		"GIT_CONFIG_COUNT":   "2",
		"GIT_CONFIG_KEY_0":   "safe.directory",
		"GIT_CONFIG_VALUE_0": mounts.WorkDir,
		"GIT_CONFIG_KEY_1":   "safe.directory",
		"GIT_CONFIG_VALUE_1": CageCommonDir,
	}
}

// Layout is where a worktree's git metadata lives on the host.
type Layout struct {
	Worktree  string `json:"worktree"`
	GitDir    string `json:"gitDir"`    // the worktree's own git dir (HEAD, index)
	CommonDir string `json:"commonDir"` // objects, refs, config, hooks
	// DotGitFile is true when <worktree>/.git is a "gitdir:" file (a linked
	// worktree or a separate git dir) rather than the git directory itself.
	DotGitFile bool `json:"dotGitFile"`
}

// Resolve finds the git metadata of worktree, refusing every layout in which
// the cage could have redirected it: a symbolic link at .git, a gitdir or
// common dir inside the worktree (for a .git file), a gitdir whose back
// pointer names another worktree, a gitdir outside its common dir.
func Resolve(worktree string) (*Layout, error) {
	if !filepath.IsAbs(worktree) {
		return nil, fmt.Errorf("worktree %q must be an absolute path", worktree)
	}
	wt := filepath.Clean(worktree)
	if real, err := filepath.EvalSymlinks(wt); err != nil {
		return nil, fmt.Errorf("worktree %s: %w", wt, err)
	} else if real != wt {
		return nil, fmt.Errorf("worktree %s is reached through a symbolic link (use %s)", wt, real)
	}
	dotgit := filepath.Join(wt, ".git")
	fi, err := os.Lstat(dotgit)
	if err != nil {
		return nil, fmt.Errorf("worktree %s is not a git worktree: %w", wt, err)
	}
	switch {
	case fi.IsDir():
		if _, err := os.Lstat(filepath.Join(dotgit, "commondir")); err == nil {
			return nil, fmt.Errorf("%s is a git directory with a commondir file; unsupported layout", dotgit)
		}
		return &Layout{Worktree: wt, GitDir: dotgit, CommonDir: dotgit}, nil
	case !fi.Mode().IsRegular():
		return nil, fmt.Errorf("%s is neither a directory nor a regular file (refused)", dotgit)
	}
	target, err := readPointer(dotgit, "gitdir: ")
	if err != nil {
		return nil, err
	}
	if !filepath.IsAbs(target) {
		target = filepath.Join(wt, target)
	}
	gitDir, err := realDir(target, "gitdir named by "+dotgit)
	if err != nil {
		return nil, err
	}
	if within(gitDir, wt) {
		return nil, fmt.Errorf("%s points into the worktree (%s), which the cage can write (refused)", dotgit, gitDir)
	}
	l := &Layout{Worktree: wt, GitDir: gitDir, CommonDir: gitDir, DotGitFile: true}
	if c, err := readPointer(filepath.Join(gitDir, "commondir"), ""); err == nil {
		if !filepath.IsAbs(c) {
			c = filepath.Join(gitDir, c)
		}
		if l.CommonDir, err = realDir(c, "commondir of "+gitDir); err != nil {
			return nil, err
		}
		// git keeps <gitdir>/gitdir pointing back at <worktree>/.git; a .git
		// file naming another worktree's gitdir fails this.
		back, err := readPointer(filepath.Join(gitDir, "gitdir"), "")
		if err != nil {
			return nil, err
		}
		if filepath.Clean(back) != dotgit {
			return nil, fmt.Errorf("%s points at %s, whose back pointer names %s (refused: rewritten gitdir pointer?)", dotgit, gitDir, back)
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	for _, d := range []string{l.GitDir, l.CommonDir} {
		if within(d, wt) {
			return nil, fmt.Errorf("%s points into the worktree (%s), which the cage can write (refused)", dotgit, d)
		}
	}
	if rel, err := filepath.Rel(l.CommonDir, l.GitDir); err != nil || strings.HasPrefix(rel, "..") {
		return nil, fmt.Errorf("gitdir %s is outside its common dir %s; unsupported layout", l.GitDir, l.CommonDir)
	}
	return l, nil
}

// readPointer reads a small one-line pointer file without following a
// symbolic link at its last component, and strips prefix.
func readPointer(path, prefix string) (string, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", fmt.Errorf("read %s: %w", path, &os.PathError{Op: "open", Path: path, Err: err})
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() {
		return "", fmt.Errorf("%s is not a regular file (refused)", path)
	}
	b, err := io.ReadAll(io.LimitReader(f, 4097))
	if err != nil {
		return "", fmt.Errorf("read %s: %w", path, err)
	}
	if len(b) > 4096 || bytes.IndexByte(b, 0) >= 0 {
		return "", fmt.Errorf("%s is not a git pointer file", path)
	}
	s := strings.TrimRight(string(b), "\r\n")
	if strings.ContainsAny(s, "\r\n") || !strings.HasPrefix(s, prefix) || len(s) == len(prefix) {
		return "", fmt.Errorf("%s is not a git pointer file (want one line %q<path>)", path, prefix)
	}
	return strings.TrimPrefix(s, prefix), nil
}

func realDir(p, what string) (string, error) {
	real, err := filepath.EvalSymlinks(filepath.Clean(p))
	if err != nil {
		return "", fmt.Errorf("%s: %w", what, err)
	}
	fi, err := os.Stat(real)
	if err != nil || !fi.IsDir() {
		return "", fmt.Errorf("%s: %s is not a directory", what, real)
	}
	return real, nil
}

func within(p, dir string) bool { return p == dir || strings.HasPrefix(p, dir+"/") }

// CagePlan is a turn's git metadata in the cage: the read-only mounts and,
// for a linked worktree, the generated .git file they need on the host.
type CagePlan struct {
	Mounts []mounts.Mount
	// Pointer is the generated .git file (nil for a plain clone).
	Pointer *Pointer
}

// Pointer is a generated .git file: Content to be written at Path.
type Pointer struct {
	Path    string
	Content string
}

// PlanCage computes the read-only git-metadata mounts of a turn whose
// worktree is bind-mounted at /work, writing nothing; the caller appends
// them after that bind and writes the plan (Write) before the cage starts. A
// plain clone gets its .git directory read-only over /work/.git. A linked
// worktree (or separate git dir) gets its common dir read-only at
// CageCommonDir and, read-only over /work/.git, a generated .git file (kept
// under stateDir/gitseal/) that points there. The cage can run git status,
// diff and log; it cannot write config, hooks, refs, the index,
// info/attributes or the gitdir pointer.
func PlanCage(worktree, stateDir string) (CagePlan, error) {
	l, err := Resolve(worktree)
	if err != nil {
		return CagePlan{}, err
	}
	ro := []string{"bind", "nosuid", "nodev", "noexec"}
	if !l.DotGitFile {
		return CagePlan{Mounts: []mounts.Mount{{Kind: mounts.Bind, Source: l.GitDir, Dest: mounts.WorkDir + "/.git", ReadOnly: true, Options: ro}}}, nil
	}
	rel, err := filepath.Rel(l.CommonDir, l.GitDir)
	if err != nil {
		return CagePlan{}, err
	}
	cageGitDir := filepath.Join(CageCommonDir, rel)
	if !filepath.IsAbs(stateDir) {
		return CagePlan{}, fmt.Errorf("state directory %q must be an absolute path", stateDir)
	}
	sum := sha256.Sum256([]byte(l.Worktree))
	file := taskstate.Layout{Dir: stateDir}.GitsealDotgit(hex.EncodeToString(sum[:8]))
	return CagePlan{
		Mounts: []mounts.Mount{
			{Kind: mounts.Bind, Source: l.CommonDir, Dest: CageCommonDir, ReadOnly: true, Options: ro},
			{Kind: mounts.Bind, Source: file, Dest: mounts.WorkDir + "/.git", ReadOnly: true, Options: ro},
		},
		Pointer: &Pointer{Path: file, Content: "gitdir: " + cageGitDir + "\n"},
	}, nil
}

// Write puts the plan's generated .git file in place (atomically); a plain
// clone's plan writes nothing.
func (p CagePlan) Write() error {
	if p.Pointer == nil {
		return nil
	}
	if err := writeGenerated(p.Pointer.Path, p.Pointer.Content); err != nil {
		return fmt.Errorf("git pointer for the cage: %w", err)
	}
	return nil
}

// SystemConfigDest is where the cage sees its system git configuration.
const SystemConfigDest = "/etc/gitconfig"

// systemConfig marks /work and the common dir safe directories, as
// CageEnv does, at git's system scope.
const systemConfig = "# Written by shrooms: the cage's system git configuration (read-only).\n" +
	"[safe]\n\tdirectory = " + mounts.WorkDir + "\n\tdirectory = " + CageCommonDir + "\n"

// SystemConfig is the cage's system git configuration, generated by shrooms
// outside the cage and mounted read-only at /etc/gitconfig (it replaces an
// image's own). CageEnv alone is not enough: Claude Code clears
// GIT_CONFIG_COUNT/KEY/VALUE (and GIT_CONFIG_PARAMETERS, GIT_CONFIG_SYSTEM,
// GIT_CONFIG_GLOBAL) from the git commands it runs itself (the git status it
// puts in the model's context among them), but not git's system scope. No
// file a turn can write decides it.
type SystemConfig struct {
	// Path is the host file (below the state directory).
	Path string
}

// PlanSystemConfig returns the system git configuration's host file below
// stateDir.
func PlanSystemConfig(stateDir string) (SystemConfig, error) {
	if !filepath.IsAbs(stateDir) {
		return SystemConfig{}, fmt.Errorf("state directory %q must be an absolute path", stateDir)
	}
	return SystemConfig{Path: taskstate.Layout{Dir: stateDir}.GitsealConfig()}, nil
}

// Mount is the read-only bind mount of the file at /etc/gitconfig.
func (c SystemConfig) Mount() mounts.Mount {
	return mounts.Mount{Kind: mounts.Bind, Source: c.Path, Dest: SystemConfigDest, ReadOnly: true,
		Options: []string{"bind", "nosuid", "nodev", "noexec"}}
}

// Write puts the file in place (atomically) unless it already holds the
// configuration.
func (c SystemConfig) Write() error {
	if b, err := os.ReadFile(c.Path); err == nil && string(b) == systemConfig {
		return nil
	}
	if err := writeGenerated(c.Path, systemConfig); err != nil {
		return fmt.Errorf("system git config for the cage: %w", err)
	}
	return nil
}

// writeGenerated writes a generated file the cage mounts read-only: world-
// readable, replaced atomically (unless it already holds content).
func writeGenerated(path, content string) error {
	return taskstate.InstallFile(path, []byte(content))
}
