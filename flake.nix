{
  description = "shrooms: run AI coding agents with permission prompts off, each turn in a sealed podman cage";

  # nixpkgs: what the packages, the module's defaults and the VM tests are
  # built from. nixpkgs-stable: the 26.05 release line, against which the
  # package and the module are checked as well (nix flake check). Each is
  # locked to a revision of the branch it names (flake.lock).
  inputs.nixpkgs.url = "github:NixOS/nixpkgs/nixpkgs-unstable";
  inputs.nixpkgs-stable.url = "github:NixOS/nixpkgs/staging-next-26.05";

  outputs =
    {
      self,
      nixpkgs,
      nixpkgs-stable,
    }:
    let
      inherit (nixpkgs) lib;
      systems = [
        "x86_64-linux"
        "aarch64-linux"
      ];
      version = self.shortRev or self.dirtyShortRev or "dev";

      # The flake's own package sets allow exactly two unfree packages:
      # shrooms itself (no licence is granted yet, see nix/package.nix) and
      # claude-code, so that the cage image and the VM tests evaluate. Your
      # NixOS configuration decides for itself: see docs/nixos.md.
      pkgsFrom =
        input: system:
        import input {
          inherit system;
          config.allowUnfreePredicate =
            pkg:
            builtins.elem (lib.getName pkg) [
              "shrooms"
              "claude-code"
            ];
        };
      pkgsFor = pkgsFrom nixpkgs;
      forAllSystems = f: lib.genAttrs systems (system: f system (pkgsFor system));
    in
    {
      overlays.default = final: _prev: {
        shrooms = final.callPackage ./nix/package.nix { inherit version; };
        shrooms-cage-image = final.callPackage ./nix/image.nix { };
      };

      packages = forAllSystems (
        system: pkgs: {
          default = pkgs.callPackage ./nix/package.nix { inherit version; };
          cage-image = pkgs.callPackage ./nix/image.nix { };
        }
      );

      apps = forAllSystems (
        system: pkgs: {
          default = {
            type = "app";
            program = lib.getExe self.packages.${system}.default;
            meta.description = "the shrooms CLI";
          };
        }
      );

      nixosModules.default = lib.modules.importApply ./nix/module.nix { flake = self; };
      nixosModules.shrooms = self.nixosModules.default;

      checks = forAllSystems (
        system: pkgs:
        let
          vmTest = file: pkgs.testers.runNixOSTest (import file { inherit self; });
          stablePkgs = pkgsFrom nixpkgs-stable system;
        in
        {
          package = self.packages.${system}.default;
          cage-image = self.packages.${system}.cage-image;
          module-eval = import ./nix/tests/module-eval.nix { inherit self nixpkgs pkgs; };
          # The same package and module on the stable release line.
          package-stable = stablePkgs.callPackage ./nix/package.nix { inherit version; };
          module-eval-stable = import ./nix/tests/module-eval.nix {
            inherit self;
            nixpkgs = nixpkgs-stable;
            pkgs = stablePkgs;
          };
          formatting =
            pkgs.runCommand "shrooms-nixfmt"
              {
                nativeBuildInputs = [ pkgs.nixfmt ];
                src = lib.fileset.toSource {
                  root = ./.;
                  fileset = lib.fileset.fileFilter (f: f.hasExt "nix") ./.;
                };
              }
              ''
                find "$src" -name '*.nix' -print0 | xargs -0 nixfmt --check
                touch "$out"
              '';
          vm-breakout = vmTest ./nix/tests/breakout.nix;
          vm-turns = vmTest ./nix/tests/turns.nix;
        }
      );

      devShells = forAllSystems (
        system: pkgs: {
          default = pkgs.mkShell {
            packages = [
              pkgs.go
              pkgs.gopls
              pkgs.podman
              pkgs.nftables
              pkgs.nixfmt
            ];
            env.CGO_ENABLED = 0;
          };
        }
      );

      formatter = forAllSystems (system: pkgs: pkgs.nixfmt-tree);
    };
}
