//go:build tools

// Package tools records the main packages build.sh compiles for the virtual machine's image, so
// that `go mod tidy` keeps their dependencies in go.mod and go.sum.
package tools

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
)
