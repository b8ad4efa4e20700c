# The shrooms CLI: one static binary (CGO off, podman's remote-client build
# tags), built from the Go module tree only (nix/source-filter.nix) so that
# editing docs or Nix files does not rebuild it. The installed
# bin/shrooms is a small wrapper that puts the tools shrooms runs by name on
# PATH as store paths; shrooms mounts the static binary itself
# (bin/.shrooms-wrapped, its os.Executable) into cages.
{
  lib,
  stdenv,
  buildGoModule,
  gitMinimal,
  e2fsprogs,
  makeBinaryWrapper,
  installShellFiles,
  version ? "dev",
}:

let
  # The tags podman's bindings need for a client-only, cgo-free build
  # (the same list as the Makefile's TAGS).
  tags = [
    "remote"
    "exclude_graphdriver_btrfs"
    "containers_image_openpgp"
    "exclude_graphdriver_devicemapper"
  ];
  # Run by name: git (pkg/gitseal commits a turn's work), mkfs.ext4
  # (pkg/homestore formats task HOME images).
  runtimeInputs = [
    gitMinimal
    e2fsprogs
  ];
in
buildGoModule {
  pname = "shrooms";
  inherit version tags;

  # The whole Go tree minus deliberate exclusions (see the filter): an
  # embedded file or a test's testdata cannot be left out.
  src = builtins.path {
    name = "shrooms-source";
    path = ../.;
    filter = import ./source-filter.nix ../.;
  };

  # The NAR hash of `go mod vendor` (vendor/ with modules.txt). Recompute
  # with nix/update-vendor-hash.sh; internal/nixcheck fails when it is stale.
  vendorHash = "sha256-55JOqSdrnCjotGP6cU4ZlnRiWtaUm721HuFiNSloBE4=";

  env.CGO_ENABLED = 0;
  subPackages = [ "cmd/shrooms" ];
  ldflags = [
    "-s"
    "-w"
    "-X main.version=${version}"
  ];

  # buildGoModule's own checkPhase only tests subPackages; run the whole
  # module's unit tests instead. The builder is unprivileged (nixbld), so
  # every test that needs root, podman, nftables or namespaces skips itself
  # through internal/itest (SHROOMS_REQUIRE_INTEGRATION is unset here).
  doCheck = true;
  # pkg/gitseal's unit tests drive a real git.
  nativeCheckInputs = runtimeInputs;
  nativeBuildInputs = [
    makeBinaryWrapper
    installShellFiles
  ];
  # Completions and the man page come from the binary itself (`shrooms
  # completion bash|zsh|fish`, `shrooms man`).
  postInstall =
    lib.optionalString (stdenv.buildPlatform.canExecute stdenv.hostPlatform) ''
      installShellCompletion --cmd shrooms \
        --bash <("$out/bin/shrooms" completion bash) \
        --zsh <("$out/bin/shrooms" completion zsh) \
        --fish <("$out/bin/shrooms" completion fish)
      "$out/bin/shrooms" man > shrooms.1
      installManPage shrooms.1
    ''
    + ''
      wrapProgram "$out/bin/shrooms" --prefix PATH : ${lib.makeBinPath runtimeInputs}
    '';
  checkPhase = ''
    runHook preCheck
    export HOME="$TMPDIR"
    unset SHROOMS_REQUIRE_INTEGRATION
    if [ "$(id -u)" = 0 ]; then
      echo "refusing to run the test suite as root in the build sandbox" >&2
      exit 1
    fi
    go test -tags "${lib.concatStringsSep " " tags}" -count=1 ./...
    runHook postCheck
  '';

  meta = {
    description = "Run AI coding agents with permission prompts off, each turn in a sealed podman cage";
    homepage = "https://github.com/shrooms-cage/shrooms";
    mainProgram = "shrooms";
    # LICENSE at the repository's root.
    license = lib.licenses.asl20;
    platforms = lib.platforms.linux;
  };
}
