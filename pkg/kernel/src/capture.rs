//! Packet capture of one interface in a pod's namespace (`weftctl capture`): an
//! AF_PACKET socket bound to the interface, which sees every frame the pod sends into
//! the link and every frame delivered to it, whatever carries the link (a veth pair, a
//! VXLAN device or a gRPC wire's veth all end in an interface in the pod).
//!
//! The socket exists only while a capture runs: opened on demand, closed when it is
//! dropped, so an interface nobody captures pays nothing. Each capture gets a socket
//! of its own, so several at once each see every frame. Written on libc directly, as
//! [`packet`](crate::packet) is, because a capture needs what the packet-socket crates
//! hide: the frame's original length (`MSG_TRUNC`), its direction (`sll_pkttype`) and
//! the kernel's receive timestamp (`SO_TIMESTAMPNS`); [`CaptureSocket`] wraps them
//! safely.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use crate::packet::{bind_to_interface, set_int_option as setsockopt};
use crate::{KernelError, NetNs, in_netns};

/// Kernel buffer of a capture socket: frames wait here while the client reads slowly;
/// beyond it the kernel drops them from the capture (never from the link).
const RECEIVE_BUFFER: libc::c_int = 4 << 20;

/// `PACKET_OUTGOING` from `<linux/if_packet.h>`: a frame the interface sent.
const PACKET_OUTGOING: u8 = 4;

/// One frame read from a [`CaptureSocket`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Captured {
    /// Bytes of the frame placed in the buffer (at most its length).
    pub len: usize,
    /// The frame's whole length on the interface.
    pub original_len: usize,
    /// Sent by the interface's owner (the pod) rather than received.
    pub outgoing: bool,
    /// When the kernel took it, in Unix nanoseconds (0 when it gave no timestamp).
    pub unix_nanos: i64,
}

/// A non-blocking packet socket bound to one interface, for capture. It owns its
/// descriptor, closed on drop, and lends it out ([`AsFd`]) so an event loop can wait on
/// it.
#[derive(Debug)]
pub struct CaptureSocket {
    fd: OwnedFd,
}

impl CaptureSocket {
    /// Opens a capture of interface `intf` of namespace `ns` (on a thread that enters
    /// it; the socket stays in `ns` wherever it is read).
    pub fn open_in(ns: &NetNs, intf: &str) -> Result<Self, KernelError> {
        in_netns(ns, || Self::open(intf))
    }

    /// Opens a capture of interface `intf` of the calling thread's namespace.
    pub fn open(intf: &str) -> Result<Self, KernelError> {
        let os = |step: String| move |e: io::Error| KernelError::os(step, e);
        let cname = std::ffi::CString::new(intf).map_err(|_| {
            KernelError::os(
                format!("interface {intf:?}"),
                io::Error::from(io::ErrorKind::InvalidInput),
            )
        })?;
        // SAFETY: if_nametoindex reads a NUL-terminated string that outlives the call.
        let index = unsafe { libc::if_nametoindex(cname.as_ptr()) };
        if index == 0 {
            return Err(KernelError::os(format!("interface {intf}"), io::Error::last_os_error()));
        }
        // Protocol 0 until bound: a socket opened for ETH_P_ALL would see every
        // interface's frames until `bind` narrows it to this one.
        // SAFETY: plain socket(2); the descriptor is owned right below.
        let raw = unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                0,
            )
        };
        if raw < 0 {
            return Err(KernelError::os("opening a capture socket", io::Error::last_os_error()));
        }
        // SAFETY: `raw` is a fresh descriptor nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // Forced past rmem_max (weftd runs as root): a burst on a fast link would
        // otherwise overflow the default buffer before the client's stream catches up.
        if setsockopt(&fd, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, RECEIVE_BUFFER).is_err() {
            setsockopt(&fd, libc::SOL_SOCKET, libc::SO_RCVBUF, RECEIVE_BUFFER).map_err(os("SO_RCVBUF".to_string()))?;
        }
        // The time the kernel took the frame, not when weftd got round to reading it.
        setsockopt(&fd, libc::SOL_SOCKET, libc::SO_TIMESTAMPNS, 1).map_err(os("SO_TIMESTAMPNS".to_string()))?;
        bind_to_interface(&fd, index).map_err(os(format!("binding a capture socket to {intf}")))?;
        Ok(Self { fd })
    }

    /// Reads one frame into `buf`, cut to its length (the snaplen): what was placed
    /// there, the frame's whole length, its direction and time; `WouldBlock` when none
    /// waits. An error such as `ENETDOWN` means the interface went away.
    pub fn recv(&self, buf: &mut [u8]) -> io::Result<Captured> {
        // SAFETY: sockaddr_ll is plain data; all-zeros is a valid start.
        let mut from: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        let mut iov = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        // Room for one SCM_TIMESTAMPNS, aligned as cmsghdr wants.
        let mut control = [0u64; 8];
        // SAFETY: msghdr is plain data; all-zeros is a valid start.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_name = (&mut from as *mut libc::sockaddr_ll).cast();
        msg.msg_namelen = std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t;
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = std::mem::size_of_val(&control) as _;
        // MSG_TRUNC: the answer is the frame's whole length even when `buf` held less.
        // SAFETY: every pointer in `msg` refers to live buffers of the sizes given,
        // which the kernel writes within.
        let n = unsafe { libc::recvmsg(self.fd.as_raw_fd(), &mut msg, libc::MSG_TRUNC) };
        let original_len = usize::try_from(n).map_err(|_| io::Error::last_os_error())?;
        let mut unix_nanos = 0;
        // SAFETY: walking the control messages the kernel wrote into `control`, with
        // the libc macros that stay within `msg_controllen`.
        unsafe {
            let mut c = libc::CMSG_FIRSTHDR(&msg);
            while !c.is_null() {
                if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_TIMESTAMPNS {
                    let ts: libc::timespec = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast());
                    unix_nanos = ts.tv_sec.saturating_mul(1_000_000_000).saturating_add(ts.tv_nsec);
                }
                c = libc::CMSG_NXTHDR(&msg, c);
            }
        }
        Ok(Captured {
            len: original_len.min(buf.len()),
            original_len,
            outgoing: from.sll_pkttype == PACKET_OUTGOING,
            unix_nanos,
        })
    }
}

impl CaptureSocket {
    /// Registers the socket with the reactor of the tokio runtime the caller has
    /// entered, for reading.
    pub fn into_async(self) -> io::Result<tokio::io::unix::AsyncFd<CaptureSocket>> {
        // SAFETY: the AsyncFd owns the socket, and so its descriptor, for its whole
        // life; a CaptureSocket never replaces its descriptor, so it always lends the
        // same one, which nothing else can close.
        unsafe { tokio::io::unix::AsyncFd::register_with_interest(self, tokio::io::Interest::READABLE) }
            .map_err(io::Error::from)
    }
}

impl AsFd for CaptureSocket {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl AsRawFd for CaptureSocket {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::TempNetns;

    fn root() -> bool {
        nix::unistd::geteuid().is_root()
    }

    /// Sends one UDP datagram over loopback inside the namespace, to a socket that
    /// takes it (a closed port would add an ICMP error to the capture).
    fn send_udp(payload: &[u8]) {
        let to = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        s.send_to(payload, to.local_addr().unwrap()).unwrap();
        let mut got = [0u8; 256];
        assert_eq!(to.recv(&mut got).unwrap(), payload.len());
    }

    #[test]
    fn sees_each_frame_with_its_whole_length_direction_and_time() {
        if !root() {
            return;
        }
        let ns = TempNetns::new();
        ns.run(|| {
            let up = std::process::Command::new("ip")
                .args(["link", "set", "lo", "up"])
                .status();
            assert!(up.unwrap().success());
            let sock = CaptureSocket::open("lo").unwrap();
            let mut buf = [0u8; 64];
            assert_eq!(sock.recv(&mut buf).unwrap_err().kind(), io::ErrorKind::WouldBlock);
            let before = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as i64;
            send_udp(&[7u8; 200]);
            // Loopback shows the datagram twice: going out, and coming in.
            let mut seen = Vec::new();
            while let Ok(c) = sock.recv(&mut buf) {
                seen.push(c);
            }
            assert_eq!(seen.len(), 2, "{seen:?}");
            for c in &seen {
                // Ethernet (14) + IPv4 (20) + UDP (8) + 200 bytes, cut to the buffer.
                assert_eq!((c.len, c.original_len), (64, 242), "{c:?}");
                assert!(c.unix_nanos >= before && c.unix_nanos - before < 5_000_000_000, "{c:?}");
            }
            assert_eq!(seen.iter().filter(|c| c.outgoing).count(), 1, "{seen:?}");
        });
        assert!(
            CaptureSocket::open_in(&NetNs::open(ns.path()).unwrap(), "nosuch0").is_err(),
            "an interface that does not exist is refused"
        );
    }
}
