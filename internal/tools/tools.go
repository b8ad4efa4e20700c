//go:build tools

// Package tools pins modules that later packages import, so go mod tidy keeps them.
package tools

import (
	_ "github.com/BurntSushi/toml"
	_ "github.com/containers/podman/v5/pkg/bindings"
	_ "github.com/containers/podman/v5/pkg/bindings/containers"
	_ "github.com/containers/podman/v5/pkg/specgen"
	_ "github.com/google/nftables"
	_ "github.com/urfave/cli/v2"
	_ "golang.org/x/sys/unix"
	_ "gotest.tools/v3/assert"
)
