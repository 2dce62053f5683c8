//! Link emulation inside a worker of weftd's (a gRPC wire end's, or a link detour's):
//! what the pod sends is lost, corrupted, duplicated, paced to a rate and delayed (with
//! jitter, or sent at once when reordered) before it joins the peer's queue or goes
//! back out of the pod's interface, as netem would on an interface. weftd carries these
//! frames itself, so it needs no qdisc for them and works on kernels built without
//! netem.
//!
//! An end without an impairment never reaches this module (one relaxed atomic load per
//! burst). Frames held for later wait in a task of their own, at most [`LIMIT`] of
//! them (netem's default limit); beyond that they are lost, as in a full netem queue.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use prometheus_client::metrics::counter::Counter;
use tokio::sync::mpsc;
use tokio::time::Instant;
use weft_kernel::packet;
use weft_link::model::{Correlated, DelayDraw, Distribution, Loss, LossModel, Prng, Prob, Slots};
use weft_rpc::wire::Frame;

use super::counters::Counters;
use super::outbox::Outbox;
use crate::metrics::WireOutcomeLabels;
use weft_link::{EmulationCounts, Impairment};

/// Where an impaired end's frames go once their time comes: the peer node's queue for
/// a gRPC end, back out of the pod's interface for a link detour.
pub(super) trait Sink: Send + Sync + 'static {
    /// Takes `frames` of end `id` (leaving the vector empty).
    fn offer(&self, id: u64, frames: &mut Vec<Frame>);
}

impl Sink for Outbox {
    fn offer(&self, id: u64, frames: &mut Vec<Frame>) {
        // An impaired end's frames come from its release task, not its reader: there
        // is no reader to hold back, the emulation's own queue bounds what waits.
        let _room = Outbox::offer(self, id, frames);
    }
}

/// Frames held for later at most (netem's default `limit`).
pub(super) const LIMIT: usize = 1000;

/// Ethernet header bytes after the virtio-net header, left intact by corruption so
/// the frame still reaches the pod (as netem corrupts payload, not the link header).
const ETH_HEADER: usize = 14;

/// A frame held until `at`; `seq` keeps frames of the same instant in order.
struct Held {
    at: Instant,
    seq: u64,
    frame: Frame,
}

impl PartialEq for Held {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl Eq for Held {}
impl PartialOrd for Held {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Held {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(o.at, o.seq))
    }
}

/// The decisions' state: the seeded generator, each model's state between frames, and
/// when the rate lets the next frame go.
struct Pacing {
    rng: Prng,
    loss: Option<Loss>,
    corrupt: Correlated,
    duplicate: Correlated,
    reorder: Correlated,
    delay: Option<DelayDraw>,
    slots: Option<Slots>,
    /// The slots' clock starts here (they count microseconds).
    epoch: Instant,
    next_free: Instant,
    seq: u64,
}

impl Pacing {
    fn new(imp: &Impairment, seed: u64) -> Self {
        let ppm = |v: Option<u32>| Prob::from_ppm(v.unwrap_or(0));
        let loss = match (imp.loss_model, imp.loss_ppm) {
            (Some(m), _) => Some(Loss::new(m.model())),
            (None, Some(p)) if p > 0 => Some(Loss::new(LossModel::Random {
                p: Prob::from_ppm(p),
                corr: ppm(imp.loss_corr_ppm),
            })),
            (None, _) => None,
        };
        let delay = imp.delay_us.filter(|d| *d > 0).map(|d| {
            DelayDraw::new(
                d,
                imp.jitter_us.unwrap_or(0),
                imp.distribution.unwrap_or(Distribution::Uniform),
                ppm(imp.jitter_corr_ppm),
            )
        });
        let now = Instant::now();
        Pacing {
            rng: Prng::new(seed),
            loss,
            corrupt: Correlated::new(ppm(imp.corrupt_corr_ppm)),
            duplicate: Correlated::new(ppm(imp.duplicate_corr_ppm)),
            reorder: Correlated::new(ppm(imp.reorder_corr_ppm)),
            delay,
            slots: imp.slot.map(Slots::new),
            epoch: now,
            next_free: now,
            seq: 0,
        }
    }

    /// A 64-bit draw (corruption picks a byte and a bit with it).
    fn draw(&mut self) -> u64 {
        (u64::from(self.rng.next_u32()) << 32) | u64::from(self.rng.next_u32())
    }
}

/// What an end's emulation did, as its `weft_wire_emulation_total` series (looked up
/// once; the same series whenever the end's emulation is replaced, so the counts go
/// on across changes and detours).
pub(super) struct Emulation {
    lost: Counter,
    overflow: Counter,
    ecn_marked: Counter,
    corrupted: Counter,
    duplicated: Counter,
    reordered: Counter,
}

impl Emulation {
    /// The series of the end whose other series `c` holds.
    pub(super) fn new(c: &Counters) -> Arc<Self> {
        let get = |outcome| {
            c.metrics
                .emulation
                .get_or_create(&WireOutcomeLabels {
                    wire: c.labels.clone(),
                    outcome,
                })
                .clone()
        };
        Arc::new(Emulation {
            lost: get("lost"),
            overflow: get("overflow"),
            ecn_marked: get("ecn_marked"),
            corrupted: get("corrupted"),
            duplicated: get("duplicated"),
            reordered: get("reordered"),
        })
    }

    /// The counts so far.
    pub(super) fn counts(&self) -> EmulationCounts {
        EmulationCounts {
            lost: self.lost.get(),
            overflow: self.overflow.get(),
            ecn_marked: self.ecn_marked.get(),
            corrupted: self.corrupted.get(),
            duplicated: self.duplicated.get(),
            reordered: self.reordered.get(),
        }
    }
}

/// One end's emulation: decides each frame's fate and holds delayed frames.
pub(super) struct Impairer {
    imp: Impairment,
    counts: Arc<Emulation>,
    pacing: Mutex<Pacing>,
    held: mpsc::Sender<Held>,
    releaser: tokio::task::JoinHandle<()>,
}

impl Drop for Impairer {
    fn drop(&mut self) {
        self.releaser.abort();
    }
}

impl Impairer {
    /// Emulation `imp` for end `id`, whose frames go to `sink`, counting into
    /// `counts`; the task holding delayed frames runs on `rt`.
    pub(super) fn new(
        imp: Impairment,
        id: u64,
        sink: Arc<dyn Sink>,
        counts: Arc<Emulation>,
        rt: &tokio::runtime::Handle,
    ) -> Arc<Self> {
        let (tx, rx) = mpsc::channel(LIMIT);
        let releaser = rt.spawn(release(rx, id, sink));
        let seed = id
            ^ std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64);
        Arc::new(Impairer {
            pacing: Mutex::new(Pacing::new(&imp, seed)),
            imp,
            counts,
            held: tx,
            releaser,
        })
    }

    /// Applies the emulation to `burst`: what may go now stays in it (in order), what
    /// is delayed is handed to the holding task, what is lost is gone.
    pub(super) fn apply(&self, burst: &mut Vec<Frame>) {
        let (imp, n) = (&self.imp, &*self.counts);
        let now = Instant::now();
        let mut now_frames = Vec::with_capacity(burst.len());
        let mut p = self.pacing.lock().expect("pacing lock");
        let p = &mut *p;
        for mut f in burst.drain(..) {
            if p.loss.as_mut().is_some_and(|l| l.lost(&mut p.rng)) {
                // With `ecn`, an ECN-capable frame is marked instead of lost.
                match imp.ecn.then(|| mark_ce(&f.data)).flatten() {
                    Some(marked) => {
                        f.data = marked;
                        n.ecn_marked.inc();
                    }
                    None => {
                        n.lost.inc();
                        continue;
                    }
                }
            }
            if p.corrupt.hit(Prob::from_ppm(imp.corrupt_ppm.unwrap_or(0)), &mut p.rng) {
                f.data = corrupt(&f.data, p.draw());
                n.corrupted.inc();
            }
            let copies = if p
                .duplicate
                .hit(Prob::from_ppm(imp.duplicate_ppm.unwrap_or(0)), &mut p.rng)
            {
                n.duplicated.inc();
                2
            } else {
                1
            };
            // Pacing: the frame leaves once the ones before it have, at the rate.
            let mut at = now;
            let bytes = f.data.len().saturating_sub(packet::VNET_HDR_LEN) as u64;
            if let Some(bps) = imp.rate_bps {
                let tx = Duration::from_nanos(bytes * 8 * 1_000_000_000 / bps.max(1));
                let start = p.next_free.max(now);
                p.next_free = start + tx;
                at = p.next_free;
            }
            let reordered = p.reorder.hit(Prob::from_ppm(imp.reorder_ppm.unwrap_or(0)), &mut p.rng);
            if reordered {
                n.reordered.inc();
            }
            if !reordered && let Some(d) = p.delay.as_mut() {
                at += Duration::from_micros(d.next(&mut p.rng));
            }
            if let Some(slots) = p.slots.as_mut() {
                let ready = at.saturating_duration_since(p.epoch).as_micros() as u64;
                at = p.epoch + Duration::from_micros(slots.release(ready, bytes, &mut p.rng));
            }
            for _ in 0..copies {
                let frame = f.clone();
                if at <= now {
                    now_frames.push(frame);
                } else {
                    p.seq += 1;
                    // A full hold is a full queue: the frame is lost.
                    if self.held.try_send(Held { at, seq: p.seq, frame }).is_err() {
                        n.overflow.inc();
                    }
                }
            }
        }
        *burst = now_frames;
    }
}

/// A copy of `data` with its IP header's ECN field set to Congestion Experienced, if
/// the frame is IPv4 or IPv6 and ECN-capable (ECT(0) or ECT(1)); `None` otherwise
/// (the frame is then lost, as netem's `ecn` does).
fn mark_ce(data: &Bytes) -> Option<Bytes> {
    let eth = packet::VNET_HDR_LEN;
    let ip = eth + ETH_HEADER;
    let ethertype = u16::from_be_bytes([*data.get(eth + 12)?, *data.get(eth + 13)?]);
    let mut b = BytesMut::from(&data[..]);
    match ethertype {
        0x0800 => {
            let tos = *b.get(ip + 1)?;
            if tos & 3 == 0 || b.len() < ip + 20 {
                return None;
            }
            if tos & 3 != 3 {
                // RFC 1624's incremental checksum: HC' = ~(~HC + ~m + m').
                let old = u16::from_be_bytes([b[ip], tos]);
                let new = u16::from_be_bytes([b[ip], tos | 3]);
                let hc = u16::from_be_bytes([b[ip + 10], b[ip + 11]]);
                let mut sum = u32::from(!hc) + u32::from(!old) + u32::from(new);
                while sum > 0xffff {
                    sum = (sum & 0xffff) + (sum >> 16);
                }
                b[ip + 1] = tos | 3;
                b[ip + 10..ip + 12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
            }
        }
        0x86dd => {
            let byte = *b.get(ip + 1)?;
            if (byte >> 4) & 3 == 0 {
                return None;
            }
            b[ip + 1] = byte | 0x30;
        }
        _ => return None,
    }
    Some(b.freeze())
}

/// A copy of `data` with one bit flipped past the virtio-net and Ethernet headers.
fn corrupt(data: &Bytes, draw: u64) -> Bytes {
    let skip = packet::VNET_HDR_LEN + ETH_HEADER;
    if data.len() <= skip {
        return data.clone();
    }
    let mut b = BytesMut::from(&data[..]);
    let at = skip + (draw as usize >> 3) % (data.len() - skip);
    b[at] ^= 1 << (draw & 7);
    b.freeze()
}

/// Holds frames until their time, then hands them to the sink.
async fn release(mut rx: mpsc::Receiver<Held>, id: u64, sink: Arc<dyn Sink>) {
    let mut heap: BinaryHeap<Reverse<Held>> = BinaryHeap::new();
    let mut due = Vec::new();
    loop {
        let next = heap.peek().map(|h| h.0.at);
        tokio::select! {
            held = rx.recv() => match held {
                Some(h) => heap.push(Reverse(h)),
                None => return,
            },
            _ = tokio::time::sleep_until(next.unwrap_or_else(Instant::now)), if next.is_some() => {
                let now = Instant::now();
                while heap.peek().is_some_and(|h| h.0.at <= now) {
                    due.push(heap.pop().expect("peeked").0.frame);
                }
                sink.offer(id, &mut due);
                due.clear();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn corruption_spares_the_headers() {
        let mut rng = Prng::new(42);
        let data = Bytes::from(vec![0u8; 100]);
        for _ in 0..64 {
            let draw = (u64::from(rng.next_u32()) << 32) | u64::from(rng.next_u32());
            let c = corrupt(&data, draw);
            let diff: Vec<usize> = (0..100).filter(|i| c[*i] != 0).collect();
            assert_eq!(diff.len(), 1);
            assert!(diff[0] >= packet::VNET_HDR_LEN + ETH_HEADER);
        }
    }

    /// A frame: virtio-net header, Ethernet with `ethertype`, then `ip`.
    fn frame(ethertype: u16, ip: &[u8]) -> Bytes {
        let mut f = vec![0u8; packet::VNET_HDR_LEN + 12];
        f.extend_from_slice(&ethertype.to_be_bytes());
        f.extend_from_slice(ip);
        Bytes::from(f)
    }

    fn checksum(h: &[u8]) -> u16 {
        let mut sum: u32 = h.chunks(2).map(|c| u32::from(u16::from_be_bytes([c[0], c[1]]))).sum();
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        !(sum as u16)
    }

    #[test]
    fn ecn_capable_frames_are_marked_and_their_checksum_stays_right() {
        let mut v4 = [
            0x45u8, 0x02, 0, 40, 0, 0, 0x40, 0, 64, 6, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2,
        ];
        let c = checksum(&v4);
        v4[10..12].copy_from_slice(&c.to_be_bytes());
        let marked = mark_ce(&frame(0x0800, &v4)).expect("ECT(0) is marked");
        let ip = &marked[packet::VNET_HDR_LEN + ETH_HEADER..];
        assert_eq!(ip[1] & 3, 3, "CE");
        assert_eq!(checksum(&ip[..20]), 0, "the header still sums right");
        let mut not_ect = v4;
        not_ect[1] = 0;
        assert_eq!(mark_ce(&frame(0x0800, &not_ect)), None, "not ECN-capable: lost");
        let v6 = [0x60u8, 0x10, 0, 0, 0, 0, 17, 64];
        let marked = mark_ce(&frame(0x86dd, &v6)).expect("ECT(1) is marked");
        assert_eq!((marked[packet::VNET_HDR_LEN + ETH_HEADER + 1] >> 4) & 3, 3);
        assert_eq!(mark_ce(&frame(0x0806, &[0; 28])), None, "ARP is not IP");
    }

    /// The frames that get through an impairment, over 100,000 of them: the loss rate
    /// and the mean length of loss bursts the model gives (the detour's decisions,
    /// without its clock).
    #[test]
    fn the_pacing_applies_the_loss_models() {
        let through = |params: &[(&str, &str)]| {
            let imp = Impairment::from_params(params.iter().copied()).unwrap();
            let mut p = Pacing::new(&imp, 7);
            let (mut lost, mut bursts, mut in_burst) = (0usize, 0usize, false);
            for _ in 0..100_000 {
                let l = p.loss.as_mut().is_some_and(|l| l.lost(&mut p.rng));
                lost += usize::from(l);
                bursts += usize::from(l && !in_burst);
                in_burst = l;
            }
            (lost as f64 / 1e5, lost as f64 / bursts.max(1) as f64)
        };
        let (rate, burst) = through(&[("loss", "gemodel 1% 10%")]);
        assert!(
            (rate - 1.0 / 11.0).abs() < 0.01 && (burst - 10.0).abs() < 1.0,
            "{rate} {burst}"
        );
        let (rate, burst) = through(&[("loss", "2% 50%")]);
        assert!(
            (rate - 0.02).abs() < 0.004 && (burst - 1.0 / (0.5 * 0.98)).abs() < 0.2,
            "{rate} {burst}"
        );
        assert_eq!(through(&[("delay", "1ms")]), (0.0, 0.0));
    }
}
