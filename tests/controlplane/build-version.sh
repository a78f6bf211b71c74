#!/usr/bin/env bash
# Builds Kubernetes components at a chosen version, for the version matrix
# (`cargo xtask compat`, docs/compatibility.md).
#
#   build-version.sh [VERSION] [BINARY...]
#
# VERSION is a k8s.io/kubernetes module version (v1.30.14, 1.37.2, v1.38.0-beta.0);
# without it $NODEWARDEN_KUBE_VERSION, and without that the version pinned in go.mod.
# BINARY names what to build (kube-apiserver kube-controller-manager kube-scheduler
# kubelet kube-proxy); without any, the API-server tier's pair: kube-apiserver and
# kube-controller-manager. $NODEWARDEN_KUBE_BINARIES (space or comma separated) says the
# same when no BINARY is given.
#
# For the pinned version this runs build.sh unchanged (same cache key, same folder, all
# binaries). For another version it writes a Go module of its own under
#   ${NODEWARDEN_CACHE:-$HOME/.cache/nodewarden}/controlplane/kube-<version>-<key>/
# (go.mod requiring k8s.io/kubernetes at that version and replacing its staging modules
# with their v0.<minor>.<patch> releases, as go.mod does for the pinned version; `go mod
# tidy` through the module proxy), builds the named binaries into its bin/ folder, each
# moved into place only when built, and puts etcd and helm from the pinned build (build.sh)
# beside them: etcd's v3 API and helm do not change with the Kubernetes version. Later calls
# build only what is missing. The Go build runs under `nice -n 15`.
#
# The last line on stdout is the bin folder; progress goes to stderr.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache_root="${NODEWARDEN_CACHE:-$HOME/.cache/nodewarden}/controlplane"
all_components=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy)

log() { echo "controlplane/build-version.sh: $*" >&2; }
die() {
    log "$*"
    exit 1
}

sha256() {
    if command -v sha256sum >/dev/null 2>&1; then sha256sum; else shasum -a 256; fi
}

pinned="$(awk '$1 == "k8s.io/kubernetes" && $2 ~ /^v/ {print $2; exit}' "$here/go.mod")"
[[ -n "$pinned" ]] || die "no k8s.io/kubernetes version in $here/go.mod"

version="${1:-${NODEWARDEN_KUBE_VERSION:-$pinned}}"
[[ $# -gt 0 ]] && shift
version="v${version#v}"
# vMAJOR.MINOR.PATCH with an optional pre-release (-alpha.N, -beta.N, -rc.N).
if ! [[ "$version" =~ ^v1\.([0-9]+)\.([0-9]+)(-(alpha|beta|rc)\.[0-9]+)?$ ]]; then
    die "'$version' is not a Kubernetes version (expected e.g. v1.30.14 or v1.38.0-beta.0)"
fi
minor="${BASH_REMATCH[1]}"
patch="${BASH_REMATCH[2]}${BASH_REMATCH[3]}"
staging_version="v0.$minor.$patch"

if [[ "$version" == "$pinned" ]]; then
    exec bash "$here/build.sh"
fi

wanted=("$@")
if [[ ${#wanted[@]} -eq 0 ]]; then
    list="${NODEWARDEN_KUBE_BINARIES:-}"
    read -r -a wanted <<<"${list//,/ }"
fi
if [[ ${#wanted[@]} -eq 0 ]]; then
    wanted=(kube-apiserver kube-controller-manager)
fi
for b in "${wanted[@]}"; do
    case " ${all_components[*]} " in
    *" $b "*) ;;
    *) die "unknown binary '$b' (one of: ${all_components[*]})" ;;
    esac
done

key="$(
    {
        go env GOVERSION GOOS GOARCH
        echo "$version"
        cat "$here/build-version.sh"
    } | sha256 | cut -c1-12
)"
root="$cache_root/kube-$version-$key"
dest="$root/bin"
mkdir -p "$root"

complete() {
    local b
    for b in etcd helm "${wanted[@]}"; do
        [[ -x "$dest/$b" ]] || return 1
    done
}

if complete; then
    echo "$dest"
    exit 0
fi

# One build at a time per version: a second caller waits and then builds only what is missing.
if command -v flock >/dev/null 2>&1; then
    exec 9>"$root/.lock"
    if ! flock -n 9; then
        log "another build of $version is running; waiting for it"
        flock 9
    fi
    if complete; then
        echo "$dest"
        exit 0
    fi
fi

# A Kubernetes whose go.mod needs a newer Go than the one installed (1.38 needs 1.27) is built with
# a Go toolchain the go command takes from the module proxy ($NODEWARDEN_GO_TOOLCHAIN, about 76 MB
# once); the other versions keep the installed Go.
# (`go mod download -json` writes the `>=` of its error as \u003e=)
needs_go="$(
    cd /tmp || exit 0
    { GOTOOLCHAIN=local go mod download -json "k8s.io/kubernetes@$version" 2>&1 || true; } |
        sed -n -e 's/\\u003e/>/g' -e 's/.*requires go >= \([0-9][0-9.]*\).*/\1/p' | head -1
)"
if [[ -n "$needs_go" ]]; then
    export GOTOOLCHAIN="${NODEWARDEN_GO_TOOLCHAIN:-go1.27.3}"
    log "k8s.io/kubernetes@$version requires go >= $needs_go: building with GOTOOLCHAIN=$GOTOOLCHAIN"
fi

export CGO_ENABLED="${CGO_ENABLED:-0}"
export GOFLAGS="${GOFLAGS:-} -buildvcs=false"

# The module: written once per version; `.tidy-done` marks a finished `go mod tidy`.
mod="$root/mod"
if [[ ! -f "$mod/.tidy-done" ]]; then
    start=$SECONDS
    rm -rf "$mod"
    mkdir -p "$mod"
    log "fetching k8s.io/kubernetes@$version from the module proxy"
    fetched="$(cd "$mod" && { go mod download -json "k8s.io/kubernetes@$version" 2>&1 || true; })"
    kube_gomod="$(awk -F'"' '$2 == "GoMod" {print $4}' <<<"$fetched")"
    [[ -f "$kube_gomod" ]] || die "the module proxy gave no go.mod for k8s.io/kubernetes@$version: $(awk -F'"' '$2 == "Error" {print $4}' <<<"$fetched")"
    # Its own replace lines name the staging modules: `k8s.io/api => ./staging/src/k8s.io/api`.
    mapfile -t staging < <(awk '$2 == "=>" && $3 ~ /^\.\/staging\// {print $1}' "$kube_gomod" | sort -u)
    [[ ${#staging[@]} -gt 0 ]] || die "no staging modules in k8s.io/kubernetes@$version's go.mod"
    go_line="$(awk '$1 == "go" {print $2; exit}' "$kube_gomod")"
    # Each staging module at the version's own release, v0.<minor>.<patch>. Where the module proxy
    # does not serve that release of one (it refuses k8s.io/endpointslice v0.32.13, for one), the
    # newest it serves of the same minor below it, said here and kept in the module folder's `substituted`: a
    # patch release of a staging module changes no API, and the binaries still say $version.
    : >"$mod/substituted"
    declare -A chosen=()
    for m in "${staging[@]}"; do
        chosen[$m]="$staging_version"
        if (cd /tmp && go mod download "$m@$staging_version" >/dev/null 2>&1); then
            continue
        fi
        served="$(cd /tmp && GOFLAGS=-mod=mod go list -m -versions "$m" 2>/dev/null | tr ' ' '\n' |
            awk -v minor="$minor" -v patch="${patch%%-*}" -F. \
                '$1 == "v0" && $2 == minor && $3 ~ /^[0-9]+$/ && $3 + 0 < patch + 0 {print $3}' |
            sort -n | tail -1 || true)"
        if [[ -z "$served" ]]; then
            # no release of that minor at all (k8s.io/sample-cli-plugin v0.32): left out; if a
            # component imports it after all, go mod tidy says so and the build stops there
            log "$m is served at neither $staging_version nor an earlier v0.$minor release: left out"
            echo "$m left out" >>"$mod/substituted"
            chosen[$m]=""
            continue
        fi
        chosen[$m]="v0.$minor.$served"
        log "$m $staging_version is not served by the module proxy: using ${chosen[$m]}"
        echo "$m ${chosen[$m]}" >>"$mod/substituted"
    done
    {
        echo "// Generated by tests/controlplane/build-version.sh for Kubernetes $version."
        echo "module nodewarden.io/tests/controlplane/kube"
        echo
        echo "go ${go_line:-1.22.0}"
        echo
        echo "require k8s.io/kubernetes $version"
        echo
        echo "replace ("
        for m in "${staging[@]}"; do
            [[ -z "${chosen[$m]}" ]] || printf '\t%s => %s %s\n' "$m" "$m" "${chosen[$m]}"
        done
        echo ")"
    } >"$mod/go.mod"
    {
        echo "//go:build tools"
        echo
        echo "package tools"
        echo
        echo "import ("
        for c in "${all_components[@]}"; do
            printf '\t_ "k8s.io/kubernetes/cmd/%s"\n' "$c"
        done
        echo ")"
    } >"$mod/tools.go"
    log "go mod tidy for $version (${#staging[@]} staging modules at $staging_version, $(wc -l <"$mod/substituted") substituted)"
    (cd "$mod" && nice -n 15 go mod tidy) || die "go mod tidy failed for $version"
    touch "$mod/.tidy-done"
    log "module ready in $((SECONDS - start))s"
fi

version_ldflags=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    version_ldflags+=" -X $pkg.gitVersion=$version"
    version_ldflags+=" -X $pkg.gitMajor=1"
    version_ldflags+=" -X $pkg.gitMinor=$minor"
    version_ldflags+=" -X $pkg.gitTreeState=clean"
done

mkdir -p "$dest"
missing=()
for b in "${wanted[@]}"; do
    [[ -x "$dest/$b" ]] || missing+=("$b")
done
if [[ ${#missing[@]} -gt 0 ]]; then
    tmp="$(mktemp -d "$root/.build.XXXXXX")"
    trap 'rm -rf "$tmp"' EXIT
    start=$SECONDS
    log "building ${missing[*]} at $version into $tmp (many minutes on a cold Go build cache)"
    pkgs=()
    for b in "${missing[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$b"); done
    (cd "$mod" && nice -n 15 go build -trimpath -ldflags "-s -w$version_ldflags" -o "$tmp/" "${pkgs[@]}")
    for b in "${missing[@]}"; do
        [[ -x "$tmp/$b" ]] || die "missing $b after the build"
        mv -f "$tmp/$b" "$dest/$b"
    done
    log "${missing[*]} built in $((SECONDS - start))s"
fi

# etcd and helm from the pinned build (waits for it, or builds it, when it is not there yet).
for b in etcd helm; do
    if [[ ! -x "$dest/$b" ]]; then
        pinned_bin="$(bash "$here/build.sh" | tail -n 1)"
        [[ -x "$pinned_bin/$b" ]] || die "build.sh gave no $b in $pinned_bin"
        cp -f "$pinned_bin/$b" "$dest/.$b.tmp"
        mv -f "$dest/.$b.tmp" "$dest/$b"
    fi
done

complete || die "$dest is incomplete after the build"
log "done"
echo "$dest"
