//! The data plane of gRPC wires. Each wire end is a veth pair into its pod whose node
//! end is read and written through a packet socket (see `weft_kernel::packet`) by a
//! worker task that queues the frames (bounded, drops counted) for the wire's peer
//! node; per peer node, the frames of all its wires are taken round-robin into
//! `FrameBatch` messages on ONE bidirectional stream, by the stream itself whenever
//! HTTP/2 is ready for the next message (so batches grow while the connection is busy,
//! and no task or channel sits in between). Frames carry the receiving end's wire id;
//! the receiver writes each into the end of that id, and drops frames for ids it does
//! not hold, so no frame can reach another wire. The node with the lower address opens
//! the stream and reconnects with backoff; the other accepts it.

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, OwnedFd};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::BytesMut;
use futures::{Stream, StreamExt};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use tokio::io::unix::AsyncFd;
use tracing::{debug, info, warn};
use weft_kernel::packet;
use weft_rpc::wire::wire_client::WireClient;
use weft_rpc::wire::{Frame, FrameBatch};
use weft_telemetry::Metrics;
use weft_telemetry::metrics::{PeerLabels, WireDirLabels, WireDropLabels, WireLabels};

/// Frames a wire end may have queued for its peer before it drops.
pub const WIRE_QUEUE: usize = 1024;
/// Bytes a wire end may have queued for its peer before it drops: 1024 GSO super-frames
/// would be 64 MiB per wire, so the bytes are bounded too (8 MiB is some 7 ms at
/// 10 Gbit/s, more than TCP keeps queued here: the bench's TCP runs never reach it).
pub const WIRE_QUEUE_BYTES: usize = 8 << 20;
/// At most this many frames go into one batch.
pub const BATCH_FRAMES: usize = 256;
/// A batch takes no further frame once it holds this many bytes: four GSO super-frames,
/// so one batch is one HTTP/2 frame and the next is being filled while it is written.
pub const BATCH_BYTES: usize = 256 * 1024;
/// Largest HTTP/2 DATA frame either end of a frame stream accepts: a whole batch goes
/// out in one frame (one `writev`) rather than in 16 KiB pieces.
pub const H2_MAX_FRAME: u32 = 1 << 20;
/// Metadata key naming the calling node on a frame stream.
pub const NODE_HEADER: &str = "x-weft-node";
/// Largest frame read from an end: a GSO super-frame plus its headers.
const MAX_FRAME: usize = packet::MAX_FRAME;
/// A reader hands what it read to the peer's queue after this many frames or bytes
/// (or when the end has nothing more): one lock and at most one wake-up per burst, not per frame.
const BURST_FRAMES: usize = 32;
const BURST_BYTES: usize = 64 * 1024;

/// The runtime every task of the data plane runs on: one thread of its own, so that a
/// frame goes from pod to stream to socket (and back) without crossing threads. On the
/// daemon's work-stealing pool each hand-off between reader, HTTP/2 stream and
/// connection task could wake the other worker (a futex and a context switch); on one
/// thread the daemons spent some 15% less CPU per gigabyte in the two-node lab, and a
/// frame's bytes stay in one core's cache.
pub fn runtime() -> &'static tokio::runtime::Handle {
    static RUNTIME: OnceLock<tokio::runtime::Handle> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        keep_freed_memory();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("weft-wires".into())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("building the wire runtime");
                let _ = tx.send(rt.handle().clone());
                rt.block_on(std::future::pending::<()>());
            })
            .expect("starting the wire thread");
        rx.recv().expect("the wire runtime starts")
    })
}

/// Frames move through buffers of 64 KiB to 1 MiB (pod-end reads, encoded batches, HTTP/2
/// reads) that live for microseconds. glibc serves such sizes from `mmap`, or gives the
/// top of the heap back once 128 KiB-2 MiB are free, so many came back as fresh pages:
/// 30-40 thousand page faults a second in the receiving daemon at 4 Gbit/s, about a
/// fifth of its CPU in faulting, zeroing and unmapping. Serving blocks below 4 MiB from
/// the heap and trimming only past 16 MiB free keeps them warm (a gigabyte then cost
/// both daemons about a third less CPU); what a burst leaves free is bounded by the
/// trim threshold.
fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets allocator parameters; it is thread-safe.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 4 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 16 << 20);
    }
}

/// Runs `task` on the data plane's [`runtime`]; the wire server goes there too, so that
/// its connections and streams share the thread with the ends' readers.
pub fn spawn<F>(task: F) -> tokio::task::JoinHandle<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    runtime().spawn(task)
}

/// Why a wire end dropped a frame (`reason` of `weft_wire_drops_total`).
#[derive(Debug, Clone, Copy)]
enum DropReason {
    /// The wire's peer end is down.
    PeerDown,
    /// No stream to the peer node is up.
    NoStream,
    /// The wire's queue to the peer node is full.
    QueueFull,
    /// The pod's end refused the frame.
    PodBusy,
}

impl DropReason {
    fn label(self) -> &'static str {
        match self {
            Self::PeerDown => "peer_down",
            Self::NoStream => "no_stream",
            Self::QueueFull => "queue_full",
            Self::PodBusy => "pod_busy",
        }
    }
}

/// A wire end's series, looked up once: counting a frame is then two atomic adds,
/// not a label clone and hash lookup per frame. Drop series are made on first use so
/// that a wire that never dropped shows none.
struct Counters {
    labels: WireLabels,
    metrics: Arc<Metrics>,
    tx_frames: Counter,
    tx_bytes: Counter,
    rx_frames: Counter,
    rx_bytes: Counter,
    drops: [OnceLock<Counter>; 4],
}

impl Counters {
    fn new(labels: WireLabels, metrics: Arc<Metrics>) -> Self {
        let dir = |direction| WireDirLabels {
            wire: labels.clone(),
            direction,
        };
        let counter = |family: &prometheus_client::metrics::family::Family<WireDirLabels, Counter>, direction| {
            family.get_or_create(&dir(direction)).clone()
        };
        Self {
            tx_frames: counter(&metrics.wire_frames, "tx"),
            tx_bytes: counter(&metrics.wire_bytes, "tx"),
            rx_frames: counter(&metrics.wire_frames, "rx"),
            rx_bytes: counter(&metrics.wire_bytes, "rx"),
            drops: Default::default(),
            labels,
            metrics,
        }
    }

    fn dropped(&self, reason: DropReason, frames: u64) {
        if frames == 0 {
            return;
        }
        self.drops[reason as usize]
            .get_or_init(|| {
                self.metrics
                    .wire_drops
                    .get_or_create(&WireDropLabels {
                        wire: self.labels.clone(),
                        reason: reason.label(),
                    })
                    .clone()
            })
            .inc_by(frames);
    }
}

/// The frames of one wire end waiting for the stream to its peer node.
struct WireQueue {
    frames: VecDeque<Frame>,
    /// Bytes of the frames queued.
    bytes: usize,
    counters: Arc<Counters>,
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
struct Outbox {
    state: Mutex<OutboxState>,
    batch_frames: Histogram,
    queue_depth: Gauge,
}

impl Outbox {
    fn new(peer: IpAddr, metrics: &Metrics) -> Self {
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
    fn open(self: &Arc<Self>) -> OutboundBatches {
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
    fn close(&self, generation: u64) {
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

    /// Gives wire end `id` a (new, empty) queue.
    fn add(&self, id: u64, counters: Arc<Counters>) {
        let mut st = self.lock();
        let st = &mut *st;
        if let Some(old) = st.queues.insert(
            id,
            WireQueue {
                frames: VecDeque::new(),
                bytes: 0,
                counters,
            },
        ) {
            st.queued -= old.frames.len();
            st.ready.retain(|q| *q != id);
        }
    }

    /// Forgets wire end `id`'s queue and what is in it.
    fn remove(&self, id: u64) {
        let mut st = self.lock();
        if let Some(old) = st.queues.remove(&id) {
            st.queued -= old.frames.len();
            st.ready.retain(|q| *q != id);
        }
    }

    /// Queues frames of wire end `id`, dropping (and counting) what finds no stream or
    /// no room; wakes the stream if it waits.
    fn offer(&self, id: u64, frames: &mut Vec<Frame>) {
        let waker = {
            let mut guard = self.lock();
            let st = &mut *guard;
            let Some(q) = st.queues.get_mut(&id) else {
                frames.clear();
                return;
            };
            if st.stream.is_none() {
                q.counters.dropped(DropReason::NoStream, frames.len() as u64);
                frames.clear();
                return;
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
            if taken == 0 {
                return;
            }
            st.queued += taken;
            if was_empty {
                st.ready.push_back(id);
            }
            st.waker.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
    }
}

/// The batches for one stream to a peer node, taken from its [`Outbox`]; ends when a
/// newer stream to the same peer takes over or this one is closed.
pub struct OutboundBatches {
    outbox: Arc<Outbox>,
    generation: u64,
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

/// One gRPC wire end: the packet socket on its node end, its peer, and its counters.
pub struct PacketEnd {
    /// This end's wire id (frames for it carry this id).
    pub id: u64,
    /// The peer end's wire id (frames from here carry that id).
    pub peer_id: u64,
    /// The peer's node address.
    pub peer: IpAddr,
    fd: AsyncFd<OwnedFd>,
    counters: Arc<Counters>,
    up: AtomicBool,
    outbox: Arc<Outbox>,
}

impl PacketEnd {
    /// Writes a frame that came from the peer into the pod.
    fn deliver(&self, data: &[u8]) {
        // SAFETY: writing from a live buffer to the socket this end owns.
        let n = unsafe { libc::write(self.fd.get_ref().as_raw_fd(), data.as_ptr().cast(), data.len()) };
        if n < 0 {
            self.counters.dropped(DropReason::PodBusy, 1);
        } else {
            self.counters.rx_frames.inc();
            self.counters
                .rx_bytes
                .inc_by(data.len().saturating_sub(packet::VNET_HDR_LEN) as u64);
        }
    }

    /// Marks the end up (its peer is there) or down.
    pub fn set_up(&self, up: bool) {
        self.up.store(up, Ordering::Relaxed);
        let c = &self.counters;
        c.metrics.wire_up.get_or_create(&c.labels).set(i64::from(up));
    }

    /// Hands a burst of frames read from the pod to the peer's queue.
    fn flush(&self, burst: &mut Vec<Frame>) {
        if burst.is_empty() {
            return;
        }
        if !self.up.load(Ordering::Relaxed) {
            self.counters.dropped(DropReason::PeerDown, burst.len() as u64);
            burst.clear();
            return;
        }
        self.outbox.offer(self.id, burst);
    }

    /// Reads frames from the pod and queues them for the peer until the end goes away.
    async fn read_loop(self: Arc<Self>) {
        let mut buf = BytesMut::with_capacity(MAX_FRAME * 4);
        let mut burst = Vec::with_capacity(BURST_FRAMES);
        let mut burst_bytes = 0;
        loop {
            let Ok(mut guard) = self.fd.readable().await else {
                return;
            };
            loop {
                if buf.capacity() - buf.len() < MAX_FRAME {
                    buf.reserve(MAX_FRAME * 4);
                }
                let spare = buf.spare_capacity_mut();
                // SAFETY: reading at most `spare.len()` bytes into uninitialised spare
                // capacity, which `set_len` then exposes only as far as was written.
                let n = unsafe { libc::read(self.fd.get_ref().as_raw_fd(), spare.as_mut_ptr().cast(), MAX_FRAME) };
                if n <= 0 {
                    let e = std::io::Error::last_os_error();
                    self.flush(&mut burst);
                    burst_bytes = 0;
                    if n < 0 && e.kind() == std::io::ErrorKind::WouldBlock {
                        guard.clear_ready();
                        break;
                    }
                    debug!(wire = self.id, error = %e, "wire end read ended");
                    return;
                }
                let n = n as usize;
                // SAFETY: the kernel wrote `n` bytes.
                unsafe { buf.set_len(buf.len() + n) };
                self.counters.tx_frames.inc();
                self.counters
                    .tx_bytes
                    .inc_by(n.saturating_sub(packet::VNET_HDR_LEN) as u64);
                burst.push(Frame {
                    wire_id: self.peer_id,
                    data: buf.split().freeze(),
                });
                burst_bytes += n;
                if burst.len() >= BURST_FRAMES || burst_bytes >= BURST_BYTES {
                    self.flush(&mut burst);
                    burst_bytes = 0;
                }
            }
        }
    }
}

/// What becomes of one frame that came from a peer node.
#[derive(Debug, PartialEq, Eq)]
pub enum Route<'a, E> {
    /// Written into this end: the one the frame's wire id names, held for the sender.
    Deliver(&'a E),
    /// Dropped: the id names an end held for another peer node.
    OtherPeer,
    /// Dropped: no end here has the id.
    Unknown,
}

/// Decides where a frame for `wire_id` from node `from` goes, given this node's ends by
/// id and how to read an end's peer node. Kept apart from the writes into pods so that the
/// rule "no frame crosses wires" can be tested and fuzzed without devices.
pub fn route<'a, E>(
    ends: &'a HashMap<u64, E>,
    peer_of: impl Fn(&E) -> IpAddr,
    from: IpAddr,
    wire_id: u64,
) -> Route<'a, E> {
    match ends.get(&wire_id) {
        Some(end) if peer_of(end) == from => Route::Deliver(end),
        Some(_) => Route::OtherPeer,
        None => Route::Unknown,
    }
}

/// The frame stream to one peer node.
struct Peer {
    /// What waits to go to the peer, and which stream takes it.
    outbox: Arc<Outbox>,
    /// The task keeping the stream open, on the node that opens it.
    connect: Option<tokio::task::JoinHandle<()>>,
}

impl Drop for Peer {
    fn drop(&mut self) {
        if let Some(t) = &self.connect {
            t.abort();
        }
    }
}

/// All gRPC wire ends of this node and their streams.
pub struct DataPlane {
    local: IpAddr,
    port: u16,
    metrics: Arc<Metrics>,
    ends: RwLock<HashMap<u64, Arc<PacketEnd>>>,
    peers: Mutex<HashMap<IpAddr, Peer>>,
    readers: Mutex<HashMap<u64, tokio::task::JoinHandle<()>>>,
}

impl DataPlane {
    /// A data plane for node address `local`, whose wire service listens on `port` on
    /// every node.
    pub fn new(local: IpAddr, port: u16, metrics: Arc<Metrics>) -> Arc<Self> {
        Arc::new(Self {
            local,
            port,
            metrics,
            ends: RwLock::default(),
            peers: Mutex::default(),
            readers: Mutex::default(),
        })
    }

    /// This node's address.
    pub fn local(&self) -> IpAddr {
        self.local
    }

    /// Whether this node opens the stream to `peer` (the lower address does).
    pub fn initiates(&self, peer: IpAddr) -> bool {
        self.local < peer
    }

    /// Starts (or replaces) the worker of a gRPC wire end over its packet socket `fd`.
    pub fn attach(
        self: &Arc<Self>,
        id: u64,
        peer_id: u64,
        peer: IpAddr,
        fd: OwnedFd,
        labels: WireLabels,
        up: bool,
    ) -> Result<(), String> {
        // Registered with the reactor of the runtime its reader runs on.
        let _rt = runtime().enter();
        // SAFETY: the AsyncFd owns the descriptor for its whole life and nothing else
        // closes or reuses it while it is registered.
        let fd = unsafe { AsyncFd::register(fd) }.map_err(|e| format!("registering the wire end's socket: {e}"))?;
        let outbox = self.peer(peer);
        let counters = Arc::new(Counters::new(labels, self.metrics.clone()));
        let end = Arc::new(PacketEnd {
            id,
            peer_id,
            peer,
            fd,
            counters: counters.clone(),
            up: AtomicBool::new(up),
            outbox: outbox.clone(),
        });
        end.set_up(up);
        if let Some(old) = self.ends.write().expect("ends lock").insert(id, end.clone()) {
            old.outbox.remove(id);
        }
        outbox.add(id, counters);
        let reader = spawn(end.read_loop());
        if let Some(old) = self.readers.lock().expect("readers lock").insert(id, reader) {
            old.abort();
        }
        Ok(())
    }

    /// Marks a wire end up or down (its peer pod came or went).
    pub fn set_up(&self, id: u64, up: bool) {
        if let Some(e) = self.ends.read().expect("ends lock").get(&id) {
            e.set_up(up);
        }
    }

    /// Stops a wire end's worker (its socket is closed; the caller removes the pair).
    pub fn detach(&self, id: u64) {
        if let Some(r) = self.readers.lock().expect("readers lock").remove(&id) {
            r.abort();
        }
        if let Some(end) = self.ends.write().expect("ends lock").remove(&id) {
            end.outbox.remove(id);
        }
    }

    /// Whether a wire end is attached.
    pub fn attached(&self, id: u64) -> bool {
        self.ends.read().expect("ends lock").contains_key(&id)
    }

    /// The outbox for `peer`, created (with the task that opens the stream, where this
    /// node opens it) on first use.
    fn peer(self: &Arc<Self>, addr: IpAddr) -> Arc<Outbox> {
        let mut peers = self.peers.lock().expect("peers lock");
        let p = peers.entry(addr).or_insert_with(|| {
            let outbox = Arc::new(Outbox::new(addr, &self.metrics));
            let connect = self
                .initiates(addr)
                .then(|| spawn(self.clone().connect_loop(addr, outbox.clone())));
            self.metrics
                .peer_stream_up
                .get_or_create(&PeerLabels {
                    peer_node: addr.to_string(),
                })
                .set(0);
            Peer { outbox, connect }
        });
        p.outbox.clone()
    }

    /// Delivers a batch that came from a peer.
    fn dispatch(&self, from: IpAddr, batch: FrameBatch) {
        let ends = self.ends.read().expect("ends lock");
        for f in batch.frames {
            match route(&ends, |e| e.peer, from, f.wire_id) {
                Route::Deliver(end) => end.deliver(&f.data),
                Route::OtherPeer => debug!(wire = f.wire_id, %from, "frame for a wire of another peer dropped"),
                Route::Unknown => debug!(wire = f.wire_id, %from, "frame for an unknown wire dropped"),
            }
        }
    }

    /// Keeps a stream to `peer` open: connects, pumps, and reconnects with backoff.
    async fn connect_loop(self: Arc<Self>, peer: IpAddr, outbox: Arc<Outbox>) {
        let labels = PeerLabels {
            peer_node: peer.to_string(),
        };
        let mut backoff = Duration::from_millis(50);
        let mut first = true;
        loop {
            let url = format!("http://{}", SocketAddr::new(peer, self.port));
            let opened = async {
                let channel = tonic::transport::Endpoint::from_shared(url.clone())
                    .map_err(|e| e.to_string())?
                    .connect_timeout(Duration::from_secs(2))
                    .tcp_nodelay(true)
                    .initial_stream_window_size(Some(4 << 20))
                    .initial_connection_window_size(Some(8 << 20))
                    .max_frame_size(Some(H2_MAX_FRAME))
                    .connect()
                    .await
                    .map_err(|e| e.to_string())?;
                let outbound = outbox.open();
                let generation = outbound.generation;
                let mut req = tonic::Request::new(outbound);
                if let Ok(v) = self.local.to_string().parse() {
                    req.metadata_mut().insert(NODE_HEADER, v);
                }
                let inbound = WireClient::new(channel)
                    .max_decoding_message_size(64 << 20)
                    .frames(req)
                    .await
                    .map_err(|e| {
                        outbox.close(generation);
                        e.to_string()
                    })?
                    .into_inner();
                Ok::<_, String>((generation, inbound))
            }
            .await;
            match opened {
                Ok((generation, mut inbound)) => {
                    if !first {
                        self.metrics.peer_reconnects.get_or_create(&labels).inc();
                    }
                    first = false;
                    info!(%peer, "frame stream to peer open");
                    self.metrics.peer_stream_up.get_or_create(&labels).set(1);
                    backoff = Duration::from_millis(50);
                    while let Some(Ok(batch)) = inbound.next().await {
                        self.dispatch(peer, batch);
                    }
                    outbox.close(generation);
                    self.metrics.peer_stream_up.get_or_create(&labels).set(0);
                    warn!(%peer, "frame stream to peer closed; reconnecting");
                }
                Err(e) => debug!(%peer, error = %e, "opening the frame stream failed"),
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(1));
        }
    }

    /// Serves a stream a peer opened: registers it as the way to that peer and pumps
    /// what arrives. Returns the outbound half for the response.
    pub fn accept(self: &Arc<Self>, peer: IpAddr, mut inbound: tonic::Streaming<FrameBatch>) -> OutboundBatches {
        let outbox = self.peer(peer);
        let outbound = outbox.open();
        let generation = outbound.generation;
        let labels = PeerLabels {
            peer_node: peer.to_string(),
        };
        self.metrics.peer_stream_up.get_or_create(&labels).set(1);
        info!(%peer, "frame stream from peer accepted");
        let me = self.clone();
        spawn(async move {
            while let Some(Ok(batch)) = inbound.next().await {
                me.dispatch(peer, batch);
            }
            outbox.close(generation);
            me.metrics.peer_stream_up.get_or_create(&labels).set(0);
        });
        outbound
    }
}

#[cfg(test)]
mod tests {
    use futures::FutureExt;

    use super::*;

    fn metrics() -> Arc<Metrics> {
        Metrics::new("test", "test")
    }

    fn counters(metrics: &Arc<Metrics>, pod: &str) -> Arc<Counters> {
        let labels = WireLabels {
            namespace: "default".into(),
            link_uid: "1".into(),
            pod: pod.into(),
            intf: "e1".into(),
            peer_node: "192.0.2.2".into(),
            kind: "grpc".into(),
        };
        Arc::new(Counters::new(labels, metrics.clone()))
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

    fn outbox(metrics: &Arc<Metrics>) -> Arc<Outbox> {
        Arc::new(Outbox::new("192.0.2.2".parse().unwrap(), metrics))
    }

    /// Without a stream frames are dropped as `no_stream`; with one they queue up to
    /// the wire's bound and the rest are dropped as `queue_full`.
    #[test]
    fn queues_are_bounded_and_drops_counted() {
        let m = metrics();
        let ob = outbox(&m);
        let c = counters(&m, "a");
        ob.add(1, c.clone());
        ob.offer(1, &mut frames(11, 3, 60));
        assert_eq!(drops(&c, DropReason::NoStream), 3);
        let _stream = ob.open();
        ob.offer(1, &mut frames(11, WIRE_QUEUE + 5, 60));
        assert_eq!(drops(&c, DropReason::QueueFull), 5);
        assert_eq!(ob.lock().queued, WIRE_QUEUE);
    }

    /// Large frames are bounded by bytes before the frame count is reached, and the
    /// room comes back as the stream takes them.
    #[tokio::test]
    async fn queues_are_bounded_in_bytes() {
        let m = metrics();
        let ob = outbox(&m);
        let c = counters(&m, "a");
        ob.add(1, c.clone());
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
        ob.add(1, counters(&m, "a"));
        ob.add(2, counters(&m, "b"));
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
        ob.add(1, c.clone());
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
        ob.add(1, counters(&m, "a"));
        ob.add(2, counters(&m, "b"));
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
