//! The tracker: turns conntrack entries (events and dumps) and denied packets into flow
//! records, keeps the open ones, the ring of ended ones and the aggregates, and counts
//! what it read and what was lost.
//!
//! Which node reports a flow: the source pod's node, or, for a flow into a pod from
//! outside or from a node, the destination pod's. A flow between pods of two nodes is
//! in both nodes' tables; only the source's reports it, so a cluster-wide listing counts
//! it once. The destination's deny of such a flow is the one exception the source cannot
//! see as a refusal: it sees a connection that never got an answer, and policy (the same
//! evaluation `weftctl policy explain` gives) names it denied.

use std::collections::{HashMap, HashSet, VecDeque};
use std::net::IpAddr;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use weft_kernel::conntrack::{CtEntry, CtEventKind, CtTuple, TcpState};

use crate::aggregate::{AggKey, AggValue, Aggregates};
use crate::intern::Interner;
use crate::record::{
    Counters, Decision, EndReason, FlowKind, FlowRecord, Peer, PeerKind, PolicyHit, PolicySide, Staged, Verdict,
};

/// The cluster as the tracker asks it: who an address is and what policy says of a new
/// flow. The node answers from its policy engine's view (the same one `policy explain`
/// evaluates); tests answer from a table.
pub trait Resolve {
    /// The end at `ip` (port 0: the tracker sets it).
    fn peer(&self, ip: IpAddr) -> Peer;
    /// Policy's judgement of a new flow from `src` to `dst`, of IP protocol
    /// `protocol` to port `port` (0 without ports).
    fn decide(&self, src: IpAddr, dst: IpAddr, protocol: u8, port: u16) -> Decision;
}

/// How the tracker is sized.
#[derive(Debug, Clone)]
pub struct Config {
    /// The reporting node's name.
    pub node: String,
    /// Ended flows kept for listing; the oldest go first.
    pub ring: usize,
    /// The aggregates' bucket length (ms).
    pub bucket_ms: i64,
    /// How many buckets are kept (with 15 s buckets, 240 is an hour).
    pub buckets: usize,
    /// Keys per bucket at most; more are summed under one "(other)" key.
    pub keys_per_bucket: usize,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            node: String::new(),
            ring: DEFAULT_RING,
            bucket_ms: 15_000,
            buckets: 240,
            keys_per_bucket: 4096,
        }
    }
}

/// The ring's default size: about 700 bytes a record, some 11 MiB.
pub const DEFAULT_RING: usize = 16_384;

/// A span of time whose flows may be missing, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Gap {
    /// From (Unix ms).
    pub from_ms: i64,
    /// To (Unix ms).
    pub to_ms: i64,
    /// Why: `start` (the daemon was not running: flows that began and ended before it
    /// started are not known), `overflow` (kernel events were dropped: ends seen only as
    /// `lost`, flows that began and ended inside it not at all).
    pub reason: String,
}

/// What the tracker read and kept.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stats {
    /// Conntrack entries applied (events and dumped entries).
    pub entries: u64,
    /// Messages that could not be decoded.
    pub undecodable: u64,
    /// Times the kernel dropped events (`ENOBUFS`).
    pub overflows: u64,
    /// Flows whose end was lost with dropped events (ended as `lost`), and flows
    /// first seen in a recovery dump: what the dropped events would have said.
    pub lost_events: u64,
    /// Denied packets read.
    pub denies: u64,
    /// Entries that are not a pod's flow this node reports (the node's own traffic,
    /// the far side of another node's flow).
    pub not_reported: u64,
    /// Flows that ended.
    pub ended: u64,
    /// Flows open now.
    pub open: u64,
    /// Ended flows in the ring now.
    pub kept: u64,
    /// Aggregate entries held.
    pub aggregates: u64,
    /// Spans whose flows may be missing, newest last (at most 16).
    pub gaps: Vec<Gap>,
}

/// A conntrack entry's identity: its id is unique only among live entries, so the
/// tuple goes with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Key {
    id: u32,
    original: CtTuple,
}

impl Key {
    fn of(e: &CtEntry) -> Self {
        Key {
            id: e.id,
            original: e.original,
        }
    }
}

struct Open {
    record: FlowRecord,
    /// What was added to the aggregates so far.
    counted: (Counters, Counters),
    agg: AggKey,
    /// Its FIN or RST is seen and its end not yet announced: it waits for counters
    /// (conntrack's update events carry none; the next dump or its destruction does).
    closing: bool,
    /// Its end was announced at its FIN or RST.
    end_announced: bool,
}

/// A denied packet as the policy engine read it.
#[derive(Debug, Clone)]
pub struct DeniedPacket {
    /// When (Unix ms).
    pub at_ms: i64,
    /// Its source address.
    pub src: IpAddr,
    /// Its destination address.
    pub dst: IpAddr,
    /// IP protocol.
    pub protocol: u8,
    /// Destination port (0 without one).
    pub port: u16,
    /// Source port (0 without one).
    pub src_port: u16,
    /// The side whose policy dropped it.
    pub side: PolicySide,
    /// Only audited (forwarded): conntrack reports those, not the deny log.
    pub audit: bool,
}

/// The flows of one node.
pub struct Tracker {
    node: Arc<str>,
    ring_cap: usize,
    open: HashMap<Key, Open>,
    ignored: HashSet<Key>,
    /// Open flows missing from the last periodic dump: ended as lost when missing from
    /// the next too.
    absent: HashSet<Key>,
    ring: VecDeque<FlowRecord>,
    aggregates: Aggregates,
    next_id: u64,
    stats: Stats,
    outbox: Vec<FlowRecord>,
    names: Interner,
    last_prune_ms: i64,
    growth: Growth,
    /// Flows [`Open::closing`].
    closing: usize,
}

/// Bytes flows moved since the last [`Tracker::take_growth`], by verdict, kind and the
/// namespace and workload (`Kind/name`, empty for a pod no controller owns) of the pod
/// the flow is reported for.
pub type Growth = HashMap<(Verdict, FlowKind, Arc<str>, Arc<str>), u64>;

impl Tracker {
    /// An empty tracker.
    pub fn new(cfg: Config) -> Self {
        Tracker {
            node: cfg.node.into(),
            ring_cap: cfg.ring.max(1),
            open: HashMap::new(),
            ignored: HashSet::new(),
            absent: HashSet::new(),
            ring: VecDeque::new(),
            aggregates: Aggregates::new(cfg.bucket_ms, cfg.buckets, cfg.keys_per_bucket),
            next_id: 1,
            stats: Stats::default(),
            outbox: Vec::new(),
            names: Interner::default(),
            last_prune_ms: 0,
            growth: Growth::new(),
            closing: 0,
        }
    }

    /// How many flows have closed (FIN or RST) and wait for a dump to read their
    /// counters before their end is announced: the node dumps soon when there are any.
    pub fn closing(&self) -> usize {
        self.closing
    }

    /// Reads the counters of the flows that closed from `dump` and announces their
    /// ends; nothing else is taken from it (the periodic [`Tracker::reconcile`] does the
    /// rest).
    pub fn read_closing(&mut self, dump: &[CtEntry], r: &dyn Resolve, now_ms: i64) {
        for e in dump {
            if self.closing == 0 {
                return;
            }
            if self.open.get(&Key::of(e)).is_some_and(|o| o.closing) {
                self.apply(e, r, now_ms);
            }
        }
    }

    /// Says that flows of `from_ms..to_ms` may be missing, and why.
    pub fn gap(&mut self, from_ms: i64, to_ms: i64, reason: &str) {
        self.stats.gaps.push(Gap {
            from_ms,
            to_ms,
            reason: reason.into(),
        });
        if self.stats.gaps.len() > 16 {
            self.stats.gaps.remove(0);
        }
    }

    /// Counts messages that did not decode.
    pub fn undecodable(&mut self, n: u64) {
        self.stats.undecodable += n;
    }

    /// Counts an overflow of the kernel's event buffer (the caller drains and
    /// dumps, then calls [`Tracker::reconcile`] with `after_loss`).
    pub fn overflowed(&mut self) {
        self.stats.overflows += 1;
    }

    /// A decision's staged part as records hold it.
    fn staged(&mut self, staged: Option<(Verdict, Vec<PolicyHit>)>) -> Option<Box<Staged>> {
        staged.map(|(verdict, hits)| {
            Box::new(Staged {
                verdict,
                policies: self.names.hits(hits),
            })
        })
    }

    /// The ends of a new entry as the cluster names them, and whether this node reports
    /// it. A translated destination (a Service's DNAT) is the address that answered.
    fn resolve_new(&mut self, e: &CtEntry, r: &dyn Resolve, now_ms: i64) -> Option<Open> {
        let Named {
            src,
            dst,
            kind,
            real_dst,
            dport,
        } = self.name(e, r)?;
        let o = &e.original;
        let (verdict, decision) = judge(e, r, real_dst, dport);
        let start_ms = e.start_ns.map_or(now_ms, |ns| (ns / 1_000_000) as i64);
        let record = FlowRecord {
            id: self.next_id,
            node: self.node.clone(),
            start_ms,
            end_ms: None,
            updated_ms: now_ms,
            dialled: (real_dst != o.dst).then_some(o.dst),
            protocol: o.protocol,
            icmp: o.icmp.map(|i| (i.kind, i.code)),
            kind,
            verdict,
            policies: self.names.hits(decision.policies),
            staged: self.staged(decision.staged),
            forward: Counters::default(),
            reverse: Counters::default(),
            end: EndReason::Open,
            src,
            dst,
        };
        self.next_id += 1;
        let agg = agg_key(&record, &mut self.names);
        Some(Open {
            record,
            counted: (Counters::default(), Counters::default()),
            agg,
            closing: false,
            end_announced: false,
        })
    }

    /// The ends of entry `e` as the cluster names them now and the flow's kind; `None`
    /// when this node does not report it.
    fn name(&mut self, e: &CtEntry, r: &dyn Resolve) -> Option<Named> {
        let o = &e.original;
        let real_dst = e.reply.src;
        let dport = if real_dst == o.dst {
            o.dst_port
        } else {
            e.reply.src_port
        };
        let mut src = r.peer(o.src);
        src.port = o.src_port;
        let mut dst = r.peer(real_dst);
        dst.port = dport;
        let kind = FlowKind::of(&src, &dst)?;
        let here = |p: &Peer| p.kind == PeerKind::Pod && *p.node == *self.node;
        let reports = here(&src) || (here(&dst) && src.kind != PeerKind::Pod);
        if !reports {
            return None;
        }
        self.names.peer(&mut src);
        self.names.peer(&mut dst);
        Some(Named {
            src,
            dst,
            kind,
            real_dst,
            dport,
        })
    }

    /// Names again an end of open flow `key` that was outside the cluster when the flow
    /// began, once the view has it: a pod the node learnt of after its first packet (the
    /// other node's announcement or the API's watch came late) would otherwise stay an
    /// unnamed address for the flow's life. Its kind and policy's judgement follow; its
    /// bytes from here on go to the aggregate of its new name (the flow itself stays
    /// counted once, where it began). Not when the new names would make it another
    /// node's to report.
    fn name_late(&mut self, key: &Key, e: &CtEntry, r: &dyn Resolve, now_ms: i64) {
        let Some(open) = self.open.get(key) else { return };
        // Cheap before naming: only an outside end the view knows now changes anything,
        // and an end already named is not looked up again.
        let learnt = |p: &Peer| p.kind == PeerKind::Outside && r.peer(p.ip).kind != PeerKind::Outside;
        if !learnt(&open.record.src) && !learnt(&open.record.dst) {
            return;
        }
        let Some(named) = self.name(e, r) else { return };
        let (verdict, decision) = judge(e, r, named.real_dst, named.dport);
        let policies = self.names.hits(decision.policies);
        let staged = self.staged(decision.staged);
        let Some(open) = self.open.get_mut(key) else { return };
        let rec = &mut open.record;
        rec.src = named.src;
        rec.dst = named.dst;
        rec.kind = named.kind;
        // A deny the record already holds stands: it was this node's own refusal.
        if rec.verdict != Verdict::Denied {
            rec.verdict = verdict;
        }
        rec.policies = policies;
        rec.staged = staged;
        rec.updated_ms = now_ms;
        let rec = rec.clone();
        open.agg = agg_key(&rec, &mut self.names);
        self.outbox.push(rec);
    }

    /// Applies one conntrack entry (an event or a dumped entry) at `now_ms`.
    pub fn apply(&mut self, e: &CtEntry, r: &dyn Resolve, now_ms: i64) {
        self.stats.entries += 1;
        let key = Key::of(e);
        match e.kind {
            CtEventKind::New | CtEventKind::Update | CtEventKind::Dumped => {
                if self.ignored.contains(&key) {
                    return;
                }
                if !self.open.contains_key(&key) {
                    let Some(mut open) = self.resolve_new(e, r, now_ms) else {
                        self.stats.not_reported += 1;
                        self.ignored.insert(key);
                        return;
                    };
                    self.aggregates.add(
                        open.record.start_ms.max(now_ms - self.aggregates.bucket_ms()),
                        &open.agg,
                        AggValue {
                            flows: 1,
                            ..AggValue::default()
                        },
                    );
                    open.record.updated_ms = now_ms;
                    self.outbox.push(open.record.clone());
                    self.open.insert(key, open);
                } else {
                    self.name_late(&key, e, r, now_ms);
                }
                let Some(open) = self.open.get_mut(&key) else { return };
                if let Some(state) = e.tcp_state
                    && open.record.end_ms.is_none()
                {
                    let end = match state {
                        TcpState::TimeWait => Some(EndReason::Fin),
                        TcpState::Close => Some(EndReason::Rst),
                        _ => None,
                    };
                    if let Some(end) = end {
                        open.record.end = end;
                        open.record.end_ms = Some(now_ms);
                        open.closing = true;
                        self.closing += 1;
                    }
                }
                if let (Some(f), Some(b)) = (counters(e.original_counters), counters(e.reply_counters)) {
                    refresh(&mut self.aggregates, &mut self.growth, open, f, b, now_ms);
                    if open.closing {
                        // Announced as ended once its counters are read, not when its
                        // entry goes (TIME_WAIT keeps it two minutes): exports and
                        // followers have it at the FIN.
                        open.closing = false;
                        open.end_announced = true;
                        self.closing -= 1;
                        open.record.updated_ms = now_ms;
                        self.outbox.push(open.record.clone());
                    }
                }
            }
            CtEventKind::Destroy => {
                self.absent.remove(&key);
                if self.ignored.remove(&key) {
                    return;
                }
                let open = match self.open.remove(&key) {
                    Some(o) => o,
                    None => match self.resolve_new(e, r, now_ms) {
                        // Began before this tracker (or in a loss) and ended now.
                        Some(o) => {
                            let v = AggValue {
                                flows: 1,
                                ..AggValue::default()
                            };
                            self.aggregates.add(now_ms, &o.agg, v);
                            o
                        }
                        None => {
                            self.stats.not_reported += 1;
                            return;
                        }
                    },
                };
                let stop_ms = e.stop_ns.map(|ns| (ns / 1_000_000) as i64);
                self.finish(
                    open,
                    counters(e.original_counters),
                    counters(e.reply_counters),
                    stop_ms,
                    EndReason::Timeout,
                    now_ms,
                );
            }
        }
    }

    /// Ends `open`: its last counters, its end time, and `otherwise` as its end
    /// reason unless a FIN or RST already gave one.
    fn finish(
        &mut self,
        mut open: Open,
        forward: Option<Counters>,
        reverse: Option<Counters>,
        stop_ms: Option<i64>,
        otherwise: EndReason,
        now_ms: i64,
    ) {
        if let (Some(f), Some(b)) = (forward, reverse) {
            refresh(&mut self.aggregates, &mut self.growth, &mut open, f, b, now_ms);
        }
        if open.closing {
            self.closing -= 1;
        }
        let rec = &mut open.record;
        if rec.end_ms.is_none() || otherwise == EndReason::Lost && rec.end == EndReason::Open {
            rec.end = otherwise;
        }
        if rec.end_ms.is_none() {
            rec.end_ms = Some(stop_ms.unwrap_or(now_ms));
        }
        rec.updated_ms = now_ms;
        self.stats.ended += 1;
        // Announced at its FIN or RST already (see `apply`): kept, not announced again.
        self.keep(open.record, !open.end_announced);
    }

    fn keep(&mut self, record: FlowRecord, announce: bool) {
        if announce {
            self.outbox.push(record.clone());
        }
        if self.ring.len() >= self.ring_cap {
            self.ring.pop_front();
        }
        self.ring.push_back(record);
    }

    /// Records a denied packet. Audited packets and ingress denies of a flow from
    /// another node's pod are left to conntrack and to that node (see the module's
    /// doc); the deny log has already limited the rate per flow.
    pub fn denied(&mut self, d: &DeniedPacket, r: &dyn Resolve) {
        self.stats.denies += 1;
        if d.audit {
            return;
        }
        let mut src = r.peer(d.src);
        src.port = d.src_port;
        let mut dst = r.peer(d.dst);
        dst.port = d.port;
        if d.side == PolicySide::Ingress && src.kind == PeerKind::Pod && *src.node != *self.node {
            return;
        }
        let Some(kind) = FlowKind::of(&src, &dst) else { return };
        self.names.peer(&mut src);
        self.names.peer(&mut dst);
        let decision = r.decide(d.src, d.dst, d.protocol, d.port);
        let record = FlowRecord {
            id: self.next_id,
            node: self.node.clone(),
            start_ms: d.at_ms,
            end_ms: Some(d.at_ms),
            updated_ms: d.at_ms,
            src,
            dst,
            dialled: None,
            protocol: d.protocol,
            icmp: None,
            kind,
            verdict: Verdict::Denied,
            policies: self.names.hits(decision.policies),
            staged: self.staged(decision.staged),
            forward: Counters { packets: 1, bytes: 0 },
            reverse: Counters::default(),
            end: EndReason::Denied,
        };
        self.next_id += 1;
        let v = AggValue {
            flows: 1,
            forward: record.forward,
            reverse: Counters::default(),
        };
        let key = agg_key(&record, &mut self.names);
        self.aggregates.add(d.at_ms, &key, v);
        self.stats.ended += 1;
        self.keep(record, true);
    }

    /// Applies a full dump of the table. Open flows missing from it ended unseen:
    /// after a loss (`after_loss`: the events were drained before the dump, so nothing
    /// is still queued) at once, otherwise when missing from two dumps in a row (a
    /// destroy event may be queued behind the dump). Each such flow ends as `lost`
    /// (or by its FIN or RST, when one was seen).
    pub fn reconcile(&mut self, dump: &[CtEntry], r: &dyn Resolve, now_ms: i64, after_loss: bool) {
        let mut seen = HashSet::with_capacity(dump.len());
        for e in dump {
            let key = Key::of(e);
            let known = self.open.contains_key(&key) || self.ignored.contains(&key);
            self.apply(e, r, now_ms);
            // A flow of ours whose opening was among the dropped events.
            if after_loss && !known && self.open.contains_key(&key) {
                self.stats.lost_events += 1;
            }
            seen.insert(key);
        }
        let gone: Vec<Key> = self.open.keys().filter(|k| !seen.contains(k)).copied().collect();
        for key in gone {
            if after_loss || self.absent.contains(&key) {
                let open = self.open.remove(&key).expect("listed");
                self.absent.remove(&key);
                self.stats.lost_events += 1;
                self.finish(open, None, None, None, EndReason::Lost, now_ms);
            } else {
                self.absent.insert(key);
            }
        }
        self.absent.retain(|k| !seen.contains(k));
        self.ignored.retain(|k| seen.contains(k));
        if now_ms - self.last_prune_ms >= 10_000 {
            self.names.prune();
            self.last_prune_ms = now_ms;
        }
    }

    /// Takes the bytes flows moved since the last call (for the metrics: counted as
    /// they grow, not only when a flow ends).
    pub fn take_growth(&mut self) -> Growth {
        std::mem::take(&mut self.growth)
    }

    /// Takes the records opened or ended since the last call (for followers and
    /// export).
    pub fn take_changes(&mut self) -> Vec<FlowRecord> {
        std::mem::take(&mut self.outbox)
    }

    /// The open flows and the ended ones in the ring that `keep` wants, oldest start
    /// first, the newest `limit` (0: all).
    pub fn list(&self, keep: impl Fn(&FlowRecord) -> bool, limit: usize) -> Vec<FlowRecord> {
        let mut out: Vec<FlowRecord> = self
            .ring
            .iter()
            .chain(self.open.values().map(|o| &o.record))
            .filter(|r| keep(r))
            .cloned()
            .collect();
        out.sort_by_key(|r| (r.start_ms, r.id));
        if limit > 0 && out.len() > limit {
            out.drain(..out.len() - limit);
        }
        out
    }

    /// The aggregates.
    pub fn aggregates(&self) -> &Aggregates {
        &self.aggregates
    }

    /// The counts, with the sizes as of now.
    pub fn stats(&self) -> Stats {
        let mut s = self.stats.clone();
        s.open = self.open.len() as u64;
        s.kept = self.ring.len() as u64;
        s.aggregates = self.aggregates.entries() as u64;
        s
    }
}

/// The ends of a flow as named, its kind, the address that answered and its port.
struct Named {
    src: Peer,
    dst: Peer,
    kind: FlowKind,
    real_dst: IpAddr,
    dport: u16,
}

/// Policy's judgement of entry `e` to `real_dst` on `dport`, and the verdict the record
/// holds.
fn judge(e: &CtEntry, r: &dyn Resolve, real_dst: IpAddr, dport: u16) -> (Verdict, Decision) {
    let o = &e.original;
    let decision = r.decide(o.src, real_dst, o.protocol, dport);
    let answered = e.status & IPS_SEEN_REPLY != 0;
    let verdict = match decision.verdict {
        // The kernel here forwarded it: a deny is the far node's, and shows as a
        // connection never answered.
        Verdict::Denied if answered => Verdict::Forwarded,
        v => v,
    };
    (verdict, decision)
}

fn counters(c: Option<weft_kernel::conntrack::CtCounters>) -> Option<Counters> {
    c.map(|c| Counters {
        packets: c.packets,
        bytes: c.bytes,
    })
}

/// `IPS_SEEN_REPLY`: the entry saw a packet of the reply direction.
const IPS_SEEN_REPLY: u32 = 1 << 1;

fn agg_key(r: &FlowRecord, names: &mut Interner) -> AggKey {
    AggKey {
        src: names.str(&r.src.group()),
        dst: names.str(&r.dst.group()),
        port: r.dst.port,
        protocol: r.protocol,
        kind: r.kind,
        verdict: r.verdict,
        policy: r.policies.first().map(|h| h.name.clone()).unwrap_or_else(|| "".into()),
    }
}

/// Takes a flow's counters as read now, adding what grew to the aggregates' current
/// bucket.
fn refresh(
    aggs: &mut Aggregates,
    growth: &mut Growth,
    open: &mut Open,
    forward: Counters,
    reverse: Counters,
    now_ms: i64,
) {
    let (df, dr) = (forward.since(open.counted.0), reverse.since(open.counted.1));
    if df.bytes + dr.bytes > 0 {
        let r = &open.record;
        let pod = if r.src.kind == PeerKind::Pod { &r.src } else { &r.dst };
        let key = (r.verdict, r.kind, pod.namespace.clone(), pod.workload.clone());
        *growth.entry(key).or_default() += df.bytes + dr.bytes;
    }
    if df != Counters::default() || dr != Counters::default() {
        aggs.add(
            now_ms,
            &open.agg,
            AggValue {
                flows: 0,
                forward: df,
                reverse: dr,
            },
        );
    }
    open.counted = (forward, reverse);
    open.record.forward = forward;
    open.record.reverse = reverse;
    open.record.updated_ms = now_ms;
}

#[cfg(test)]
mod tests;
