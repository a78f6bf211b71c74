#!/usr/bin/env bash
# Installs the Debian packages named on the command line that are not installed yet; does nothing
# (and needs no root) when all of them are. The real-node tier and the image test list what they
# need here, e.g.:
#   tests/node/packages.sh buildah
# Set NODEWARDEN_NO_APT=1 to only report what is missing (exit 1 if anything is).
set -euo pipefail

if [ "$#" -eq 0 ]; then
    echo "usage: $0 PACKAGE..." >&2
    exit 2
fi

missing=()
for pkg in "$@"; do
    status=$(dpkg-query -W -f='${db:Status-Status}' "$pkg" 2>/dev/null || true)
    if [ "$status" != "installed" ]; then
        missing+=("$pkg")
    fi
done

if [ "${#missing[@]}" -eq 0 ]; then
    exit 0
fi

if [ -n "${NODEWARDEN_NO_APT:-}" ]; then
    echo "packages.sh: missing Debian packages: ${missing[*]}" >&2
    exit 1
fi
if ! command -v apt-get >/dev/null; then
    echo "packages.sh: missing ${missing[*]}, and there is no apt-get on this machine: install them by hand" >&2
    exit 1
fi
sudo=()
if [ "$(id -u)" -ne 0 ]; then
    if ! command -v sudo >/dev/null; then
        echo "packages.sh: missing ${missing[*]}; installing needs root" >&2
        exit 1
    fi
    sudo=(sudo)
fi

echo "packages.sh: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
# one installer at a time: tests of one run may ask together (apt's own lock fails instead of waiting)
exec 9>"${TMPDIR:-/tmp}/nodewarden-packages.lock"
flock 9
# apt-get update once per run of this script, and only when something is missing
"${sudo[@]}" apt-get update -qq >&2
"${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
