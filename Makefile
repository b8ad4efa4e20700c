# shrooms — build, set up a Debian test host, test, demo, benchmark.
# `make test` is what CI runs (.ci/run); it installs what it needs first.

SHELL := /bin/bash
export PATH := /usr/local/go/bin:$(HOME)/go/bin:$(PATH)
export CGO_ENABLED := 0

TAGS := remote exclude_graphdriver_btrfs containers_image_openpgp exclude_graphdriver_devicemapper
VERSION ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -s -w -X main.version=$(VERSION)
SOCKET := unix:///run/shrooms-test/podman.sock

.PHONY: all build setup test unit vet demo bench fuzz soak clean install uninstall kube-test kube-bin shape runsc-test runsc-suites vm-test

all: build

build: bin/shrooms

bin/shrooms: $(shell find cmd pkg internal -name '*.go' 2>/dev/null) go.mod go.sum
	go build -tags "$(TAGS)" -trimpath -ldflags "$(LDFLAGS)" -o $@ ./cmd/shrooms

# Installs podman, runc, nftables, … from Debian, writes the containers.conf
# drop-in and subuid/subgid ranges, starts a private podman API service and
# builds the test image without any registry. Idempotent.
setup:
	bash scripts/setup.sh

# The code-shape figures of issue 25 (before: docs/code-shape.md).
shape:
	@bash scripts/shape.sh

vet:
	@unformatted=$$(gofmt -l cmd pkg internal test); if [ -n "$$unformatted" ]; then echo "not gofmt-formatted: $$unformatted"; exit 1; fi
	go vet -tags "$(TAGS) runsc" ./...

# The pinned static runsc `make setup` builds (scripts/build-runsc.sh).
RUNSC ?= $(shell bash scripts/build-runsc.sh --path)

# The whole suite, integration tests included: a missing prerequisite fails.
# The runsc tag adds the gVisor suites (docs/gvisor.md) under the pinned runsc.
# Then the suites of RUNSC_SUITES again with every cage under runsc (also
# after a failure of the first run; either failing fails `make test`).
test: setup vet
	@status=0; set -x; \
	SHROOMS_TEST_RUNSC=$(RUNSC) SHROOMS_REQUIRE_INTEGRATION=1 SHROOMS_TEST_PODMAN_SOCKET=$(SOCKET) go test -tags "$(TAGS) runsc" -count=1 -p 1 -timeout 40m ./... || status=1; \
	$(RUNSC_SUITES_CMD) || status=1; \
	exit $$status

# What `shrooms kube` emits against a real kube-apiserver + etcd on loopback
# (test/kubeapi): every object created under PodSecurity restricted:latest
# with fieldValidation=Strict. The two binaries are built from the Go module
# proxy at the versions test/kubecp/go.mod pins, once per version set
# (bin/kubecp/<key>, key = hash of its go.mod + go.sum + the Go version); a
# cold build takes long (see README), later runs only the test. Needs no
# root, podman or registry.
KUBECP_KEY = $(shell cat test/kubecp/go.mod test/kubecp/go.sum | sha256sum | cut -c1-12)-$(shell go env GOVERSION)
KUBECP_BIN = $(CURDIR)/bin/kubecp/$(KUBECP_KEY)
kube-bin:
	@if [ -x $(KUBECP_BIN)/kube-apiserver ] && [ -x $(KUBECP_BIN)/etcd ]; then \
		echo "kube-bin: cached in $(KUBECP_BIN)"; \
	else \
		set -e; cd test/kubecp; start=$$(date +%s); \
		go build -trimpath -ldflags "-s -w" -o $(KUBECP_BIN)/kube-apiserver.tmp k8s.io/kubernetes/cmd/kube-apiserver; \
		go build -trimpath -ldflags "-s -w" -o $(KUBECP_BIN)/etcd.tmp go.etcd.io/etcd/server/v3; \
		mv $(KUBECP_BIN)/kube-apiserver.tmp $(KUBECP_BIN)/kube-apiserver; mv $(KUBECP_BIN)/etcd.tmp $(KUBECP_BIN)/etcd; \
		echo "kube-bin: built kube-apiserver and etcd in $$(( $$(date +%s) - start ))s"; \
	fi

kube-test: kube-bin
	go vet -tags "$(TAGS) kubeapi" ./test/kubeapi
	SHROOMS_KUBE_BIN=$(KUBECP_BIN) go test -tags "$(TAGS) kubeapi" -count=1 -timeout 20m -v ./test/kubeapi

# Only the gVisor suites (docs/gvisor.md; also part of `make test`), under
# RUNSC (default: the pinned runsc make setup builds; a missing one fails).
runsc-test: setup
	SHROOMS_TEST_RUNSC=$(RUNSC) SHROOMS_REQUIRE_INTEGRATION=1 SHROOMS_TEST_PODMAN_SOCKET=$(SOCKET) go test -tags "$(TAGS) runsc" -count=1 -p 1 -timeout 20m -run 'Runsc' ./pkg/turn ./pkg/probe ./test/agents ./cmd/shrooms

# The runtime-parameterised suites (docs/gvisor.md, "The suites under
# runsc"): the same tests as under runc, with SHROOMS_TEST_RUNTIME=runsc,
# so internal/itest starts each package's podman service with the runsc
# profile and every config asks for cage.runtime = RUNSC; a test that
# cannot pass under runsc is skipped by name (internal/itest runtimeSkip),
# only there. One quoted `package:regexp` a line; `make test` runs them after the
# main run.
RUNSC_SUITES := \
	'./pkg/turn:.' \
	'./pkg/homereset:^TestTurnScenariosInPodman$$' \
	'./pkg/firewall:^(TestSealInTestbed|TestSealGaps|TestCageWallInTestbed)$$' \
	'./cmd/shrooms:^(TestSanctionedExits|TestExitCodePassesThrough|TestDeadlineExitCode|TestSignalsStopAndRemoveTheCage|TestBusyTaskExitCode|TestOutboxIsOneWay|TestPreparedCageNeedsItsOutbox)$$' \
	'./test/faults:.' \
	'./test/agents:^(TestClaudePersistenceDoesNotSurviveTurn|TestClaudeOutboxIsOneWay|TestOpencodeOutboxIsOneWay|TestGatewayKeepsTheKeyOutsideTheCage|TestGatewayOpencode|TestGatewayLimitEndsTheTurn|TestGitInTheCage|TestInteractiveClaudeAsksNothing|TestCodexToolResumeAndKey|TestGeminiToolResumeAndKey)$$'
RUNSC_SUITES_CMD = ( rs=0; for s in $(RUNSC_SUITES); do \
		SHROOMS_TEST_RUNTIME=runsc SHROOMS_TEST_RUNSC=$(RUNSC) SHROOMS_REQUIRE_INTEGRATION=1 SHROOMS_TEST_PODMAN_SOCKET=$(SOCKET) \
		go test -tags "$(TAGS)" -count=1 -timeout 20m -run "$${s\#*:}" "$${s%%:*}" || rs=1; \
	done; [ $$rs = 0 ] )
runsc-suites: setup
	@set -x; $(RUNSC_SUITES_CMD)

# shrooms installed on a booted Debian 12 VM (test/vm): `make install` with
# systemd running, a reboot (the seal before podman.socket), turns, a
# gateway turn, forget/gc, the seal unit made to fail (nothing networked
# starts), `make uninstall`. The VM image is built from Debian packages and
# cached in VM_CACHE by its inputs; qemu uses KVM when it can, TCG otherwise.
VM_CACHE ?= /var/cache/shrooms-vm
vm-test: setup build
	@missing=; for p in qemu-system-x86 mmdebstrap e2fsprogs; do \
		[ "$$(dpkg-query -W -f='$${db:Status-Status}' $$p 2>/dev/null)" = installed ] || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then echo "vm-test: installing$$missing"; \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing || \
		{ apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing; }; fi
	go vet -tags "$(TAGS) vmtest" ./test/vm/...
	SHROOMS_VM_CACHE=$(VM_CACHE) SHROOMS_REQUIRE_INTEGRATION=1 go test -tags "$(TAGS) vmtest" -count=1 -timeout 90m -v ./test/vm

# Unit tests only (no root, podman or nftables needed).
unit:
	go test -tags "$(TAGS)" -count=1 ./...

# Outside NixOS: the binary, its man page and shell completions (made by the
# binary itself), /etc/shrooms/config.toml from the example (an
# existing one is never overwritten), the shrooms-seal unit that applies the
# seal at boot before podman, the br_netfilter module and bridge sysctls the
# seal needs, and a drop-in that re-applies the seal after nftables restarts.
# Without DESTDIR, on a host where systemd runs, it also loads the module,
# applies the sysctls and enables podman.socket and shrooms-seal.service.
PREFIX ?= /usr/local
BINDIR ?= $(PREFIX)/bin
SYSCONFDIR ?= /etc
UNITDIR ?= $(SYSCONFDIR)/systemd/system
MANDIR ?= $(PREFIX)/share/man
DATADIR ?= $(PREFIX)/share
DESTDIR ?=
SHROOMS_BIN ?= bin/shrooms
install: $(SHROOMS_BIN)
	install -D -m 0755 $(SHROOMS_BIN) $(DESTDIR)$(BINDIR)/shrooms
	install -d -m 0755 $(DESTDIR)$(MANDIR)/man1 $(DESTDIR)$(DATADIR)/bash-completion/completions $(DESTDIR)$(DATADIR)/zsh/site-functions $(DESTDIR)$(DATADIR)/fish/vendor_completions.d
	$(SHROOMS_BIN) man > $(DESTDIR)$(MANDIR)/man1/shrooms.1
	$(SHROOMS_BIN) completion bash > $(DESTDIR)$(DATADIR)/bash-completion/completions/shrooms
	$(SHROOMS_BIN) completion zsh > $(DESTDIR)$(DATADIR)/zsh/site-functions/_shrooms
	$(SHROOMS_BIN) completion fish > $(DESTDIR)$(DATADIR)/fish/vendor_completions.d/shrooms.fish
	chmod 0644 $(DESTDIR)$(MANDIR)/man1/shrooms.1 $(DESTDIR)$(DATADIR)/bash-completion/completions/shrooms $(DESTDIR)$(DATADIR)/zsh/site-functions/_shrooms $(DESTDIR)$(DATADIR)/fish/vendor_completions.d/shrooms.fish
	@if [ -e $(DESTDIR)$(SYSCONFDIR)/shrooms/config.toml ]; then \
		echo "install: kept the existing $(DESTDIR)$(SYSCONFDIR)/shrooms/config.toml"; \
	else \
		echo "install -D -m 0644 config.example.toml $(DESTDIR)$(SYSCONFDIR)/shrooms/config.toml"; \
		install -D -m 0644 config.example.toml $(DESTDIR)$(SYSCONFDIR)/shrooms/config.toml; \
	fi
	install -d -m 0755 $(DESTDIR)$(UNITDIR)/nftables.service.d $(DESTDIR)$(SYSCONFDIR)/modules-load.d $(DESTDIR)$(SYSCONFDIR)/sysctl.d
	sed -e 's|@BINDIR@|$(BINDIR)|g' -e 's|@CONFIG@|$(SYSCONFDIR)/shrooms/config.toml|g' dist/shrooms-seal.service.in > $(DESTDIR)$(UNITDIR)/shrooms-seal.service
	chmod 0644 $(DESTDIR)$(UNITDIR)/shrooms-seal.service
	install -m 0644 dist/nftables-shrooms-seal.conf $(DESTDIR)$(UNITDIR)/nftables.service.d/shrooms-seal.conf
	install -m 0644 dist/modules-load-shrooms.conf $(DESTDIR)$(SYSCONFDIR)/modules-load.d/shrooms.conf
	install -m 0644 dist/sysctl-shrooms.conf $(DESTDIR)$(SYSCONFDIR)/sysctl.d/50-shrooms.conf
	@command -v iptables >/dev/null || echo "install: no iptables here: netavark (podman's cage network) needs it; apt-get install iptables (shrooms doctor checks it)"
	@if [ -z "$(DESTDIR)" ] && [ -d /run/systemd/system ]; then \
		set -x; modprobe br_netfilter && sysctl -q -p $(SYSCONFDIR)/sysctl.d/50-shrooms.conf && \
		systemctl daemon-reload && systemctl enable --now podman.socket shrooms-seal.service; \
	else \
		echo "install: systemd is not running here (or DESTDIR is set): enable podman.socket and shrooms-seal.service at boot yourself"; \
	fi

# What `make install` put there, with the same variables, and the empty
# directories it made for it. The config (/etc/shrooms/config.toml, the
# owner's) stays, and so does shrooms' state unless PURGE=1: then, before
# anything is removed, `shrooms purge` removes the cage network, the seal,
# the outbox root and the state directory, and refuses (the uninstall
# stops, nothing removed) while a task, HOME, delivery or cage remains
# (`shrooms forget` each task first). Without DESTDIR, on a host where
# systemd runs, shrooms-seal is stopped and disabled first (which flushes
# the seal).
PURGE ?=
uninstall:
	@if [ -n "$(PURGE)" ] && [ -n "$(DESTDIR)" ]; then echo "uninstall: PURGE=1 removes this host's shrooms state, not DESTDIR's: not with DESTDIR"; exit 2; fi
	@if [ -n "$(PURGE)" ]; then set -x; $(BINDIR)/shrooms --config $(SYSCONFDIR)/shrooms/config.toml purge; fi
	@if [ -z "$(DESTDIR)" ] && [ -d /run/systemd/system ]; then \
		set -x; systemctl disable --now shrooms-seal.service || true; \
	fi
	rm -f $(DESTDIR)$(BINDIR)/shrooms $(DESTDIR)$(MANDIR)/man1/shrooms.1 \
		$(DESTDIR)$(DATADIR)/bash-completion/completions/shrooms $(DESTDIR)$(DATADIR)/zsh/site-functions/_shrooms \
		$(DESTDIR)$(DATADIR)/fish/vendor_completions.d/shrooms.fish \
		$(DESTDIR)$(UNITDIR)/shrooms-seal.service $(DESTDIR)$(UNITDIR)/nftables.service.d/shrooms-seal.conf \
		$(DESTDIR)$(SYSCONFDIR)/modules-load.d/shrooms.conf $(DESTDIR)$(SYSCONFDIR)/sysctl.d/50-shrooms.conf
	-rmdir $(DESTDIR)$(UNITDIR)/nftables.service.d 2>/dev/null
	@# The directories install -d made, where now empty (never a parent
	@# such as $(MANDIR) itself).
	-rmdir --ignore-fail-on-non-empty $(DESTDIR)$(MANDIR)/man1 \
		$(DESTDIR)$(DATADIR)/bash-completion/completions $(DESTDIR)$(DATADIR)/bash-completion \
		$(DESTDIR)$(DATADIR)/zsh/site-functions $(DESTDIR)$(DATADIR)/zsh \
		$(DESTDIR)$(DATADIR)/fish/vendor_completions.d $(DESTDIR)$(DATADIR)/fish 2>/dev/null
	@if [ -z "$(DESTDIR)" ] && [ -d /run/systemd/system ]; then systemctl daemon-reload; fi
	@if [ -n "$(PURGE)" ]; then echo "uninstall: kept $(DESTDIR)$(SYSCONFDIR)/shrooms/config.toml"; \
	else echo "uninstall: kept $(DESTDIR)$(SYSCONFDIR)/shrooms/config.toml and shrooms' state (make uninstall PURGE=1 removes the state once every task is forgotten)"; fi

# A demonstration turn in a sealed cage.
demo: setup build
	bash scripts/demo.sh

# Every benchmark of the repository (not part of `make test`): the
# packages' own, test/perf's (through the binary) and test/agents' (a real
# agent). test/perf's measure nothing at -benchtime 1x (see BenchmarkGoals).
bench: setup build
	set -o pipefail; SHROOMS_TEST_RUNSC=$(RUNSC) SHROOMS_REQUIRE_INTEGRATION=1 SHROOMS_TEST_PODMAN_SOCKET=$(SOCKET) go test -tags "$(TAGS) runsc" -run '^$$' -bench . -benchtime 10x -timeout 60m ./pkg/... ./test/perf ./test/agents 2>&1 | tee bench.out

# Every Fuzz target for FUZZTIME each (their seed corpora already run as
# ordinary tests in `make test`).
FUZZTIME ?= 60s
fuzz:
	set -e; for f in $$(grep -rl --include='*_test.go' '^func Fuzz' cmd pkg internal); do \
		dir=./$$(dirname $$f); \
		for fn in $$(grep -o '^func Fuzz[A-Za-z0-9_]*' $$f | cut -d' ' -f2); do \
			echo "fuzz $$dir $$fn ($(FUZZTIME))"; \
			go test -tags "$(TAGS)" -run '^$$' -fuzz "^$$fn\$$" -fuzztime $(FUZZTIME) $$dir; \
		done; \
	done

# The full soak (test/soak): SOAK_TASKS tasks × SOAK_TURNS turns with random
# kill -9 and gc, then a leak check. `make test` runs its short form (2 × 10).
SOAK_TASKS ?= 8
SOAK_TURNS ?= 100
soak: setup
	set -o pipefail; SHROOMS_SOAK_TASKS=$(SOAK_TASKS) SHROOMS_SOAK_TURNS=$(SOAK_TURNS) SHROOMS_REQUIRE_INTEGRATION=1 SHROOMS_TEST_PODMAN_SOCKET=$(SOCKET) \
		go test -tags "$(TAGS)" -count=1 -p 1 -timeout 3h -v -run '^TestSoak$$' ./test/soak 2>&1 | tee soak.out

clean:
	rm -rf bin
