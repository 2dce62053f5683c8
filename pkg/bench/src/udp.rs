//! A 64-byte UDP flood between two namespaces: a sender blasting with `sendmmsg` and a
//! receiver counting with `recvmmsg`, 64 datagrams per call on both sides. iperf3 pays
//! one syscall per datagram and tops out near the kernel's own veth rate on these
//! machines, so it would measure itself rather than the wire.

use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;

use weft_harness::NamedNetns;

/// Datagrams per `sendmmsg`/`recvmmsg`.
const BATCH: usize = 64;
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

fn receive(sock: &UdpSocket, stop: &AtomicBool) -> u64 {
    let mut bufs = vec![[0u8; 2048]; BATCH];
    let mut iovs: Vec<libc::iovec> = bufs
        .iter_mut()
        .map(|b| libc::iovec {
            iov_base: b.as_mut_ptr().cast(),
            iov_len: b.len(),
        })
        .collect();
    let mut msgs: Vec<libc::mmsghdr> = iovs
        .iter_mut()
        .map(|iov| {
            // SAFETY: an all-zero mmsghdr is valid (no name, no control data).
            let mut h: libc::mmsghdr = unsafe { std::mem::zeroed() };
            h.msg_hdr.msg_iov = iov;
            h.msg_hdr.msg_iovlen = 1;
            h
        })
        .collect();
    let mut got = 0u64;
    while !stop.load(Ordering::Relaxed) {
        // SAFETY: every header points at a live iovec over a live buffer of its length.
        let n = unsafe {
            libc::recvmmsg(
                sock.as_raw_fd(),
                msgs.as_mut_ptr(),
                BATCH as u32,
                libc::MSG_WAITFORONE,
                std::ptr::null_mut(),
            )
        };
        if n > 0 {
            got += n as u64;
        }
    }
    got
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

fn send(sock: &UdpSocket, for_: Duration) -> (u64, f64) {
    let mut payload = [0x5au8; PAYLOAD];
    let mut iov = libc::iovec {
        iov_base: payload.as_mut_ptr().cast(),
        iov_len: payload.len(),
    };
    let mut msgs: Vec<libc::mmsghdr> = (0..BATCH)
        .map(|_| {
            // SAFETY: as above; the socket is connected, so no name is needed.
            let mut h: libc::mmsghdr = unsafe { std::mem::zeroed() };
            h.msg_hdr.msg_iov = &mut iov;
            h.msg_hdr.msg_iovlen = 1;
            h
        })
        .collect();
    let start = Instant::now();
    let mut sent = 0u64;
    while start.elapsed() < for_ {
        // SAFETY: every header points at the one live payload iovec.
        let n = unsafe { libc::sendmmsg(sock.as_raw_fd(), msgs.as_mut_ptr(), BATCH as u32, 0) };
        if n > 0 {
            sent += n as u64;
        }
    }
    (sent, start.elapsed().as_secs_f64())
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
    let size: libc::c_int = 16 << 20;
    // SAFETY: setting an int socket option from a live int.
    unsafe {
        libc::setsockopt(
            receiver.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUFFORCE,
            (&size as *const libc::c_int).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
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
    let receiving = std::thread::spawn(move || receive(&receiver, &stop_rx));
    let duration = Duration::from_secs_f64(seconds);
    let sent = std::thread::spawn(move || send(&sender, duration))
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
