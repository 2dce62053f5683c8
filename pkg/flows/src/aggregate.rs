//! Flows summed per 15 s bucket and per (source group, destination group, port,
//! protocol, verdict, policy): what `weftctl flows --aggregate`, `flows top` and the
//! map read, kept for a window, bounded in keys per bucket.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::record::{Counters, FlowKind, Verdict};

/// What flows are summed by.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct AggKey {
    /// The source's group (see [`crate::Peer::group`]).
    pub src: Arc<str>,
    /// The destination's group.
    pub dst: Arc<str>,
    /// The destination port (0 without one).
    pub port: u16,
    /// The IP protocol.
    pub protocol: u8,
    /// Where the flows go.
    pub kind: FlowKind,
    /// The verdict.
    pub verdict: Verdict,
    /// The policy that decided (the first hit's name), or empty.
    pub policy: Arc<str>,
}

/// The sums of one key.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AggValue {
    /// Flows that began (or were refused).
    pub flows: u64,
    /// Source to destination, as counted during the bucket.
    pub forward: Counters,
    /// Destination to source.
    pub reverse: Counters,
}

impl AggValue {
    fn add(&mut self, o: &AggValue) {
        self.flows += o.flows;
        self.forward.packets += o.forward.packets;
        self.forward.bytes += o.forward.bytes;
        self.reverse.packets += o.reverse.packets;
        self.reverse.bytes += o.reverse.bytes;
    }
}

/// One key's sums over a span of time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Aggregate {
    /// The first bucket's start (Unix ms).
    pub start_ms: i64,
    /// The end of the last bucket (Unix ms).
    pub end_ms: i64,
    /// What was summed.
    pub key: AggKey,
    /// The sums.
    pub value: AggValue,
}

/// The key every flow beyond a bucket's key budget is summed under: nothing is lost,
/// only its grouping.
pub const OVERFLOW_GROUP: &str = "(other)";

/// One bucket's sums: a hash map while flows still land in it, then, once two newer
/// buckets exist, a sorted vector of exactly its size (a hash map holds up to twice its
/// entries' room; an hour of buckets is most of what flows keep).
#[derive(Debug)]
enum Bucket {
    Open(HashMap<AggKey, AggValue>),
    Frozen(Vec<(AggKey, AggValue)>),
}

impl Bucket {
    fn get_mut(&mut self, key: &AggKey) -> Option<&mut AggValue> {
        match self {
            Bucket::Open(m) => m.get_mut(key),
            Bucket::Frozen(v) => v.binary_search_by(|(k, _)| k.cmp(key)).ok().map(|i| &mut v[i].1),
        }
    }

    fn len(&self) -> usize {
        match self {
            Bucket::Open(m) => m.len(),
            Bucket::Frozen(v) => v.len(),
        }
    }

    /// Adds a key not held yet (a late add into a frozen bucket is rare: a flow's
    /// opening counted in the bucket before the newest).
    fn insert(&mut self, key: AggKey, value: AggValue) {
        match self {
            Bucket::Open(m) => {
                m.insert(key, value);
            }
            Bucket::Frozen(v) => {
                let at = v.binary_search_by(|(k, _)| k.cmp(&key)).unwrap_or_else(|i| i);
                v.insert(at, (key, value));
            }
        }
    }

    fn iter(&self) -> Box<dyn Iterator<Item = (&AggKey, &AggValue)> + '_> {
        match self {
            Bucket::Open(m) => Box::new(m.iter()),
            Bucket::Frozen(v) => Box::new(v.iter().map(|(k, v)| (k, v))),
        }
    }

    fn freeze(&mut self) {
        if let Bucket::Open(m) = self {
            let mut v: Vec<(AggKey, AggValue)> = std::mem::take(m).into_iter().collect();
            v.sort_by(|a, b| a.0.cmp(&b.0));
            v.shrink_to_fit();
            *self = Bucket::Frozen(v);
        }
    }
}

/// The buckets of the window, oldest first.
#[derive(Debug)]
pub struct Aggregates {
    bucket_ms: i64,
    keep: usize,
    max_keys: usize,
    buckets: VecDeque<(i64, Bucket)>,
    /// Adds summed under [`OVERFLOW_GROUP`] because a bucket was full.
    pub overflowed: u64,
}

impl Aggregates {
    /// Buckets of `bucket_ms`, `keep` of them, at most `max_keys` keys in each.
    pub fn new(bucket_ms: i64, keep: usize, max_keys: usize) -> Self {
        Aggregates {
            bucket_ms: bucket_ms.max(1),
            keep: keep.max(1),
            max_keys: max_keys.max(1),
            buckets: VecDeque::new(),
            overflowed: 0,
        }
    }

    /// The bucket length.
    pub fn bucket_ms(&self) -> i64 {
        self.bucket_ms
    }

    /// Adds `v` to `key` in the bucket of `at_ms`. An add older than the window is
    /// dropped; one older than the newest bucket goes into its own bucket when kept.
    pub fn add(&mut self, at_ms: i64, key: &AggKey, v: AggValue) {
        let start = at_ms.div_euclid(self.bucket_ms) * self.bucket_ms;
        let newest = self.buckets.back().map(|b| b.0);
        if newest.is_none_or(|n| start > n) {
            self.buckets.push_back((start, Bucket::Open(HashMap::new())));
            while self.buckets.len() > self.keep {
                self.buckets.pop_front();
            }
            if let Some(i) = self.buckets.len().checked_sub(3) {
                self.buckets[i].1.freeze();
            }
        }
        let Some((_, map)) = self.buckets.iter_mut().rev().find(|(s, _)| *s <= start) else {
            return;
        };
        if let Some(slot) = map.get_mut(key) {
            slot.add(&v);
            return;
        }
        if map.len() >= self.max_keys {
            self.overflowed += 1;
            let other = AggKey {
                src: OVERFLOW_GROUP.into(),
                dst: OVERFLOW_GROUP.into(),
                port: 0,
                protocol: 0,
                kind: key.kind,
                verdict: key.verdict,
                policy: "".into(),
            };
            match map.get_mut(&other) {
                Some(slot) => slot.add(&v),
                None => map.insert(other, v),
            }
            return;
        }
        map.insert(key.clone(), v);
    }

    /// Every key's sums since `since_ms` (the bucket holding it on), one per key and
    /// bucket when `per_bucket`, else one per key over the whole span; largest bytes
    /// first.
    pub fn query(&self, since_ms: i64, per_bucket: bool, keep: impl Fn(&AggKey) -> bool) -> Vec<Aggregate> {
        let mut out: Vec<Aggregate> = Vec::new();
        let mut merged: HashMap<&AggKey, Aggregate> = HashMap::new();
        for (start, map) in &self.buckets {
            if start + self.bucket_ms <= since_ms {
                continue;
            }
            for (k, v) in map.iter().filter(|(k, _)| keep(k)) {
                let v = *v;
                if per_bucket {
                    out.push(Aggregate {
                        start_ms: *start,
                        end_ms: start + self.bucket_ms,
                        key: k.clone(),
                        value: v,
                    });
                    continue;
                }
                let a = merged.entry(k).or_insert_with(|| Aggregate {
                    start_ms: *start,
                    end_ms: start + self.bucket_ms,
                    key: k.clone(),
                    value: AggValue::default(),
                });
                a.value.add(&v);
                a.end_ms = start + self.bucket_ms;
            }
        }
        out.extend(merged.into_values());
        if per_bucket {
            out.sort_by(|a, b| a.start_ms.cmp(&b.start_ms).then_with(|| a.key.cmp(&b.key)));
        } else {
            let bytes = |x: &Aggregate| x.value.forward.bytes + x.value.reverse.bytes;
            out.sort_by(|a, b| bytes(b).cmp(&bytes(a)).then_with(|| a.key.cmp(&b.key)));
        }
        out
    }

    /// The aggregates of the buckets that closed after `after_ms` (a bucket's end) by
    /// `now_ms`, per bucket, and the end of the newest of them: what an export sends once.
    /// A bucket is closed one bucket after its end, when the periodic dump (every 10 s)
    /// has added what its open flows moved.
    pub fn closed(&self, after_ms: i64, now_ms: i64) -> (Vec<Aggregate>, i64) {
        let until = (now_ms - self.bucket_ms).div_euclid(self.bucket_ms) * self.bucket_ms;
        if until <= after_ms {
            return (Vec::new(), after_ms);
        }
        let mut out = self.query(after_ms, true, |_| true);
        out.retain(|a| a.start_ms >= after_ms && a.end_ms <= until);
        (out, until)
    }

    /// How many (bucket, key) entries are held.
    pub fn entries(&self) -> usize {
        self.buckets.iter().map(|(_, m)| m.len()).sum()
    }

    /// The newest bucket's start, if any.
    pub fn newest(&self) -> Option<i64> {
        self.buckets.back().map(|b| b.0)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_bucket_is_sent_once_one_bucket_after_it_ends() {
        let mut a = Aggregates::new(15_000, 10, 100);
        let key = |src: &str| AggKey {
            src: src.into(),
            dst: "d".into(),
            port: 80,
            protocol: 6,
            kind: FlowKind::IntraNode,
            verdict: Verdict::Forwarded,
            policy: "".into(),
        };
        let one = AggValue {
            flows: 1,
            ..AggValue::default()
        };
        a.add(1_000, &key("a"), one);
        a.add(16_000, &key("b"), one);
        // At 29 s the first bucket [0, 15) is not closed yet: it is, one bucket on.
        let (none, after) = a.closed(i64::MIN, 29_999);
        assert!(none.is_empty());
        let (first, after) = a.closed(after, 30_000);
        assert_eq!(first.iter().map(|x| &*x.key.src).collect::<Vec<_>>(), ["a"]);
        assert_eq!((first[0].start_ms, first[0].end_ms, after), (0, 15_000, 15_000));
        // A late add to the sent bucket is not sent again; the next bucket goes once.
        a.add(2_000, &key("late"), one);
        let (second, after) = a.closed(after, 46_000);
        assert_eq!(second.iter().map(|x| &*x.key.src).collect::<Vec<_>>(), ["b"]);
        assert_eq!(after, 30_000);
        assert!(a.closed(after, 46_000).0.is_empty());
    }

    use super::*;

    fn key(src: &str, dst: &str, port: u16) -> AggKey {
        AggKey {
            src: src.into(),
            dst: dst.into(),
            port,
            protocol: 6,
            kind: FlowKind::IntraNode,
            verdict: Verdict::Forwarded,
            policy: "".into(),
        }
    }

    fn bytes(n: u64) -> AggValue {
        AggValue {
            flows: 1,
            forward: Counters { packets: 1, bytes: n },
            reverse: Counters::default(),
        }
    }

    #[test]
    fn adds_sum_per_bucket_and_key_within_the_window() {
        let mut a = Aggregates::new(15_000, 4, 100);
        a.add(1_000, &key("x/a", "y/b", 80), bytes(10));
        a.add(14_999, &key("x/a", "y/b", 80), bytes(5));
        a.add(15_000, &key("x/a", "y/b", 80), bytes(7));
        a.add(16_000, &key("x/a", "y/b", 443), bytes(1));
        let per = a.query(0, true, |_| true);
        assert_eq!(per.len(), 3);
        assert_eq!(
            (per[0].start_ms, per[0].value.forward.bytes, per[0].value.flows),
            (0, 15, 2)
        );
        let merged = a.query(0, false, |_| true);
        assert_eq!(merged.len(), 2);
        assert_eq!(merged[0].key.port, 80, "largest bytes first");
        assert_eq!(
            (merged[0].value.forward.bytes, merged[0].start_ms, merged[0].end_ms),
            (22, 0, 30_000)
        );
        assert_eq!(
            a.query(20_000, false, |_| true)[0].value.forward.bytes,
            7,
            "since cuts whole buckets"
        );
        assert!(a.query(0, false, |k| k.port == 443).len() == 1);
        // Four buckets are kept: a fifth pushes the first out.
        for t in [30_000, 45_000, 60_000] {
            a.add(t, &key("x/a", "y/b", 80), bytes(1));
        }
        assert_eq!(a.query(0, true, |_| true).first().unwrap().start_ms, 15_000);
        // A late add into a bucket still kept lands there; older ones are dropped.
        a.add(16_000, &key("x/a", "y/b", 80), bytes(100));
        a.add(1_000, &key("x/a", "y/b", 80), bytes(1000));
        let first = &a.query(0, true, |_| true)[0];
        assert_eq!((first.start_ms, first.value.forward.bytes), (15_000, 107));
    }

    #[test]
    fn an_older_bucket_frozen_still_takes_late_adds_in_order() {
        let mut a = Aggregates::new(15_000, 10, 100);
        for port in [5, 1, 9] {
            a.add(0, &key("x/a", "y/b", port), bytes(1));
        }
        a.add(15_000, &key("x/a", "y/b", 1), bytes(1));
        a.add(30_000, &key("x/a", "y/b", 1), bytes(1));
        assert!(
            matches!(a.buckets[0].1, Bucket::Frozen(_)),
            "two newer buckets: the first is frozen"
        );
        assert!(matches!(a.buckets[1].1, Bucket::Open(_)));
        a.add(1_000, &key("x/a", "y/b", 5), bytes(10));
        a.add(1_000, &key("x/a", "y/b", 7), bytes(3));
        let first: Vec<(u16, u64)> = a
            .query(0, true, |_| true)
            .iter()
            .filter(|x| x.start_ms == 0)
            .map(|x| (x.key.port, x.value.forward.bytes))
            .collect();
        assert_eq!(first, vec![(1, 1), (5, 11), (7, 3), (9, 1)]);
    }

    #[test]
    fn keys_beyond_the_budget_are_summed_apart_not_dropped() {
        let mut a = Aggregates::new(15_000, 4, 2);
        for port in 1..=5 {
            a.add(0, &key("x/a", "y/b", port), bytes(10));
        }
        let all = a.query(0, false, |_| true);
        assert_eq!(all.len(), 3);
        let other = all.iter().find(|x| &*x.key.src == OVERFLOW_GROUP).unwrap();
        assert_eq!((other.value.flows, other.value.forward.bytes), (3, 30));
        assert_eq!(a.overflowed, 3);
        assert_eq!(a.entries(), 3);
    }
}
