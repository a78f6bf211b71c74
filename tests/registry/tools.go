//go:build tools

// Package tools pins the CNCF Distribution registry, which the real-node tests start as the
// registry a release is pushed to and the nodes' containerd pulls from (tests/src/registry.rs).
package tools

import (
	_ "github.com/distribution/distribution/v3/cmd/registry"
)
