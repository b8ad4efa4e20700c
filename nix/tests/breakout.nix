# Breakout: the probe battery in a real cage on a NixOS host behind a LAN
# router, with canaries on the router (admin page, metadata, private
# addresses), the host and the internet. Sealed, nothing escapes and the
# internet canary is reached (positive control); with the seal unit stopped
# the same battery gets through to the LAN (negative control) and `shrooms
# run` refuses to start a networked cage.
{ self }:
let
  common = import ./common.nix { inherit self; };
  t = common.topology;
  # What `shrooms probe --targets` aims at (probe.Params fields).
  targets = {
    internet = [
      t.internet.canary4
      t.internet.canary6
    ];
    host = [
      t.lan.host4
      t.lan.host6
    ];
    lan = [
      t.lan.router4
      t.lan.router6
    ]
    ++ t.private;
    metadata = [
      t.metadata4
      t.metadata6
    ];
    resolvers = [ t.internet.canary4 ];
    inherit (t) tcpPorts udpPorts;
  };
in
{
  name = "shrooms-breakout";

  nodes = {
    internet = common.internet;
    router = common.router;
    host =
      { ... }:
      {
        imports = [ (common.host { }) ];
        environment.etc."shrooms-test/targets.json".text = builtins.toJSON targets;
      };
  };

  testScript = ''
    import json
    import shlex

    T = json.loads(${builtins.toJSON (builtins.toJSON t)})
    CAGE_GW4 = "10.89.0.1"  # settings.network.subnet4 = 10.89.0.0/24 (default)


    def canary_hits(machine, tag):
        out = machine.succeed("journalctl -u canary.service -o cat --no-pager")
        return [l for l in out.splitlines() if l.startswith("CANARY ") and tag in l]


    def cage_tcp(task, addr, port, tag):
        """One turn of bash in the real cage image: connect to addr:port with
        bash's /dev/tcp and send an HTTP request carrying tag. Returns
        (exit code, output)."""
        script = (
            f"exec 3<>/dev/tcp/{addr}/{port} || exit 7; "
            f"printf 'GET /{tag} HTTP/1.0\\r\\n\\r\\n' >&3; timeout 5 cat <&3"
        )
        return host.execute(
            f"timeout 120 shrooms run --task {task} --agent bash --no-stdin -- {shlex.quote(script)} 2>&1"
        )


    def escaped(report):
        return [c["id"] + ": " + "; ".join(c.get("evidence") or []) for c in report["checks"] if c["verdict"] == "escaped"]


    start_all()
    for m in (internet, router, host):
        m.wait_for_unit("canary.service")
        m.wait_for_unit("network.target")
    host.wait_for_unit("shrooms-image.service")
    host.wait_for_unit("shrooms-seal.service")
    host.wait_until_succeeds(f"ping -c1 -W1 {T['internet']['canary4']}", timeout=60)

    with subtest("the host is ready: doctor, seal status, image, subids, group rule"):
        host.succeed("shrooms doctor")
        host.succeed("shrooms net status")
        status = json.loads(host.succeed("shrooms --json net status"))
        assert status["ok"] and status["policy"] == "internet", status
        host.succeed("podman image exists localhost/shrooms-agent:latest")
        host.succeed("grep -q '^shrooms:1879048192:268435456$' /etc/subuid")
        host.succeed("grep -q '^shrooms:1879048192:268435456$' /etc/subgid")
        host.succeed("test \"$(cat /proc/sys/net/bridge/bridge-nf-call-iptables)\" = 1")
        host.succeed("test -f /etc/shrooms/config.toml")
        host.succeed("su - alice -c 'sudo -n shrooms net status'")
        host.fail("su - bob -c 'sudo -n shrooms net status'")

    with subtest("positive control: a cage reaches the internet canary through the router"):
        rc, out = cage_tcp("reach-inet", T["internet"]["canary4"], 80, "vm-pos-inet")
        assert rc == 0 and "canary internet" in out, f"rc={rc} out={out}"
        hits = canary_hits(internet, "vm-pos-inet")
        assert hits, "the internet canary saw no hit"
        # Masqueraded twice: by the host (cage network) and by the router.
        assert all(f"from ::ffff:{T['wan']['router4']}:" in h for h in hits), hits

    with subtest("the cage reaches none of router admin page, metadata, host services, cage gateway"):
        for task, addr, port in [
            ("lan-admin", T["lan"]["router4"], 80),
            ("metadata", T["metadata4"], 80),
            ("host-lan", T["lan"]["host4"], 8080),
            ("host-gw", CAGE_GW4, 22),
            ("private", T["private"][0], 80),
        ]:
            tag = f"vm-neg-{task}"
            rc, out = cage_tcp(task, addr, port, tag)
            assert rc != 0 and "canary" not in out, f"{task}: {addr}:{port} answered: rc={rc} out={out}"
            for m in (router, host, internet):
                assert not canary_hits(m, tag), f"{task}: {m.name} canary saw {canary_hits(m, tag)}"

    with subtest("sealed: shrooms probe finds no escape and its positive control passes"):
        host.succeed("jq '.nonce = \"vmsealed\"' /etc/shrooms-test/targets.json > /tmp/targets-sealed.json")
        rc, out = host.execute(
            "timeout 600 shrooms --json probe --task probe-sealed --targets /tmp/targets-sealed.json > /tmp/probe-sealed.json"
        )
        report = json.loads(host.succeed("cat /tmp/probe-sealed.json"))
        print(json.dumps(report["summary"]))
        assert report["schema"] == 1 and report["checks"], report
        assert not escaped(report), f"escaped: {escaped(report)}"
        assert report["summary"]["escaped"] == 0, report["summary"]
        d2 = [c for c in report["checks"] if c["id"] == "D2"]
        assert d2 and d2[0]["verdict"] == "sealed", f"positive control D2: {d2}"
        # The receiving side agrees: the internet saw the probe, the LAN did not.
        assert canary_hits(internet, "vmsealed"), "the internet canary saw none of the probe's attempts"
        assert not canary_hits(router, "vmsealed"), f"router canary: {canary_hits(router, 'vmsealed')}"
        assert not canary_hits(host, "vmsealed"), f"host canary: {canary_hits(host, 'vmsealed')}"

    with subtest("negative control: with the seal stopped, shrooms refuses and the same probes get through"):
        host.succeed("systemctl stop shrooms-seal.service")
        host.fail("shrooms net status")
        rc, out = host.execute("shrooms run --task refused --agent bash --no-stdin -- true 2>&1")
        assert rc == 122 and "seal" in out, f"shrooms run without the seal: rc={rc} out={out}"
        # The same cage image, network and battery, started by podman itself
        # (shrooms would refuse): now the LAN answers.
        params = json.loads(host.succeed("cat /etc/shrooms-test/targets.json"))
        params.update({"policy": "internet", "nonce": "vmunsealed", "gateway": [CAGE_GW4]})
        # The static binary behind the PATH wrapper (what shrooms mounts itself).
        shrooms_bin = host.succeed("dirname $(readlink -f $(command -v shrooms))").strip() + "/.shrooms-wrapped"
        host.succeed(f"test -x {shrooms_bin}")
        host.succeed(
            "podman run --rm --network shrooms --user 1000:1000 --cap-drop all "
            f"-v {shrooms_bin}:/.shrooms/shrooms:ro "
            "localhost/shrooms-agent:latest /.shrooms/shrooms probe inside --params-json "
            f"{shlex.quote(json.dumps(params))} > /tmp/probe-unsealed.json || true"
        )
        report = json.loads(host.succeed("cat /tmp/probe-unsealed.json"))
        print(json.dumps(report["summary"]))
        assert escaped(report), "without the seal the probe should escape to the LAN"
        assert canary_hits(router, "vmunsealed"), "without the seal the router canary should see the probe"
        host.succeed("systemctl start shrooms-seal.service")
        host.succeed("shrooms net status")
        rc, out = cage_tcp("resealed", T["lan"]["router4"], 80, "vm-resealed")
        assert rc != 0 and not canary_hits(router, "vm-resealed"), f"resealed: rc={rc} out={out}"
  '';
}
