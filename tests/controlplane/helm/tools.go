//go:build tools

// Package tools records the helm main package that build.sh compiles, so that
// `go mod tidy` keeps its dependencies in go.mod and go.sum.
package tools

import (
	_ "helm.sh/helm/v4/cmd/helm"
)
