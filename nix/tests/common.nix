# The VM tests' network, mirroring internal/testbed (one topology,
# topology.json): a LAN router (vlan 1: 192.168.1.1 with an admin canary, a
# fake metadata service on 169.254.169.254, sample private addresses; NAT to
# vlan 2), an "internet" node (vlan 2: HTTP/UDP/DNS canaries and a scripted
# model API on 203.0.113.10) and the shrooms host (vlan 1: 192.168.1.2).
# Every canary logs each hit (protocol, local address, peer, payload) to the
# journal of its canary.service, so verdicts come from the receiving side.
{ self }:
let
  topology = builtins.fromJSON (builtins.readFile ./topology.json);
  t = topology;

  addr4 = address: prefixLength: { inherit address prefixLength; };
  addr6 = address: prefixLength: { inherit address prefixLength; };
  isV6 = a: builtins.match ".*:.*" a != null;

  # One canary process per node: TCP and UDP on every port, dual-stack.
  canaryModule =
    {
      role,
      tcpPorts,
      udpPorts,
      dns ? false,
    }:
    { pkgs, lib, ... }:
    {
      systemd.services.canary = {
        description = "shrooms test canary (${role})";
        wantedBy = [ "multi-user.target" ];
        after = [ "network.target" ];
        serviceConfig = {
          ExecStart = lib.escapeShellArgs (
            [
              (lib.getExe pkgs.python3)
              # Interpolated, so the script is copied to the store and is in
              # the test's closure (a bare path through escapeShellArgs is
              # only its source location as a string).
              "${./canary.py}"
              "--role"
              role
              "--tcp"
              (lib.concatMapStringsSep "," toString tcpPorts)
              "--udp"
              (lib.concatMapStringsSep "," toString udpPorts)
            ]
            ++ lib.optional dns "--dns"
          );
          Restart = "always";
        };
      };
    };

  # internet: vlan 2 (its eth1); the canaries, the DNS canary and the model API.
  internet =
    { lib, ... }:
    {
      imports = [
        (canaryModule {
          role = "internet";
          tcpPorts = [ 53 443 ] ++ t.tcpPorts;
          udpPorts = [ 53 443 ] ++ t.udpPorts;
          dns = true;
        })
      ];
      virtualisation.vlans = [ 2 ];
      networking.useDHCP = false;
      networking.firewall.enable = false;
      networking.interfaces = lib.mkOverride 0 {
        eth1.ipv4.addresses = [
          (addr4 t.internet.canary4 t.wan.prefix4)
          (addr4 t.internet.canary2_4 t.wan.prefix4)
        ];
        eth1.ipv6.addresses = [
          (addr6 t.internet.canary6 t.wan.prefix6)
          (addr6 t.internet.canary2_6 t.wan.prefix6)
        ];
        # IPv6 is routed, not translated: the LAN's prefix lies behind the router.
        eth1.ipv6.routes = [
          {
            address = t.lan.net6;
            prefixLength = t.lan.prefix6;
            via = t.wan.router6;
          }
        ];
      };
    };

  # router: LAN on eth1 (vlan 1), uplink on eth2 (vlan 2), NAT from the LAN.
  router =
    { lib, ... }:
    {
      imports = [
        (canaryModule {
          role = "router";
          tcpPorts = t.tcpPorts;
          udpPorts = [ 53 ] ++ t.udpPorts;
        })
      ];
      virtualisation.vlans = [
        1
        2
      ];
      networking.useDHCP = false;
      networking.firewall.enable = false;
      networking.nftables.enable = true;
      networking.interfaces = lib.mkOverride 0 {
        eth1.ipv4.addresses = [ (addr4 t.lan.router4 t.lan.prefix4) ];
        eth1.ipv6.addresses = [ (addr6 t.lan.router6 t.lan.prefix6) ];
        eth2.ipv4.addresses = [ (addr4 t.wan.router4 t.wan.prefix4) ];
        eth2.ipv6.addresses = [ (addr6 t.wan.router6 t.wan.prefix6) ];
        # The fake metadata service and sample private-range hosts.
        lo.ipv4.addresses = map (a: addr4 a 32) (
          [ t.metadata4 ] ++ builtins.filter (a: !(isV6 a)) t.private
        );
        lo.ipv6.addresses = map (a: addr6 a 128) (
          [ t.metadata6 ] ++ builtins.filter isV6 t.private
        );
      };
      networking.nat = {
        enable = true;
        internalIPs = [ "${t.lan.net4}/${toString t.lan.prefix4}" ];
        externalInterface = "eth2";
      };
      boot.kernel.sysctl."net.ipv6.conf.all.forwarding" = 1;
    };

  # host: shrooms, the seal, podman and the cage image built by the flake.
  host =
    {
      agents ? { },
      # The NixOS firewall with filterForward, as a hardened host runs it:
      # the module must forward cage traffic through it.
      firewall ? false,
    }:
    { pkgs, lib, ... }:
    {
      imports = [
        self.nixosModules.default
        (canaryModule {
          role = "host";
          tcpPorts = t.tcpPorts ++ [ t.loopbackPort ];
          udpPorts = t.udpPorts;
        })
      ];
      virtualisation.vlans = [ 1 ];
      virtualisation.memorySize = 3072;
      virtualisation.diskSize = 8192;
      virtualisation.cores = 2;
      networking.useDHCP = false;
      # Without the firewall only the seal stands between a cage and the
      # host's own services (the breakout test).
      networking.firewall.enable = firewall;
      networking.firewall.filterForward = firewall;
      networking.nftables.enable = true;
      networking.interfaces = lib.mkOverride 0 {
        eth1.ipv4.addresses = [ (addr4 t.lan.host4 t.lan.prefix4) ];
        eth1.ipv6.addresses = [ (addr6 t.lan.host6 t.lan.prefix6) ];
      };
      networking.defaultGateway = {
        address = t.lan.router4;
        interface = "eth1";
      };
      networking.defaultGateway6 = {
        address = t.lan.router6;
        interface = "eth1";
      };
      # The internet node is the only resolver there is (its DNS canary).
      networking.nameservers = [ t.internet.canary4 ];

      services.shrooms = {
        enable = true;
        settings.network.policy = "internet";
        settings.cage.memory = "1g";
        # The turns' worktrees are plain directories under /srv/work.
        settings.worktree.roots = [ "/srv/work" ];
        # /srv/work is not mounted with prjquota: run uncapped, on purpose.
        settings.worktree.uncapped = "allow";
        agents = {
          # bash from the real cage image, for scripted turns.
          bash = {
            command = [
              "/bin/bash"
              "-c"
            ];
            home = [
              "claude"
              "opencode"
              "shell"
            ];
          };
        }
        // agents;
      };

      environment.systemPackages = [
        pkgs.jq
        pkgs.curl
      ];
      environment.etc."shrooms-test/topology.json".source = ./topology.json;

      # A member of the shrooms group may run shrooms through sudo; bob may not.
      users.users.alice = {
        isNormalUser = true;
        extraGroups = [ "shrooms" ];
      };
      users.users.bob.isNormalUser = true;
    };
in
{
  inherit
    topology
    internet
    router
    host
    ;
}
