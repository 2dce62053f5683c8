//! The worker of a link detour (see `weft_kernel::detour`): it reads what a pod sent
//! on a veth or VXLAN end, steered to the detour's node side, passes it through the
//! end's emulation and writes it back to go out of the end. It runs only while an end
//! needs an emulation the kernel cannot give (no netem).

use std::sync::{Arc, RwLock};

use bytes::BytesMut;
use tokio::io::unix::AsyncFd;
use tracing::debug;
use weft_kernel::packet::{self, PacketSocket};
use weft_rpc::wire::Frame;

use super::counters::{Counters, DropReason};
use super::impair::{Impairer, Sink};

/// Frames read before a burst goes through the emulation.
const BURST_FRAMES: usize = 32;

/// Writes frames back into the detour's socket: out of the pod's end.
pub(super) struct WriteBack {
    sock: Arc<AsyncFd<PacketSocket>>,
    pub(super) counters: Arc<Counters>,
}

impl Sink for WriteBack {
    fn offer(&self, _id: u64, frames: &mut Vec<Frame>) {
        for f in frames.drain(..) {
            // A full socket is a full link: the frame is lost, and counted.
            if self.sock.get_ref().write(&f.data).is_err() {
                self.counters.dropped(DropReason::PodBusy, 1);
            }
        }
    }
}

/// A detour with the task reading its socket.
pub(super) type Running = (Arc<Detour>, tokio::task::JoinHandle<()>);

/// One end's detour: where its frames go back and the emulation it applies (the
/// data plane holds its reader).
pub(super) struct Detour {
    pub(super) sink: Arc<WriteBack>,
    pub(super) impair: RwLock<Arc<Impairer>>,
}

impl Detour {
    /// The write-back over `sock` (registered with the runtime its reader runs on).
    pub(super) fn sink(sock: AsyncFd<PacketSocket>, counters: Arc<Counters>) -> Arc<WriteBack> {
        Arc::new(WriteBack {
            sock: Arc::new(sock),
            counters,
        })
    }
}

/// Reads what the pod sends, in bursts, through the detour's current emulation and
/// back out, until the socket goes.
pub(super) async fn read_loop(id: u64, detour: Arc<Detour>) {
    let sock = detour.sink.sock.clone();
    let mut buf = BytesMut::with_capacity(packet::MAX_FRAME * 4);
    let mut burst: Vec<Frame> = Vec::with_capacity(BURST_FRAMES);
    let flush = |burst: &mut Vec<Frame>| {
        if burst.is_empty() {
            return;
        }
        let imp = detour.impair.read().expect("impair lock").clone();
        imp.apply(burst);
        detour.sink.offer(id, burst);
    };
    loop {
        let Ok(mut guard) = sock.readable().await else {
            return;
        };
        loop {
            if buf.capacity() - buf.len() < packet::MAX_FRAME {
                buf.reserve(packet::MAX_FRAME * 4);
            }
            match sock.get_ref().read_buf(&mut buf) {
                Ok(n) if n > 0 => {
                    burst.push(Frame {
                        wire_id: id,
                        data: buf.split().freeze(),
                    });
                    if burst.len() >= BURST_FRAMES {
                        flush(&mut burst);
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    flush(&mut burst);
                    guard.clear_ready();
                    break;
                }
                other => {
                    flush(&mut burst);
                    debug!(wire = id, result = ?other.map(|_| ()), "link detour read ended");
                    return;
                }
            }
        }
    }
}
