//! What waits to go to one peer node: a bounded queue per wire end, drained
//! round-robin into batches by the frame stream itself.

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use super::counters::{Counters, DropReason};
use super::{BATCH_BYTES, BATCH_FRAMES, WIRE_QUEUE, WIRE_QUEUE_BYTES};
use crate::metrics::{PeerLabels, WireMetrics};
use futures::Stream;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use tokio::sync::Notify;
use weft_kernel::packet;
use weft_rpc::wire::{Frame, FrameBatch};

/// The frames of one wire end waiting for the stream to its peer node.
struct WireQueue {
    frames: VecDeque<Frame>,
    /// Bytes of the frames queued.
    bytes: usize,
    counters: Arc<Counters>,
    /// Where the end's reader waits for room once an offer filled the queue.
    room: Arc<Notify>,
    /// Whether the reader was told the queue is full and waits for [`Self::room`].
    waiting: bool,
}

impl WireQueue {
    fn full(&self) -> bool {
        self.frames.len() >= WIRE_QUEUE || self.bytes >= WIRE_QUEUE_BYTES - packet::MAX_FRAME
    }

    /// Wakes a waiting reader once the stream took the queue down to half.
    fn taken(&mut self) {
        if self.waiting && self.frames.len() <= WIRE_QUEUE / 2 && self.bytes <= WIRE_QUEUE_BYTES / 2 {
            self.waiting = false;
            self.room.notify_one();
        }
    }
}

/// What an [`Outbox`] guards.
#[derive(Default)]
struct OutboxState {
    /// The generation of the stream that takes batches now; none while no stream is up.
    stream: Option<u64>,
    generation: u64,
    /// Queues by local wire id.
    queues: HashMap<u64, WireQueue>,
    /// Ids of the queues holding frames, in the order they get their next turn.
    ready: VecDeque<u64>,
    /// Frames in all queues.
    queued: usize,
    /// The stream waiting for frames.
    waker: Option<Waker>,
}

/// Everything waiting to go to one peer node: a bounded queue per wire end, drained
/// round-robin into batches by the stream itself when HTTP/2 asks for the next message.
/// No task sits between the ends' readers and the stream, and batches grow by
/// themselves while the connection is busy writing the previous one.
pub(super) struct Outbox {
    state: Mutex<OutboxState>,
    batch_frames: Histogram,
    queue_depth: Gauge,
}

impl Outbox {
    pub(super) fn new(peer: IpAddr, metrics: &WireMetrics) -> Self {
        let labels = PeerLabels {
            peer_node: peer.to_string(),
        };
        Self {
            state: Mutex::default(),
            batch_frames: metrics.peer_batch_frames.get_or_create(&labels).clone(),
            queue_depth: metrics.peer_queue_depth.get_or_create(&labels).clone(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, OutboxState> {
        self.state.lock().expect("outbox lock")
    }

    /// Makes a new stream the one batches go to; a previous one ends at its next poll.
    pub(super) fn open(self: &Arc<Self>) -> OutboundBatches {
        let mut st = self.lock();
        st.generation += 1;
        let generation = st.generation;
        st.stream = Some(generation);
        let old = st.waker.take();
        drop(st);
        if let Some(w) = old {
            w.wake();
        }
        OutboundBatches {
            outbox: self.clone(),
            generation,
        }
    }

    /// The stream of `generation` ended: unless a newer one took over, nothing is sent
    /// until the next, and what waits is dropped (the peer's daemon is away) rather than
    /// held.
    pub(super) fn close(&self, generation: u64) {
        let waker = {
            let mut guard = self.lock();
            let st = &mut *guard;
            if st.stream != Some(generation) {
                return;
            }
            st.stream = None;
            for q in st.queues.values_mut() {
                q.counters.dropped(DropReason::NoStream, q.frames.len() as u64);
                q.frames.clear();
                q.bytes = 0;
                q.taken();
            }
            st.ready.clear();
            st.queued = 0;
            self.queue_depth.set(0);
            st.waker.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
    }

    /// Gives wire end `id` a (new, empty) queue; `room` is notified when a full queue
    /// has room again (see [`offer`](Self::offer)).
    pub(super) fn add(&self, id: u64, counters: Arc<Counters>, room: Arc<Notify>) {
        let mut st = self.lock();
        let st = &mut *st;
        if let Some(old) = st.queues.insert(
            id,
            WireQueue {
                frames: VecDeque::new(),
                bytes: 0,
                counters,
                room,
                waiting: false,
            },
        ) {
            st.queued -= old.frames.len();
            st.ready.retain(|q| *q != id);
        }
    }

    /// Forgets wire end `id`'s queue and what is in it.
    pub(super) fn remove(&self, id: u64) {
        let mut st = self.lock();
        if let Some(old) = st.queues.remove(&id) {
            st.queued -= old.frames.len();
            st.ready.retain(|q| *q != id);
        }
    }

    /// Queues frames of wire end `id`, dropping (and counting) what finds no stream or
    /// no room; wakes the stream if it waits. Returns whether the queue has room left:
    /// `false` means it is full, and the end's `room` (see [`add`](Self::add)) will be
    /// notified once the stream has taken it down to half. A reader that waits for that
    /// leaves what the pod sends meanwhile to its socket's buffer, where the kernel drops
    /// a flood's excess before it costs this thread a read.
    pub(super) fn offer(&self, id: u64, frames: &mut Vec<Frame>) -> bool {
        let (waker, room) = {
            let mut guard = self.lock();
            let st = &mut *guard;
            let Some(q) = st.queues.get_mut(&id) else {
                frames.clear();
                return true;
            };
            if st.stream.is_none() {
                q.counters.dropped(DropReason::NoStream, frames.len() as u64);
                frames.clear();
                return true;
            }
            let was_empty = q.frames.is_empty();
            let room = WIRE_QUEUE.saturating_sub(q.frames.len());
            let mut taken = 0;
            for f in frames.iter() {
                if taken == room || q.bytes + f.data.len() > WIRE_QUEUE_BYTES {
                    break;
                }
                q.bytes += f.data.len();
                taken += 1;
            }
            q.counters.dropped(DropReason::QueueFull, (frames.len() - taken) as u64);
            frames.truncate(taken);
            q.frames.extend(frames.drain(..));
            let room = !q.full();
            q.waiting = !room;
            if taken > 0 {
                st.queued += taken;
                if was_empty {
                    st.ready.push_back(id);
                }
            }
            (if taken > 0 { st.waker.take() } else { None }, room)
        };
        if let Some(w) = waker {
            w.wake();
        }
        room
    }
}

/// The batches for one stream to a peer node, taken from its [`Outbox`]; ends when a
/// newer stream to the same peer takes over or this one is closed.
pub struct OutboundBatches {
    outbox: Arc<Outbox>,
    /// Which of the outbox's streams this is.
    pub(super) generation: u64,
}

impl Stream for OutboundBatches {
    type Item = FrameBatch;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<FrameBatch>> {
        let mut st = self.outbox.lock();
        if st.stream != Some(self.generation) {
            return Poll::Ready(None);
        }
        if st.queued == 0 {
            if !st.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                st.waker = Some(cx.waker().clone());
            }
            return Poll::Pending;
        }
        let st = &mut *st;
        let mut frames = Vec::with_capacity(st.queued.min(BATCH_FRAMES));
        let mut bytes = 0;
        // One frame per wire per turn, so a busy wire cannot starve the others.
        while frames.len() < BATCH_FRAMES && bytes < BATCH_BYTES {
            let Some(id) = st.ready.pop_front() else { break };
            let Some(q) = st.queues.get_mut(&id) else { continue };
            let Some(f) = q.frames.pop_front() else { continue };
            q.bytes -= f.data.len();
            q.taken();
            bytes += f.data.len();
            frames.push(f);
            if !q.frames.is_empty() {
                st.ready.push_back(id);
            }
        }
        st.queued -= frames.len();
        self.outbox.queue_depth.set(st.queued as i64);
        self.outbox.batch_frames.observe(frames.len() as f64);
        Poll::Ready(Some(FrameBatch { frames }))
    }
}

#[cfg(test)]
mod tests {
    use futures::{FutureExt, StreamExt};
    use prometheus_client::metrics::counter::Counter;
    use weft_link::{LinkKind, WireEnd, WireState};

    use super::*;

    fn metrics() -> Arc<WireMetrics> {
        weft_telemetry::Metrics::new("test", "test").families::<WireMetrics>()
    }

    fn counters(metrics: &Arc<WireMetrics>, pod: &str) -> Arc<Counters> {
        let end = WireEnd {
            namespace: "default".into(),
            link_uid: 1,
            local_pod: pod.into(),
            local_intf: "e1".into(),
            peer_pod: "peer".into(),
            peer_intf: "e1".into(),
            peer_node: "192.0.2.2".into(),
            kind: LinkKind::Grpc,
            id: 1,
            peer_id: 2,
            state: WireState::Up,
            vni: None,
            netns: String::new(),
        };
        Arc::new(Counters::new(crate::convert::labels(&end), metrics.clone()))
    }

    fn frames(wire_id: u64, n: usize, len: usize) -> Vec<Frame> {
        (0..n)
            .map(|i| Frame {
                wire_id,
                data: vec![i as u8; len].into(),
            })
            .collect()
    }

    fn drops(c: &Counters, reason: DropReason) -> u64 {
        c.drops[reason as usize].get().map_or(0, Counter::get)
    }

    fn room() -> Arc<Notify> {
        Arc::new(Notify::new())
    }

    fn outbox(metrics: &Arc<WireMetrics>) -> Arc<Outbox> {
        Arc::new(Outbox::new("192.0.2.2".parse().unwrap(), metrics))
    }

    /// Without a stream frames are dropped as `no_stream`; with one they queue up to
    /// the wire's bound and the rest are dropped as `queue_full`.
    #[test]
    fn queues_are_bounded_and_drops_counted() {
        let m = metrics();
        let ob = outbox(&m);
        let c = counters(&m, "a");
        ob.add(1, c.clone(), room());
        ob.offer(1, &mut frames(11, 3, 60));
        assert_eq!(drops(&c, DropReason::NoStream), 3);
        let _stream = ob.open();
        ob.offer(1, &mut frames(11, WIRE_QUEUE + 5, 60));
        assert_eq!(drops(&c, DropReason::QueueFull), 5);
        assert_eq!(ob.lock().queued, WIRE_QUEUE);
    }

    /// An offer that fills the queue says so, and the end's `room` is notified once the
    /// stream has taken the queue down to half (not before); without a stream nothing
    /// waits, and closing the stream frees a waiting reader too.
    #[tokio::test]
    async fn a_full_queue_holds_its_reader_until_half_is_taken() {
        let m = metrics();
        let ob = outbox(&m);
        let r = room();
        ob.add(1, counters(&m, "a"), r.clone());
        assert!(
            ob.offer(1, &mut frames(11, WIRE_QUEUE + 1, 60)),
            "no stream: nothing to wait for"
        );
        let mut stream = ob.open();
        assert!(ob.offer(1, &mut frames(11, WIRE_QUEUE / 2, 60)), "room left");
        assert!(!ob.offer(1, &mut frames(11, WIRE_QUEUE / 2, 60)), "full");
        let notified = r.notified();
        tokio::pin!(notified);
        let mut taken = 0;
        while taken + BATCH_FRAMES < WIRE_QUEUE / 2 {
            taken += stream.next().await.unwrap().frames.len();
            assert!(
                notified.as_mut().now_or_never().is_none(),
                "{taken} taken: still waiting"
            );
        }
        while taken < WIRE_QUEUE / 2 {
            taken += stream.next().await.unwrap().frames.len();
        }
        assert!(
            notified.as_mut().now_or_never().is_some(),
            "half taken: the reader goes on"
        );

        assert!(!ob.offer(1, &mut frames(11, WIRE_QUEUE, 60)));
        let notified = r.notified();
        ob.close(stream.generation);
        assert!(notified.now_or_never().is_some(), "a closed stream frees the reader");
    }

    /// Large frames are bounded by bytes before the frame count is reached, and the
    /// room comes back as the stream takes them.
    #[tokio::test]
    async fn queues_are_bounded_in_bytes() {
        let m = metrics();
        let ob = outbox(&m);
        let c = counters(&m, "a");
        ob.add(1, c.clone(), room());
        let mut stream = ob.open();
        let fit = WIRE_QUEUE_BYTES / 65_546;
        assert!(fit < WIRE_QUEUE, "the byte bound is the tighter one for GSO frames");
        ob.offer(1, &mut frames(11, fit + 3, 65_546));
        assert_eq!(drops(&c, DropReason::QueueFull), 3);
        assert_eq!(ob.lock().queued, fit);
        let sent = stream.next().await.unwrap().frames.len();
        ob.offer(1, &mut frames(11, sent + 1, 65_546));
        assert_eq!(drops(&c, DropReason::QueueFull), 4, "room for what was sent, no more");
        assert_eq!(ob.lock().queues[&1].bytes, fit * 65_546);
    }

    /// Batches take one frame per wire in turn, keep each wire's order, and stop at
    /// the frame and byte limits.
    #[tokio::test]
    async fn batches_are_fair_and_bounded() {
        let m = metrics();
        let ob = outbox(&m);
        ob.add(1, counters(&m, "a"), room());
        ob.add(2, counters(&m, "b"), room());
        let mut stream = ob.open();
        let mut a = frames(11, 3, 10);
        a[1].data = vec![7; 10].into();
        ob.offer(1, &mut a);
        ob.offer(2, &mut frames(22, 1, 10));
        let batch = stream.next().await.unwrap();
        let order: Vec<(u64, u8)> = batch.frames.iter().map(|f| (f.wire_id, f.data[0])).collect();
        assert_eq!(order, [(11, 0), (22, 0), (11, 7), (11, 2)]);
        assert!(stream.next().now_or_never().is_none(), "nothing left: the stream waits");

        ob.offer(1, &mut frames(11, BATCH_FRAMES.min(WIRE_QUEUE) + 1, 1));
        assert_eq!(stream.next().await.unwrap().frames.len(), BATCH_FRAMES);
        assert_eq!(stream.next().await.unwrap().frames.len(), 1);

        ob.offer(1, &mut frames(11, 6, 65_546));
        let n = stream.next().await.unwrap().frames.len();
        assert_eq!(n, BATCH_BYTES.div_ceil(65_546));
        assert_eq!(stream.next().await.unwrap().frames.len(), 6 - n);
    }

    /// A newer stream takes over (the old one ends); closing the old one then changes
    /// nothing, closing the current one drops what waits as `no_stream`.
    #[tokio::test]
    async fn a_newer_stream_takes_over() {
        let m = metrics();
        let ob = outbox(&m);
        let c = counters(&m, "a");
        ob.add(1, c.clone(), room());
        let mut old = ob.open();
        let mut new = ob.open();
        assert!(old.next().await.is_none());
        ob.close(old.generation);
        ob.offer(1, &mut frames(11, 2, 10));
        assert_eq!(drops(&c, DropReason::NoStream), 0);
        ob.close(new.generation);
        assert_eq!(drops(&c, DropReason::NoStream), 2);
        assert!(new.next().await.is_none());
    }

    /// A removed wire's frames never go out, and its queue is gone for later offers.
    #[tokio::test]
    async fn a_removed_wire_sends_nothing() {
        let m = metrics();
        let ob = outbox(&m);
        ob.add(1, counters(&m, "a"), room());
        ob.add(2, counters(&m, "b"), room());
        let mut stream = ob.open();
        ob.offer(1, &mut frames(11, 2, 10));
        ob.offer(2, &mut frames(22, 1, 10));
        ob.remove(1);
        ob.offer(1, &mut frames(11, 2, 10));
        let batch = stream.next().await.unwrap();
        assert!(batch.frames.iter().all(|f| f.wire_id == 22));
        assert_eq!(batch.frames.len(), 1);
        assert_eq!(ob.lock().queued, 0);
    }
}
