# The package's source set, as a builtins.path filter: the whole Go module
# tree (go.mod, go.sum, cmd/, pkg/, internal/) plus config.example.toml,
# which pkg/config's tests read. Everything under the Go directories is kept
# (embedded files such as pkg/seccomp/shrooms.json, testdata, golden files)
# except the debris named below, so no embed or test input can be missed;
# docs, Nix files and scripts stay out, so editing them does not rebuild.
# Plain builtins (no nixpkgs lib): internal/nixcheck evaluates nix/package.nix's
# src with Debian's nix-instantiate and builds and vets exactly that tree.
root:
let
  rootStr = toString root;
  topFiles = [
    "go.mod"
    "go.sum"
    "config.example.toml"
  ];
  goDirs = [
    "cmd"
    "pkg"
    "internal"
  ];
  # Excluded on purpose, anywhere below the Go directories: a vendor tree
  # (buildGoModule supplies its own), nix-build's result links and editor
  # leftovers. Untracked files never reach a flake's source anyway.
  excluded = name: builtins.match "vendor|result(-.*)?|\\..*\\.sw[op]|.*~|#.*#" name != null;
in
path: type:
let
  rel = builtins.substring (builtins.stringLength rootStr + 1) (builtins.stringLength path) path;
  parts = builtins.filter builtins.isString (builtins.split "/" rel);
  top = builtins.head parts;
  depth = builtins.length parts;
in
if depth == 1 then
  (type == "regular" && builtins.elem top topFiles)
  || (type == "directory" && builtins.elem top goDirs)
else
  builtins.elem top goDirs
  && (type == "regular" || type == "directory")
  && !(excluded (baseNameOf path))
