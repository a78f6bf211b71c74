#!/usr/bin/env bash
# Installs the Debian packages named on the command line that are not installed yet, and does
# nothing when every one is. The real-node tier calls it with what a node needs (containerd, runc,
# the CNI plugins, iptables, conntrack); other tests with what they need.
#
#   tests/node/packages.sh containerd runc containernetworking-plugins
#
# Needs root and apt-get (a Debian or Ubuntu host); anywhere else it says what to install by hand
# and exits 1. `apt-get update` runs once, only when something is missing.
set -euo pipefail

missing=()
for p in "$@"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
        missing+=("$p")
    fi
done
[[ ${#missing[@]} -eq 0 ]] && exit 0

if ! command -v apt-get >/dev/null 2>&1 || [[ $(id -u) -ne 0 ]]; then
    echo "tests/node/packages.sh: missing Debian packages: ${missing[*]} (install them as root with apt-get)" >&2
    exit 1
fi
echo "tests/node/packages.sh: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
# One installer at a time: tests of one run may ask together.
exec 9>"${TMPDIR:-/tmp}/nodewarden-packages.lock"
flock 9
apt-get update -qq >&2
apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
