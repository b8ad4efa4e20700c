# Evaluates nix/module.nix with nixpkgs' lib alone (nix-community/nixpkgs.lib,
# fetched outside the repository), for machines without nixpkgs: the NixOS
# options the module reads or sets are declared here as loosely typed stubs,
# and `pkgs` is a fake set with the few values the module touches. What this
# proves is the module's own logic (option types and defaults, assertions,
# the settings handed to pkgs.formats.toml, the units' shape); it cannot
# prove that NixOS accepts the units or that anything builds.
#
#   nix-instantiate --eval --strict --json nix/tests/eval-stubs.nix \
#     --argstr libPath /path/to/nixpkgs.lib/lib
#
# (nix/eval-module.sh runs exactly that.) The result is plain data:
# { good = { failedAssertions, settings, etcSource, units, … };
#   bad = { <name> = { expect, messages }; }; undocumented; options }.
{
  libPath ? null,
  lib ? import (/. + libPath),
}:

let
  inherit (lib) mkOption types;

  system = "x86_64-linux";
  fakeDrv = name: {
    type = "derivation";
    inherit name system;
    outPath = "${builtins.storeDir}/00000000000000000000000000000000-${name}";
    drvPath = "${builtins.storeDir}/00000000000000000000000000000000-${name}.drv";
    meta.mainProgram = name;
  };

  # pkgs.formats.toml { } as nixpkgs defines its type (a recursive TOML
  # value); generate returns a path-like attrset that keeps the value it
  # was given, so the harness can read exactly what would be rendered.
  tomlFormat = {
    type =
      let
        valueType =
          types.oneOf [
            types.bool
            types.int
            types.float
            types.str
            types.path
            (types.attrsOf valueType)
            (types.listOf valueType)
          ]
          // {
            description = "TOML value";
          };
      in
      types.attrsOf valueType;
    generate = name: value: {
      outPath = "${builtins.storeDir}/00000000000000000000000000000000-${name}";
      inherit name;
      generatedValue = value;
    };
  };

  fakePkgs = {
    inherit lib;
    # runCommand keeps its name, environment and script, so the harness can
    # check that the config file is run through `shrooms config check`.
    runCommand = name: env: script: {
      outPath = "${builtins.storeDir}/00000000000000000000000000000000-${name}";
      inherit name script env;
    };
    stdenv.hostPlatform.system = system;
    formats.toml = _: tomlFormat;
    callPackage = _: _: fakeDrv "shrooms-cage-image";
    coreutils = fakeDrv "coreutils";
    podman = fakeDrv "podman";
    systemd = fakeDrv "systemd";
    shrooms = fakeDrv "shrooms";
  };
  fakeFlake.packages.${system}.default = fakeDrv "shrooms";

  anything = mkOption {
    type = types.anything;
    default = { };
  };
  flag =
    default:
    mkOption {
      type = types.bool;
      inherit default;
    };
  strList = mkOption {
    type = types.listOf types.str;
    default = [ ];
  };

  # The part of a NixOS systemd service the module uses, typed as NixOS
  # types it; everything else is free-form.
  serviceType = types.submodule {
    freeformType = types.attrsOf types.anything;
    options = {
      description = mkOption {
        type = types.str;
        default = "";
      };
      wantedBy = strList;
      requiredBy = strList;
      wants = strList;
      requires = strList;
      conflicts = strList;
      before = strList;
      after = strList;
      partOf = strList;
      documentation = strList;
      reloadIfChanged = flag false;
      reloadTriggers = mkOption {
        type = types.listOf types.anything;
        default = [ ];
      };
      path = mkOption {
        type = types.listOf types.anything;
        default = [ ];
      };
      environment = mkOption {
        type = types.attrsOf (
          types.nullOr (
            types.oneOf [
              types.str
              types.path
              types.package
            ]
          )
        );
        default = { };
      };
      script = mkOption {
        type = types.lines;
        default = "";
      };
      serviceConfig = mkOption {
        type = types.attrsOf types.anything;
        default = { };
      };
      unitConfig = mkOption {
        type = types.attrsOf types.anything;
        default = { };
      };
      startLimitIntervalSec = mkOption {
        type = types.nullOr types.int;
        default = null;
      };
      startLimitBurst = mkOption {
        type = types.nullOr types.int;
        default = null;
      };
    };
  };

  # Stubs of the NixOS options the module reads or sets.
  nixosStubs = {
    options = {
      assertions = mkOption {
        type = types.listOf types.unspecified;
        default = [ ];
      };
      warnings = strList;
      nixpkgs = anything;
      virtualisation.podman = {
        enable = flag false;
        dockerSocket.enable = flag false;
        package = mkOption {
          type = types.package;
          default = fakePkgs.podman;
        };
      };
      virtualisation.containers.containersConf.settings = mkOption {
        type = types.attrsOf types.anything;
        default = { };
      };
      boot.kernelModules = strList;
      networking.nftables.enable = flag false;
      networking.nftables.flushRuleset = flag false;
      networking.firewall.interfaces = mkOption {
        type = types.attrsOf (types.attrsOf (types.listOf types.port));
        default = { };
      };
      networking.firewall.extraForwardRules = mkOption {
        type = types.lines;
        default = "";
      };
      systemd.package = mkOption {
        type = types.package;
        default = fakePkgs.systemd;
      };
      systemd.timers = mkOption {
        type = types.attrsOf (types.attrsOf types.anything);
        default = { };
      };
      boot.kernel.sysctl = mkOption {
        type = types.attrsOf types.anything;
        default = { };
      };
      environment.systemPackages = mkOption {
        type = types.listOf types.package;
        default = [ ];
      };
      environment.etc = mkOption {
        type = types.attrsOf (
          types.submodule {
            freeformType = types.attrsOf types.anything;
            options.source = mkOption { type = types.anything; };
          }
        );
        default = { };
      };
      users.users = mkOption {
        type = types.attrsOf (types.attrsOf types.anything);
        default = { };
      };
      users.groups = mkOption {
        type = types.attrsOf (types.attrsOf types.anything);
        default = { };
      };
      security.sudo.enable = flag true;
      security.sudo.extraRules = mkOption {
        type = types.listOf types.anything;
        default = [ ];
      };
      security.sudo-rs.enable = flag false;
      security.sudo-rs.extraRules = mkOption {
        type = types.listOf types.anything;
        default = [ ];
      };
      systemd.services = mkOption {
        type = types.attrsOf serviceType;
        default = { };
      };
      # attrsOf (attrsOf (attrsOf submodule{type,mode,user,group,age,argument})).
      systemd.tmpfiles.settings = mkOption {
        type = types.attrsOf (
          types.attrsOf (
            types.attrsOf (
              types.submodule {
                options = lib.genAttrs [ "mode" "user" "group" "age" "argument" ] (
                  _:
                  mkOption {
                    type = types.str;
                    default = "-";
                  }
                );
              }
            )
          )
        );
        default = { };
      };
    };
  };

  eval =
    {
      flake ? fakeFlake,
      extra ? { },
    }:
    lib.evalModules {
      modules = [
        nixosStubs
        (lib.modules.importApply ../module.nix { inherit flake; })
        {
          _module.args.pkgs = fakePkgs;
          services.shrooms.enable = true;
        }
        extra
      ];
    };
  failed = e: map (a: a.message) (lib.filter (a: !a.assertion) e.config.assertions);

  # The configuration docs/nixos.md shows, with an allowlist.
  good = {
    networking.nftables.enable = true;
    services.shrooms = {
      tokens.anthropic = "/run/secrets/anthropic-api-key";
      settings.tokens.openai = "/run/secrets/openai-api-key";
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
        env.DISABLE_AUTOUPDATER = "1";
        home = [
          "claude"
          "shell"
        ];
        tokenEnv.ANTHROPIC_API_KEY = "anthropic";
      };
      # Raw TOML, merged with the typed agents.
      settings.agents.bash.command = [
        "/bin/bash"
        "-c"
      ];
      settings.agents.bash.home = [ "shell" ];
    };
  };
  goodEval = eval { extra = good; };
  gc = goodEval.config;
  configSource = gc.environment.etc."shrooms/config.toml".source;
  unitFields =
    u:
    {
      inherit (u)
        wantedBy
        wants
        requires
        before
        after
        partOf
        reloadIfChanged
        script
        unitConfig
        ;
      reloadTriggers = map toString u.reloadTriggers;
      path = map toString u.path;
      environment = lib.mapAttrs (_: toString) u.environment;
      serviceConfig = lib.mapAttrs (
        _: v: if builtins.isList v then map toString v else toString v
      ) u.serviceConfig;
    };

  # name = { extra; expect = a fragment of the assertion message }.
  bad = {
    token-in-store = {
      extra.services.shrooms.tokens.anthropic = "${builtins.storeDir}/00000000000000000000000000000000-key";
      expect = "must be an absolute path outside ${builtins.storeDir}";
    };
    token-relative = {
      extra.services.shrooms.tokens.anthropic = "secrets/key";
      expect = "must be an absolute path outside";
    };
    # As a user writes it: a plain false beats the module's mkDefault true.
    no-podman = {
      extra.virtualisation.podman.enable = false;
      expect = "set virtualisation.podman.enable = true";
    };
    token-in-store-via-settings = {
      extra.services.shrooms.settings.tokens.other = "${builtins.storeDir}/00000000000000000000000000000000-key";
      expect = "must be an absolute path outside ${builtins.storeDir}";
    };
    outbox-is-state-dir = {
      extra.services.shrooms.outbox.root = "/var/lib/shrooms";
      expect = "is also settings.state.dir";
    };
    world-writable-outbox = {
      extra.services.shrooms.outbox.mode = "0777";
      expect = "lets other users write the outbox root";
    };
    subid-count = {
      extra.services.shrooms.subIdRange.count = 1000;
      expect = "must be a multiple of 65536";
    };
    subid-user-unknown = {
      extra.services.shrooms.settings.cage.subid_user = "alice";
      expect = "users.users.alice must exist with subUidRanges and subGidRanges";
    };
    subid-user-without-ranges = {
      extra = {
        services.shrooms.settings.cage.subid_user = "alice";
        users.users.alice.isNormalUser = true;
      };
      expect = "users.users.alice must exist with subUidRanges and subGidRanges";
    };
  };

  # A subid user of the owner's own, with ranges: accepted.
  ownSubidUser = failed (eval {
    extra = {
      services.shrooms.settings.cage.subid_user = "alice";
      users.users.alice = {
        isNormalUser = true;
        subUidRanges = [
          {
            startUid = 1879048192;
            count = 65536;
          }
        ];
        subGidRanges = [
          {
            startGid = 1879048192;
            count = 65536;
          }
        ];
      };
    };
  });
  flushEval = eval {
    extra = lib.recursiveUpdate good { networking.nftables.flushRuleset = true; };
  };

  docList = lib.filter (o: o.visible && !o.internal) (
    lib.optionAttrSetToDocList goodEval.options.services.shrooms
  );
  descriptionOf =
    o:
    let
      d = o.description or null;
    in
    if d == null then
      ""
    else if builtins.isAttrs d then
      d.text or ""
    else
      d;
in
{
  good = {
    failedAssertions = failed goodEval;
    settings = configSource.env.unchecked.generatedValue;
    configScript = configSource.script;
    etcSource = toString configSource;
    warnings = gc.warnings;
    firewallInterfaces = gc.networking.firewall.interfaces;
    extraForwardRules = gc.networking.firewall.extraForwardRules;
    timers = gc.systemd.timers;
    units = lib.mapAttrs (_: unitFields) gc.systemd.services;
    tmpfiles = gc.systemd.tmpfiles.settings;
    users = lib.mapAttrs (_: u: builtins.removeAttrs u [ ]) gc.users.users;
    groups = builtins.attrNames gc.users.groups;
    sudoRules = gc.security.sudo.extraRules;
    kernelModules = gc.boot.kernelModules;
    sysctl = gc.boot.kernel.sysctl;
    podman = gc.virtualisation.podman.enable;
    packages = map toString gc.environment.systemPackages;
  };
  inherit ownSubidUser;
  flushWarnings = flushEval.config.warnings;
  # The same with policy "none": no seal unit.
  noneUnits = builtins.attrNames (
    (eval { extra.services.shrooms.settings.network.policy = "none"; }).config.systemd.services
  );
  # The overlay's module (flake = null): the package defaults to pkgs.shrooms.
  overlayPackage = toString (eval { flake = null; }).config.services.shrooms.package;
  bad = lib.mapAttrs (_: c: {
    inherit (c) expect;
    messages = failed (eval { inherit (c) extra; });
  }) bad;
  options = map (o: o.name) docList;
  undocumented = map (o: o.name) (lib.filter (o: lib.trim (descriptionOf o) == "") docList);
}
