//! What more than one of the webhook's test files needs.

use std::net::TcpListener;

/// A TCP port on 127.0.0.1 that was free a moment ago, for the webhook binary to listen on.
///
/// Chosen at random below the kernel's ephemeral range (where outgoing connections take their
/// source ports; the attack tests open thousands) and tried with a bind first. A port from
/// binding port 0 lies inside that range, so it could be taken by any outgoing connection
/// between the choice and the program's own bind.
pub fn free_port() -> u16 {
    let below = ephemeral_low().unwrap_or(32768);
    let (low, high) = if below > 12_000 {
        (10_000, below)
    } else {
        (1024, below.max(1025))
    };
    for _ in 0..200 {
        let port = fastrand::u16(low..high);
        if TcpListener::bind(("127.0.0.1", port)).is_ok() && TcpListener::bind(("0.0.0.0", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port in {low}..{high} on 127.0.0.1 after 200 tries");
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
