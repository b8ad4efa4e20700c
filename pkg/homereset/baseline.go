package homereset

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"

	"github.com/shrooms-cage/shrooms/pkg/config"
	"github.com/shrooms-cage/shrooms/pkg/profile"
)

// baseFile is one file of the baseline, laid down fresh every turn.
type baseFile struct {
	rel  string
	data []byte
	mode uint32
}

// baseline computes the profiles' baseline from config, reading the host
// files it names, and checks that no baseline path collides with a keep-list
// entry or another baseline file.
func baseline(home *config.Home, profiles []string, rules []profile.Rule) ([]baseFile, error) {
	var files []baseFile
	for _, name := range profiles {
		p := home.Profile(name)
		if p == nil {
			return nil, fmt.Errorf("unknown HOME profile %q", name)
		}
		key := "home." + name
		if prof, _ := profile.Lookup(name); prof.Settings != "" {
			paths := [2]string{prof.Settings, prof.Instructions}
			switch {
			case p.Settings != nil:
				data, err := prof.EncodeSettings(p.Settings)
				if err != nil {
					return nil, &config.Error{Key: key + ".settings", Msg: err.Error()}
				}
				files = append(files, baseFile{paths[0], data, 0o644})
			case p.SettingsFile != "":
				data, err := config.ReadHostFile(p.SettingsFile, int64(home.MaxFileSize))
				if err == nil {
					if err = prof.CheckSettings(data); err != nil {
						err = fmt.Errorf("%s %v", p.SettingsFile, err)
					}
				}
				if err != nil {
					return nil, &config.Error{Key: key + ".settings_file", Msg: err.Error()}
				}
				files = append(files, baseFile{paths[0], data, 0o644})
			}
			switch {
			case p.Instructions != "":
				files = append(files, baseFile{paths[1], []byte(p.Instructions), 0o644})
			case p.InstructionsFile != "":
				data, err := config.ReadHostFile(p.InstructionsFile, int64(home.MaxFileSize))
				if err != nil {
					return nil, &config.Error{Key: key + ".instructions_file", Msg: err.Error()}
				}
				files = append(files, baseFile{paths[1], data, 0o644})
			}
		}
		for _, rel := range slices.Sorted(maps.Keys(p.Files)) {
			data, err := config.ReadHostFile(p.Files[rel], int64(home.MaxFileSize))
			if err != nil {
				return nil, &config.Error{Key: fmt.Sprintf("%s.files.%q", key, rel), Msg: err.Error()}
			}
			files = append(files, baseFile{rel, data, 0o644})
		}
	}
	sort.Slice(files, func(i, j int) bool { return files[i].rel < files[j].rel })
	for i, f := range files {
		if !config.ValidHomeRel(f.rel) {
			return nil, fmt.Errorf("baseline path %q is not a clean HOME-relative path", f.rel)
		}
		if why := profile.Overlap(rules, f.rel); why != "" {
			return nil, fmt.Errorf("baseline path %q %s", f.rel, why)
		}
		for j := 0; j < i; j++ {
			if files[j].rel == f.rel || strings.HasPrefix(f.rel, files[j].rel+"/") {
				return nil, fmt.Errorf("baseline paths %q and %q collide", files[j].rel, f.rel)
			}
		}
	}
	return files, nil
}

// digest is the baseline's identity: sha256 over every path, mode and
// content, in path order. It is the same for every turn of a task as long as
// the config and the host files it names are unchanged.
func digest(files []baseFile) string {
	h := sha256.New()
	for _, f := range files {
		fmt.Fprintf(h, "%s\x00%o\x00%d\x00", f.rel, f.mode, len(f.data))
		h.Write(f.data)
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}

// CheckBaseline builds the baseline of profiles as a turn would — reading
// every host file it names and checking it against the keep-list — and
// changes nothing. A problem is a *config.Error (bad input, exit 121), so
// `config check`, `doctor` and every turn refuse it before anything starts.
func CheckBaseline(cfg *config.Config, profiles []string) error {
	rules, err := profile.KeepList(profiles)
	if err != nil {
		return &config.Error{File: cfg.Source, Key: "agents", Msg: err.Error()}
	}
	if _, err := baseline(&cfg.Home, profiles, rules); err != nil {
		var ce *config.Error
		if errors.As(err, &ce) {
			if ce.File == "" {
				ce.File = cfg.Source
			}
			return ce
		}
		return &config.Error{File: cfg.Source, Key: "home", Msg: err.Error() + " (profiles " + strings.Join(profiles, ", ") + ")"}
	}
	return nil
}
