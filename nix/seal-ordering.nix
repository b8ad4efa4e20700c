# Where the shrooms-seal unit sits in boot, as plain data (no nixpkgs lib) so
# internal/nixcheck can check it for ordering cycles against the units it
# names. Without default dependencies: a normal service is ordered after
# basic.target, which comes after sockets.target and so after podman.socket,
# which the seal must precede. Nothing here propagates a stop from nftables:
# the seal is removed only by stopping shrooms-seal itself, and nftables'
# reloads and restarts re-apply it (see module.nix).
{
  unitConfig = {
    DefaultDependencies = false;
    # nftables' reload runs first (After= orders reload jobs too), then the
    # seal's ExecReload re-applies the tables it may have flushed.
    ReloadPropagatedFrom = [ "nftables.service" ];
  };
  wants = [ "sysinit.target" ];
  after = [
    "sysinit.target"
    "systemd-modules-load.service"
    "systemd-sysctl.service"
    "nftables.service"
    "firewall.service"
  ];
  before = [
    "podman.socket"
    "podman.service"
  ];
  # Pulled in at boot and whenever podman is started on its own.
  wantedBy = [
    "multi-user.target"
    "podman.socket"
    "podman.service"
  ];
}
