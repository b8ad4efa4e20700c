package home

import (
	"fmt"
	"slices"
	"strings"

	"github.com/shrooms-cage/shrooms/pkg/config"
	"github.com/shrooms-cage/shrooms/pkg/fault"
	"github.com/shrooms-cage/shrooms/pkg/profile"
	"github.com/shrooms-cage/shrooms/pkg/taskstate"
)

// TaskOf describes a task HOME under root to the reset: the agent's host
// ids from the task's ids and cfg's cage user, the turn's HOME profiles,
// and kept, the task's other profiles whose kept state stays
// (KeptProfiles).
func TaskOf(cfg *config.Config, root string, ids taskstate.IDs, profiles, kept []string) Task {
	return Task{
		Root:     root,
		UID:      int(ids.UID) + int(cfg.Cage.User),
		GID:      int(ids.GID) + int(cfg.Cage.User),
		Config:   cfg,
		Profiles: profiles,
		Kept:     kept,
	}
}

// KeptProfiles returns the HOME profiles of task that a turn of an agent
// with HOME profiles home must keep besides its own: every profile the task
// bootstrapped or used before (its profiles fact; for a task from before
// that fact, the profiles of its last agent, when cfg still has it).
func KeptProfiles(cfg *config.Config, st taskstate.Dir, home []string) ([]string, error) {
	kept, err := keptProfiles(cfg, st, home)
	return kept, fault.Wrap(fault.HostNotReady, err)
}

func keptProfiles(cfg *config.Config, st taskstate.Dir, home []string) ([]string, error) {
	used, err := st.Recall(taskstate.FactProfiles)
	if err != nil {
		return nil, err
	}
	var known []string
	if used != "" {
		known = strings.Split(used, ",")
	} else if last, err := st.Recall(taskstate.FactAgent); err != nil {
		return nil, err
	} else if a, err := cfg.Agent(last); last != "" && err == nil {
		known = a.Home
	}
	var kept []string
	for _, p := range known {
		if _, ok := profile.Lookup(p); !ok {
			return nil, fmt.Errorf("task %s's profiles fact names %q, which is no HOME profile (%s)", st.Name(), p, strings.Join(profile.Names(), ", "))
		}
		if !slices.Contains(home, p) && !slices.Contains(kept, p) {
			kept = append(kept, p)
		}
	}
	return kept, nil
}

// Had reports whether the task of st had a HOME made (then a missing image is drift,
// never a new start): its home fact, or turns from before the fact.
func Had(st taskstate.Dir) (bool, error) {
	fact, err := st.Recall(taskstate.FactHome)
	if err != nil {
		return false, fault.Wrap(fault.HostNotReady, err)
	}
	if fact != "" {
		return true, nil
	}
	n, _ := st.LastTurn()
	return n > 0, nil
}

// Remember records in st that the task's HOME, the volume named volume
// (Store.Name), was made (its home fact), so that Had says so from now on.
func Remember(st taskstate.Dir, volume string) error {
	return fault.Wrap(fault.HostNotReady, st.Remember(taskstate.FactHome, volume))
}

// RememberProfiles records in st that the task's HOME holds state of profiles (with
// kept, those it held before), before the reset that may carry it over.
func RememberProfiles(st taskstate.Dir, profiles, kept []string) error {
	all := append(slices.Clone(kept), profiles...)
	slices.Sort(all)
	all = slices.Compact(all)
	return fault.Wrap(fault.HostNotReady, st.Remember(taskstate.FactProfiles, strings.Join(all, ",")))
}
