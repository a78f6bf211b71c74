#!/usr/bin/env bash
# Builds the binaries nodewarden's end-to-end tests run: kube-apiserver,
# kube-controller-manager, etcd, and for the real-node tier kube-scheduler, kubelet
# and kube-proxy (from this Go module), and helm (from ./helm).
#
# Output: ${NODEWARDEN_CACHE:-$HOME/.cache/nodewarden}/controlplane/<key>/bin
# where <key> is a short hash of everything that decides what gets built. When
# that folder exists the script prints it and exits at once. Otherwise it builds
# into a temporary folder beside it and renames that into place at the end, so an
# interrupted build never leaves a half-filled folder behind.
#
# The last line on stdout is the bin folder; progress goes to stderr.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache_root="${NODEWARDEN_CACHE:-$HOME/.cache/nodewarden}/controlplane"
binaries=(etcd kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy helm)

log() { echo "controlplane/build.sh: $*" >&2; }

sha256() {
    if command -v sha256sum >/dev/null 2>&1; then sha256sum; else shasum -a 256; fi
}

cd "$here"
key="$(
    {
        go env GOVERSION GOOS GOARCH
        for f in build.sh go.mod go.sum tools.go cmd/etcd/main.go helm/go.mod helm/go.sum helm/tools.go; do
            printf '%s\n' "$f"
            cat "$f"
        done
    } | sha256 | cut -c1-16
)"
dest="$cache_root/$key/bin"

complete() {
    local b
    for b in "${binaries[@]}"; do
        [[ -x "$dest/$b" ]] || return 1
    done
}

if complete; then
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
    if complete; then
        echo "$dest"
        exit 0
    fi
fi

tmp="$(mktemp -d "$cache_root/$key/.build.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
chmod 755 "$tmp"

export CGO_ENABLED="${CGO_ENABLED:-0}"
# Reproducible builds: no VCS stamping (this folder is inside the nodewarden repo).
export GOFLAGS="${GOFLAGS:-} -buildvcs=false"

kube_version="$(go list -m -f '{{.Version}}' k8s.io/kubernetes)"
kube_major="$(echo "${kube_version#v}" | cut -d. -f1)"
kube_minor="$(echo "${kube_version#v}" | cut -d. -f2)"
# What the Kubernetes release build stamps; without it /version reports v0.0.0-master
# and version checks (helm's kubeVersion, clients) misbehave.
version_ldflags=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    version_ldflags+=" -X $pkg.gitVersion=$kube_version"
    version_ldflags+=" -X $pkg.gitMajor=$kube_major"
    version_ldflags+=" -X $pkg.gitMinor=$kube_minor"
    version_ldflags+=" -X $pkg.gitTreeState=clean"
done

start=$SECONDS
log "building etcd and the Kubernetes $kube_version components into $tmp (this takes a while on a cold Go build cache)"
go build -trimpath -ldflags "-s -w$version_ldflags" -o "$tmp/" \
    ./cmd/etcd \
    k8s.io/kubernetes/cmd/kube-apiserver \
    k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler \
    k8s.io/kubernetes/cmd/kubelet \
    k8s.io/kubernetes/cmd/kube-proxy
log "control plane built in $((SECONDS - start))s"

start=$SECONDS
helm_version="$(cd helm && go list -m -f '{{.Version}}' helm.sh/helm/v4)"
log "building helm $helm_version"
(cd helm && go build -trimpath \
    -ldflags "-s -w -X helm.sh/helm/v4/internal/version.version=$helm_version" \
    -o "$tmp/helm" helm.sh/helm/v4/cmd/helm)
log "helm built in $((SECONDS - start))s"

for b in "${binaries[@]}"; do
    [[ -x "$tmp/$b" ]] || { log "missing $b after the build"; exit 1; }
done

# Atomic hand-over: `mv -T` refuses to replace a non-empty folder, so a build that
# raced with another one just drops its own result.
if ! mv -T "$tmp" "$dest" 2>/dev/null; then
    complete || { log "could not move the build into $dest"; exit 1; }
fi
trap - EXIT
log "done"
echo "$dest"
