//! One gRPC wire end: its packet socket, the task reading it, and its counters.

use std::cell::RefCell;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::BytesMut;
use tokio::io::unix::AsyncFd;
use tokio::sync::Notify;
use tracing::debug;
use weft_kernel::packet::{self, PacketSocket, READ_BATCH, READ_SLOT, ReadRoom};
use weft_rpc::wire::Frame;

use super::counters::{Counters, DropReason};
use super::impair::Impairer;
use super::outbox::Outbox;

/// Largest frame read from an end: a GSO super-frame plus its headers.
const MAX_FRAME: usize = packet::MAX_FRAME;

thread_local! {
    /// The scratch room of batched reads, one per thread: the readers of a data plane
    /// take turns on its one thread, none holding it across an await.
    static READ_ROOM: RefCell<ReadRoom> = RefCell::new(ReadRoom::new());
}

/// A reader hands what it read to the peer's queue after this many frames or bytes
/// (or when the end has nothing more): one lock and at most one wake-up per burst, not per frame.
const BURST_FRAMES: usize = 32;
const BURST_BYTES: usize = 64 * 1024;

/// A reader waiting for room in a full queue reads again after this long at most, so
/// that a stream that stalls still has the frames its end drops counted as they go.
const ROOM_WAIT: std::time::Duration = std::time::Duration::from_millis(100);

/// One gRPC wire end: the packet socket on its node end, its peer, and its counters.
pub struct PacketEnd {
    /// This end's wire id (frames for it carry this id).
    pub id: u64,
    /// The peer end's wire id (frames from here carry that id).
    pub peer_id: u64,
    /// The peer's node address.
    pub peer: IpAddr,
    sock: AsyncFd<PacketSocket>,
    counters: Arc<Counters>,
    up: AtomicBool,
    pub(super) outbox: Arc<Outbox>,
    /// Whether `impair` holds an emulation: the one load an unimpaired burst pays.
    impaired: AtomicBool,
    impair: std::sync::RwLock<Option<Arc<Impairer>>>,
    /// Notified when the peer's queue has room again after this end filled it.
    pub(super) room: Arc<Notify>,
}

impl PacketEnd {
    /// This end's series.
    pub(super) fn counters(&self) -> &Arc<Counters> {
        &self.counters
    }

    /// An end over `sock` (see [`register`]), whose frames go to `outbox`; down until
    /// [`set_up`](Self::set_up).
    pub(super) fn new(
        id: u64,
        peer_id: u64,
        peer: IpAddr,
        sock: AsyncFd<PacketSocket>,
        counters: Arc<Counters>,
        outbox: Arc<Outbox>,
    ) -> Self {
        Self {
            id,
            peer_id,
            peer,
            sock,
            counters,
            up: AtomicBool::new(false),
            outbox,
            impaired: AtomicBool::new(false),
            impair: std::sync::RwLock::new(None),
            room: Arc::new(Notify::new()),
        }
    }

    /// Writes frames that came from the peer into the pod, as few system calls as the
    /// kernel takes them in; a frame that finds no room is dropped (and counted) and
    /// the ones after it still go.
    pub(super) fn deliver(&self, frames: &[&[u8]]) {
        let sock = self.sock.get_ref();
        let mut at = 0;
        while at < frames.len() {
            match sock.write_many(&frames[at..]) {
                Ok(n) if n > 0 => {
                    self.counters.rx_frames.inc_by(n as u64);
                    let bytes: usize = frames[at..at + n]
                        .iter()
                        .map(|f| f.len().saturating_sub(packet::VNET_HDR_LEN))
                        .sum();
                    self.counters.rx_bytes.inc_by(bytes as u64);
                    at += n;
                }
                _ => {
                    self.counters.dropped(DropReason::PodBusy, 1);
                    at += 1;
                }
            }
        }
    }

    /// Marks the end up (its peer is there) or down.
    pub fn set_up(&self, up: bool) {
        self.up.store(up, Ordering::Relaxed);
        let c = &self.counters;
        c.metrics.up.get_or_create(&c.labels).set(i64::from(up));
    }

    /// Emulates a link on what the pod sends (`None`: carries frames untouched).
    pub(super) fn set_impairer(&self, i: Option<Arc<Impairer>>) {
        let on = i.is_some();
        *self.impair.write().expect("impair lock") = i;
        self.impaired.store(on, Ordering::Release);
    }

    /// Hands a burst of frames read from the pod to the peer's queue; returns whether
    /// the queue has room for more (`false`: wait for [`Self::room`] before reading on).
    fn flush(&self, burst: &mut Vec<Frame>) -> bool {
        if burst.is_empty() {
            return true;
        }
        if !self.up.load(Ordering::Relaxed) {
            self.counters.dropped(DropReason::PeerDown, burst.len() as u64);
            burst.clear();
            return true;
        }
        if self.impaired.load(Ordering::Acquire)
            && let Some(i) = self.impair.read().expect("impair lock").as_ref()
        {
            i.apply(burst);
            if burst.is_empty() {
                return true;
            }
        }
        self.outbox.offer(self.id, burst)
    }

    /// Waits until the peer's queue has room again (or [`ROOM_WAIT`] passed), then
    /// counts what the kernel dropped from the socket's full buffer meanwhile as the
    /// queue's drops: for the pod the link's queue was full either way.
    async fn wait_for_room(&self) {
        let _ = tokio::time::timeout(ROOM_WAIT, self.room.notified()).await;
        match self.sock.get_ref().take_drops() {
            Ok(n) => self.counters.dropped(DropReason::QueueFull, n),
            Err(e) => debug!(wire = self.id, error = %e, "reading the wire end's socket statistics"),
        }
    }

    /// Reads frames from the pod and queues them for the peer until the end goes away.
    /// Small frames are read [`READ_BATCH`] to a system call; while frames are
    /// super-frames, one at a time, straight into the buffer they go out of (see
    /// [`PacketSocket::read_many`] for why).
    pub(super) async fn read_loop(self: Arc<Self>) {
        let mut buf = BytesMut::with_capacity(MAX_FRAME * 4);
        let mut burst = Vec::with_capacity(BURST_FRAMES);
        let mut burst_bytes = 0;
        let mut lens = Vec::with_capacity(READ_BATCH);
        let mut batch = 1;
        let mut full = false;
        loop {
            if std::mem::take(&mut full) {
                self.wait_for_room().await;
            }
            let Ok(mut guard) = self.sock.readable().await else {
                return;
            };
            loop {
                if buf.capacity() - buf.len() < MAX_FRAME {
                    buf.reserve(MAX_FRAME * 4);
                }
                lens.clear();
                let sock = self.sock.get_ref();
                let read = if batch == 1 {
                    sock.read_buf(&mut buf).map(|n| {
                        lens.push(n);
                        usize::from(n > 0)
                    })
                } else {
                    READ_ROOM.with_borrow_mut(|room| sock.read_many(&mut buf, room, batch, &mut lens))
                };
                match read {
                    Ok(n) if n > 0 => {}
                    other => {
                        full = !self.flush(&mut burst);
                        burst_bytes = 0;
                        match other {
                            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                                guard.clear_ready();
                                break;
                            }
                            Err(e) => debug!(wire = self.id, error = %e, "wire end read ended"),
                            Ok(_) => debug!(wire = self.id, "wire end read ended: the socket closed"),
                        }
                        return;
                    }
                }
                let mut large = false;
                let mut bytes = 0;
                for &n in &lens {
                    large |= n > READ_SLOT;
                    bytes += n.saturating_sub(packet::VNET_HDR_LEN);
                    burst_bytes += n;
                    burst.push(Frame {
                        wire_id: self.peer_id,
                        data: buf.split_to(n).freeze(),
                    });
                }
                self.counters.tx_frames.inc_by(lens.len() as u64);
                self.counters.tx_bytes.inc_by(bytes as u64);
                batch = if large { 1 } else { READ_BATCH };
                if burst.len() >= BURST_FRAMES || burst_bytes >= BURST_BYTES {
                    full = !self.flush(&mut burst);
                    burst_bytes = 0;
                    if full {
                        break;
                    }
                }
            }
        }
    }
}
