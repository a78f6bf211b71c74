//go:build tools

// Package tools pins actionlint, which tests/tests/workflows.rs runs on .github/workflows
// (the CI and release workflows), offline.
package tools

import (
	_ "github.com/rhysd/actionlint/cmd/actionlint"
)
