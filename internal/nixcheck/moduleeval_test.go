package nixcheck

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/BurntSushi/toml"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/shrooms-cage/shrooms/pkg/config"
)

// moduleEval is what nix/tests/eval-stubs.nix returns.
type moduleEval struct {
	Good struct {
		FailedAssertions []string                    `json:"failedAssertions"`
		Settings         map[string]any              `json:"settings"`
		ConfigScript     string                      `json:"configScript"`
		EtcSource        string                      `json:"etcSource"`
		Warnings         []string                    `json:"warnings"`
		FirewallIfaces   map[string]map[string][]int `json:"firewallInterfaces"`
		ExtraForward     string                      `json:"extraForwardRules"`
		Timers           map[string]map[string]any   `json:"timers"`
		Units            map[string]unitEval         `json:"units"`
		Tmpfiles         map[string]map[string]any   `json:"tmpfiles"`
		Users            map[string]map[string]any   `json:"users"`
		Groups           []string                    `json:"groups"`
		SudoRules        []map[string]any            `json:"sudoRules"`
		KernelModules    []string                    `json:"kernelModules"`
		Sysctl           map[string]json.Number      `json:"sysctl"`
		Podman           bool                        `json:"podman"`
		Packages         []string                    `json:"packages"`
	} `json:"good"`
	NoneUnits      []string `json:"noneUnits"`
	FlushWarnings  []string `json:"flushWarnings"`
	OwnSubidUser   []string `json:"ownSubidUser"`
	OverlayPackage string   `json:"overlayPackage"`
	Bad            map[string]struct {
		Expect   string   `json:"expect"`
		Messages []string `json:"messages"`
	} `json:"bad"`
	Options      []string `json:"options"`
	Undocumented []string `json:"undocumented"`
}

type unitEval struct {
	WantedBy      []string          `json:"wantedBy"`
	Wants         []string          `json:"wants"`
	Requires      []string          `json:"requires"`
	UnitConfig    map[string]any    `json:"unitConfig"`
	Before        []string          `json:"before"`
	After         []string          `json:"after"`
	PartOf        []string          `json:"partOf"`
	Environment   map[string]string `json:"environment"`
	Script        string            `json:"script"`
	ServiceConfig map[string]any    `json:"serviceConfig"`
}

// TestModuleEvaluates evaluates nix/module.nix with nixpkgs' lib and stub
// NixOS options (nix/eval-module.sh): the documented configuration passes
// every assertion, the settings it hands to pkgs.formats.toml, written as
// TOML, load with shrooms' own strict config loader, the seal unit runs
// `net apply --seal-only` on that file before podman, every option is
// documented, and each bad configuration is refused by the assertion that
// names its problem.
func TestModuleEvaluates(t *testing.T) {
	requireNix(t)
	libDir := os.Getenv("SHROOMS_NIXPKGS_LIB")
	if libDir == "" {
		// The one skip that SHROOMS_REQUIRE_INTEGRATION does not turn into a
		// failure: CI cannot fetch nixpkgs.lib, and issue 8 keeps the module
		// evaluation local (the fetched lib is never committed).
		t.Skip("SHROOMS_NIXPKGS_LIB is unset: evaluating the NixOS module needs a nixpkgs.lib checkout, which CI cannot fetch (local only, issue 8); run with SHROOMS_NIXPKGS_LIB=/path/to/nixpkgs.lib")
	}
	cmd := exec.Command(filepath.Join(repo, "nix/eval-module.sh"))
	cmd.Env = append(os.Environ(), "NIXPKGS_LIB="+libDir)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	assert.NilError(t, err, "nix/eval-module.sh: %s", stderr.String())

	var ev moduleEval
	dec := json.NewDecoder(bytes.NewReader(out))
	dec.UseNumber()
	assert.NilError(t, dec.Decode(&ev))
	g := ev.Good

	t.Run("good configuration", func(t *testing.T) {
		assert.Check(t, is.Len(g.FailedAssertions, 0), "%q", g.FailedAssertions)
		assert.Check(t, g.Podman, "virtualisation.podman.enable")
		assert.Check(t, is.DeepEqual(g.KernelModules, []string{"overlay", "br_netfilter"}))
		assert.Check(t, is.Len(g.Warnings, 0), "%q", g.Warnings)
		assert.Check(t, is.Len(ev.OwnSubidUser, 0), "an own subid user with ranges is refused: %q", ev.OwnSubidUser)
		// flushRuleset makes a gap possible: the module says so.
		assert.Check(t, is.Len(ev.FlushWarnings, 1))
		for _, w := range ev.FlushWarnings {
			assert.Check(t, is.Contains(w, "flushRuleset"))
		}
		// Cage DNS on the bridge, forwarded cage traffic for exactly the cage subnets.
		assert.Check(t, is.DeepEqual(g.FirewallIfaces, map[string]map[string][]int{"shrooms0": {"allowedUDPPorts": {53}, "allowedTCPPorts": {53}}}))
		assert.Check(t, is.Equal(g.ExtraForward, "iifname \"shrooms0\" ip saddr 10.89.0.0/24 accept comment \"shrooms cages\"\n"+
			"iifname \"shrooms0\" ip6 saddr fd89:5eed:cafe::/64 accept comment \"shrooms cages\""))
		assert.Check(t, is.Equal(g.Timers["shrooms-gc"]["timerConfig"].(map[string]any)["OnCalendar"], "hourly"))
		assert.Check(t, is.Equal(string(g.Sysctl["net.bridge.bridge-nf-call-iptables"]), "1"))
		assert.Check(t, is.Equal(string(g.Sysctl["net.bridge.bridge-nf-call-ip6tables"]), "1"))
		assert.Check(t, is.Contains(g.Groups, "shrooms"))
		u := g.Users["shrooms"]
		assert.Check(t, is.Equal(u["isSystemUser"], true))
		assert.Check(t, is.DeepEqual(u["subUidRanges"], []any{map[string]any{"startUid": json.Number("1879048192"), "count": json.Number("268435456")}}))
		assert.Check(t, is.DeepEqual(u["subGidRanges"], []any{map[string]any{"startGid": json.Number("1879048192"), "count": json.Number("268435456")}}))
		tf := g.Tmpfiles["10-shrooms"]
		assert.Check(t, is.DeepEqual(tf["/var/lib/shrooms/outbox"], map[string]any{"d": map[string]any{"mode": "0750", "user": "root", "group": "shrooms", "age": "-", "argument": "-"}}))
		assert.Check(t, is.Len(g.SudoRules, 1))
		assert.Check(t, is.Equal(ev.OverlayPackage, "/nix/store/00000000000000000000000000000000-shrooms"))
	})

	t.Run("config.toml loads", func(t *testing.T) {
		var buf bytes.Buffer
		assert.NilError(t, toml.NewEncoder(&buf).Encode(plain(g.Settings)))
		t.Logf("generated config.toml:\n%s", buf.String())
		cfg, err := config.Parse("config.toml", buf.Bytes())
		assert.NilError(t, err)
		assert.Check(t, is.Equal(cfg.Network.Policy, "allowlist"))
		assert.Check(t, is.DeepEqual(cfg.Network.Allow, []string{"api.anthropic.com", "203.0.113.0/24"}))
		assert.Check(t, is.Equal(cfg.Tokens["anthropic"], "/run/secrets/anthropic-api-key"))
		assert.Check(t, is.Equal(cfg.Podman.Socket, "unix:///run/podman/podman.sock"))
		assert.Check(t, is.Equal(cfg.Outbox.Root, "/var/lib/shrooms/outbox"))
		assert.Check(t, is.Equal(cfg.Cage.SubIDUser, "shrooms"))
		assert.Check(t, is.Equal(cfg.Cage.Image, "localhost/shrooms-agent:latest"))
		assert.Check(t, is.DeepEqual(cfg.Agents["claude"].TokenEnv, map[string]string{"ANTHROPIC_API_KEY": "anthropic"}))
		assert.Check(t, is.DeepEqual(cfg.Agents["claude"].Home, []string{"claude", "shell"}))
		assert.Check(t, is.DeepEqual(cfg.Agents["bash"].Command, []string{"/bin/bash", "-c"}))
		// services.shrooms.tokens and settings.tokens are merged, not replaced.
		assert.Check(t, is.DeepEqual(cfg.Tokens, map[string]string{"anthropic": "/run/secrets/anthropic-api-key", "openai": "/run/secrets/openai-api-key"}))
		assert.Check(t, is.Equal(cfg.Network.Bridge, config.Default().Network.Bridge))
		assert.Check(t, is.Equal(cfg.Network.Subnet4, config.Default().Network.Subnet4))
		assert.Check(t, is.Equal(cfg.Network.Subnet6, config.Default().Network.Subnet6))
		// The file /etc/shrooms/config.toml points at is built by running
		// the CLI's strict check on the generated TOML.
		assert.Check(t, is.Contains(g.ConfigScript, "/bin/shrooms config check --syntax \"$unchecked\""))

		// Control: the loader is strict, so a typo the freeform settings
		// let through is caught at run time, not silently ignored.
		typo := plain(g.Settings).(map[string]any)
		typo["cage"].(map[string]any)["memroy"] = "8g"
		buf.Reset()
		assert.NilError(t, toml.NewEncoder(&buf).Encode(typo))
		_, err = config.Parse("config.toml", buf.Bytes())
		assert.Check(t, is.ErrorContains(err, "unknown key"))
	})

	t.Run("seal unit", func(t *testing.T) {
		seal, ok := g.Units["shrooms-seal"]
		assert.Assert(t, ok, "no shrooms-seal unit; units: %v", keys(g.Units))
		cfgArg := "--config " + g.EtcSource + " "
		start, _ := seal.ServiceConfig["ExecStart"].(string)
		assert.Check(t, strings.HasSuffix(start, "/bin/shrooms "+cfgArg+"net apply --seal-only"), "ExecStart=%s", start)
		stop, _ := seal.ServiceConfig["ExecStop"].(string)
		assert.Check(t, strings.HasSuffix(stop, "/bin/shrooms "+cfgArg+"net flush"), "ExecStop=%s", stop)
		assert.Check(t, is.Equal(seal.ServiceConfig["Type"], "oneshot"))
		assert.Check(t, is.Contains(seal.Before, "podman.service"))
		assert.Check(t, is.Contains(seal.Before, "podman.socket"))
		assert.Check(t, is.Contains(seal.After, "nftables.service"))
		assert.Check(t, is.Contains(seal.WantedBy, "multi-user.target"))
		assert.Check(t, is.Equal(seal.UnitConfig["DefaultDependencies"], false))
		assert.Check(t, is.DeepEqual(seal.UnitConfig["ReloadPropagatedFrom"], []any{"nftables.service"}))
		assert.Check(t, is.Len(seal.PartOf, 0))
		assert.Check(t, is.Equal(seal.ServiceConfig["ExecReload"], start))
		nft, ok := g.Units["nftables"]
		assert.Assert(t, ok, "no nftables hook")
		assert.Check(t, is.DeepEqual(nft.ServiceConfig["ExecStartPost"], []any{"/nix/store/00000000000000000000000000000000-systemd/bin/systemctl --no-block try-reload-or-restart shrooms-seal.service"}))
		assert.Check(t, !contains(ev.NoneUnits, "shrooms-seal"), "policy none still has a seal unit: %v", ev.NoneUnits)
		img, ok := g.Units["shrooms-image"]
		assert.Assert(t, ok)
		assert.Check(t, is.Equal(img.Environment["IMAGE_NAME"], "localhost/shrooms-agent:latest"))
		assert.Check(t, is.Contains(img.Script, "p load"))
		assert.Check(t, is.Contains(img.Script, `podman --remote --url "$PODMAN_URL"`))
		assert.Check(t, is.Equal(img.Environment["PODMAN_URL"], "unix:///run/podman/podman.sock"))
		assert.Check(t, is.Contains(img.Requires, "podman.socket"))
		assert.Check(t, is.Contains(img.After, "podman.socket"))
		assert.Check(t, is.Equal(img.ServiceConfig["CapabilityBoundingSet"], ""))
		gcUnit, ok := g.Units["shrooms-gc"]
		assert.Assert(t, ok)
		assert.Check(t, strings.HasSuffix(gcUnit.ServiceConfig["ExecStart"].(string), cfgArg+"gc"))
	})

	t.Run("options documented", func(t *testing.T) {
		assert.Check(t, is.Len(ev.Undocumented, 0), "%q", ev.Undocumented)
		for _, o := range []string{"enable", "package", "settings", "tokens", "outbox.root", "outbox.mode", "image.package", "image.load", "group", "subIdRange.start", "settings.network.policy", "agents.<name>.command", "agents.<name>.tokenEnv", "agents.<name>.home", "agents.<name>.image", "agents.<name>.env", "gc.enable", "gc.dates"} {
			assert.Check(t, is.Contains(ev.Options, "services.shrooms."+o))
		}
	})

	t.Run("refused", func(t *testing.T) {
		for _, name := range []string{"token-in-store", "token-relative", "token-in-store-via-settings", "no-podman", "world-writable-outbox", "subid-count", "subid-user-unknown", "subid-user-without-ranges", "outbox-is-state-dir"} {
			b, ok := ev.Bad[name]
			if !assert.Check(t, ok, "bad configuration %s not evaluated", name) {
				continue
			}
			t.Logf("%s: %q", name, b.Messages)
			found := false
			for _, m := range b.Messages {
				found = found || strings.Contains(m, b.Expect)
			}
			assert.Check(t, found, "%s: want an assertion containing %q, got %q", name, b.Expect, b.Messages)
		}
	})
}

// plain turns json.Numbers into int64 or float64 for the TOML encoder.
func plain(v any) any {
	switch v := v.(type) {
	case map[string]any:
		m := make(map[string]any, len(v))
		for k, x := range v {
			m[k] = plain(x)
		}
		return m
	case []any:
		l := make([]any, len(v))
		for i, x := range v {
			l[i] = plain(x)
		}
		return l
	case json.Number:
		if i, err := v.Int64(); err == nil {
			return i
		}
		f, _ := v.Float64()
		return f
	}
	return v
}

// keys returns m's keys, sorted.
func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func contains(l []string, s string) bool {
	for _, x := range l {
		if x == s {
			return true
		}
	}
	return false
}
