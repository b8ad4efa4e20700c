# The cage image: the agent CLIs (Claude Code, opencode) with bash,
# coreutils, git and CA certificates, streamed as a layered image tagged
# localhost/shrooms-agent:latest (the default cage.image). Nothing is pulled:
# the image is built from nixpkgs and loaded into podman by the NixOS module.
#
# claude-code is unfree: the nixpkgs this is called with must allow it, e.g.
#   nixpkgs.config.allowUnfreePredicate = pkg: builtins.elem (lib.getName pkg) [ "claude-code" ];
# or build without it (withClaudeCode = false).
{
  lib,
  dockerTools,
  buildEnv,
  bashInteractive,
  coreutils,
  gitMinimal,
  cacert,
  claude-code,
  opencode,
  withClaudeCode ? true,
  withOpencode ? true,
  extraPackages ? [ ],
  name ? "localhost/shrooms-agent",
  tag ? "latest",
}:

let
  # The cage user: shrooms runs turns as cage.user = 1000 with HOME on the
  # task volume at /home/agent.
  uid = "1000";
  root = buildEnv {
    name = "shrooms-agent-root";
    paths = [
      bashInteractive
      coreutils
      gitMinimal
      cacert
    ]
    ++ lib.optional withClaudeCode claude-code
    ++ lib.optional withOpencode opencode
    ++ extraPackages;
    pathsToLink = [
      "/bin"
      "/etc/ssl"
    ];
  };
in
dockerTools.streamLayeredImage {
  inherit name tag;
  contents = [ root ];
  # The cage's root is read-only, so every mount point shrooms and podman
  # use must already exist: /work (worktree), /outbox, /home/agent (the task
  # HOME volume), /tmp and /run (tmpfs), and the files podman bind-mounts
  # over (/etc/hosts, /etc/hostname, /etc/resolv.conf).
  fakeRootCommands = ''
    mkdir -p etc home/agent work outbox tmp var/tmp run root usr/bin
    cat > etc/passwd <<'EOF'
    root:x:0:0:root:/root:/bin/bash
    agent:x:${uid}:${uid}:agent:/home/agent:/bin/bash
    nobody:x:65534:65534:nobody:/nonexistent:/bin/false
    EOF
    cat > etc/group <<'EOF'
    root:x:0:
    agent:x:${uid}:
    nogroup:x:65534:
    EOF
    : > etc/hosts
    : > etc/hostname
    : > etc/resolv.conf
    chmod 0644 etc/passwd etc/group etc/hosts etc/hostname etc/resolv.conf
    ln -sf /bin/env usr/bin/env
    chmod 0700 root
    chmod 1777 tmp var/tmp
    chmod 0755 home work outbox run
    chown ${uid}:${uid} home/agent
    chmod 0755 home/agent
  '';
  config = {
    User = "${uid}:${uid}";
    WorkingDir = "/work";
    Cmd = [ "/bin/bash" ];
    Env = [
      "PATH=/bin"
      "HOME=/home/agent"
      "USER=agent"
      "SSL_CERT_FILE=/etc/ssl/certs/ca-bundle.crt"
      "NIX_SSL_CERT_FILE=/etc/ssl/certs/ca-bundle.crt"
      "GIT_SSL_CAINFO=/etc/ssl/certs/ca-bundle.crt"
    ];
    Labels = {
      "org.opencontainers.image.title" = "shrooms-agent";
      "org.opencontainers.image.description" = "shrooms cage image: agent CLIs, bash, coreutils, git, CA certificates";
    };
  };
}
