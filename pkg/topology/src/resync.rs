//! When an engine that plans from the cluster's objects (the wire engine, network
//! policy) looks at everything again and reads its kernel objects back: once per resync
//! interval, but not while the cluster keeps moving, for at most one more interval.
//!
//! Such a look holds whatever waits on the engine (an ADD waits on both) for as long
//! as it takes, which grows with the node; in a bring-up what it would repair is what
//! the passes of the arriving pods are building anyway. One rule for both engines.

use std::time::{Duration, Instant};

/// How long no pass may have had anything to do before a due resync runs.
pub const RESYNC_QUIET: Duration = Duration::from_secs(1);

/// Whether the pass about to run looks at everything.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resync {
    /// It does: there was no resync yet (or the caller wants one at once), one is due
    /// and nothing moved for [`RESYNC_QUIET`], or one is overdue by an interval.
    Now,
    /// A resync is due but things keep moving: this pass looks at what moved, and the
    /// caller asks again within [`RESYNC_QUIET`].
    Waits,
    /// The last resync is less than an interval old.
    NotDue,
}

/// The rule. `last_full`: when the last resync started (`None`: none yet, or one must
/// come at once); `last_moved`: when a pass last had something to look at.
pub fn resync(last_full: Option<Instant>, last_moved: Option<Instant>, interval: Duration, now: Instant) -> Resync {
    let Some(full) = last_full else {
        return Resync::Now;
    };
    let since = now.saturating_duration_since(full);
    if since < interval {
        return Resync::NotDue;
    }
    let moving = last_moved.is_some_and(|t| now.saturating_duration_since(t) < RESYNC_QUIET);
    if moving && since < interval.saturating_mul(2) {
        Resync::Waits
    } else {
        Resync::Now
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every case of the rule, at a 10 s interval, times in seconds from a start.
    #[test]
    fn a_due_resync_waits_while_things_move_for_at_most_one_more_interval() {
        let t0 = Instant::now();
        let at = |s: f64| t0 + Duration::from_secs_f64(s);
        let interval = Duration::from_secs(10);
        let cases = [
            (None, None, 0.0, Resync::Now, "no resync yet"),
            (None, Some(0.5), 0.6, Resync::Now, "no resync yet, moving"),
            (
                Some(0.0),
                Some(9.9),
                9.95,
                Resync::NotDue,
                "within the interval, moving",
            ),
            (Some(0.0), None, 9.99, Resync::NotDue, "within the interval"),
            (Some(0.0), None, 10.0, Resync::Now, "due, nothing ever moved"),
            (Some(0.0), Some(8.0), 10.5, Resync::Now, "due, quiet for 2.5 s"),
            (Some(0.0), Some(9.6), 10.5, Resync::Waits, "due, moved 0.9 s ago"),
            (
                Some(0.0),
                Some(19.9),
                19.95,
                Resync::Waits,
                "moving through the second interval",
            ),
            (Some(0.0), Some(19.99), 20.0, Resync::Now, "overdue by an interval"),
            (Some(0.0), Some(30.0), 30.0, Resync::Now, "long overdue"),
        ];
        for (full, moved, now, want, why) in cases {
            assert_eq!(resync(full.map(at), moved.map(at), interval, at(now)), want, "{why}");
        }
    }
}
