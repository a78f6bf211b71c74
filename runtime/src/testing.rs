//! For tests only (feature `test-util`): what the tests of more than one crate need to start
//! nodewarden's binaries and the components around them.

use std::net::TcpListener;

/// Tries of [`free_port`] before it gives up.
const TRIES: usize = 200;

/// A TCP port that was free a moment ago on 127.0.0.1 and on every address, for a process about
/// to listen on it; `None` if none was found in [`TRIES`] tries.
///
/// Chosen at random below the kernel's ephemeral range (`net.ipv4.ip_local_port_range`, where
/// outgoing connections take their source ports) and tried with a bind first. A port from
/// binding port 0 lies inside that range, so any outgoing connection (the tests open thousands)
/// could take it between the choice and the program's own bind: once an API server's start
/// ended with `address already in use` that way.
pub fn free_port() -> Option<u16> {
    let below = ephemeral_low().unwrap_or(32768);
    let (low, high) = if below > 12_000 {
        (10_000, below)
    } else {
        (1024, below.max(1025))
    };
    (0..TRIES).map(|_| fastrand::u16(low..high)).find(|&port| {
        TcpListener::bind(("127.0.0.1", port)).is_ok() && TcpListener::bind(("0.0.0.0", port)).is_ok()
    })
}

/// `n` distinct ports of [`free_port`].
pub fn free_ports(n: usize) -> Option<Vec<u16>> {
    let mut ports: Vec<u16> = Vec::with_capacity(n);
    // a port chosen twice is chosen again; bounded, though a repeat is rare
    for _ in 0..n * 20 {
        if ports.len() == n {
            return Some(ports);
        }
        let port = free_port()?;
        if !ports.contains(&port) {
            ports.push(port);
        }
    }
    (ports.len() == n).then_some(ports)
}

/// The first port of `net.ipv4.ip_local_port_range`.
fn ephemeral_low() -> Option<u16> {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_distinct_below_the_ephemeral_range_and_free() {
        let low = ephemeral_low().unwrap_or(32768);
        let ports = free_ports(8).expect("eight free ports");
        let mut sorted = ports.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), 8, "{ports:?}");
        for port in ports {
            assert!(port < low, "{port} is in the ephemeral range from {low}");
            TcpListener::bind(("127.0.0.1", port)).expect("still free");
        }
    }
}
