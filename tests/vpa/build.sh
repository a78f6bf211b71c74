#!/usr/bin/env bash
# Builds the VPA admission-controller (k8s.io/autoscaler/vertical-pod-autoscaler, the version
# in go.mod) for the side-by-side right-sizing benchmark.
#
# Output: ${NODEWARDEN_CACHE:-$HOME/.cache/nodewarden}/vpa/<key>/bin/vpa-admission-controller,
# where <key> hashes the Go version, go.mod, go.sum and this script. When it exists the script
# prints the folder and exits at once. The last line on stdout is the bin folder.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache_root="${NODEWARDEN_CACHE:-$HOME/.cache/nodewarden}/vpa"
cd "$here"
key="$(
    {
        go env GOVERSION GOOS GOARCH
        for f in build.sh go.mod go.sum; do
            printf '%s\n' "$f"
            cat "$f"
        done
    } | sha256sum | cut -c1-16
)"
dest="$cache_root/$key/bin"
if [[ -x "$dest/vpa-admission-controller" ]]; then
    echo "$dest"
    exit 0
fi
mkdir -p "$cache_root/$key"
tmp="$(mktemp -d "$cache_root/$key/bin.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
echo "vpa/build.sh: building the VPA admission-controller into $dest" >&2
go build -trimpath -o "$tmp/vpa-admission-controller" k8s.io/autoscaler/vertical-pod-autoscaler/pkg/admission-controller
# the CRDs of the same version, from the module
module_dir="$(go list -m -f '{{.Dir}}' k8s.io/autoscaler/vertical-pod-autoscaler)"
cp "$module_dir/deploy/vpa-v1-crd-gen.yaml" "$tmp/"
chmod u+w "$tmp/vpa-v1-crd-gen.yaml"
mv "$tmp" "$dest"
trap - EXIT
echo "$dest"
