//! Batched UDP for traffic generators (the benchmarks' floods): many datagrams per
//! system call with sendmmsg(2) and recvmmsg(2), so the sender's own loop is not what
//! a measurement measures.

use std::net::UdpSocket;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Datagrams per system call.
pub const BATCH: usize = 64;

/// Sends `payload` on the connected `sock`, [`BATCH`] datagrams per call, for `for_`;
/// returns the datagrams the kernel took and the seconds it took.
pub fn send_for(sock: &UdpSocket, payload: &[u8], for_: Duration) -> (u64, f64) {
    let mut payload = payload.to_vec();
    let mut iov = libc::iovec {
        iov_base: payload.as_mut_ptr().cast(),
        iov_len: payload.len(),
    };
    let mut msgs: Vec<libc::mmsghdr> = (0..BATCH)
        .map(|_| {
            // SAFETY: an all-zero mmsghdr is valid (no name, no control data); the
            // socket is connected, so no name is needed.
            let mut h: libc::mmsghdr = unsafe { std::mem::zeroed() };
            h.msg_hdr.msg_iov = &mut iov;
            h.msg_hdr.msg_iovlen = 1;
            h
        })
        .collect();
    let start = Instant::now();
    let mut sent = 0u64;
    while start.elapsed() < for_ {
        // SAFETY: every header points at the one live payload iovec, over `payload`,
        // which outlives the call.
        let n = unsafe { libc::sendmmsg(sock.as_raw_fd(), msgs.as_mut_ptr(), BATCH as u32, 0) };
        if n > 0 {
            sent += n as u64;
        }
    }
    (sent, start.elapsed().as_secs_f64())
}

/// Receives on `sock`, [`BATCH`] datagrams per call, until `stop` is set (the socket
/// should have a read timeout, so the loop sees it); returns the datagrams received.
pub fn receive_until(sock: &UdpSocket, stop: &AtomicBool) -> u64 {
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

/// Grows `sock`'s receive buffer to `bytes`, past `rmem_max` (needs CAP_NET_ADMIN), so
/// what arrives is counted rather than lost to a reader that was not scheduled.
pub fn force_receive_buffer(sock: &UdpSocket, bytes: usize) -> std::io::Result<()> {
    nix::sys::socket::setsockopt(sock, nix::sys::socket::sockopt::RcvBufForce, &bytes).map_err(std::io::Error::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_sent_on_loopback_are_received() {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        rx.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        tx.connect(rx.local_addr().unwrap()).unwrap();
        let stop = AtomicBool::new(false);
        let (sent, got) = std::thread::scope(|s| {
            let r = s.spawn(|| receive_until(&rx, &stop));
            let (sent, _) = send_for(&tx, b"x", Duration::from_millis(5));
            std::thread::sleep(Duration::from_millis(100));
            stop.store(true, Ordering::Relaxed);
            (sent, r.join().unwrap())
        });
        assert!(sent >= BATCH as u64, "one batch at least: {sent}");
        // Loopback may drop what the receive buffer cannot hold, never invent.
        assert!(got > 0 && got <= sent, "sent {sent}, received {got}");
    }
}
