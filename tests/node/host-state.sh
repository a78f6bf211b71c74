#!/bin/sh
# What a real node changes on the host, recorded before it starts and put back after it stops.
#
#   host-state.sh snapshot DIR   record the host's state into DIR (a new folder)
#   host-state.sh restore DIR    kill what the node left running and undo every change since the
#                                snapshot: mounts, network namespaces, links, routes, iptables and
#                                nftables, sysctls, cgroups, fixed folders, conntrack entries
#   host-state.sh diff DIR       print what differs from the snapshot; exit 1 when anything does
#
# DIR/owner names the folder whose processes belong to the node (containerd, its shims, the kubelet):
# any process whose command line mentions it is killed on restore. DIR/cgroup-roots lists the
# cgroup names (one per line, e.g. `nodewarden-node-a`) whose processes are killed and whose
# folders are removed in every cgroup hierarchy. DIR/conntrack-ranges lists CIDRs whose conntrack
# entries are deleted. The harness writes those three; the rest is this script's.
#
# `restore` never stops at a failed step, and is safe to run twice: the test harness runs it when a
# node is torn down, and its watchdog runs it again when the test process died without tearing down.
set -u

# sysctls a node may change (kubelet, the bridge CNI plugin, kube-proxy), as key prefixes.
SYSCTL_KEYS='^(kernel\.panic|kernel\.panic_on_oops|kernel\.keys\.root_max|vm\.overcommit_memory|vm\.panic_on_oom|net\.ipv4\.ip_forward|net\.ipv4\.conf\.|net\.ipv6\.conf\.(all|default)\.(forwarding|accept_ra|disable_ipv6)|net\.bridge\.|net\.netfilter\.nf_conntrack_(max|tcp_timeout_established|tcp_timeout_close_wait|udp_timeout)|net\.core\.(somaxconn|netdev_max_backlog)) '
# Folders the kubelet, containerd and the CNI plugins use at fixed places, whatever their flags,
# and the chart's default checkpoint folder (a hostPath the kubelet creates when missing).
FIXED_DIRS='/var/lib/kubelet /var/lib/nodewarden /var/log/containers /var/log/pods /var/lib/cni /run/containerd /opt/containerd /run/nri /var/lib/containerd /etc/cni /opt/cni /run/netns'

cmd="${1:-}"
dir="${2:-}"
[ -n "$cmd" ] && [ -n "$dir" ] || {
    echo "usage: $0 snapshot|restore|diff DIR" >&2
    exit 2
}

have() { command -v "$1" >/dev/null 2>&1; }

sysctls() { sysctl -a 2>/dev/null | grep -E "$SYSCTL_KEYS" | sort; }
mounts() { awk '{print $5}' /proc/self/mountinfo | sort -u; }
links() { ip -o link show | awk -F': ' '{sub(/@.*/, "", $2); print $2}' | sort -u; }
netns() { ls /run/netns 2>/dev/null | sort; }
routes() { { ip route show table all; ip -6 route show table all; } 2>/dev/null | sort; }
# iptables-save prints comment lines with a time stamp: leave them out.
# A table that holds nothing (its built-in chains accepting, no rule, no chain of its own) is left
# out: it is what a host without rules has, whether the table was never loaded or was emptied
# (iptables-nft cannot unload a table, so a fresh host's empty snapshot must match an emptied one).
nonempty_tables() {
    awk '/^\*/ { block = $0 "\n"; keep = 0; next }
        /^COMMIT/ { if (keep) printf "%sCOMMIT\n", block; next }
        { block = block $0 "\n"; if ($0 !~ /^:(INPUT|FORWARD|OUTPUT|PREROUTING|POSTROUTING) ACCEPT$/) keep = 1 }'
}
# iptables-restore input that empties every table iptables-save shows (the tables' own chains
# deleted, their built-in chains accepting)
empty_tables() {
    sed 's/ \[[0-9]*:[0-9]*\]//' | awk '/^\*/ || /^COMMIT/ { print; next }
        /^:(INPUT|FORWARD|OUTPUT|PREROUTING|POSTROUTING) / { print $1 " ACCEPT" }'
}
iptables_v4() { have iptables-save && iptables-save 2>/dev/null | grep -v '^#' | sed 's/ \[[0-9]*:[0-9]*\]//' | nonempty_tables; }
iptables_v6() { have ip6tables-save && ip6tables-save 2>/dev/null | grep -v '^#' | sed 's/ \[[0-9]*:[0-9]*\]//' | nonempty_tables; }
nft_tables() { have nft && nft list tables 2>/dev/null | sort; }
# Top-level cgroups of every hierarchy (v1 controllers and the unified one), as "hierarchy/name".
cgroups() {
    for h in /sys/fs/cgroup /sys/fs/cgroup/*; do
        [ -d "$h" ] || continue
        for c in "$h"/*/; do
            [ -d "$c" ] && echo "${c%/}"
        done
    done 2>/dev/null | sort -u
}
fixed_dirs() { for d in $FIXED_DIRS; do [ -e "$d" ] && echo "$d"; done; }

snapshot() {
    mkdir -p "$dir"
    sysctls >"$dir/sysctls"
    mounts >"$dir/mounts"
    links >"$dir/links"
    netns >"$dir/netns"
    routes >"$dir/routes"
    iptables_v4 >"$dir/iptables-v4"
    iptables_v6 >"$dir/iptables-v6"
    nft_tables >"$dir/nft-tables"
    cgroups >"$dir/cgroups"
    fixed_dirs >"$dir/fixed-dirs"
    touch "$dir/owner" "$dir/cgroup-roots" "$dir/conntrack-ranges"
}

# Lines of $2 (a command's output) that are not in the file $1.
added() { printf '%s\n' "$2" | grep -vxF -f "$1" | grep -v '^$'; }

# Process ids whose command line mentions $1, but not this script, its callers or the watchdog
# (their command lines name the same folder).
node_pids() {
    for pid in $(pgrep -f -- "$1"); do
        [ "$pid" = "$$" ] && continue
        args=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null) || continue
        case "$args" in
        *host-state.sh* | *nodewarden-e2e-watchdog* | *pgrep*) ;;
        *) echo "$pid" ;;
        esac
    done
}

kill_node_processes() {
    owner=$(cat "$dir/owner" 2>/dev/null)
    if [ -n "$owner" ]; then
        # twice: a shim may fork while the first round runs
        for _round in 1 2; do
            node_pids "$owner" | xargs -r kill -KILL 2>/dev/null
            sleep 0.2
        done
    fi
    while read -r root; do
        [ -n "$root" ] || continue
        for h in /sys/fs/cgroup /sys/fs/cgroup/*; do
            [ -d "$h/$root" ] || continue
            find "$h/$root" -name cgroup.procs -exec cat {} + 2>/dev/null | xargs -r kill -KILL 2>/dev/null
        done
    done <"$dir/cgroup-roots"
    sleep 0.2
}

restore() {
    [ -f "$dir/sysctls" ] || {
        echo "host-state.sh: no snapshot in $dir" >&2
        return 1
    }
    kill_node_processes

    for ns in $(added "$dir/netns" "$(netns)"); do ip netns delete "$ns" 2>/dev/null; done
    # deepest first, lazily: a busy mount must not keep the others mounted
    added "$dir/mounts" "$(mounts)" | awk '{print length, $0}' | sort -rn | cut -d' ' -f2- |
        while read -r m; do umount -l "$m" 2>/dev/null; done
    for l in $(added "$dir/links" "$(links)"); do ip link delete "$l" 2>/dev/null; done
    added "$dir/routes" "$(routes)" | while read -r r; do
        # shellcheck disable=SC2086 # a route line is a list of words for ip
        ip route del $r 2>/dev/null || ip -6 route del $r 2>/dev/null
    done

    # every table emptied first (a table the snapshot does not list was empty then, and a fresh
    # host's snapshot lists none), then the snapshot's rules put back
    if have iptables-restore && have iptables-save; then
        iptables-save 2>/dev/null | grep -v '^#' | empty_tables | iptables-restore 2>/dev/null
        if [ -s "$dir/iptables-v4" ]; then iptables-restore <"$dir/iptables-v4" 2>/dev/null; fi
    fi
    if have ip6tables-restore && have ip6tables-save; then
        ip6tables-save 2>/dev/null | grep -v '^#' | empty_tables | ip6tables-restore 2>/dev/null
        if [ -s "$dir/iptables-v6" ]; then ip6tables-restore <"$dir/iptables-v6" 2>/dev/null; fi
    fi
    if have nft; then
        added "$dir/nft-tables" "$(nft_tables)" | while read -r _table family name; do
            nft delete table "$family" "$name" 2>/dev/null
        done
    fi

    # ip_forward resets every interface's forwarding: write it first, then the rest, twice
    for _pass in 1 2; do
        grep -E '^net\.ipv4\.ip_forward ' "$dir/sysctls" | while read -r key _eq value; do
            sysctl -q -w "$key=$value" >/dev/null 2>&1
        done
        added "$dir/sysctls" "$(sysctls)" | while read -r key _eq _value; do
            want=$(grep -E "^$(printf '%s' "$key" | sed 's/[.[\*^$]/\\&/g') = " "$dir/sysctls" | sed 's/^[^=]*= //')
            [ -n "$want" ] || continue
            sysctl -q -w "$key=$want" >/dev/null 2>&1
        done
    done

    # cgroups the node made: deepest first (rmdir only removes empty cgroups)
    for c in $(added "$dir/cgroups" "$(cgroups)"); do
        find "$c" -depth -type d -exec rmdir {} \; 2>/dev/null
    done

    for d in $(added "$dir/fixed-dirs" "$(fixed_dirs)"); do rm -rf "$d"; done

    if have conntrack; then
        while read -r range; do
            [ -n "$range" ] || continue
            conntrack -D -s "$range" >/dev/null 2>&1
            conntrack -D -d "$range" >/dev/null 2>&1
        done <"$dir/conntrack-ranges"
    fi
    return 0
}

# What differs from the snapshot, one line per difference. Empty when the host is as before.
diff_state() {
    for what in sysctls mounts links netns routes cgroups fixed-dirs nft-tables; do
        case $what in
        fixed-dirs) now=$(fixed_dirs) ;;
        nft-tables) now=$(nft_tables) ;;
        *) now=$($what) ;;
        esac
        printf '%s\n' "$now" >"$dir/.now"
        added "$dir/$what" "$now" | sed "s|^|$what: now |"
        grep -vxF -f "$dir/.now" "$dir/$what" | grep -v '^$' | sed "s|^|$what: gone |"
    done
    for fam in v4 v6; do
        if [ "$fam" = v4 ]; then now=$(iptables_v4); else now=$(iptables_v6); fi
        printf '%s\n' "$now" | grep -v '^$' >"$dir/.now"
        if ! grep -v '^$' "$dir/iptables-$fam" | cmp -s - "$dir/.now"; then
            grep -v '^$' "$dir/iptables-$fam" | diff - "$dir/.now" | grep '^[<>]' | sed "s|^|iptables-$fam: |"
        fi
    done
    owner=$(cat "$dir/owner" 2>/dev/null)
    if [ -n "$owner" ]; then
        for pid in $(node_pids "$owner"); do
            echo "process: $pid $(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null)"
        done
    fi
    if have conntrack; then
        while read -r range; do
            [ -n "$range" ] || continue
            n=$( { conntrack -L -s "$range"; conntrack -L -d "$range"; } 2>/dev/null | wc -l)
            [ "$n" -eq 0 ] || echo "conntrack: $n entries for $range"
        done <"$dir/conntrack-ranges"
    fi
    rm -f "$dir/.now"
}

case "$cmd" in
snapshot) snapshot ;;
restore) restore ;;
diff)
    out=$(diff_state)
    if [ -n "$out" ]; then
        printf '%s\n' "$out"
        exit 1
    fi
    ;;
*)
    echo "usage: $0 snapshot|restore|diff DIR" >&2
    exit 2
    ;;
esac
