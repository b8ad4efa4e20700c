#!/usr/bin/env bash
# The code-shape figures of issue 25, one line each: `make shape`.
# Counts are of non-test Go files unless a line says otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
TAGS="remote exclude_graphdriver_btrfs containers_image_openpgp exclude_graphdriver_devicemapper"
nontest() { find "$@" -name '*.go' ! -name '*_test.go' 2>/dev/null; }
count() { grep -cE "$1" || true; }

echo "imports of homestore/homereset from turn, task, cmd: $(go list -tags "$TAGS" -f '{{join .Imports "\n"}}' ./pkg/turn ./pkg/task ./cmd/shrooms | count '/pkg/home(store|reset)$')"
echo "state-dir paths joined outside taskstate: $(nontest pkg cmd internal | grep -v '^pkg/taskstate/' | xargs grep -hE 'filepath\.Join\([^)]*(State\.Dir|[sS]tateDir)' | wc -l)"
echo "exported turn.Runner methods: $(nontest pkg/turn | xargs grep -hE '^func \(\w+ \*?Runner\) [A-Z]' | wc -l)"
echo "turn.Runner uses in pkg/task: $(nontest pkg/task | xargs grep -ho 'turn\.Runner' | wc -l)"
echo "\"claude\"/\"opencode\" literals outside pkg/profile: $(nontest pkg cmd internal | grep -v '^pkg/profile/' | xargs grep -hoE '"(claude|opencode)"' | wc -l)"
echo "shrooms imports of pkg/profile: $( [ -d pkg/profile ] && go list -tags "$TAGS" -f '{{join .Imports "\n"}}' ./pkg/profile | count 'shrooms-cage/shrooms/' || echo n/a)"
echo "shrooms imports of pkg/probe (the in-cage battery): $(go list -tags "$TAGS" -f '{{join .Imports "\n"}}' ./pkg/probe | count 'shrooms-cage/shrooms/')"
echo "homereset lines (non-test; code lines, i.e. not blank or comment / wc -l): $(nontest pkg/homereset | xargs cat | grep -v '^\s*$' | grep -cv '^\s*//') / $(nontest pkg/homereset | xargs cat | wc -l)"
echo "funcs taking task string in pkg/: $(nontest pkg | xargs grep -hE '^func .*\btask string' | wc -l)"
# World types: any type named …Env/env/World/world/Harness/harness/
# Fixture/fixture in a test file or in the world packages (internal/itest,
# internal/testbed, internal/tbworld); and, by what they hold rather than
# their name, the test structs that embed or carry one of those worlds.
worlds() { { find cmd pkg internal test -name '*_test.go'; find internal/itest internal/testbed internal/tbworld -name '*.go' ! -name '*_test.go'; } 2>/dev/null; }
echo "test harness types (type …Env/env/World/world/Harness/harness/Fixture/fixture struct in test files and internal/itest, testbed, tbworld): $(worlds | xargs grep -hE '^type \w*(Env|env|World|world|Harness|harness|Fixture|fixture) struct' | wc -l)"
echo "other test structs holding a world (*itest.Env, *tbworld.World or *testbed.Testbed): $(worlds | xargs grep -B12 -hE '^\s+(\w+\s+)?\*(itest\.Env|tbworld\.World|testbed\.Testbed)$' | grep -E '^type \w+ struct' | grep -vcE '^type \w*(Env|env|World|world|Harness|harness|Fixture|fixture) struct' || true)"
echo "test files removing HOMEs by hand: $(grep -rlE 'Home\(\)\.Remove|homes\(\)\.Remove|NewStore\([^)]*\)\.Remove|Homes\.Remove|homestore\.Remove\(' --include='*_test.go' cmd pkg test | wc -l)"
echo "fault-kind wrapping sites (lines with fmt.Errorf(… fault.X …)): $(nontest pkg cmd | xargs grep -hE 'Errorf\(.*fault\.[A-Z]' | wc -l)"
echo "fault-kind decisions (those, plus fault.Wrap/Wrapf/Default/Phase calls outside pkg/fault): $(nontest pkg cmd | grep -v '^pkg/fault/' | xargs grep -hE 'Errorf\(.*fault\.[A-Z]|fault\.(Wrap|Wrapf|Default|Phase)\(' | wc -l)"
# The walk of a turn's request (tools/walk, its own module: golang.org/x/tools
# stays out of go.mod; `make setup` puts it in the module cache). The second
# line counts structs that carry the task too, the third also the handles
# holding only values derived from it (docs/code-shape.md).
echo "$(go run -C tools/walk . -root "$PWD" -tags "$TAGS")"; echo "$(go run -C tools/walk . -root "$PWD" -tags "$TAGS" -carriers)"; echo "$(go run -C tools/walk . -root "$PWD" -tags "$TAGS" -derived)"
echo "openat2 resolve policies spelled outside pkg/resolve (lines with unix.RESOLVE_): $(nontest pkg cmd internal | grep -v '^pkg/resolve/' | xargs grep -h 'unix\.RESOLVE_' | wc -l)"
