package main

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"

	"github.com/shrooms-cage/shrooms/pkg/config"
	"github.com/shrooms-cage/shrooms/pkg/home"
)

// checkConfig loads what a turn would load from a config, for `config
// check` and `doctor`: every host file it names, each agent's baseline
// against the keep-list, and every token file that exists (mode 0600 or
// 0400, owner root). A token file that does not exist is a note, not an
// error: only the turns of the agents that use it need it (named).
func checkConfig(cfg *config.Config) (notes []string, err error) {
	notes = []string{}
	if err := cfg.CheckFiles(); err != nil {
		return notes, err
	}
	for _, name := range slices.Sorted(maps.Keys(cfg.Agents)) {
		if err := home.CheckBaseline(cfg, cfg.Agents[name].Home); err != nil {
			return notes, fmt.Errorf("agent %s: %w", name, err)
		}
	}
	for _, tok := range slices.Sorted(maps.Keys(cfg.Tokens)) {
		if _, serr := os.Lstat(cfg.Tokens[tok]); errors.Is(serr, os.ErrNotExist) {
			notes = append(notes, fmt.Sprintf("token %s: %s does not exist yet; turns of %s refuse until it does", tok, cfg.Tokens[tok], agentsUsing(cfg, tok)))
			continue
		}
		if err := cfg.CheckToken(tok); err != nil {
			return notes, err
		}
	}
	return notes, nil
}

// agentsUsing names the agents whose turns read token tok.
func agentsUsing(cfg *config.Config, tok string) string {
	var names []string
	for _, name := range slices.Sorted(maps.Keys(cfg.Agents)) {
		if slices.Contains(cfg.TokensOf(cfg.Agents[name]), tok) {
			names = append(names, name)
		}
	}
	if len(names) == 0 {
		return "no agent"
	}
	return "agent " + strings.Join(names, ", ")
}
