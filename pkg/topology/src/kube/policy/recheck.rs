//! The watch backoff of the optional policy kinds (ClusterNetworkPolicy, a cluster may
//! not serve it): slow rechecks while the cluster refuses the kind, kube's default
//! otherwise.

use std::sync::Arc;
use std::time::Duration;

use kube::runtime::utils::Backoff;
use kube::runtime::watcher::DefaultBackoff;

use super::{FIRST_RECHECK, Kind, PolicyCache, RECHECK};

/// The watch backoff of an optional kind: while the cluster does not serve it (or
/// refuses it), retries come after [`FIRST_RECHECK`], doubling up to [`RECHECK`];
/// otherwise as kube's default.
pub(super) struct Recheck {
    cache: Arc<PolicyCache>,
    kind: Kind,
    default: DefaultBackoff,
    /// The next delay while unserved.
    next: Duration,
}

impl Recheck {
    pub(super) fn new(cache: Arc<PolicyCache>, kind: Kind) -> Self {
        Self {
            cache,
            kind,
            default: DefaultBackoff::default(),
            next: FIRST_RECHECK,
        }
    }
}

impl Iterator for Recheck {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        // The answer that failed is in the cache already: `Observed` records it before
        // the watcher sees it.
        if self.cache.unserved(self.kind) {
            let delay = self.next;
            self.next = (delay * 2).min(RECHECK);
            return Some(delay);
        }
        self.default.next()
    }
}

impl Backoff for Recheck {
    fn reset(&mut self) {
        self.default.reset();
        // The watcher emits `Init` (which resets its backoff) before every list, even one
        // that is answered 404 again: only a served answer starts the delays over.
        if !self.cache.unserved(self.kind) {
            self.next = FIRST_RECHECK;
        }
    }
}
