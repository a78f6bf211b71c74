//! Fairness between the addresses that connect: how fast each may open connections (a token
//! bucket per address, checked before anything else is done with a connection), and which open
//! connection makes room when the server or one address is at its limit.
//!
//! Both are bounded: a bucket table of at most as many entries as the server has connection
//! slots, and a count per address that holds connections (an entry per address, removed with its
//! last connection). Limits and what happens at each: docs/server.md.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// The address a connection counts under: an IPv4-mapped IPv6 address (`::ffff:a.b.c.d`, what a
/// dual-stack listener sees of an IPv4 client) is the IPv4 address.
pub fn source_of(ip: IpAddr) -> IpAddr {
    ip.to_canonical()
}

/// A token bucket per address: at most `per_second` new connections a second from one address,
/// up to `per_second` at once after a quiet second.
///
/// Each bucket is one instant (the generic cell rate algorithm's "theoretical arrival time"): a
/// connection is let in when that instant, moved on by one interval, is at most one second (the
/// burst) ahead of now. A bucket whose instant has passed is full, the same as no bucket at all,
/// so such entries can be dropped at any time without changing what is let in. The table holds
/// at most `capacity` entries; when it is full and a new address comes, full buckets are dropped
/// (one pass over the table), and if none is, the new address shares one overflow bucket with
/// every other address not in the table. A connection that is refused changes nothing and
/// allocates nothing; an address seen for the first time may grow the table, up to `capacity`.
#[derive(Debug)]
pub struct ConnectionRate {
    interval: Duration,
    burst: Duration,
    capacity: usize,
    buckets: HashMap<IpAddr, Instant>,
    overflow: Instant,
}

impl ConnectionRate {
    /// `per_second` new connections a second per address (at least 1), for at most `capacity`
    /// addresses at once (at least 1), more sharing one bucket.
    pub fn new(per_second: u32, capacity: usize, now: Instant) -> Self {
        let per_second = per_second.max(1);
        let interval = Duration::from_secs(1) / per_second;
        let capacity = capacity.max(1);
        ConnectionRate {
            interval,
            burst: interval * per_second,
            capacity,
            buckets: HashMap::with_capacity(capacity.min(1024)),
            overflow: now,
        }
    }

    /// Whether `source` may open a connection at `now`; takes its token if so.
    pub fn admit(&mut self, source: IpAddr, now: Instant) -> bool {
        let (interval, burst) = (self.interval, self.burst);
        if let Some(at) = self.buckets.get_mut(&source) {
            return take(at, now, interval, burst);
        }
        if self.buckets.len() >= self.capacity {
            self.buckets.retain(|_, at| *at > now);
        }
        if self.buckets.len() >= self.capacity {
            return take(&mut self.overflow, now, interval, burst);
        }
        // a bucket not in the table is full: it always has a token
        self.buckets.insert(source, now + interval);
        true
    }

    /// Addresses with a bucket that is not full (for tests).
    pub fn tracked(&self) -> usize {
        self.buckets.len()
    }
}

/// One bucket's step: let the connection in when the bucket has a token, that is, when its
/// instant moved on by one interval is at most `burst` ahead of `now`.
fn take(at: &mut Instant, now: Instant, interval: Duration, burst: Duration) -> bool {
    let next = (*at).max(now) + interval;
    if next.saturating_duration_since(now) > burst {
        return false;
    }
    *at = next;
    true
}

/// A connection that may be closed to make room, as the registry sees it.
#[derive(Debug, Clone, Copy)]
pub struct Candidate {
    /// Its client's address ([`source_of`]).
    pub source: IpAddr,
    /// Has not begun a request [`super::QUIET_EVICT_AFTER`] after it was accepted.
    pub quiet: bool,
    /// Since when it has shown no sign of life (accepted, or its last request's end).
    pub stale_since: Instant,
}

/// Which of `candidates` (stale connections, none asked to close yet) to close when the server
/// is at its connection limit: one of the address that holds the most connections (`held`), and
/// of those a quiet one before an idle one, the stalest first. `None` when there is none.
pub fn choose(
    candidates: impl Iterator<Item = (usize, Candidate)>,
    held: impl Fn(&IpAddr) -> usize,
) -> Option<usize> {
    candidates
        .max_by_key(|(_, c)| (held(&c.source), c.quiet, std::cmp::Reverse(c.stale_since)))
        .map(|(at, _)| at)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, Ipv6Addr};

    fn ip(last: u8) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(10, 0, 0, last))
    }

    #[test]
    fn an_ipv4_mapped_address_counts_as_the_ipv4_address() {
        let mapped = IpAddr::V6(Ipv4Addr::new(10, 0, 0, 7).to_ipv6_mapped());
        assert_eq!(source_of(mapped), ip(7));
        let v6 = IpAddr::V6(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 7));
        assert_eq!(source_of(v6), v6);
        assert_eq!(source_of(ip(7)), ip(7));
    }

    #[test]
    fn a_source_gets_its_burst_then_its_rate_and_others_are_not_affected() {
        let start = Instant::now();
        let mut rate = ConnectionRate::new(10, 16, start);
        let admitted = (0..100).filter(|_| rate.admit(ip(1), start)).count();
        assert_eq!(admitted, 10, "one second's worth at once");
        assert!(!rate.admit(ip(1), start + Duration::from_millis(50)));
        // another address is let in while the first is refused
        assert!(rate.admit(ip(2), start));
        // the rate: one token every 100 ms
        assert!(rate.admit(ip(1), start + Duration::from_millis(100)));
        assert!(!rate.admit(ip(1), start + Duration::from_millis(150)));
        let later = start + Duration::from_millis(100);
        let in_ten_seconds = (1..=100)
            .filter(|i| rate.admit(ip(1), later + Duration::from_millis(100) * *i))
            .count();
        assert_eq!(in_ten_seconds, 100, "one every 100 ms for 10 s");
        // after a quiet second the burst is back
        let quiet = later + Duration::from_secs(11) + Duration::from_secs(1);
        assert_eq!((0..100).filter(|_| rate.admit(ip(1), quiet)).count(), 10);
    }

    #[test]
    fn the_table_is_bounded_and_full_buckets_make_room() {
        let start = Instant::now();
        let mut rate = ConnectionRate::new(10, 4, start);
        for i in 0..4 {
            assert!(rate.admit(ip(i), start));
        }
        assert_eq!(rate.tracked(), 4);
        // the table is full: new addresses share the overflow bucket (10 at once)
        let overflowed = (10..40).filter(|i| rate.admit(ip(*i), start)).count();
        assert_eq!(overflowed, 10);
        assert_eq!(rate.tracked(), 4, "never more entries than its capacity");
        // a known address keeps its own bucket while the overflow is empty
        assert!(rate.admit(ip(0), start));
        // once the buckets are full again (100 ms: each took one token), a new address
        // takes the place of one
        let later = start + Duration::from_secs(1);
        assert!(rate.admit(ip(50), later));
        assert!(rate.tracked() <= 4);
        assert_eq!(
            (0..100).filter(|_| rate.admit(ip(50), later)).count(),
            9,
            "its own bucket"
        );
    }

    #[test]
    fn the_address_that_holds_most_loses_its_stalest_quiet_connection_first() {
        let now = Instant::now();
        let ago = |ms: u64| now - Duration::from_millis(ms);
        let held = |ip: &IpAddr| match ip {
            IpAddr::V4(v4) if v4.octets()[3] == 1 => 3, // the API server, say
            IpAddr::V4(v4) if v4.octets()[3] == 2 => 5, // the attacker
            _ => 1,
        };
        let candidates = [
            Candidate {
                source: ip(1),
                quiet: false,
                stale_since: ago(60_000),
            },
            Candidate {
                source: ip(3),
                quiet: true,
                stale_since: ago(9_000),
            },
            Candidate {
                source: ip(2),
                quiet: false,
                stale_since: ago(5_000),
            },
            Candidate {
                source: ip(2),
                quiet: true,
                stale_since: ago(300),
            },
            Candidate {
                source: ip(2),
                quiet: true,
                stale_since: ago(400),
            },
            Candidate {
                source: ip(2),
                quiet: false,
                stale_since: ago(20_000),
            },
        ];
        let chosen = choose(candidates.iter().copied().enumerate(), held);
        assert_eq!(chosen, Some(4), "the attacker's oldest quiet connection");

        // without quiet ones, the attacker's stalest
        let idle_only = [candidates[0], candidates[2], candidates[5]];
        assert_eq!(choose(idle_only.iter().copied().enumerate(), held), Some(2));

        // only the API server's idle connection is stale: it is the one
        assert_eq!(choose([candidates[0]].into_iter().enumerate(), held), Some(0));
        assert_eq!(choose(std::iter::empty(), held), None);
    }
}
