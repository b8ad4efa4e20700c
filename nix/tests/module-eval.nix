# Evaluates services.shrooms without booting anything: a good configuration
# has no failed assertion and renders a config.toml that the real binary's
# strict loader accepts; each bad configuration is refused by the assertion
# that names its problem. Any mismatch aborts the evaluation with a message.
{
  self,
  nixpkgs,
  pkgs,
}:

let
  inherit (pkgs) lib;

  eval =
    extra:
    nixpkgs.lib.nixosSystem {
      modules = [
        self.nixosModules.default
        {
          nixpkgs.pkgs = pkgs;
          boot.loader.grub.enable = false;
          fileSystems."/" = {
            device = "none";
            fsType = "tmpfs";
          };
          system.stateVersion = "26.05";
          services.shrooms.enable = true;
        }
        extra
      ];
    };
  failed = extra: map (a: a.message) (lib.filter (a: !a.assertion) (eval extra).config.assertions);

  good = {
    services.shrooms = {
      tokens.anthropic = "/run/secrets/anthropic-api-key";
      settings.network.policy = "allowlist";
      settings.network.allow = [
        "api.anthropic.com"
        "203.0.113.0/24"
      ];
      settings.cage.memory = "8g";
      settings.agents.claude = {
        command = [
          "claude"
          "--dangerously-skip-permissions"
        ];
        home = [
          "claude"
          "shell"
        ];
        token_env.ANTHROPIC_API_KEY = "anthropic";
      };
    };
  };
  goodConfig = (eval good).config;

  # name = { config; expect = a fragment of the assertion message }.
  bad = {
    token-in-store = {
      config.services.shrooms.tokens.anthropic = "${builtins.storeDir}/0000000000000000000000000000000-key";
      expect = "must be an absolute path outside ${builtins.storeDir}";
    };
    token-relative = {
      config.services.shrooms.tokens.anthropic = "secrets/key";
      expect = "must be an absolute path outside";
    };
    no-podman = {
      config.virtualisation.podman.enable = lib.mkForce false;
      expect = "set virtualisation.podman.enable = true";
    };
    bad-token-name = {
      config.services.shrooms.tokens."Anthropic Key" = "/run/secrets/anthropic-api-key";
      expect = "a token name is 1-63 of a-z 0-9 _ -";
    };
    outbox-is-state-dir = {
      config.services.shrooms.outbox.root = "/var/lib/shrooms";
      expect = "is also settings.state.dir";
    };
    bad-policy = {
      config.services.shrooms.settings.network.policy = "open";
      expect = "is not a policy";
    };
    empty-allowlist = {
      config.services.shrooms.settings.network.policy = "allowlist";
      expect = "empty network.allow";
    };
    world-writable-outbox = {
      config.services.shrooms.outbox.mode = "0777";
      expect = "lets other users write the outbox root";
    };
    unknown-token = {
      config.services.shrooms.settings.agents.claude = {
        command = [ "claude" ];
        token_env.ANTHROPIC_API_KEY = "missing";
      };
      expect = "which services.shrooms.tokens does not define";
    };
    bad-home-profile = {
      config.services.shrooms.settings.agents.claude = {
        command = [ "claude" ];
        home = [ "root" ];
      };
      expect = "may only list the HOME profiles";
    };
    subid-count = {
      config.services.shrooms.subIdRange.count = 1000;
      expect = "must be a multiple of 65536";
    };
  };

  checkBad =
    name: c:
    let
      msgs = failed c.config;
    in
    if lib.any (m: lib.hasInfix c.expect m) msgs then
      name
    else
      throw "module-eval: ${name}: expected an assertion containing \"${c.expect}\", got ${builtins.toJSON msgs}";

  goodFailed = failed good;
  refused = lib.mapAttrsToList checkBad bad;
in
if goodFailed != [ ] then
  throw "module-eval: the good configuration fails assertions: ${builtins.toJSON goodFailed}"
else
  pkgs.runCommand "shrooms-module-eval"
    {
      nativeBuildInputs = [ pkgs.jq ];
      config = goodConfig.environment.etc."shrooms/config.toml".source;
      shrooms = lib.getExe goodConfig.services.shrooms.package;
      sealUnit = goodConfig.systemd.units."shrooms-seal.service".unit;
      imageUnit = goodConfig.systemd.units."shrooms-image.service".unit;
      subuid = builtins.toJSON goodConfig.users.users.shrooms.subUidRanges;
      tmpfiles = builtins.toJSON goodConfig.systemd.tmpfiles.settings."10-shrooms";
      refused = lib.concatStringsSep " " refused;
    }
    ''
      set -euo pipefail
      echo "refused as expected: $refused"
      cat "$config"
      # The real binary's strict loader: exit 121 means a config error. In
      # the build sandbox there is no podman, subuid file or nftables, so
      # doctor itself exits 122 (host not ready) after loading the config.
      rc=0
      "$shrooms" --config "$config" --json doctor > doctor.json || rc=$?
      cat doctor.json
      if [ "$rc" = 121 ]; then
        echo "the generated config.toml is refused by shrooms" >&2
        exit 1
      fi
      jq -e '.findings[] | select(.check == "config" and .status == "ok")' doctor.json
      grep -q '^policy = "allowlist"' "$config"
      grep -q '^anthropic = "/run/secrets/anthropic-api-key"' "$config"
      grep -q 'net apply' "$sealUnit/shrooms-seal.service"
      grep -q 'ExecStop=.*net flush' "$sealUnit/shrooms-seal.service"
      grep -q 'After=.*nftables.service' "$sealUnit/shrooms-seal.service"
      grep -q 'podman load' "$imageUnit/shrooms-image.service" || grep -q 'ExecStart=' "$imageUnit/shrooms-image.service"
      echo "$subuid" | jq -e '.[0].startUid == 1879048192 and .[0].count == 268435456'
      echo "$tmpfiles" | jq -e '."/var/lib/shrooms/outbox".d.mode == "0750"'
      touch "$out"
    ''
