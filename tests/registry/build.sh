#!/usr/bin/env bash
# Builds the CNCF Distribution registry (from the Go module pinned in go.mod) for the real-node
# tests (tests/src/registry.rs): the registry a release is pushed to and the nodes pull from.
#
# Output: ${NODEWARDEN_CACHE:-$HOME/.cache/nodewarden}/registry/<key>/bin/registry, where <key>
# is a short hash of the Go version and of this folder's build.sh, go.mod, go.sum and tools.go.
# When the file exists the script prints the folder and exits at once. Otherwise it builds into a
# temporary folder beside it and renames that into place, so an interrupted build never leaves a
# half-filled folder behind.
#
# The last line on stdout is the bin folder; progress goes to stderr.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache_root="${NODEWARDEN_CACHE:-$HOME/.cache/nodewarden}/registry"

log() { echo "registry/build.sh: $*" >&2; }

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

built() { [[ -x "$dest/registry" ]]; }

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

version="$(go list -m -f '{{.Version}}' github.com/distribution/distribution/v3)"
start=$SECONDS
log "building the registry from github.com/distribution/distribution/v3 $version into $tmp"
go build -trimpath -ldflags "-s -w" -o "$tmp/registry" github.com/distribution/distribution/v3/cmd/registry
log "the registry built in $((SECONDS - start))s"

if ! mv -T "$tmp" "$dest" 2>/dev/null; then
    built || { log "could not move the build into $dest"; exit 1; }
fi
trap - EXIT
echo "$dest"
