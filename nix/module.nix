# services.shrooms: the shrooms CLI on a NixOS host, with everything a sealed
# turn needs in place before the first one runs: rootful podman with its API
# socket, the cage image loaded, the nftables seal applied at boot (before
# podman may start a cage), br_netfilter, the subuid/subgid range the
# per-task user namespaces are carved from, /etc/shrooms/config.toml, the
# state and outbox directories, and a group whose members may run turns.
#
# Imported by the flake as nixosModules.default with `flake` set (the
# package and image default to the flake's); `flake = null` makes
# services.shrooms.package default to pkgs.shrooms (an overlay's).
{
  flake ? null,
}:
{
  config,
  lib,
  pkgs,
  ...
}:

let
  inherit (lib)
    literalExpression
    mkDefault
    mkEnableOption
    mkIf
    mkOption
    mkPackageOption
    types
    ;

  cfg = config.services.shrooms;
  settingsFormat = pkgs.formats.toml { };
  system = pkgs.stdenv.hostPlatform.system;
  netDefaults = import ./network-defaults.nix;

  # Where services.shrooms.package's default comes from.
  shroomsPackages = if flake != null then flake.packages.${system} or { } else pkgs;
  shroomsPackagesText =
    if flake != null then "shrooms.packages.\${pkgs.stdenv.hostPlatform.system}" else "pkgs";

  # The settings as TOML, refused at build time unless shrooms' own strict
  # loader accepts them (`shrooms config check`: an unknown key such as
  # settings.netwrok, a bad value, a token_env naming no token). The Go
  # parser is the one source of truth; the module only adds what the CLI
  # cannot know (store paths, users, podman being on).
  uncheckedConfig = settingsFormat.generate "shrooms-config-unchecked.toml" cfg.settings;
  configFile = pkgs.runCommand "shrooms-config.toml" { unchecked = uncheckedConfig; } ''
    ${exe} config check --syntax "$unchecked"
    cp "$unchecked" "$out"
  '';
  exe = lib.getExe cfg.package;
  # Every unit passes the same file, which is also /etc/shrooms/config.toml
  # (the CLI's default), so a hand-run `shrooms` sees what the units see.
  shrooms = "${exe} --config ${configFile}";

  storeDir = builtins.storeDir;
  isStorePath = p: p == storeDir || lib.hasPrefix "${storeDir}/" p;
  badTokenPaths = lib.filterAttrs (
    _: p: !(lib.hasPrefix "/" p) || isStorePath p
  ) cfg.settings.tokens;
  badTokenText = lib.concatStringsSep ", " (
    lib.mapAttrsToList (n: p: "${n} = \"${p}\"") badTokenPaths
  );

  networked = cfg.settings.network.policy != "none";
  net = cfg.settings.network;
  nftables = config.networking.nftables;

  # The cage user namespaces come from this user's /etc/subuid and
  # /etc/subgid ranges (the module creates "shrooms" itself).
  subidUser = cfg.settings.cage.subid_user;
  cageRuntime = cfg.settings.cage.runtime;
  subidEntry = config.users.users.${subidUser} or null;
  subidOK =
    subidUser == "shrooms"
    || (
      subidEntry != null
      && (subidEntry.subUidRanges or [ ]) != [ ]
      && (subidEntry.subGidRanges or [ ]) != [ ]
    );

  profiles = [
    "claude"
    "codex"
    "gemini"
    "opencode"
    "shell"
  ];
  agentType = types.submodule {
    options = {
      command = mkOption {
        type = types.nonEmptyListOf types.str;
        example = [
          "claude"
          "--dangerously-skip-permissions"
        ];
        description = "The argv run in /work; `shrooms run`'s trailing arguments are appended.";
      };
      image = mkOption {
        type = types.nullOr types.str;
        default = null;
        description = "The image this agent's turns run, instead of `settings.cage.image`.";
      };
      env = mkOption {
        type = types.attrsOf types.str;
        default = { };
        example = {
          DISABLE_AUTOUPDATER = "1";
        };
        description = "Extra environment of the cage (never secrets: see `tokenEnv`).";
      };
      home = mkOption {
        type = types.nonEmptyListOf (types.enum profiles);
        default = [ "shell" ];
        description = "The HOME profiles whose reset applies between this agent's turns.";
      };
      tokenEnv = mkOption {
        type = types.attrsOf types.str;
        default = { };
        example = {
          ANTHROPIC_API_KEY = "anthropic";
        };
        description = ''
          Environment variable → token name of {option}`services.shrooms.tokens`: the
          cage gets the token file's contents in that variable. Becomes `token_env`.
          The weaker mode: prefer `gateway`.
        '';
      };
      gateway = mkOption {
        type = types.nullOr types.str;
        default = null;
        example = "anthropic";
        description = ''
          A `[gateway.NAME]` of {option}`services.shrooms.settings`: the agent's model
          requests go through shrooms' per-turn gateway and the real key (or
          subscription sign-in) never enters the cage.
        '';
      };
    };
  };
  agentSettings =
    a:
    {
      inherit (a) command env home;
      token_env = a.tokenEnv;
    }
    // lib.optionalAttrs (a.image != null) { inherit (a) image; }
    // lib.optionalAttrs (a.gateway != null) { inherit (a) gateway; };

  # Hardening shared by the oneshot units (as harmonia and headscale do);
  # each unit widens only what it needs.
  hardening = {
    NoNewPrivileges = true;
    ProtectHome = true;
    PrivateTmp = true;
    ProtectKernelLogs = true;
    ProtectKernelModules = true;
    ProtectClock = true;
    ProtectHostname = true;
    RestrictRealtime = true;
    LockPersonality = true;
    SystemCallArchitectures = "native";
    RemoveIPC = true;
  };
in
{
  options.services.shrooms = {
    enable = mkEnableOption "shrooms (each agent turn in a sealed rootful podman cage)";

    package = mkPackageOption shroomsPackages "shrooms" {
      default = if flake != null then [ "default" ] else [ "shrooms" ];
      pkgsText = shroomsPackagesText;
    };

    group = mkOption {
      type = types.str;
      default = "shrooms";
      description = ''
        Members of this group may run shrooms (every subcommand, turns
        included) as root through sudo without a password: `sudo shrooms run …`.
        shrooms needs root for rootful podman, the nftables seal and the task
        state, and it mounts the worktree a caller names into a cage, so
        membership is as trusted as root. The group is created when it is the
        default.
      '';
    };

    sudo = mkOption {
      type = types.bool;
      default = true;
      description = ''
        Whether to add the sudo (and sudo-rs) rule that lets members of
        {option}`services.shrooms.group` run the shrooms binary as root
        without a password.
      '';
    };

    subIdRange = {
      start = mkOption {
        type = types.ints.unsigned;
        default = 1879048192;
        description = ''
          First host uid/gid of the range shrooms carves into one 65536-id user
          namespace per task (stable for a task, disjoint between tasks). It
          must not overlap any other user's range: NixOS gives normal users
          ranges from 100000 up.
        '';
      };
      count = mkOption {
        type = types.ints.positive;
        default = 268435456;
        description = "Number of ids in the range (a multiple of 65536; 268435456 gives 4096 task slots).";
      };
    };

    tokens = mkOption {
      type = types.attrsOf types.str;
      default = { };
      example = literalExpression ''
        {
          anthropic = "/run/secrets/anthropic-api-key";
          claude-credentials = "/run/agenix/claude-credentials.json";
        }
      '';
      description = ''
        Secrets: token name → absolute path of a file outside the Nix store
        (which is world-readable), e.g. one managed by agenix or sops-nix.
        Only the path is written to the configuration; shrooms reads the file
        at the start of each turn and hands it to the cage only as the
        environment variable an agent's `token_env` names, or seeds it once
        into a task HOME (`home.<profile>.bootstrap`). Give paths as strings,
        never as Nix path literals (those would be copied into the store).
        Merged into `settings.tokens` (`[tokens]` of the configuration); a
        name defined in both with different paths is an evaluation error.
      '';
    };

    agents = mkOption {
      type = types.attrsOf agentType;
      default = { };
      example = literalExpression ''
        {
          claude = {
            command = [ "claude" "--dangerously-skip-permissions" ];
            env.DISABLE_AUTOUPDATER = "1";
            home = [ "claude" "shell" ];
            tokenEnv.ANTHROPIC_API_KEY = "anthropic";
          };
        }
      '';
      description = ''
        Agents (`[agents.NAME]` of the configuration), typed. Merged into
        `settings.agents`; an agent here replaces the built-in agent of the same
        name (claude, codex, gemini, opencode, shell).
      '';
    };

    gc = {
      enable = mkOption {
        type = types.bool;
        default = true;
        description = "Whether a timer runs `shrooms gc` (removes cages a crashed shrooms left behind, releases HOME mounts and loop devices of idle tasks).";
      };
      dates = mkOption {
        type = types.str;
        default = "hourly";
        description = "When the gc timer fires (systemd.time(7) calendar event).";
      };
    };

    outbox = {
      root = mkOption {
        type = types.str;
        default = "/var/lib/shrooms/outbox";
        description = ''
          Directory under which each task's outbox (`<root>/<task>`, mounted at
          /outbox in the cage as a fresh size-capped tmpfs while a turn runs)
          and its pending deliveries (`<root>/.pending/<task>/<turn>/`, what
          each turn left there, root-only until `shrooms outbox collect`) live.
          Created at boot by systemd-tmpfiles with the owner and mode below. It
          must not contain symbolic links. Becomes `outbox.root`.
        '';
      };
      user = mkOption {
        type = types.str;
        default = "root";
        description = "Owner of the outbox root.";
      };
      group = mkOption {
        type = types.str;
        default = cfg.group;
        defaultText = literalExpression "config.services.shrooms.group";
        description = "Group of the outbox root.";
      };
      mode = mkOption {
        type = types.strMatching "0?[0-7]{3}";
        default = "0750";
        description = "Mode of the outbox root (never writable by others).";
      };
    };

    image = {
      package = mkOption {
        type = types.package;
        default = pkgs.callPackage ./image.nix { };
        defaultText = literalExpression "pkgs.callPackage \"\${shrooms}/nix/image.nix\" { }";
        description = ''
          The cage image as a `dockerTools.streamLayeredImage` (an executable
          that writes the image) or a `buildLayeredImage`/`buildImage` tarball.
          The default holds Claude Code, opencode, bash, coreutils, git and CA
          certificates and is tagged `localhost/shrooms-agent:latest`.
          Claude Code is unfree: allow it with
          `nixpkgs.config.allowUnfreePredicate = pkg: builtins.elem (lib.getName pkg) [ "claude-code" ];`
          (or `nixpkgs.config.allowUnfree = true`), or build the image
          without it: `pkgs.callPackage "''${shrooms}/nix/image.nix" { withClaudeCode = false; }`.
        '';
      };
      load = mkOption {
        type = types.bool;
        default = true;
        description = ''
          Whether the shrooms-image unit loads {option}`services.shrooms.image.package`
          into rootful podman's store at boot (and again whenever the image
          changes). shrooms never pulls; without this, load the image yourself
          (`podman load`) under the name `settings.cage.image` gives.
        '';
      };
    };

    settings = mkOption {
      default = { };
      description = ''
        shrooms' configuration (config.toml; see config.example.toml for every
        key), written to /etc/shrooms/config.toml. The generated file is checked
        at build time with `shrooms config check`, so an unknown key or a bad
        value fails the build. The keys below are typed here; everything else
        is passed through as given.
      '';
      example = literalExpression ''
        {
          network.policy = "allowlist";
          network.allow = [ "api.anthropic.com" "opencode.ai" ];
          cage.memory = "8g";
          agents.claude.token_env = { ANTHROPIC_API_KEY = "anthropic"; };
        }
      '';
      type = types.submodule {
        freeformType = settingsFormat.type;
        options = {
          podman.socket = mkOption {
            type = types.str;
            default = "unix:///run/podman/podman.sock";
            description = "The rootful podman API service (podman.socket on NixOS).";
          };
          state.dir = mkOption {
            type = types.str;
            default = "/var/lib/shrooms";
            description = "Host-side state: task locks, per-task uid ranges, turn counters.";
          };
          cage.image = mkOption {
            type = types.str;
            default = "localhost/shrooms-agent:latest";
            description = "The image turns run (never pulled; the shrooms-image unit loads it).";
          };
          cage.subid_user = mkOption {
            type = types.str;
            default = "shrooms";
            description = ''
              The /etc/subuid and /etc/subgid entry whose range shrooms carves
              into per-task user namespaces. When it is "shrooms" the module
              creates that system user with {option}`services.shrooms.subIdRange`.
            '';
          };
          cage.runtime = mkOption {
            type = types.str;
            default = "default";
            example = "/run/current-system/sw/bin/runsc";
            description = ''
              The OCI runtime cages run under: "default" (podman's own), a
              name (runc, crun, runsc, kata) or an absolute path. Podman
              before 5.x takes no per-container runtime over its API, so
              when it is not "default" the module makes it the runtime of
              the host's rootful podman (containers.conf engine.runtime, for
              every container of that podman), and shrooms refuses a cage
              that runs any other. gVisor: containers.conf takes no runtime
              flags, so name a wrapper called runsc that runs it with --platform=systrap
              --oci-seccomp --network=host (docs/gvisor.md): each turn reads the
              flags from its cage's runsc sandbox and refuses the cage without
              --oci-seccomp.
            '';
          };
          network.policy = mkOption {
            type = types.enum [
              "internet"
              "allowlist"
              "none"
            ];
            default = netDefaults.policy;
            description = ''
              `internet`: public internet only (no LAN, host, metadata or other
              cages); `allowlist`: only `network.allow`; `none`: no network
              interface at all. For `internet` and `allowlist` the shrooms-seal
              unit installs the nftables seal at boot.
            '';
          };
          network.allow = mkOption {
            type = types.listOf types.str;
            default = [ ];
            example = [
              "api.anthropic.com"
              "203.0.113.0/24"
            ];
            description = ''
              CIDRs, addresses and host names reachable under the `allowlist`
              policy. Names are answered by each cage's own resolver, which
              pins every address it hands out into the seal first (so names
              whose addresses rotate keep working) and refuses all others.
            '';
          };
          network.dns_upstream = mkOption {
            type = types.listOf types.str;
            default = [ ];
            example = [ "127.0.0.53" ];
            description = ''
              Resolvers the cages' resolver asks (addresses, optionally
              `addr:port`); empty is the host's /etc/resolv.conf.
            '';
          };
          network.driver = mkOption {
            type = types.enum [
              "shrooms"
              "podman"
            ];
            default = netDefaults.driver;
            description = ''
              Who links a cage to the bridge: `shrooms` (shrooms itself over
              netlink before the cage starts; no netavark or iptables, the NAT
              is shrooms' own nftables table) or `podman` (a podman network,
              netavark). With `shrooms` and an nftables firewall that drops
              forwarded packets by default, this module's forward rules let the
              cage subnet through.
            '';
          };
          network.bridge = mkOption {
            type = types.str;
            default = netDefaults.bridge;
            description = "The cage network's bridge.";
          };
          network.subnet4 = mkOption {
            type = types.str;
            default = netDefaults.subnet4;
            description = "The cage network's IPv4 subnet (let through `networking.firewall.filterForward`).";
          };
          network.subnet6 = mkOption {
            type = types.str;
            default = netDefaults.subnet6;
            description = "The cage network's IPv6 subnet; \"\" disables IPv6 in cages.";
          };
          outbox.root = mkOption {
            type = types.str;
            default = cfg.outbox.root;
            defaultText = literalExpression "config.services.shrooms.outbox.root";
            description = "See {option}`services.shrooms.outbox.root`.";
          };
          tokens = mkOption {
            type = types.attrsOf types.str;
            default = { };
            description = "Merged with {option}`services.shrooms.tokens` (prefer that).";
          };
          agents = mkOption {
            type = types.attrsOf settingsFormat.type;
            default = { };
            example = literalExpression ''
              {
                claude = {
                  command = [ "claude" "--dangerously-skip-permissions" ];
                  env = { DISABLE_AUTOUPDATER = "1"; };
                  home = [ "claude" "shell" ];
                  token_env = { ANTHROPIC_API_KEY = "anthropic"; };
                };
              }
            '';
            description = ''
              Agents as raw TOML tables (`[agents.NAME]`: `command`, `env`,
              `home`, `token_env`, `image`), merged with the typed
              {option}`services.shrooms.agents`.
            '';
          };
        };
      };
    };
  };

  config = mkIf cfg.enable {
    assertions = [
      {
        assertion = config.virtualisation.podman.enable;
        message = "services.shrooms needs rootful podman: set virtualisation.podman.enable = true (shrooms talks to its API socket, /run/podman/podman.sock).";
      }
      {
        assertion = badTokenPaths == { };
        message = "services.shrooms.tokens: ${badTokenText}: a token must be an absolute path outside ${storeDir} (the store is world-readable); point it at a file from agenix/sops-nix or under /run/secrets, given as a string.";
      }
      {
        assertion =
          lib.hasPrefix "/" cfg.outbox.root
          && cfg.outbox.root != "/"
          && !(isStorePath cfg.outbox.root)
          && cfg.settings.outbox.root == cfg.outbox.root;
        message = "services.shrooms.outbox.root = \"${cfg.outbox.root}\" must be an absolute directory other than / and outside ${storeDir}, and settings.outbox.root must not differ from it (set services.shrooms.outbox.root only).";
      }
      {
        assertion = builtins.match "0?[0-7][0-7][0145]" cfg.outbox.mode != null;
        message = "services.shrooms.outbox.mode = \"${cfg.outbox.mode}\" lets other users write the outbox root; use e.g. \"0750\".";
      }
      {
        assertion =
          lib.removeSuffix "/" cfg.outbox.root != lib.removeSuffix "/" cfg.settings.state.dir;
        message = "services.shrooms.outbox.root = \"${cfg.outbox.root}\" is also settings.state.dir: give the outbox root a directory of its own (default /var/lib/shrooms/outbox).";
      }
      {
        assertion = !(isStorePath cfg.settings.state.dir);
        message = "services.shrooms.settings.state.dir = \"${cfg.settings.state.dir}\" must be outside ${storeDir}.";
      }
      {
        assertion = lib.mod cfg.subIdRange.count 65536 == 0;
        message = "services.shrooms.subIdRange.count = ${toString cfg.subIdRange.count} must be a multiple of 65536 (one user namespace per task).";
      }
      {
        assertion =
          cfg.subIdRange.start >= 65536
          && cfg.subIdRange.start + cfg.subIdRange.count <= 4294967295;
        message = "services.shrooms.subIdRange must lie within 65536..4294967294 (start ${toString cfg.subIdRange.start}, count ${toString cfg.subIdRange.count}).";
      }
      {
        assertion = subidOK;
        message = "services.shrooms.settings.cage.subid_user = \"${subidUser}\": users.users.${subidUser} must exist with subUidRanges and subGidRanges (one 65536-id range per task), or leave it \"shrooms\" so the module creates that user from services.shrooms.subIdRange.";
      }
    ];

    # A flushed ruleset takes the seal with it until shrooms-seal re-applies
    # it (after nftables' own start or reload): warn about that gap.
    warnings =
      lib.optional (networked && nftables.enable && nftables.flushRuleset)
        "services.shrooms: networking.nftables.flushRuleset is on (it is whenever networking.nftables.ruleset or rulesetFile is set, or stateVersion < 23.11): every nftables start, reload and stop flushes shrooms' seal and podman's NAT, and shrooms-seal re-applies the seal only after nftables' job has finished, so running cages are briefly unsealed. Set networking.nftables.flushRuleset = false and keep your rules in networking.nftables.tables (deleted and re-created one by one) to close the gap.";

    # Rootful podman with its API socket (root:podman 0660 at
    # /run/podman/podman.sock); the docker-compatible socket is not needed.
    virtualisation.podman.enable = mkDefault true;
    virtualisation.podman.dockerSocket.enable = mkDefault false;
    virtualisation.containers.containersConf.settings = mkIf (cageRuntime != "default") {
      engine.runtime = cageRuntime;
    };

    # overlay: podman's storage driver. br_netfilter: the seal's rules for
    # bridged cage traffic (IPv6 link-local between cages) only see packets
    # that pass the IP hooks; `shrooms net apply` refuses to run without it.
    boot.kernelModules = [
      "overlay"
      "br_netfilter"
    ];
    boot.kernel.sysctl = {
      "net.bridge.bridge-nf-call-iptables" = 1;
      "net.bridge.bridge-nf-call-ip6tables" = 1;
    };

    # Cages resolve names through their own resolver on their loopback (shrooms
    # serves it from the host; no DNS port is opened on the bridge), and
    # their traffic is forwarded; the NixOS firewall drops it otherwise.
    # These rules only let packets reach the seal's own chains, which still
    # drop everything the policy forbids (a drop in any base chain is final).
    networking.firewall.extraForwardRules = mkIf (networked && nftables.enable) (
      lib.concatStringsSep "\n" (
        [ "iifname \"${net.bridge}\" ip saddr ${net.subnet4} accept comment \"shrooms cages\"" ]
        ++ lib.optional (
          net.subnet6 != ""
        ) "iifname \"${net.bridge}\" ip6 saddr ${net.subnet6} accept comment \"shrooms cages\""
      )
    );

    environment.systemPackages = [ cfg.package ];
    environment.etc."shrooms/config.toml".source = configFile;

    services.shrooms.settings = {
      tokens = cfg.tokens;
      agents = lib.mapAttrs (_: agentSettings) cfg.agents;
    };

    users.groups = mkIf (cfg.group == "shrooms") { shrooms = { }; };
    # The subid owner: /etc/subuid and /etc/subgid get `shrooms:START:COUNT`.
    # A system user without a login, so nothing ever runs as it.
    users.users = mkIf (subidUser == "shrooms") {
      shrooms = {
        isSystemUser = true;
        group = if cfg.group == "shrooms" then "shrooms" else "nogroup";
        description = "shrooms cage uid/gid ranges (never logs in)";
        subUidRanges = [
          {
            startUid = cfg.subIdRange.start;
            count = cfg.subIdRange.count;
          }
        ];
        subGidRanges = [
          {
            startGid = cfg.subIdRange.start;
            count = cfg.subIdRange.count;
          }
        ];
      };
    };

    security.sudo.extraRules = mkIf (cfg.sudo && config.security.sudo.enable) [
      {
        groups = [ cfg.group ];
        commands = [
          {
            command = exe;
            options = [ "NOPASSWD" ];
          }
        ];
      }
    ];
    security.sudo-rs.extraRules = mkIf (cfg.sudo && config.security.sudo-rs.enable) [
      {
        groups = [ cfg.group ];
        commands = [
          {
            command = exe;
            options = [ "NOPASSWD" ];
          }
        ];
      }
    ];

    # Merged rather than one attrset literal, so that an outbox root equal to
    # the state dir reaches its assertion instead of an evaluation error.
    systemd.tmpfiles.settings."10-shrooms" = lib.mkMerge [
      {
        ${cfg.settings.state.dir}.d = {
          mode = "0750";
          user = "root";
          group = cfg.group;
        };
      }
      {
        ${cfg.outbox.root}.d = {
          inherit (cfg.outbox) mode user group;
        };
      }
    ];

    # The seal: shrooms' drop-only nftables tables around the cage network.
    # `shrooms net apply --seal-only` installs it without contacting podman
    # (the rules match the bridge by name, so they can precede the network),
    # early in boot (nix/seal-ordering.nix: no default dependencies, after
    # the modules, sysctls and nftables, before podman.socket and
    # podman.service). It is re-applied in place (ExecReload; the tables are
    # replaced in one batch) when the config or binary changes and after
    # every nftables reload or restart. Only stopping this unit removes the
    # seal (and so stops networked turns); the seal is left in place at
    # shutdown. The first networked `shrooms run` creates the podman network
    # once it has verified the seal, and every turn refuses a networked cage
    # without it.
    systemd.services.shrooms-seal = mkIf networked (
      import ./seal-ordering.nix
      // {
        description = "shrooms nftables seal around the cage network";
        documentation = [ "https://github.com/shrooms-cage/shrooms/blob/main/docs/nixos.md" ];
        reloadIfChanged = true;
        reloadTriggers = [
          configFile
          cfg.package
        ];
        serviceConfig = hardening // {
          Type = "oneshot";
          RemainAfterExit = true;
          ExecStart = "${shrooms} net apply --seal-only";
          ExecReload = "${shrooms} net apply --seal-only";
          ExecStop = "${shrooms} net flush";
          # Root with CAP_NET_ADMIN only, in the host's network namespace.
          CapabilityBoundingSet = [ "CAP_NET_ADMIN" ];
          PrivateNetwork = false;
          PrivateUsers = false;
          ProtectSystem = "strict";
          PrivateDevices = true;
          ProtectKernelTunables = true;
          ProtectControlGroups = true;
          ProtectProc = "invisible";
          # `net apply` reads /proc/sys/net/bridge/* (br_netfilter on?).
          ProcSubset = "all";
          RestrictNamespaces = true;
          RestrictSUIDSGID = true;
          PrivateMounts = true;
          MemoryDenyWriteExecute = true;
          DevicePolicy = "closed";
          UMask = "0077";
          # Netlink for nftables; inet for resolving allowlist host names.
          RestrictAddressFamilies = [
            "AF_NETLINK"
            "AF_UNIX"
            "AF_INET"
            "AF_INET6"
          ];
          SystemCallFilter = [
            "@system-service"
            "~@privileged"
          ];
          SystemCallErrorNumber = "EPERM";
          # Allowlist host names may not resolve this early in boot.
          Restart = "on-failure";
          RestartSec = "5s";
        };
        startLimitIntervalSec = 120;
        startLimitBurst = 10;
      }
    );

    # A restarted nftables (stop flushes with flushRuleset, then the ruleset
    # is loaded anew) gets the seal back: --no-block, because the seal's own
    # job is ordered after nftables' and would wait for this one. A seal that
    # is not running (early boot, or stopped on purpose) stays as it is.
    systemd.services.nftables.serviceConfig.ExecStartPost = mkIf (networked && nftables.enable) (
      lib.mkAfter [
        "${config.systemd.package}/bin/systemctl --no-block try-reload-or-restart shrooms-seal.service"
      ]
    );

    # Loads the cage image through rootful podman's API socket (podman never
    # pulls for shrooms), so only podman.service writes its store and this
    # unit needs no capabilities at all. Skipped when this exact image was
    # loaded before and is still there; a changed image changes the unit, so
    # switching to a new configuration loads it again.
    systemd.services.shrooms-image = mkIf cfg.image.load {
      description = "Load the shrooms cage image into podman";
      wantedBy = [ "multi-user.target" ];
      requires = [ "podman.socket" ];
      after = [ "podman.socket" ];
      path = [
        config.virtualisation.podman.package
        pkgs.coreutils
      ];
      environment = {
        IMAGE = cfg.image.package;
        IMAGE_NAME = cfg.settings.cage.image;
        PODMAN_URL = cfg.settings.podman.socket;
        HOME = "/var/lib/shrooms-image";
        # podman-remote spools a streamed image to a file first.
        TMPDIR = "/var/tmp";
      };
      script = ''
        set -euo pipefail
        p() { podman --remote --url "$PODMAN_URL" "$@"; }
        stamp=/var/lib/shrooms-image/loaded
        if [ "$(cat "$stamp" 2>/dev/null || true)" = "$IMAGE" ] && p image exists "$IMAGE_NAME"; then
          echo "shrooms-image: $IMAGE_NAME already loaded from $IMAGE"
          exit 0
        fi
        if [ -d "$IMAGE" ]; then
          echo "shrooms-image: $IMAGE is a directory, not an image (use dockerTools.streamLayeredImage or buildLayeredImage)" >&2
          exit 1
        elif [ -x "$IMAGE" ]; then
          "$IMAGE" | p load
        else
          p load --input "$IMAGE"
        fi
        if ! p image exists "$IMAGE_NAME"; then
          echo "shrooms-image: $IMAGE loaded but $IMAGE_NAME is not in podman's store: the image's name:tag must equal settings.cage.image" >&2
          exit 1
        fi
        echo "$IMAGE" > "$stamp.tmp"
        mv "$stamp.tmp" "$stamp"
      '';
      serviceConfig = hardening // {
        Type = "oneshot";
        RemainAfterExit = true;
        StateDirectory = "shrooms-image";
        # Root only to open the root:podman 0660 socket; no capability.
        CapabilityBoundingSet = "";
        ProtectSystem = "strict";
        PrivateDevices = true;
        PrivateNetwork = true;
        ProtectControlGroups = true;
        ProtectKernelTunables = true;
        RestrictAddressFamilies = [ "AF_UNIX" ];
        RestrictNamespaces = true;
        RestrictSUIDSGID = true;
        SystemCallFilter = [
          "@system-service"
          "~@privileged"
        ];
        UMask = "0077";
      };
    };

    # Removes cages a crashed shrooms left behind (running turns are kept).
    systemd.services.shrooms-gc = mkIf cfg.gc.enable {
      description = "Remove cages a crashed shrooms left behind";
      requires = [ "podman.socket" ];
      after = [
        "podman.socket"
        "shrooms-image.service"
      ];
      # Not sandboxed: gc mounts task HOME filesystems again and cleans them,
      # as a hand-run `shrooms gc` does, and a private mount namespace would
      # hide those mounts from the turns that use them.
      serviceConfig = {
        Type = "oneshot";
        ExecStart = "${shrooms} gc";
        UMask = "0077";
      };
    };
    systemd.timers.shrooms-gc = mkIf cfg.gc.enable {
      wantedBy = [ "timers.target" ];
      timerConfig = {
        OnCalendar = cfg.gc.dates;
        Persistent = true;
        RandomizedDelaySec = "5m";
      };
    };
  };
}
