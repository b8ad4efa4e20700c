# pkg/config's defaults for the cage network, which the module needs at
# evaluation time (firewall rules for the bridge). internal/nixcheck checks
# them against config.Default().
{
  # The recommended policy with the model gateway: no network interface.
  policy = "none";
  # Who links a cage to the bridge: shrooms itself (netlink, its own NAT
  # table) or podman (a podman network, netavark).
  driver = "shrooms";
  bridge = "shrooms0";
  subnet4 = "10.89.0.0/24";
  subnet6 = "fd89:5eed:cafe::/64";
}
