//! What the guard knows of the other claims: a [`ClaimView`] (the watch caches, or a fixed
//! `StaticView` in tests) merged with the well-known writes this replica admitted and the caches
//! may not show yet (`RecentWrites`).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::Shape;

/// Whether a claim exists, as far as the guard can tell. Where the watch cache and this
/// replica's own recent decisions disagree, the two answers differ: rules that deny look at
/// `may_exist`, rules that allow look at `surely_exists`, so doubt keeps the ID in place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Presence {
    /// The claim may exist: rules that deny because of it apply.
    pub may_exist: bool,
    /// The claim surely exists: rules that allow because of it apply.
    pub surely_exists: bool,
}

impl Presence {
    /// Not there.
    pub const ABSENT: Presence = Presence {
        may_exist: false,
        surely_exists: false,
    };
    /// There, and not being deleted.
    pub const PRESENT: Presence = Presence {
        may_exist: true,
        surely_exists: true,
    };
    /// Being deleted (has a deletionTimestamp) or just admitted and not yet seen.
    pub const UNCERTAIN: Presence = Presence {
        may_exist: true,
        surely_exists: false,
    };
}

/// The other claims of a shape, as the cross-object rules see them.
pub trait ClaimView: Send + Sync {
    /// `None` when the claims of `shape` are not known (not watched, or not synced yet).
    fn presence(&self, shape: Shape, name: &str) -> Option<Presence>;
}

#[cfg(any(test, feature = "test-util"))]
/// A fixed set of existing claims, for tests (feature `test-util`).
#[derive(Clone, Debug, Default)]
pub struct StaticView {
    /// The existing claims of each shape, by name; a shape missing here is not known.
    pub claims: BTreeMap<Shape, BTreeMap<String, Presence>>,
}

#[cfg(any(test, feature = "test-util"))]
impl StaticView {
    /// Every shape known and empty.
    pub fn empty() -> Self {
        StaticView {
            claims: Shape::ALL.into_iter().map(|s| (s, BTreeMap::new())).collect(),
        }
    }

    /// Adds `names` as existing claims of `shape`.
    pub fn with(mut self, shape: Shape, names: &[&str]) -> Self {
        let set = self.claims.entry(shape).or_default();
        for name in names {
            set.insert(name.to_string(), Presence::PRESENT);
        }
        self
    }

    /// Sets one claim's presence.
    pub fn with_presence(mut self, shape: Shape, name: &str, presence: Presence) -> Self {
        self.claims
            .entry(shape)
            .or_default()
            .insert(name.to_string(), presence);
        self
    }

    /// Forgets `shape` (as when its cache has not synced).
    pub fn without(mut self, shape: Shape) -> Self {
        self.claims.remove(&shape);
        self
    }
}

#[cfg(any(test, feature = "test-util"))]
impl ClaimView for StaticView {
    fn presence(&self, shape: Shape, name: &str) -> Option<Presence> {
        let set = self.claims.get(&shape)?;
        Some(set.get(name).copied().unwrap_or(Presence::ABSENT))
    }
}

/// How long an admitted write of a well-known claim is remembered when the cache does not show it.
pub const RECENT_WRITE_TTL: Duration = Duration::from_secs(15);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Written {
    Upserted,
    Deleted,
}

/// The well-known claims this replica admitted and its cache may not show yet.
///
/// Between admission and the watch event, the cache lags. Merged with it conservatively, this
/// closes the window for writes that go through one replica: an admitted create of
/// `clusterset.k8s.io` counts as "may exist" (later ID deletes are denied at once), an admitted
/// delete of an ID claim means "not surely there" (a following clusterset create is denied).
#[derive(Debug, Default)]
pub(crate) struct RecentWrites {
    entries: Mutex<BTreeMap<(Shape, String), (Written, Instant)>>,
}

impl RecentWrites {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<(Shape, String), (Written, Instant)>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn record(&self, shape: Shape, name: &str, written: Written, now: Instant) {
        let mut entries = self.lock();
        entries.retain(|_, (_, at)| now.duration_since(*at) < RECENT_WRITE_TTL);
        entries.insert((shape, name.to_string()), (written, now));
    }

    /// `cached` merged with what this replica admitted; forgets entries the cache has caught up with.
    fn merge(&self, shape: Shape, name: &str, cached: Presence, now: Instant) -> Presence {
        let mut entries = self.lock();
        let key = (shape, name.to_string());
        let Some((written, at)) = entries.get(&key).copied() else {
            return cached;
        };
        if now.duration_since(at) >= RECENT_WRITE_TTL {
            entries.remove(&key);
            return cached;
        }
        match written {
            Written::Upserted if cached.surely_exists => {
                entries.remove(&key);
                cached
            }
            Written::Upserted => Presence {
                may_exist: true,
                surely_exists: cached.surely_exists,
            },
            Written::Deleted if !cached.may_exist => {
                entries.remove(&key);
                cached
            }
            Written::Deleted => Presence {
                may_exist: cached.may_exist,
                surely_exists: false,
            },
        }
    }
}

/// A [`ClaimView`] of the caches merged with this replica's recent writes.
pub(super) struct Merged<'a> {
    pub(super) cached: &'a dyn ClaimView,
    pub(super) recent: &'a RecentWrites,
    pub(super) now: Instant,
}

impl ClaimView for Merged<'_> {
    fn presence(&self, shape: Shape, name: &str) -> Option<Presence> {
        let cached = self.cached.presence(shape, name)?;
        Some(self.recent.merge(shape, name, cached, self.now))
    }
}
