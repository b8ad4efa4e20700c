# Evaluates services.shrooms on the real NixOS module system without booting
# anything: a good configuration has no failed assertion and no shrooms
# warning, and its config.toml is built (which runs `shrooms config check` on
# it); each bad configuration is refused by the assertion that names its
# problem; a typo in settings fails the config file's build. Any mismatch
# aborts the evaluation or the build with a message.
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
          networking.nftables.enable = true;
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
      agents.claude = {
        command = [
          "claude"
          "--dangerously-skip-permissions"
        ];
        home = [
          "claude"
          "shell"
        ];
        tokenEnv.ANTHROPIC_API_KEY = "anthropic";
      };
    };
  };
  goodConfig = (eval good).config;

  # A key shrooms does not know: the config file must not build.
  typoConfig =
    (eval {
      services.shrooms.settings.netwrok.policy = "none";
    }).config;
  typoFile = typoConfig.environment.etc."shrooms/config.toml".source;

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
    outbox-is-state-dir = {
      config.services.shrooms.outbox.root = "/var/lib/shrooms";
      expect = "is also settings.state.dir";
    };
    world-writable-outbox = {
      config.services.shrooms.outbox.mode = "0777";
      expect = "lets other users write the outbox root";
    };
    subid-count = {
      config.services.shrooms.subIdRange.count = 1000;
      expect = "must be a multiple of 65536";
    };
    subid-user-unknown = {
      config.services.shrooms.settings.cage.subid_user = "nosuchuser";
      expect = "users.users.nosuchuser must exist with subUidRanges and subGidRanges";
    };
  };

  checkBad =
    name: c:
    let
      msgs = failed c.config;
      got = builtins.toJSON msgs;
    in
    if lib.any (m: lib.hasInfix c.expect m) msgs then
      name
    else
      throw "module-eval: ${name}: expected an assertion containing \"${c.expect}\", got ${got}";

  goodFailed = failed good;
  shroomsWarnings = lib.filter (lib.hasInfix "services.shrooms") goodConfig.warnings;
  refused = lib.mapAttrsToList checkBad bad;
in
if goodFailed != [ ] then
  throw "module-eval: the good configuration fails assertions: ${builtins.toJSON goodFailed}"
else if shroomsWarnings != [ ] then
  throw "module-eval: the good configuration warns: ${builtins.toJSON shroomsWarnings}"
else
  pkgs.runCommand "shrooms-module-eval"
    {
      nativeBuildInputs = [ pkgs.jq ];
      config = goodConfig.environment.etc."shrooms/config.toml".source;
      typoFailure = pkgs.testers.testBuildFailure typoFile;
      shrooms = lib.getExe goodConfig.services.shrooms.package;
      sealUnit = goodConfig.systemd.units."shrooms-seal.service".unit;
      imageUnit = goodConfig.systemd.units."shrooms-image.service".unit;
      nftUnit = goodConfig.systemd.units."nftables.service".unit;
      timerUnit = goodConfig.systemd.units."shrooms-gc.timer".unit;
      subuid = builtins.toJSON goodConfig.users.users.shrooms.subUidRanges;
      tmpfiles = builtins.toJSON goodConfig.systemd.tmpfiles.settings."10-shrooms";
      kernelModules = toString goodConfig.boot.kernelModules;
      refused = lib.concatStringsSep " " refused;
    }
    ''
      set -euo pipefail
      echo "refused as expected: $refused"
      cat "$config"
      # Built, so `shrooms config check` accepted it; the CLI agrees again.
      "$shrooms" --json config check "$config" | jq -e '.ok'
      grep -q 'unknown key' "$typoFailure/testBuildFailure.log"
      grep -q '^policy = "allowlist"' "$config"
      grep -q '^anthropic = "/run/secrets/anthropic-api-key"' "$config"
      grep -q '^ANTHROPIC_API_KEY = "anthropic"' "$config"
      seal="$sealUnit/shrooms-seal.service"
      cat "$seal"
      grep -q 'ExecStart=.*net apply --seal-only' "$seal"
      grep -q 'ExecReload=.*net apply --seal-only' "$seal"
      grep -q 'ExecStop=.*net flush' "$seal"
      grep -q '^DefaultDependencies=false' "$seal"
      grep -q '^ReloadPropagatedFrom=nftables.service' "$seal"
      grep -q '^After=.*nftables.service' "$seal"
      grep -q '^Before=.*podman.socket' "$seal"
      if grep -q '^PartOf=' "$seal"; then
        echo "shrooms-seal must not be PartOf= anything (its stop flushes the seal)" >&2
        exit 1
      fi
      grep -q 'try-reload-or-restart shrooms-seal.service' "$nftUnit/nftables.service"
      grep -q 'podman --remote' "$imageUnit/shrooms-image.service" \
        || grep -rq 'podman --remote' "$(sed -n 's/^ExecStart=//p' "$imageUnit/shrooms-image.service")"
      grep -q '^OnCalendar=hourly' "$timerUnit/shrooms-gc.timer"
      echo "$subuid" | jq -e '.[0].startUid == 1879048192 and .[0].count == 268435456'
      echo "$tmpfiles" | jq -e '."/var/lib/shrooms/outbox".d.mode == "0750"'
      case " $kernelModules " in *" overlay "*) ;; *) echo "overlay not loaded" >&2; exit 1 ;; esac
      touch "$out"
    ''
