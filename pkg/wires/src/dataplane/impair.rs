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
use tokio::sync::mpsc;
use tokio::time::Instant;
use weft_kernel::packet;
use weft_link::Impairment;
use weft_rpc::wire::Frame;

use super::outbox::Outbox;

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

/// The decisions' state: the random generator and when the rate lets the next frame go.
struct Pacing {
    rng: u64,
    next_free: Instant,
    seq: u64,
}

impl Pacing {
    /// xorshift64*: emulation needs cheap, uniform draws, not cryptographic ones.
    fn next(&mut self) -> u64 {
        let mut x = self.rng;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// True with probability `ppm` parts per million.
    fn hit(&mut self, ppm: Option<u32>) -> bool {
        ppm.is_some_and(|p| p > 0 && (self.next() % 1_000_000) < u64::from(p))
    }
}

/// One end's emulation: decides each frame's fate and holds delayed frames.
pub(super) struct Impairer {
    imp: Impairment,
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
    /// Emulation `imp` for end `id`, whose frames go to `sink`; the task holding
    /// delayed frames runs on `rt`.
    pub(super) fn new(imp: Impairment, id: u64, sink: Arc<dyn Sink>, rt: &tokio::runtime::Handle) -> Arc<Self> {
        let (tx, rx) = mpsc::channel(LIMIT);
        let releaser = rt.spawn(release(rx, id, sink));
        let seed = id
            ^ std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64);
        Arc::new(Impairer {
            imp,
            pacing: Mutex::new(Pacing {
                rng: seed | 1,
                next_free: Instant::now(),
                seq: 0,
            }),
            held: tx,
            releaser,
        })
    }

    /// Applies the emulation to `burst`: what may go now stays in it (in order), what
    /// is delayed is handed to the holding task, what is lost is gone.
    pub(super) fn apply(&self, burst: &mut Vec<Frame>) {
        let imp = &self.imp;
        let now = Instant::now();
        let mut now_frames = Vec::with_capacity(burst.len());
        let mut p = self.pacing.lock().expect("pacing lock");
        for mut f in burst.drain(..) {
            if p.hit(imp.loss_ppm) {
                continue;
            }
            if p.hit(imp.corrupt_ppm) {
                f.data = corrupt(&f.data, p.next());
            }
            let copies = if p.hit(imp.duplicate_ppm) { 2 } else { 1 };
            // Pacing: the frame leaves once the ones before it have, at the rate.
            let mut at = now;
            if let Some(bps) = imp.rate_bps {
                let bytes = f.data.len().saturating_sub(packet::VNET_HDR_LEN) as u64;
                let tx = Duration::from_nanos(bytes * 8 * 1_000_000_000 / bps.max(1));
                let start = p.next_free.max(now);
                p.next_free = start + tx;
                at = p.next_free;
            }
            let reordered = p.hit(imp.reorder_ppm);
            if !reordered && let Some(d) = imp.delay_us.filter(|d| *d > 0) {
                let jitter = imp.jitter_us.unwrap_or(0) as i64;
                let j = if jitter > 0 {
                    (p.next() % (2 * jitter as u64 + 1)) as i64 - jitter
                } else {
                    0
                };
                at += Duration::from_micros((d as i64 + j).max(0) as u64);
            }
            for _ in 0..copies {
                let frame = f.clone();
                if at <= now {
                    now_frames.push(frame);
                } else {
                    p.seq += 1;
                    // A full hold is a full queue: the frame is lost.
                    let _ = self.held.try_send(Held { at, seq: p.seq, frame });
                }
            }
        }
        *burst = now_frames;
    }
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
    fn draws_hit_at_their_rate_and_corruption_spares_the_headers() {
        let mut p = Pacing {
            rng: 42,
            next_free: Instant::now(),
            seq: 0,
        };
        let hits = (0..100_000).filter(|_| p.hit(Some(100_000))).count();
        assert!((9_000..11_000).contains(&hits), "{hits}");
        assert!(!(0..1000).any(|_| p.hit(None) || p.hit(Some(0))));
        let data = Bytes::from(vec![0u8; 100]);
        for draw in 0..64 {
            let c = corrupt(&data, p.next() ^ draw);
            let diff: Vec<usize> = (0..100).filter(|i| c[*i] != 0).collect();
            assert_eq!(diff.len(), 1);
            assert!(diff[0] >= packet::VNET_HDR_LEN + ETH_HEADER);
        }
    }
}
