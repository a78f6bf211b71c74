//go:build tools

// Package tools pins promtool, which the chart's alert-rule tests run
// (`promtool check rules`, `promtool test rules`) and the history tests use to backfill
// (`promtool tsdb create-blocks-from openmetrics`), and the Prometheus server those history
// tests query.
package tools

import (
	_ "github.com/prometheus/prometheus/cmd/prometheus"
	_ "github.com/prometheus/prometheus/cmd/promtool"
)
