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
//!
//! The same runtime runs the workers of link detours (`detour`): veth and VXLAN ends
//! whose emulation the kernel cannot hold (no netem) have their frames read, impaired
//! and written back here, with the gRPC ends' emulation code.

mod counters;
mod detour;
mod end;
mod impair;
mod outbox;
mod runtime;

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use futures::StreamExt;
use tokio::runtime::Handle;
use tracing::{debug, info, warn};
use weft_kernel::packet::PacketSocket;
use weft_rpc::wire::FrameBatch;
use weft_rpc::wire::wire_client::WireClient;
use weft_telemetry::Metrics;
use weft_wiretls::{WireConnector, WireSecurity};

use crate::metrics::{PeerLabels, RejectLabels, WireLabels, WireMetrics};

pub use end::PacketEnd;
pub use outbox::OutboundBatches;
pub use runtime::{DataPlaneRuntime, THREAD_NAME};

use counters::Counters;
use outbox::Outbox;

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
/// Largest frame-stream message either end decodes: a full batch (its bytes, plus the
/// one super-frame that may take it past [`BATCH_BYTES`], plus per-frame framing) with
/// room to spare. A larger message is refused (counted as `oversized_batch`) rather than
/// buffered: a peer cannot make this node hold more than this per message.
pub const MAX_BATCH_MESSAGE: usize = 4 << 20;
const _: () = assert!(MAX_BATCH_MESSAGE >= BATCH_BYTES + weft_kernel::packet::MAX_FRAME + BATCH_FRAMES * 32);

/// Metadata key naming the calling node on a frame stream.
pub const NODE_HEADER: &str = "x-weft-node";

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

/// Whether a stream error (gRPC `INTERNAL`) says the peer sent a message that is not a
/// `FrameBatch` (it does not decode, or its gRPC framing is invalid), as opposed to the
/// connection ending midway.
pub fn malformed(message: &str) -> bool {
    message.contains("decode Protobuf") || message.starts_with("protocol error")
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
    connector: WireConnector,
    metrics: Arc<WireMetrics>,
    ends: RwLock<HashMap<u64, Arc<PacketEnd>>>,
    peers: Mutex<HashMap<IpAddr, Peer>>,
    readers: Mutex<HashMap<u64, tokio::task::JoinHandle<()>>>,
    /// The emulation of each impaired end, kept across re-attachments.
    impairments: Mutex<HashMap<u64, weft_link::Impairment>>,
    /// The link detours of veth and VXLAN ends emulated here, with their readers.
    detours: Mutex<HashMap<u64, detour::Running>>,
    /// What each emulated end's emulation did, kept across its emulation's changes.
    emulation: Mutex<HashMap<u64, Arc<impair::Emulation>>>,
    /// Where every task of this data plane runs (a [`DataPlaneRuntime`]'s, in weftd).
    rt: Handle,
    /// Where the node ends its sockets are opened on live.
    node_ends: weft_kernel::packet::NodeEnds,
}

impl DataPlane {
    /// A data plane for node address `local`, whose wire service listens on `port` on
    /// every node, running its ends' readers and its streams on `rt`: the handle of a
    /// [`DataPlaneRuntime`], which the wire server should share (see there why).
    /// `security` is the wire port's (the stream is opened with it); `node_ends` says
    /// where the node ends of its gRPC wire ends live.
    pub fn new(
        local: IpAddr,
        port: u16,
        security: WireSecurity,
        metrics: Arc<Metrics>,
        rt: Handle,
        node_ends: weft_kernel::packet::NodeEnds,
    ) -> Arc<Self> {
        Arc::new(Self {
            local,
            port,
            connector: WireConnector::new(security),
            metrics: metrics.families::<WireMetrics>(),
            ends: RwLock::default(),
            peers: Mutex::default(),
            readers: Mutex::default(),
            impairments: Mutex::default(),
            detours: Mutex::default(),
            emulation: Mutex::default(),
            rt,
            node_ends,
        })
    }

    /// Where the node ends of its gRPC wire ends live.
    pub fn node_ends(&self) -> &weft_kernel::packet::NodeEnds {
        &self.node_ends
    }

    /// This node's address.
    pub fn local(&self) -> IpAddr {
        self.local
    }

    /// Whether this node opens the stream to `peer` (the lower address does).
    pub fn initiates(&self, peer: IpAddr) -> bool {
        self.local < peer
    }

    /// Starts (or replaces) the worker of a gRPC wire end over its packet socket `sock`.
    pub fn attach(
        self: &Arc<Self>,
        id: u64,
        peer_id: u64,
        peer: IpAddr,
        sock: PacketSocket,
        labels: WireLabels,
        up: bool,
    ) -> Result<(), String> {
        let sock = {
            let _rt = self.rt.enter();
            sock.into_async()
                .map_err(|e| format!("registering the wire end's socket: {e}"))?
        };
        let outbox = self.peer(peer);
        let counters = Arc::new(Counters::new(labels, self.metrics.clone()));
        let end = Arc::new(PacketEnd::new(
            id,
            peer_id,
            peer,
            sock,
            counters.clone(),
            outbox.clone(),
        ));
        end.set_up(up);
        if let Some(imp) = self.impairments.lock().expect("impairments lock").get(&id) {
            let counts = self.emulation_of(id, &counters);
            end.set_impairer(Some(impair::Impairer::new(*imp, id, outbox.clone(), counts, &self.rt)));
        }
        if let Some(old) = self.ends.write().expect("ends lock").insert(id, end.clone()) {
            old.outbox.remove(id);
        }
        outbox.add(id, counters, end.room.clone());
        let reader = self.rt.spawn(end.read_loop());
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
        self.emulation.lock().expect("emulation lock").remove(&id);
        if let Some(r) = self.readers.lock().expect("readers lock").remove(&id) {
            r.abort();
        }
        if let Some(end) = self.ends.write().expect("ends lock").remove(&id) {
            end.outbox.remove(id);
        }
    }

    /// Emulates a link on what end `id`'s pod sends (an empty impairment: none), now
    /// and whenever the end is attached again.
    pub fn set_impairment(&self, id: u64, imp: weft_link::Impairment) {
        let mut all = self.impairments.lock().expect("impairments lock");
        if imp.is_empty() {
            all.remove(&id);
        } else {
            all.insert(id, imp);
        }
        if let Some(end) = self.ends.read().expect("ends lock").get(&id) {
            let i = (!imp.is_empty()).then(|| {
                let counts = self.emulation_of(id, end.counters());
                impair::Impairer::new(imp, id, end.outbox.clone(), counts, &self.rt)
            });
            end.set_impairer(i);
        }
    }

    /// Emulates `imp` on what a veth or VXLAN end `id` sends, through its link detour
    /// (see `weft_kernel::detour`): a running detour takes the new emulation in place;
    /// otherwise `open` gives the detour's socket and a reader starts on it.
    pub fn detour(
        &self,
        id: u64,
        imp: weft_link::Impairment,
        labels: WireLabels,
        open: impl FnOnce() -> std::io::Result<PacketSocket>,
    ) -> Result<(), String> {
        let mut all = self.detours.lock().expect("detours lock");
        if let Some((d, reader)) = all.get(&id)
            && !reader.is_finished()
        {
            let counts = self.emulation_of(id, &d.sink.counters);
            *d.impair.write().expect("impair lock") = impair::Impairer::new(imp, id, d.sink.clone(), counts, &self.rt);
            return Ok(());
        }
        let sock = open().map_err(|e| format!("opening the link detour's socket: {e}"))?;
        let sock = {
            let _rt = self.rt.enter();
            sock.into_async()
                .map_err(|e| format!("registering the link detour's socket: {e}"))?
        };
        let sink = detour::Detour::sink(sock, Arc::new(Counters::new(labels, self.metrics.clone())));
        let counts = self.emulation_of(id, &sink.counters);
        let d = Arc::new(detour::Detour {
            impair: std::sync::RwLock::new(impair::Impairer::new(imp, id, sink.clone(), counts, &self.rt)),
            sink,
        });
        let reader = self.rt.spawn(detour::read_loop(id, d.clone()));
        if let Some((_, old)) = all.insert(id, (d, reader)) {
            old.abort();
        }
        Ok(())
    }

    /// What weft's emulation did to what end `id` sent, if weft emulates it (a gRPC
    /// end's worker or a link detour; the counts outlive a change of settings).
    pub fn emulation(&self, id: u64) -> Option<weft_link::EmulationCounts> {
        self.emulation
            .lock()
            .expect("emulation lock")
            .get(&id)
            .map(|e| e.counts())
    }

    /// End `id`'s emulation series (made on first use).
    fn emulation_of(&self, id: u64, c: &Counters) -> Arc<impair::Emulation> {
        self.emulation
            .lock()
            .expect("emulation lock")
            .entry(id)
            .or_insert_with(|| impair::Emulation::new(c))
            .clone()
    }

    /// Stops end `id`'s detour reader; returns whether it had one.
    pub fn undetour(&self, id: u64) -> bool {
        self.emulation.lock().expect("emulation lock").remove(&id);
        let gone = self.detours.lock().expect("detours lock").remove(&id);
        if let Some((_, reader)) = &gone {
            reader.abort();
        }
        gone.is_some()
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
                .then(|| self.rt.spawn(self.clone().connect_loop(addr, outbox.clone())));
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

    /// Delivers what arrives on a stream from `peer` until it ends. A message over
    /// [`MAX_BATCH_MESSAGE`] ends the stream and is counted; other ends (the peer
    /// restarting, the connection dropping) are not refusals.
    async fn pump(&self, peer: IpAddr, inbound: &mut tonic::Streaming<FrameBatch>) {
        loop {
            match inbound.next().await {
                Some(Ok(batch)) => self.dispatch(peer, batch),
                Some(Err(status)) => {
                    if status.code() == tonic::Code::OutOfRange {
                        self.refused("oversized_batch");
                        warn!(%peer, error = %status.message(), "frame stream from peer refused: message too large");
                    } else if status.code() == tonic::Code::Internal && malformed(status.message()) {
                        self.refused("malformed_batch");
                        warn!(%peer, error = %status.message(), "frame stream from peer refused: a message does not decode");
                    } else {
                        debug!(%peer, error = %status, "frame stream from peer ended");
                    }
                    return;
                }
                None => return,
            }
        }
    }

    /// Counts a frame from a peer that no end of this node takes from it.
    fn refused(&self, reason: &'static str) {
        self.metrics.rejected.get_or_create(&RejectLabels { reason }).inc();
    }

    /// Delivers a batch that came from a peer: each run of frames for one end in one
    /// write to it.
    fn dispatch(&self, from: IpAddr, batch: FrameBatch) {
        let ends = self.ends.read().expect("ends lock");
        let mut run: Vec<&[u8]> = Vec::with_capacity(batch.frames.len().min(weft_kernel::packet::WRITE_BATCH));
        let mut run_end: Option<&Arc<PacketEnd>> = None;
        for f in &batch.frames {
            match route(&ends, |e| e.peer, from, f.wire_id) {
                Route::Deliver(end) => {
                    if !run_end.is_some_and(|r| Arc::ptr_eq(r, end)) {
                        if let Some(r) = run_end {
                            r.deliver(&run);
                        }
                        run.clear();
                        run_end = Some(end);
                    }
                    run.push(&f.data);
                }
                Route::OtherPeer => {
                    self.refused("other_peer_wire");
                    debug!(wire = f.wire_id, %from, "frame for a wire of another peer dropped")
                }
                Route::Unknown => {
                    self.refused("unknown_wire");
                    debug!(wire = f.wire_id, %from, "frame for an unknown wire dropped")
                }
            }
        }
        if let Some(r) = run_end {
            r.deliver(&run);
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
                    .connect_with_connector(self.connector.clone())
                    .await
                    .map_err(|e| e.to_string())?;
                let outbound = outbox.open();
                let generation = outbound.generation;
                let mut req = tonic::Request::new(outbound);
                if let Ok(v) = self.local.to_string().parse() {
                    req.metadata_mut().insert(NODE_HEADER, v);
                }
                let inbound = WireClient::new(channel)
                    .max_decoding_message_size(MAX_BATCH_MESSAGE)
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
                    self.pump(peer, &mut inbound).await;
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
        self.rt.spawn(async move {
            me.pump(peer, &mut inbound).await;
            outbox.close(generation);
            me.metrics.peer_stream_up.get_or_create(&labels).set(0);
        });
        outbound
    }
}
