//go:build tools

// Package tools pins promtool, which the chart's alert-rule tests run
// (`promtool check rules`, `promtool test rules`).
package tools

import _ "github.com/prometheus/prometheus/cmd/promtool"
