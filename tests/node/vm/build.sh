#!/usr/bin/env bash
# Builds the disk image of the cgroup v2 test node: a minimal Debian bookworm with systemd (unified
# cgroup hierarchy), its kernel, Debian's runc, CNI plugins, iptables, conntrack and
# qemu-guest-agent, containerd 2.x built from this Go module, and the kubelet and kube-proxy of
# the control-plane build (tests/controlplane/build.sh), or with NODEWARDEN_KUBE_VERSION set those
# of that version (tests/controlplane/build-version.sh): an image of its own, as the key says.
#
# Output: ${NODEWARDEN_CACHE:-$HOME/.cache/nodewarden}/vm/<key>/ holding
#   root.img     raw ext4 file system of the root (boot it behind a qcow2 overlay: never write to it)
#   vmlinuz      the guest's kernel      initrd.img   its initramfs
#   info         what went in (versions, sizes, build time)
# <key> hashes this script, the Go module, the guest's files, the Go version and the kubelet and
# kube-proxy binaries. When the folder exists the script prints it and exits at once; otherwise it
# builds beside it and renames the result into place. The last line on stdout is the folder.
#
# Needs root (the root file system's owners), mmdebstrap, e2fsprogs and access to Debian's
# package archive (NODEWARDEN_VM_MIRROR=<uri> picks the archive; default: mmdebstrap's). Nothing
# is mounted on the host: mmdebstrap runs in a mount namespace of its own, and the image is made
# with `mkfs.ext4 -d`.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache_root="${NODEWARDEN_CACHE:-$HOME/.cache/nodewarden}/vm"
suite=bookworm
outputs=(root.img vmlinuz initrd.img info)

log() { echo "vm/build.sh: $*" >&2; }

[[ "$(id -u)" -eq 0 ]] || {
    log "needs root (the image's files belong to root)"
    exit 1
}
bash "$here/../packages.sh" mmdebstrap e2fsprogs util-linux >&2

# the pinned version's (build.sh), or $NODEWARDEN_KUBE_VERSION's (the version matrix's newest)
cp_bin="$("$here/../../controlplane/build-version.sh" "${NODEWARDEN_KUBE_VERSION:-}" kubelet kube-proxy | tail -n 1)"
for b in kubelet kube-proxy; do
    [[ -x "$cp_bin/$b" ]] || {
        log "$cp_bin/$b is missing"
        exit 1
    }
done

cd "$here"
key="$(
    {
        go env GOVERSION GOOS GOARCH
        echo "$suite ${NODEWARDEN_VM_MIRROR:-}"
        for f in build.sh go.mod go.sum tools.go guest/*; do
            printf '%s\n' "$f"
            cat "$f"
        done
        sha256sum "$cp_bin/kubelet" "$cp_bin/kube-proxy" | cut -d' ' -f1
    } | sha256sum | cut -c1-16
)"
dest="$cache_root/$key"

complete() {
    local f
    for f in "${outputs[@]}"; do
        [[ -s "$dest/$f" ]] || return 1
    done
}

if complete; then
    echo "$dest"
    exit 0
fi

mkdir -p "$cache_root"
# One build at a time per key: a second caller waits and then finds the result.
exec 9>"$cache_root/.$key.lock"
if ! flock -n 9; then
    log "another build of $key is running; waiting for it"
    flock 9
fi
if complete; then
    echo "$dest"
    exit 0
fi

tmp="$(mktemp -d "$cache_root/.build-$key.XXXXXX")"
chmod 755 "$tmp"
root="$tmp/root"

# Anything still mounted below the build folder (there should never be anything: mmdebstrap runs
# in a private mount namespace). Checked before any removal, so `rm -rf` can never reach through
# a bind mount into the host's own /dev, /proc or /sys.
mounted_below() { findmnt -rn -o TARGET | awk -v p="$tmp/" 'index($0 "/", p) == 1'; }
cleanup() {
    local left
    left="$(mounted_below)"
    if [[ -n "$left" ]]; then
        log "still mounted below $tmp, unmounting: $left"
        echo "$left" | sort -r | while read -r m; do umount -l "$m" || true; done
    fi
    if [[ -n "$(mounted_below)" ]]; then
        log "could not unmount everything below $tmp; leaving it for you to remove"
        return
    fi
    rm -rf --one-file-system "$tmp"
}
trap cleanup EXIT

began=$SECONDS
export CGO_ENABLED=0
export GOFLAGS="${GOFLAGS:-} -buildvcs=false"
containerd_version="$(go list -m -f '{{.Version}}' github.com/containerd/containerd/v2)"
log "building containerd $containerd_version"
start=$SECONDS
mkdir -p "$tmp/bin"
go build -trimpath \
    -ldflags "-s -w -X github.com/containerd/containerd/v2/version.Version=$containerd_version" \
    -o "$tmp/bin/" \
    github.com/containerd/containerd/v2/cmd/containerd \
    github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 \
    github.com/containerd/containerd/v2/cmd/ctr
log "containerd built in $((SECONDS - start))s"

packages=(
    systemd systemd-sysv udev dbus kmod iproute2 procps
    linux-image-amd64 initramfs-tools
    iptables conntrack containernetworking-plugins runc ca-certificates qemu-guest-agent
)
mirror=()
if [[ -n "${NODEWARDEN_VM_MIRROR:-}" ]]; then mirror=("$NODEWARDEN_VM_MIRROR"); fi
log "installing Debian $suite into $root"
start=$SECONDS
# a mount namespace of its own: whatever mmdebstrap mounts inside the root (/proc, /sys, /dev for
# the packages' scripts) goes away with it, also when it fails
unshare --mount --propagation private -- \
    mmdebstrap --mode=root --variant=minbase --include="$(
        IFS=,
        echo "${packages[*]}"
    )" \
    --dpkgopt=path-exclude=/usr/share/doc/* --dpkgopt=path-exclude=/usr/share/man/* \
    --dpkgopt=path-exclude=/usr/share/locale/* --dpkgopt=path-exclude=/usr/share/info/* \
    --quiet "$suite" "$root" "${mirror[@]}" >&2
if [[ -n "$(mounted_below)" ]]; then
    log "mmdebstrap left mounts behind: $(mounted_below)"
    exit 1
fi
log "root installed in $((SECONDS - start))s"

# containerd and the Kubernetes node binaries
install -m 0755 "$tmp/bin/containerd" "$tmp/bin/containerd-shim-runc-v2" "$tmp/bin/ctr" "$root/usr/local/bin/"
install -m 0755 "$cp_bin/kubelet" "$cp_bin/kube-proxy" "$root/usr/local/bin/"
# the guest's configuration: units, network, modules, sysctls, file systems
install -m 0644 guest/containerd.service guest/kubelet.service guest/kube-proxy.service \
    guest/mnt-nodewarden.mount "$root/etc/systemd/system/"
install -m 0644 guest/10-eth.network "$root/etc/systemd/network/"
install -m 0644 guest/modules.conf "$root/etc/modules-load.d/nodewarden.conf"
install -m 0644 guest/sysctl.conf "$root/etc/sysctl.d/90-nodewarden.conf"
install -m 0644 guest/fstab "$root/etc/fstab"
mkdir -p "$root/mnt/nodewarden"
echo nodewarden-vm >"$root/etc/hostname"
# empty: systemd makes a new machine ID at every boot (every run's node is a new machine)
: >"$root/etc/machine-id"
systemctl --root="$root" enable systemd-networkd.service mnt-nodewarden.mount >&2
# no login prompts and no timers doing work in the background of a slow, emulated machine
systemctl --root="$root" mask apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer \
    e2scrub_reap.service fstrim.timer getty@tty1.service serial-getty@ttyS0.service >/dev/null 2>&1
rm -rf "$root/var/cache/apt/archives/"*.deb "$root/var/lib/apt/lists/"*

kernel="$(cd "$root/boot" && ls vmlinuz-* | sort -V | tail -n 1)"
initrd="initrd.img-${kernel#vmlinuz-}"
[[ -s "$root/boot/$initrd" ]] || {
    log "no $initrd in the root"
    exit 1
}
cp "$root/boot/$kernel" "$tmp/vmlinuz"
cp "$root/boot/$initrd" "$tmp/initrd.img"

# the root's size, plus room for images, containers and logs
used_mib="$(du -sm --apparent-size "$root" | cut -f1)"
size_mib=$((used_mib + 2048))
log "making a ${size_mib} MiB ext4 image of ${used_mib} MiB of files"
mkfs.ext4 -q -L nodewarden-root -E root_owner=0:0 -d "$root" "$tmp/root.img" "${size_mib}M" >&2
chmod 0444 "$tmp/root.img"

{
    echo "debian $suite, kernel ${kernel#vmlinuz-}"
    echo "containerd $containerd_version"
    echo "kubelet $("$cp_bin/kubelet" --version 2>/dev/null | awk '{print $2}')"
    for p in systemd runc containernetworking-plugins qemu-guest-agent; do
        echo "$p $(dpkg-query --admindir="$root/var/lib/dpkg" -W -f='${Version}' "$p" 2>/dev/null || echo '?')"
    done
    echo "files ${used_mib} MiB, image ${size_mib} MiB (sparse)"
    echo "built in $((SECONDS - began))s"
} >"$tmp/info"
rm -rf --one-file-system "$root" "$tmp/bin"

# Atomic hand-over: `mv -T` refuses to replace a non-empty folder, so a build that raced with
# another one just drops its own result.
if ! mv -T "$tmp" "$dest" 2>/dev/null; then
    complete || {
        log "could not move the build into $dest"
        exit 1
    }
fi
trap - EXIT
log "done in $((SECONDS - began))s: $dest"
echo "$dest"
