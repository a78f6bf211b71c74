#!/usr/bin/env bash
# Builds promtool and the Prometheus server (both from the Prometheus Go module pinned in go.mod):
# promtool for the chart's alert-rule tests (`promtool check rules`, `promtool test rules`) and
# for the history tests' backfill (`promtool tsdb create-blocks-from openmetrics`), the server
# for the history tests (tests/src/prometheus.rs), which query its HTTP API.
#
# Output: ${NODEWARDEN_CACHE:-$HOME/.cache/nodewarden}/promtool/<key>/bin/{promtool,prometheus},
# where <key> is a short hash of the Go version and of this folder's build.sh, go.mod, go.sum and
# tools.go. When both files exist the script prints the folder and exits at once. Otherwise it builds into
# a temporary folder beside it and renames that into place, so an interrupted build never leaves
# a half-filled folder behind.
#
# The last line on stdout is the bin folder; progress goes to stderr.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache_root="${NODEWARDEN_CACHE:-$HOME/.cache/nodewarden}/promtool"

log() { echo "promtool/build.sh: $*" >&2; }

sha256() {
    if command -v sha256sum >/dev/null 2>&1; then sha256sum; else shasum -a 256; fi
}

cd "$here"
key="$(
    {
        go env GOVERSION GOOS GOARCH
        for f in build.sh go.mod go.sum tools.go; do
            printf '%s\n' "$f"
            cat "$f"
        done
    } | sha256 | cut -c1-16
)"
dest="$cache_root/$key/bin"

built() { [[ -x "$dest/promtool" && -x "$dest/prometheus" ]]; }

if built; then
    echo "$dest"
    exit 0
fi

mkdir -p "$cache_root/$key"

# One build at a time per key: a second caller waits and then finds the result.
if command -v flock >/dev/null 2>&1; then
    exec 9>"$cache_root/$key/.lock"
    if ! flock -n 9; then
        log "another build of $key is running; waiting for it"
        flock 9
    fi
    if built; then
        echo "$dest"
        exit 0
    fi
fi

tmp="$(mktemp -d "$cache_root/$key/.build.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
chmod 755 "$tmp"

export CGO_ENABLED="${CGO_ENABLED:-0}"
export GOFLAGS="${GOFLAGS:-} -buildvcs=false"

# Prometheus's own build tags: `remove_all_sd` leaves out every service discovery but static,
# file and http (the cloud SDKs behind them are half of the source a build compiles: about 3.1 of
# 6.2 million lines, `go list -deps` with and without the tag); `enable_kubernetes_sd` keeps the
# Kubernetes one, which both commands compile anyway and a test may scrape kubelets with.
tags="remove_all_sd,enable_kubernetes_sd"

version="$(go list -m -f '{{.Version}}' github.com/prometheus/prometheus)"
start=$SECONDS
for cmd in promtool prometheus; do
    log "building $cmd from github.com/prometheus/prometheus $version (tags $tags) into $tmp"
    go build -trimpath -tags "$tags" -ldflags "-s -w" -o "$tmp/$cmd" "github.com/prometheus/prometheus/cmd/$cmd"
done
log "promtool and prometheus built in $((SECONDS - start))s"

if ! mv -T "$tmp" "$dest" 2>/dev/null; then
    built || { log "could not move the build into $dest"; exit 1; }
fi
trap - EXIT
echo "$dest"
