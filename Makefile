# shrooms — build, set up a Debian test host, test, demo, benchmark.
# `make test` is what CI runs (.ci/run); it installs what it needs first.

SHELL := /bin/bash
export PATH := /usr/local/go/bin:$(HOME)/go/bin:$(PATH)
export CGO_ENABLED := 0

TAGS := remote exclude_graphdriver_btrfs containers_image_openpgp exclude_graphdriver_devicemapper
VERSION ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -s -w -X main.version=$(VERSION)
GOFLAGS_TEST := -tags "$(TAGS)" -count=1 -p 1 -timeout 25m
SOCKET := unix:///run/shrooms-test/podman.sock

.PHONY: all build setup test unit vet demo bench fuzz clean

all: build

build: bin/shrooms

bin/shrooms: $(shell find cmd pkg internal -name '*.go' 2>/dev/null) go.mod go.sum
	go build -tags "$(TAGS)" -trimpath -ldflags "$(LDFLAGS)" -o $@ ./cmd/shrooms

# Installs podman, runc, nftables, … from Debian, writes the containers.conf
# drop-in and subuid/subgid ranges, starts a private podman API service and
# builds the test image without any registry. Idempotent.
setup:
	bash scripts/setup.sh

vet:
	@unformatted=$$(gofmt -l cmd pkg internal); if [ -n "$$unformatted" ]; then echo "not gofmt-formatted: $$unformatted"; exit 1; fi
	go vet -tags "$(TAGS)" ./...

# The whole suite, integration tests included: a missing prerequisite fails.
test: setup vet
	SHROOMS_REQUIRE_INTEGRATION=1 SHROOMS_TEST_PODMAN_SOCKET=$(SOCKET) go test $(GOFLAGS_TEST) ./...

# Unit tests only (no root, podman or nftables needed).
unit:
	go test -tags "$(TAGS)" -count=1 ./...

# A demonstration turn in a sealed cage.
demo: setup build
	bash scripts/demo.sh

# Benchmarks (not part of `make test`).
bench: setup build
	set -o pipefail; SHROOMS_REQUIRE_INTEGRATION=1 SHROOMS_TEST_PODMAN_SOCKET=$(SOCKET) go test -tags "$(TAGS)" -run '^$$' -bench . -benchtime 10x -timeout 60m ./pkg/... ./test/perf 2>&1 | tee bench.out

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

clean:
	rm -rf bin
