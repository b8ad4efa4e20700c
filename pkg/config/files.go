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

// CheckFiles checks the host files the configuration names — token files,
// a seccomp profile path, HOME settings, instructions and files — without
// changing anything: each must be a readable regular file within its size
// cap, and a settings file a JSON object. The first problem is returned as
// *Error naming the key and its line, so that bad input is refused before
// shrooms contacts podman or touches the host.
func (c *Config) CheckFiles() error {
	max := int64(c.Home.MaxFileSize)
	for _, name := range slices.Sorted(maps.Keys(c.Tokens)) {
		if err := c.checkFile("tokens."+name, c.Tokens[name], 64<<10, false, true); err != nil {
			return err
		}
	}
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

func filepathIsAbs(p string) bool { return len(p) > 0 && p[0] == '/' }

// checkFile reads path once (never blocking on a FIFO, never a device) and
// checks it; the contents are never part of an error.
func (c *Config) checkFile(key, path string, max int64, jsonObject, nonEmpty bool) error {
	fail := func(msg string) error {
		return &Error{File: c.Source, Line: lineOf(c.raw, key), Key: key, Msg: msg}
	}
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fail(fmt.Sprintf("cannot read %s: %v", path, underlyingErr(err)))
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return fail(fmt.Sprintf("cannot stat %s: %v", path, underlyingErr(err)))
	}
	if !st.Mode().IsRegular() {
		return fail(fmt.Sprintf("%s is not a regular file", path))
	}
	if st.Size() > max {
		return fail(fmt.Sprintf("%s is larger than %d bytes", path, max))
	}
	data, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return fail(fmt.Sprintf("cannot read %s: %v", path, underlyingErr(err)))
	}
	if int64(len(data)) > max {
		return fail(fmt.Sprintf("%s is larger than %d bytes", path, max))
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

func underlyingErr(err error) error {
	if pe, ok := err.(*os.PathError); ok {
		return pe.Err
	}
	return err
}
