//! The data plane of gRPC wires. Each wire end is a TAP device in its pod, read by a
//! worker task that queues the frames (bounded, drops counted) for the wire's peer
//! node; per peer node, one sender task batches the frames of all its wires into
//! `FrameBatch` messages on ONE bidirectional stream. Frames carry the receiving end's
//! wire id; the receiver writes each into the TAP of that id, and drops frames for ids
//! it does not hold, so no frame can reach another wire. The node with the lower
//! address opens the stream and reconnects with backoff; the other accepts it.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use bytes::BytesMut;
use futures::StreamExt;
use futures::stream::SelectAll;
use tokio::io::unix::AsyncFd;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tracing::{debug, info, warn};
use weft_rpc::wire::wire_client::WireClient;
use weft_rpc::wire::{Frame, FrameBatch};
use weft_telemetry::Metrics;
use weft_telemetry::metrics::{PeerLabels, WireDirLabels, WireDropLabels, WireLabels};

/// Frames a wire end may have queued for its peer before it drops.
pub const WIRE_QUEUE: usize = 1024;
/// At most this many frames go into one batch.
pub const BATCH_FRAMES: usize = 256;
/// Metadata key naming the calling node on a frame stream.
pub const NODE_HEADER: &str = "x-weft-node";
/// Largest frame read from a TAP: a GSO super-frame plus its virtio-net header.
const MAX_FRAME: usize = 65_536 + weft_kernel::tap::VNET_HDR_LEN;

/// Where a peer's batches go while a stream is up, tagged with a generation so an old
/// stream ending does not unset a newer one.
#[derive(Default)]
struct Sink {
    current: Mutex<Option<(u64, mpsc::Sender<FrameBatch>)>>,
    generation: std::sync::atomic::AtomicU64,
}

impl Sink {
    fn set(&self, tx: mpsc::Sender<FrameBatch>) -> u64 {
        let g = self.generation.fetch_add(1, Ordering::Relaxed) + 1;
        *self.current.lock().expect("sink lock") = Some((g, tx));
        g
    }

    fn clear(&self, generation: u64) {
        let mut c = self.current.lock().expect("sink lock");
        if c.as_ref().is_some_and(|(g, _)| *g == generation) {
            *c = None;
        }
    }

    fn get(&self) -> Option<mpsc::Sender<FrameBatch>> {
        self.current
            .lock()
            .expect("sink lock")
            .as_ref()
            .map(|(_, tx)| tx.clone())
    }

    fn is_up(&self) -> bool {
        self.current.lock().expect("sink lock").is_some()
    }
}

/// One gRPC wire end: its TAP, its peer, and its counters.
pub struct TapEnd {
    /// This end's wire id (frames for it carry this id).
    pub id: u64,
    /// The peer end's wire id (frames from here carry that id).
    pub peer_id: u64,
    /// The peer's node address.
    pub peer: IpAddr,
    fd: AsyncFd<OwnedFd>,
    labels: WireLabels,
    metrics: Arc<Metrics>,
    up: AtomicBool,
    stream: Arc<Sink>,
}

impl TapEnd {
    fn count(&self, direction: &'static str, bytes: usize) {
        let l = WireDirLabels {
            wire: self.labels.clone(),
            direction,
        };
        self.metrics.wire_frames.get_or_create(&l).inc();
        self.metrics.wire_bytes.get_or_create(&l).inc_by(bytes as u64);
    }

    fn drop_frame(&self, reason: &'static str) {
        self.metrics
            .wire_drops
            .get_or_create(&WireDropLabels {
                wire: self.labels.clone(),
                reason,
            })
            .inc();
    }

    /// Writes a frame that came from the peer into the pod.
    fn deliver(&self, data: &[u8]) {
        // SAFETY: writing from a live buffer to the TAP this end owns.
        let n = unsafe { libc::write(self.fd.get_ref().as_raw_fd(), data.as_ptr().cast(), data.len()) };
        if n < 0 {
            self.drop_frame("pod_busy");
        } else {
            self.count("rx", data.len().saturating_sub(weft_kernel::tap::VNET_HDR_LEN));
        }
    }

    /// Marks the end up (its peer is there) or down.
    pub fn set_up(&self, up: bool) {
        self.up.store(up, Ordering::Relaxed);
        self.metrics.wire_up.get_or_create(&self.labels).set(i64::from(up));
    }

    /// Reads frames from the pod and queues them for the peer until the TAP goes away.
    async fn read_loop(self: Arc<Self>, out: mpsc::Sender<Frame>) {
        let mut buf = BytesMut::with_capacity(MAX_FRAME * 4);
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
                if n < 0 {
                    let e = std::io::Error::last_os_error();
                    if e.kind() == std::io::ErrorKind::WouldBlock {
                        guard.clear_ready();
                        break;
                    }
                    debug!(wire = self.id, error = %e, "TAP read ended");
                    return;
                }
                if n == 0 {
                    return;
                }
                // SAFETY: the kernel wrote `n` bytes.
                unsafe { buf.set_len(buf.len() + n as usize) };
                let data = buf.split().freeze();
                self.count("tx", (n as usize).saturating_sub(weft_kernel::tap::VNET_HDR_LEN));
                if !self.up.load(Ordering::Relaxed) {
                    self.drop_frame("peer_down");
                    continue;
                }
                if !self.stream.is_up() {
                    self.drop_frame("no_stream");
                    continue;
                }
                if out
                    .try_send(Frame {
                        wire_id: self.peer_id,
                        data,
                    })
                    .is_err()
                {
                    self.drop_frame("queue_full");
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
/// id and how to read an end's peer node. Kept apart from the TAP writes so that the
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
    /// Hands a new wire's outbound queue to the sender task.
    add_queue: mpsc::UnboundedSender<ReceiverStream<Frame>>,
    /// Where batches go while a stream is up.
    sink: Arc<Sink>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Peer {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// All gRPC wire ends of this node and their streams.
pub struct DataPlane {
    local: IpAddr,
    port: u16,
    metrics: Arc<Metrics>,
    ends: RwLock<HashMap<u64, Arc<TapEnd>>>,
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

    /// Starts (or replaces) the worker of a gRPC wire end over the TAP `fd`.
    pub fn attach(
        self: &Arc<Self>,
        id: u64,
        peer_id: u64,
        peer: IpAddr,
        fd: OwnedFd,
        labels: WireLabels,
        up: bool,
    ) -> Result<(), String> {
        // SAFETY: the AsyncFd owns the descriptor for its whole life and nothing else
        // closes or reuses it while it is registered.
        let fd = unsafe { AsyncFd::register(fd) }.map_err(|e| format!("registering the TAP: {e}"))?;
        let (add_queue, sink) = self.peer(peer);
        let end = Arc::new(TapEnd {
            id,
            peer_id,
            peer,
            fd,
            labels,
            metrics: self.metrics.clone(),
            up: AtomicBool::new(up),
            stream: sink,
        });
        end.set_up(up);
        let (tx, rx) = mpsc::channel(WIRE_QUEUE);
        add_queue
            .send(ReceiverStream::new(rx))
            .map_err(|_| "peer sender stopped".to_string())?;
        self.ends.write().expect("ends lock").insert(id, end.clone());
        let reader = tokio::spawn(end.read_loop(tx));
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

    /// Stops a wire end's worker (its TAP is closed; the caller removes the device).
    pub fn detach(&self, id: u64) {
        if let Some(r) = self.readers.lock().expect("readers lock").remove(&id) {
            r.abort();
        }
        self.ends.write().expect("ends lock").remove(&id);
    }

    /// Whether a wire end is attached.
    pub fn attached(&self, id: u64) -> bool {
        self.ends.read().expect("ends lock").contains_key(&id)
    }

    /// The stream state for `peer` (created on first use): the sender task's queue
    /// intake and the stream sink.
    fn peer(self: &Arc<Self>, addr: IpAddr) -> (mpsc::UnboundedSender<ReceiverStream<Frame>>, Arc<Sink>) {
        let mut peers = self.peers.lock().expect("peers lock");
        let p = peers.entry(addr).or_insert_with(|| {
            let (add_queue, queues) = mpsc::unbounded_channel();
            let sink = Arc::new(Sink::default());
            let mut tasks = vec![tokio::spawn(sender(addr, queues, sink.clone(), self.metrics.clone()))];
            if self.initiates(addr) {
                tasks.push(tokio::spawn(self.clone().connect_loop(addr, sink.clone())));
            }
            self.metrics
                .peer_stream_up
                .get_or_create(&PeerLabels {
                    peer_node: addr.to_string(),
                })
                .set(0);
            Peer { add_queue, sink, tasks }
        });
        (p.add_queue.clone(), p.sink.clone())
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
    async fn connect_loop(self: Arc<Self>, peer: IpAddr, sink: Arc<Sink>) {
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
                    .connect()
                    .await
                    .map_err(|e| e.to_string())?;
                let (tx, rx) = mpsc::channel::<FrameBatch>(64);
                let mut req = tonic::Request::new(ReceiverStream::new(rx));
                if let Ok(v) = self.local.to_string().parse() {
                    req.metadata_mut().insert(NODE_HEADER, v);
                }
                let inbound = WireClient::new(channel)
                    .max_decoding_message_size(64 << 20)
                    .frames(req)
                    .await
                    .map_err(|e| e.to_string())?
                    .into_inner();
                Ok::<_, String>((tx, inbound))
            }
            .await;
            match opened {
                Ok((tx, mut inbound)) => {
                    if !first {
                        self.metrics.peer_reconnects.get_or_create(&labels).inc();
                    }
                    first = false;
                    info!(%peer, "frame stream to peer open");
                    let generation = sink.set(tx);
                    self.metrics.peer_stream_up.get_or_create(&labels).set(1);
                    backoff = Duration::from_millis(50);
                    while let Some(Ok(batch)) = inbound.next().await {
                        self.dispatch(peer, batch);
                    }
                    sink.clear(generation);
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
    pub fn accept(
        self: &Arc<Self>,
        peer: IpAddr,
        mut inbound: tonic::Streaming<FrameBatch>,
    ) -> ReceiverStream<FrameBatch> {
        let (tx, rx) = mpsc::channel::<FrameBatch>(64);
        let (_, sink) = self.peer(peer);
        let generation = sink.set(tx);
        let labels = PeerLabels {
            peer_node: peer.to_string(),
        };
        self.metrics.peer_stream_up.get_or_create(&labels).set(1);
        info!(%peer, "frame stream from peer accepted");
        let me = self.clone();
        tokio::spawn(async move {
            while let Some(Ok(batch)) = inbound.next().await {
                me.dispatch(peer, batch);
            }
            sink.clear(generation);
            me.metrics.peer_stream_up.get_or_create(&labels).set(0);
        });
        ReceiverStream::new(rx)
    }
}

/// Batches the frames of every wire to one peer onto its stream; frames with no stream
/// to go to are dropped (the peer's daemon is away) rather than held.
async fn sender(
    peer: IpAddr,
    mut queues: mpsc::UnboundedReceiver<ReceiverStream<Frame>>,
    sink: Arc<Sink>,
    metrics: Arc<Metrics>,
) {
    let labels = PeerLabels {
        peer_node: peer.to_string(),
    };
    let mut all: SelectAll<ReceiverStream<Frame>> = SelectAll::new();
    loop {
        let first = tokio::select! {
            q = queues.recv() => match q {
                Some(q) => { all.push(q); continue; }
                None => return,
            },
            f = all.next(), if !all.is_empty() => match f { Some(f) => f, None => continue },
        };
        let mut frames = Vec::with_capacity(BATCH_FRAMES);
        frames.push(first);
        while frames.len() < BATCH_FRAMES {
            match futures::FutureExt::now_or_never(all.next()) {
                Some(Some(f)) => frames.push(f),
                _ => break,
            }
        }
        metrics
            .peer_batch_frames
            .get_or_create(&labels)
            .observe(frames.len() as f64);
        match sink.get() {
            Some(tx) => {
                metrics
                    .peer_queue_depth
                    .get_or_create(&labels)
                    .set((tx.max_capacity() - tx.capacity()) as i64);
                if tx.send(FrameBatch { frames }).await.is_err() {
                    debug!(%peer, "stream closed under a batch");
                }
            }
            None => debug!(%peer, frames = frames.len(), "no stream to the peer; batch dropped"),
        }
    }
}
