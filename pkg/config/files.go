package config

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"

	"github.com/shrooms-cage/shrooms/pkg/profile"
	"golang.org/x/sys/unix"
)

// CheckFiles checks the host files the configuration names — a seccomp
// profile path, HOME settings, instructions and files — without
// changing anything: each must be a readable regular file within its size
// cap, and a settings file a JSON object. The first problem is returned as
// *Error naming the key and its line, so that bad input is refused before
// shrooms contacts podman or touches the host.
func (c *Config) CheckFiles() error {
	max := int64(c.Home.MaxFileSize)
	if filepathIsAbs(c.Cage.Seccomp) {
		if err := c.checkFile("cage.seccomp", c.Cage.Seccomp, 4<<20, true, false); err != nil {
			return err
		}
	}
	for _, name := range profile.Names() {
		p := c.Home.Profile(name)
		key := "home." + name
		if p.SettingsFile != "" {
			if err := c.checkFile(key+".settings_file", p.SettingsFile, max, true, false); err != nil {
				return err
			}
		}
		if p.InstructionsFile != "" {
			if err := c.checkFile(key+".instructions_file", p.InstructionsFile, max, false, false); err != nil {
				return err
			}
		}
		for _, rel := range slices.Sorted(maps.Keys(p.Files)) {
			if err := c.checkFile(fmt.Sprintf("%s.files.%q", key, rel), p.Files[rel], max, false, false); err != nil {
				return err
			}
		}
	}
	return nil
}

// CheckToken checks the file of token name as a turn of an agent that uses
// it reads it: a regular, non-empty file within 64 KiB, owned by root and
// readable by its owner only (mode 0600 or 0400). Tokens are checked only
// for the agents that use them: a missing token of another agent stops no
// turn.
func (c *Config) CheckToken(name string) error {
	path, ok := c.Tokens[name]
	key := "tokens." + name
	if !ok {
		return &Error{File: c.Source, Key: key, Msg: "no such token"}
	}
	if err := c.checkFile(key, path, 64<<10, false, true); err != nil {
		return err
	}
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		return &Error{File: c.Source, Line: lineOf(c.raw, key), Key: key, Msg: fmt.Sprintf("cannot stat %s: %v", path, err)}
	}
	if perm := st.Mode & 0o7777; perm != 0o600 && perm != 0o400 {
		return &Error{File: c.Source, Line: lineOf(c.raw, key), Key: key, Msg: fmt.Sprintf("%s has mode %04o; a token file must be readable by its owner only (chmod 0600 %s)", path, perm, path)}
	}
	if st.Uid != 0 {
		return &Error{File: c.Source, Line: lineOf(c.raw, key), Key: key, Msg: fmt.Sprintf("%s is owned by uid %d; a token file must belong to root (chown root %s)", path, st.Uid, path)}
	}
	return nil
}

// TokensOf lists the tokens agent uses (its token_env and gateway), sorted.
func (c *Config) TokensOf(a Agent) []string {
	set := map[string]bool{}
	for _, tok := range a.TokenEnv {
		set[tok] = true
	}
	if g, ok := c.Gateway[a.Gateway]; ok && g.Token != "" {
		set[g.Token] = true
	}
	return slices.Sorted(maps.Keys(set))
}

func filepathIsAbs(p string) bool { return len(p) > 0 && p[0] == '/' }

// checkFile reads path once (never blocking on a FIFO, never a device) and
// checks it; the contents are never part of an error.
func (c *Config) checkFile(key, path string, max int64, jsonObject, nonEmpty bool) error {
	fail := func(msg string) error {
		return &Error{File: c.Source, Line: lineOf(c.raw, key), Key: key, Msg: msg}
	}
	data, err := ReadHostFile(path, max)
	if err != nil {
		return fail(err.Error())
	}
	if nonEmpty && len(bytes.TrimRight(data, "\r\n")) == 0 {
		return fail(fmt.Sprintf("%s is empty", path))
	}
	if jsonObject {
		var v map[string]any
		if err := json.Unmarshal(data, &v); err != nil {
			return fail(fmt.Sprintf("%s is not a JSON object: %v", path, err))
		}
	}
	return nil
}

// ReadHostFile reads an owner-named host file (config is trusted, so links
// in its path are followed, e.g. into /nix/store), refusing anything but a
// regular file of at most max bytes. O_NONBLOCK: a FIFO cannot hang us.
// The contents are never part of an error.
func ReadHostFile(path string, max int64) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("cannot read %s: %v", path, underlyingErr(err))
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("cannot stat %s: %v", path, underlyingErr(err))
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file", path)
	}
	if st.Size() > max {
		return nil, fmt.Errorf("%s is larger than %d bytes", path, max)
	}
	data, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, fmt.Errorf("cannot read %s: %v", path, underlyingErr(err))
	}
	if int64(len(data)) > max {
		return nil, fmt.Errorf("%s is larger than %d bytes", path, max)
	}
	return data, nil
}

func underlyingErr(err error) error {
	if pe, ok := err.(*os.PathError); ok {
		return pe.Err
	}
	return err
}
