# The shrooms CLI: one static binary (CGO off, podman's remote-client build
# tags), built from the Go sources only so that editing docs or Nix files
# does not rebuild it.
{
  lib,
  buildGoModule,
  gitMinimal,
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
  root = ../.;
in
buildGoModule {
  pname = "shrooms";
  inherit version tags;

  # Every Go file of the module, plus what its unit tests read. The vendor
  # hash below depends on the imports of exactly these files.
  src = lib.fileset.toSource {
    inherit root;
    fileset = lib.fileset.unions [
      ../go.mod
      ../go.sum
      ../config.example.toml
      (lib.fileset.fileFilter (f: f.hasExt "go") ../cmd)
      (lib.fileset.fileFilter (f: f.hasExt "go") ../pkg)
      (lib.fileset.fileFilter (f: f.hasExt "go") ../internal)
      # The pinned opencode.db schema (embedded) and fuzz seeds.
      ../pkg/homereset/testdata
    ];
  };

  # The NAR hash of `go mod vendor` (vendor/ with modules.txt). Recompute
  # with nix/update-vendor-hash.sh; internal/nixcheck fails when it is stale.
  vendorHash = "sha256-UQZ3RKQrZl5WrVyW0csDblMAhre23UlMVEORsA/PznE=";

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
  nativeCheckInputs = [ gitMinimal ];
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
    platforms = lib.platforms.linux;
  };
}
