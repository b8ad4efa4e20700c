// Command walk counts how far a turn's request travels: the SSA of
// ./cmd/shrooms and its class-hierarchy call graph (golang.org/x/tools),
// walked depth first from (*turn.Runner).Run in call order, each function
// once, along the calls that hand the request or the task on. It prints
// one line for `make shape` (scripts/shape.sh); -v lists the stays in walk
// order.
//
// A stay is a shrooms function that takes the request or the task: a
// parameter (the receiver included) of type turn.Request or taskid.ID, or
// a pointer to one, or a string parameter named task or name (the last
// also catches agent and phase names: the count is a proxy, the same on
// both sides of a change). The walk enters only stays (and passes through
// the compiler's wrappers of shrooms' methods). Turn entered counts the
// steps of the walk, stay to next stay in walk order, from one outside
// pkg/turn to one inside it. Re-parses are the taskid.Parse call sites in
// the stays.
//
// -carriers prints a second figure under a wider rule: a parameter of a
// struct type holding the request or the task in a field (nested, embedded
// or through a pointer) counts too. The first rule does not look into
// structs, so a function handed a bundle that carries the task id is not a
// stay, and the walk does not go below it; the second figure shows how far
// the task reaches when it travels that way. -derived (implying
// -carriers) also counts the handles that hold only values derived from
// the task, taskstate.Dir (its state directory), home.Volume (its HOME's
// names) and worktree.Idmap (its idmapped worktree's staging and record
// paths): the strictest figure, make shape's third walk line.
//
// It is its own module (tools/walk) so that golang.org/x/tools stays out
// of shrooms' go.mod and nix vendor hash. Run from the repository root:
//
//	go run -C tools/walk . -root "$PWD" -tags "$TAGS"
package main

import (
	"flag"
	"fmt"
	"go/token"
	"go/types"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"golang.org/x/tools/go/callgraph"
	"golang.org/x/tools/go/callgraph/cha"
	"golang.org/x/tools/go/packages"
	"golang.org/x/tools/go/ssa"
	"golang.org/x/tools/go/ssa/ssautil"
)

const (
	module = "github.com/shrooms-cage/shrooms/"
	turnPk = module + "pkg/turn"
	taskPk = module + "pkg/taskid"
)

func main() {
	dir := flag.String("root", ".", "the shrooms repository (its root)")
	tags := flag.String("tags", "remote exclude_graphdriver_btrfs containers_image_openpgp exclude_graphdriver_devicemapper", "build tags, as go build takes them (default: the Makefile's)")
	verbose := flag.Bool("v", false, "list the stays, in walk order")
	derived := flag.Bool("derived", false, "with -carriers, also count the handles that hold only values derived from the task (taskstate.Dir, home.Volume, worktree.Idmap): the strictest figure")
	carriers := flag.Bool("carriers", false, "also count as stays the functions that take a struct carrying the request or the task in a field (not the rule make shape counts: a second figure, so that bundling the id into a struct cannot pass for unpacking it)")
	flag.Parse()
	if err := run(*dir, *tags, *verbose, *carriers, *derived); err != nil {
		fmt.Fprintln(os.Stderr, "walk:", err)
		os.Exit(1)
	}
}

func run(dir, tags string, verbose, carriers, derived bool) error {
	root, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	// shrooms' own packages in ./cmd/shrooms's build, from source; every
	// other package from export data (types only: its bodies are never
	// walked), which keeps the load to seconds.
	deps, err := packages.Load(&packages.Config{Mode: packages.NeedName | packages.NeedImports | packages.NeedDeps,
		Dir: root, BuildFlags: []string{"-tags=" + tags}}, "./cmd/shrooms")
	if err != nil {
		return fmt.Errorf("load ./cmd/shrooms: %w", err)
	}
	var own []string
	packages.Visit(deps, nil, func(p *packages.Package) {
		if strings.HasPrefix(p.PkgPath, module) {
			own = append(own, p.PkgPath)
		}
	})
	pkgs, err := packages.Load(&packages.Config{Mode: packages.LoadSyntax, Dir: root, BuildFlags: []string{"-tags=" + tags}}, own...)
	if err != nil {
		return fmt.Errorf("load ./cmd/shrooms: %w", err)
	}
	if n := packages.PrintErrors(pkgs); n > 0 {
		return fmt.Errorf("%d errors loading ./cmd/shrooms", n)
	}
	prog, _ := ssautil.Packages(pkgs, ssa.InstantiateGenerics)
	prog.Build()
	start := runMethod(prog)
	if start == nil {
		return fmt.Errorf("(*turn.Runner).Run not found")
	}
	w := &walker{cg: cha.CallGraph(prog), seen: map[*ssa.Function]bool{}, files: map[string]bool{}, fset: prog.Fset, root: root, carriers: carriers || derived, derived: derived}
	w.walk(start)
	if verbose {
		for _, s := range w.stays {
			fmt.Println(s)
		}
	}
	rule := ""
	if carriers || derived {
		rule = ", structs carrying it counted"
	}
	if derived {
		rule += ", and handles derived from it (taskstate.Dir, home.Volume, worktree.Idmap)"
	}
	fmt.Printf("walk of turn.Runner.Run's request (SSA + CHA, tools/walk%s): %d stays in %d files, turn entered %d times, taskid.Parse %d\n",
		rule, len(w.stays), len(w.files), w.entered, w.parses)
	return nil
}

// runMethod is (*turn.Runner).Run.
func runMethod(prog *ssa.Program) *ssa.Function {
	p := prog.ImportedPackage(turnPk)
	if p == nil {
		return nil
	}
	t, ok := p.Members["Runner"].(*ssa.Type)
	if !ok {
		return nil
	}
	sel := prog.MethodSets.MethodSet(types.NewPointer(t.Type())).Lookup(p.Pkg, "Run")
	if sel == nil {
		return nil
	}
	return prog.MethodValue(sel)
}

type walker struct {
	cg      *callgraph.Graph
	fset    *token.FileSet
	root    string
	seen    map[*ssa.Function]bool
	stays   []string
	files   map[string]bool
	entered int
	parses  int
	// last is the stay the walk reached last.
	last *ssa.Function
	// carriers counts a struct parameter with a field of the request or
	// the task as taking it (-carriers).
	carriers bool
	// derived counts taskstate.Dir and home.Volume as the task too
	// (-derived).
	derived bool
}

// walk visits fn (once, when it is a stay or a wrapper of shrooms' own)
// and then its callees in call order.
func (w *walker) walk(fn *ssa.Function) {
	if w.seen[fn] || !ours(fn) || (fn.Synthetic == "" && !stay(fn, w.carriers, w.derived)) {
		return
	}
	w.seen[fn] = true
	if fn.Synthetic == "" {
		if w.last != nil && !inTurn(w.last) && inTurn(fn) {
			w.entered++
		}
		w.last = fn
		pos := w.fset.Position(fn.Pos())
		rel, _ := filepath.Rel(w.root, pos.Filename)
		w.files[rel] = true
		w.stays = append(w.stays, fmt.Sprintf("%s:%d %s", rel, pos.Line, fn.String()))
	}
	node := w.cg.Nodes[fn]
	if node == nil {
		return
	}
	// Call order: by the call site's position, then by callee name.
	edges := append([]*callgraph.Edge{}, node.Out...)
	sort.SliceStable(edges, func(i, j int) bool {
		pi, pj := edges[i].Site.Pos(), edges[j].Site.Pos()
		if pi != pj {
			return pi < pj
		}
		return edges[i].Callee.Func.String() < edges[j].Callee.Func.String()
	})
	for _, e := range edges {
		if c := e.Callee.Func; c.Pkg != nil && c.Pkg.Pkg.Path() == taskPk && c.Name() == "Parse" {
			w.parses++
		}
	}
	for _, e := range edges {
		w.walk(e.Callee.Func)
	}
}

// ours reports whether fn is shrooms' own code: closures, generic
// instances and the wrappers of its methods (bound method values, method
// expressions) included. The walk goes through wrappers; they are never
// stays.
func ours(fn *ssa.Function) bool {
	for fn.Parent() != nil {
		fn = fn.Parent()
	}
	if o := fn.Origin(); o != nil {
		fn = o
	}
	if fn.Pkg != nil {
		return strings.HasPrefix(fn.Pkg.Pkg.Path(), module)
	}
	obj := fn.Object()
	return obj != nil && obj.Pkg() != nil && strings.HasPrefix(obj.Pkg().Path(), module)
}

func inTurn(fn *ssa.Function) bool {
	for fn.Parent() != nil {
		fn = fn.Parent()
	}
	return fn.Pkg != nil && fn.Pkg.Pkg.Path() == turnPk
}

// stay reports whether fn takes the request or the task (with carriers,
// also inside a struct's fields).
func stay(fn *ssa.Function, carriers, derived bool) bool {
	for _, p := range fn.Params {
		t := p.Type()
		if carries(t, carriers, derived, map[types.Type]bool{}) {
			return true
		}
		if b, ok := t.(*types.Basic); ok && b.Kind() == types.String && (p.Name() == "task" || p.Name() == "name") {
			return true
		}
	}
	return false
}

// carries reports whether t (through a pointer) is turn.Request or
// taskid.ID or, with fields, a struct holding one in a field (embedded
// and nested structs and pointers to them included).
func carries(t types.Type, fields, derived bool, seen map[types.Type]bool) bool {
	if pt, ok := t.(*types.Pointer); ok {
		t = pt.Elem()
	}
	if seen[t] {
		return false
	}
	seen[t] = true
	if n, ok := t.(*types.Named); ok && n.Obj().Pkg() != nil {
		path, name := n.Obj().Pkg().Path(), n.Obj().Name()
		if (path == turnPk && name == "Request") || (path == taskPk && name == "ID") {
			return true
		}
		if derived && ((path == module+"pkg/taskstate" && name == "Dir") || (path == module+"pkg/home" && name == "Volume") || (path == module+"pkg/worktree" && name == "Idmap")) {
			return true
		}
	}
	if !fields {
		return false
	}
	st, ok := t.Underlying().(*types.Struct)
	if !ok {
		return false
	}
	for i := range st.NumFields() {
		if carries(st.Field(i).Type(), true, derived, seen) {
			return true
		}
	}
	return false
}
