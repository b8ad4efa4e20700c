{
  description = "shrooms: run AI coding agents with permission prompts off, each turn in a sealed podman cage";

  inputs.nixpkgs.url = "github:NixOS/nixpkgs/nixos-26.05";

  outputs =
    { self, nixpkgs }:
    let
      inherit (nixpkgs) lib;
      systems = [
        "x86_64-linux"
        "aarch64-linux"
      ];
      version = self.shortRev or self.dirtyShortRev or "dev";

      # The flake's own package set allows exactly one unfree package,
      # claude-code, so that the cage image and the VM tests evaluate. Your
      # NixOS configuration decides for itself: see docs/nixos.md.
      pkgsFor =
        system:
        import nixpkgs {
          inherit system;
          config.allowUnfreePredicate = pkg: builtins.elem (lib.getName pkg) [ "claude-code" ];
        };
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
        in
        {
          package = self.packages.${system}.default;
          cage-image = self.packages.${system}.cage-image;
          module-eval = import ./nix/tests/module-eval.nix { inherit self nixpkgs pkgs; };
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
