#!/usr/bin/env bash
# Builds cmd/recommend: VPA's recommender model and estimators (the version in go.mod) behind
# a JSON-in/JSON-out command, for the agent's differential test (estimator/tests/vpa_differential.rs).
#
# Output: ${NODEWARDEN_CACHE:-$HOME/.cache/nodewarden}/vpa-recommend/<key>/bin/vpa-recommend,
# where <key> hashes the Go version, go.mod, go.sum, the Go sources of cmd/recommend and this
# script. When it exists the script prints the folder and exits at once. The last line on
# stdout is the bin folder. Only Go modules are downloaded (through the Go module proxy).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache_root="${NODEWARDEN_CACHE:-$HOME/.cache/nodewarden}/vpa-recommend"
cd "$here"
key="$(
    {
        go env GOVERSION GOOS GOARCH
        for f in build-recommend.sh go.mod go.sum cmd/recommend/*.go; do
            printf '%s\n' "$f"
            cat "$f"
        done
    } | sha256sum | cut -c1-16
)"
dest="$cache_root/$key/bin"
if [[ -x "$dest/vpa-recommend" ]]; then
    echo "$dest"
    exit 0
fi
mkdir -p "$cache_root/$key"
tmp="$(mktemp -d "$cache_root/$key/bin.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
echo "vpa/build-recommend.sh: building VPA's recommender model into $dest" >&2
go build -mod=readonly -trimpath -o "$tmp/vpa-recommend" ./cmd/recommend
# a concurrent build may have finished first: keep its folder
mv -T "$tmp" "$dest" 2>/dev/null || rm -rf "$tmp"
trap - EXIT
echo "$dest"
