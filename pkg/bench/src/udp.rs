//! A 64-byte UDP flood between two namespaces: a sender blasting with `sendmmsg` and a
//! receiver counting with `recvmmsg`, 64 datagrams per call on both sides. iperf3 pays
//! one syscall per datagram and tops out near the kernel's own veth rate on these
//! machines, so it would measure itself rather than the wire.

use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde::Serialize;

use weft_harness::NamedNetns;

/// UDP payload: the small-packet case (a 106-byte Ethernet frame).
pub const PAYLOAD: usize = 64;
/// The port floods go to (see [`flood_to`] for another).
pub(crate) const PORT: u16 = 9919;

/// What one flood did.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Flood {
    /// Datagrams the sender handed to the kernel.
    pub sent: u64,
    /// Datagrams the receiver got.
    pub received: u64,
    /// How long the sender sent (s).
    pub seconds: f64,
}

impl Flood {
    /// Datagrams received per second of sending.
    pub fn received_per_s(&self) -> f64 {
        if self.seconds > 0.0 {
            self.received as f64 / self.seconds
        } else {
            0.0
        }
    }

    /// Datagrams sent per second.
    pub fn sent_per_s(&self) -> f64 {
        if self.seconds > 0.0 {
            self.sent as f64 / self.seconds
        } else {
            0.0
        }
    }
}

/// One datagram from the sender, answered by the receiver, each way within a second
/// (retried a few times).
fn answer_once(sender: &UdpSocket, receiver: &UdpSocket) -> Result<(), String> {
    let _ = sender.set_read_timeout(Some(Duration::from_millis(200)));
    let mut buf = [0u8; 64];
    for _ in 0..10 {
        sender
            .send(b"hello")
            .map_err(|e| format!("sending the first datagram: {e}"))?;
        let Ok((_, from)) = receiver.recv_from(&mut buf) else {
            continue;
        };
        receiver
            .send_to(b"hello", from)
            .map_err(|e| format!("answering the first datagram: {e}"))?;
        if sender.recv(&mut buf).is_ok() {
            return Ok(());
        }
    }
    Err("the flow was never answered".into())
}

/// Floods `dst` (an address in `server_ns`) from `client_ns` for `seconds`, and counts
/// what arrives.
pub fn flood(client_ns: &str, server_ns: &str, dst: Ipv4Addr, seconds: f64) -> Result<Flood, String> {
    flood_to(client_ns, server_ns, dst, PORT, false, seconds)
}

/// [`flood`] to `port`; with `replied`, the flow is answered once before the flood (one
/// datagram each way), so connection tracking holds it as established, as it does a
/// flow whose receiver talks back, rather than new (a flow that was never answered).
pub(crate) fn flood_to(
    client_ns: &str,
    server_ns: &str,
    dst: Ipv4Addr,
    port: u16,
    replied: bool,
    seconds: f64,
) -> Result<Flood, String> {
    // Both sockets are made inside their namespaces and keep them; the threads that
    // then send and receive on them need not be there.
    let receiver = NamedNetns::existing(server_ns)
        .within(|| UdpSocket::bind(SocketAddrV4::new(dst, port)))
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("binding {dst}:{port}: {e}"))?;
    // A deep receive queue, so what the wire delivers is counted rather than lost to a
    // reader that was not scheduled; the timeout lets it see `stop`.
    let _ = weft_kernel::udp::force_receive_buffer(&receiver, 16 << 20);
    let _ = receiver.set_read_timeout(Some(Duration::from_millis(50)));
    let sender = NamedNetns::existing(client_ns)
        .within(|| UdpSocket::bind("0.0.0.0:0"))
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("binding the sender: {e}"))?;
    sender
        .connect(SocketAddrV4::new(dst, port))
        .map_err(|e| format!("connecting to {dst}: {e}"))?;
    if replied {
        answer_once(&sender, &receiver)?;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let stop_rx = stop.clone();
    let receiving = std::thread::spawn(move || weft_kernel::udp::receive_until(&receiver, &stop_rx));
    let duration = Duration::from_secs_f64(seconds);
    let sent = std::thread::spawn(move || weft_kernel::udp::send_for(&sender, &[0x5a; PAYLOAD], duration))
        .join()
        .map_err(|_| "the UDP sender panicked".to_string());
    // What is still in flight (queues in the wire) arrives within this.
    std::thread::sleep(Duration::from_millis(200));
    stop.store(true, Ordering::Relaxed);
    let received = receiving.join().map_err(|_| "the UDP receiver panicked".to_string())?;
    let (sent, secs) = sent?;
    Ok(Flood {
        sent,
        received,
        seconds: secs,
    })
}
