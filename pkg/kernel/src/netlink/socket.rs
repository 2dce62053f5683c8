//! The netlink socket: one protocol family per socket (`NETLINK_ROUTE`, `NETLINK_NETFILTER`), bound to the namespace of the thread that opened it, with request/ACK, dump and batch helpers. Everything else in this module is operations over it.

use std::io;
use std::marker::PhantomData;

use netlink_packet_core::{
    NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST, NetlinkDeserializable, NetlinkHeader, NetlinkMessage, NetlinkPayload,
    NetlinkSerializable,
};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_sys::{
    SocketAddr,
    protocols::{NETLINK_NETFILTER, NETLINK_ROUTE},
};

/// A netlink protocol family: which socket protocol it is and what its messages are.
pub trait Protocol {
    /// The socket protocol (`NETLINK_*`).
    const PROTOCOL: isize;
    /// Its messages, without the netlink header (which the socket writes and reads).
    type Message: NetlinkSerializable + NetlinkDeserializable;
    /// Sets the family's own socket options on a fresh socket.
    fn configure(_sock: &mut netlink_sys::Socket) {}
}

/// rtnetlink (`NETLINK_ROUTE`): links, addresses, routes, neighbours.
#[derive(Debug)]
pub enum Rtnetlink {}

impl Protocol for Rtnetlink {
    const PROTOCOL: isize = NETLINK_ROUTE;
    type Message = RouteNetlinkMessage;

    fn configure(sock: &mut netlink_sys::Socket) {
        // Strict checking makes the kernel filter dumps by the header we send.
        let _ = sock.set_netlink_get_strict_chk(true);
        let _ = sock.set_ext_ack(true);
    }
}

/// nfnetlink (`NETLINK_NETFILTER`): nftables' messages, sent in batches.
#[derive(Debug)]
pub enum Nfnetlink {}

impl Protocol for Nfnetlink {
    const PROTOCOL: isize = NETLINK_NETFILTER;
    type Message = NetfilterMessage;

    fn configure(sock: &mut netlink_sys::Socket) {
        // An error need not echo the failed message: a large element list would not
        // fit the receive buffer, and the error would be lost to a truncated read.
        let _ = sock.set_cap_ack(true);
    }
}

/// One nfnetlink message as its user writes it: no crate models nftables' messages
/// under a licence weft can use, so the caller lays out the body and the socket adds
/// the netlink header, sequence numbers and acknowledgements.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetfilterMessage {
    /// The message type: `(subsystem << 8) | message`, or a batch delimiter.
    pub message_type: u16,
    /// Everything after the netlink header: the `nfgenmsg` header and the attributes,
    /// padded to 4 bytes.
    pub body: Vec<u8>,
}

impl NetlinkSerializable for NetfilterMessage {
    fn message_type(&self) -> u16 {
        self.message_type
    }

    fn buffer_len(&self) -> usize {
        self.body.len()
    }

    fn serialize(&self, buffer: &mut [u8]) {
        buffer.copy_from_slice(&self.body);
    }
}

impl NetlinkDeserializable for NetfilterMessage {
    type Error = std::convert::Infallible;

    fn deserialize(header: &NetlinkHeader, payload: &[u8]) -> Result<Self, Self::Error> {
        Ok(Self {
            message_type: header.message_type,
            body: payload.to_vec(),
        })
    }
}

/// A blocking netlink socket of protocol family `P` in the caller's network namespace.
pub struct NetlinkSocket<P: Protocol> {
    sock: netlink_sys::Socket,
    seq: u32,
    buf: Vec<u8>,
    protocol: PhantomData<P>,
    /// The receive timeout [`Self::receive_unsolicited`] last set.
    unsolicited_timeout: Option<std::time::Duration>,
}

/// A blocking rtnetlink socket in the caller's network namespace.
pub type Netlink = NetlinkSocket<Rtnetlink>;

impl<P: Protocol> NetlinkSocket<P> {
    /// Opens a socket in the calling thread's network namespace.
    pub fn new() -> io::Result<Self> {
        let mut sock = netlink_sys::Socket::new(P::PROTOCOL)?;
        sock.bind_auto()?;
        sock.connect(&SocketAddr::new(0, 0))?;
        P::configure(&mut sock);
        // A reply that never comes must fail the call, not hang it.
        nix::sys::socket::setsockopt(
            &sock,
            nix::sys::socket::sockopt::ReceiveTimeout,
            &nix::sys::time::TimeVal::new(10, 0),
        )
        .map_err(io::Error::from)?;
        Ok(Self {
            sock,
            seq: 0,
            buf: vec![0; 64 * 1024],
            protocol: PhantomData,
            unsolicited_timeout: None,
        })
    }

    /// Appends `msg` with the next sequence number to `out`, returning the number.
    pub(super) fn encode(&mut self, msg: P::Message, flags: u16, out: &mut Vec<u8>) -> u32 {
        self.seq = self.seq.wrapping_add(1);
        let mut header = NetlinkHeader::default();
        header.flags = flags;
        header.sequence_number = self.seq;
        let mut nl = NetlinkMessage::new(header, NetlinkPayload::InnerMessage(msg));
        nl.finalize();
        let at = out.len();
        out.resize(at + nl.buffer_len(), 0);
        nl.serialize(&mut out[at..]);
        // Messages sharing a datagram start on 4-byte boundaries.
        out.resize(out.len().next_multiple_of(4), 0);
        self.seq
    }

    pub(super) fn send(&mut self, msg: P::Message, flags: u16) -> io::Result<u32> {
        let mut out = Vec::new();
        let seq = self.encode(msg, flags, &mut out);
        self.sock.send(&out, 0)?;
        Ok(seq)
    }

    /// Receives every message answering `seq` until the ACK/error or the end of a dump.
    pub(super) fn receive(&mut self, seq: u32) -> io::Result<Vec<P::Message>> {
        let mut out = Vec::new();
        loop {
            let n = self.sock.recv(&mut &mut self.buf[..], 0)?;
            let mut off = 0;
            while off < n {
                let msg = decode::<P>(&self.buf[off..n])?;
                let len = msg.header.length as usize;
                off += if len == 0 { n } else { (len + 3) & !3 };
                if msg.header.sequence_number != seq {
                    continue;
                }
                match msg.payload {
                    NetlinkPayload::Error(e) => {
                        return match e.code {
                            None => Ok(out),
                            Some(_) => Err(e.to_io()),
                        };
                    }
                    NetlinkPayload::Done(_) => return Ok(out),
                    NetlinkPayload::InnerMessage(m) => out.push(m),
                    _ => {}
                }
            }
        }
    }

    /// Sends a request and waits for its ACK.
    pub fn execute(&mut self, msg: P::Message, extra_flags: u16) -> io::Result<()> {
        let seq = self.send(msg, NLM_F_REQUEST | NLM_F_ACK | extra_flags)?;
        self.receive(seq).map(|_| ())
    }

    /// Sends a message the kernel answers nothing to (no ACK asked, none read): a
    /// queue's verdict, whose ACK would have to be told from the packets that arrive
    /// on the same socket meanwhile.
    pub fn notify(&mut self, msg: P::Message) -> io::Result<()> {
        self.send(msg, NLM_F_REQUEST).map(|_| ())
    }

    /// Sends a request that is answered with messages (a `GET` of one object) and
    /// collects them until its ACK.
    pub fn request(&mut self, msg: P::Message) -> io::Result<Vec<P::Message>> {
        let seq = self.send(msg, NLM_F_REQUEST | NLM_F_ACK)?;
        self.receive(seq)
    }

    /// Sends a request that removes something and waits for its ACK; returns whether it
    /// existed (`absent` is the errno the kernel answers when it did not).
    pub fn execute_if_present(&mut self, msg: P::Message, absent: i32) -> io::Result<bool> {
        match self.execute(msg, 0) {
            Ok(()) => Ok(true),
            Err(e) if e.raw_os_error() == Some(absent) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Sends a dump request and collects every message of the answer.
    pub fn dump(&mut self, msg: P::Message) -> io::Result<Vec<P::Message>> {
        let seq = self.send(msg, NLM_F_REQUEST | NLM_F_DUMP)?;
        self.receive(seq)
    }

    /// Sends `msgs` (each with its flags) in one datagram, as nftables takes a batch
    /// (begin, the changes, end), and waits for the acknowledgement of every message
    /// that asks for one (`NLM_F_ACK`). The first error wins: the kernel aborts the
    /// whole batch then, so nothing more is waited for.
    pub fn batch(&mut self, msgs: impl IntoIterator<Item = (P::Message, u16)>) -> io::Result<()> {
        self.batch_checked(msgs).map_err(|f| f.error)
    }

    /// [`batch`](Self::batch), saying which message failed: the kernel answers each
    /// message of a batch in order, so the first error is the first message that
    /// failed (later ones may only fail because of it). An error about the batch's
    /// first message is one of the batch as a whole: nfnetlink reports a failed
    /// commit there.
    pub fn batch_checked(&mut self, msgs: impl IntoIterator<Item = (P::Message, u16)>) -> Result<(), BatchFailure> {
        let unplaced = |error| BatchFailure { message: None, error };
        let mut out = Vec::new();
        let mut seqs = Vec::new();
        let mut pending = Vec::new();
        for (msg, flags) in msgs {
            let seq = self.encode(msg, flags, &mut out);
            seqs.push(seq);
            if flags & NLM_F_ACK != 0 {
                pending.push(seq);
            }
        }
        if out.is_empty() {
            return Ok(());
        }
        self.make_room(out.len(), pending.len()).map_err(unplaced)?;
        self.sock.send(&out, 0).map_err(unplaced)?;
        while !pending.is_empty() {
            let n = self.sock.recv(&mut &mut self.buf[..], 0).map_err(unplaced)?;
            let mut off = 0;
            let mut first_error = None;
            while off < n {
                let msg = decode::<P>(&self.buf[off..n]).map_err(unplaced)?;
                let len = msg.header.length as usize;
                off += if len == 0 { n } else { (len + 3) & !3 };
                if let NetlinkPayload::Error(e) = msg.payload {
                    let seq = msg.header.sequence_number;
                    pending.retain(|s| *s != seq);
                    if e.code.is_some() && first_error.is_none() {
                        first_error = Some(BatchFailure {
                            message: seqs.iter().position(|s| *s == seq),
                            error: e.to_io(),
                        });
                    }
                }
            }
            if let Some(e) = first_error {
                return Err(e);
            }
        }
        Ok(())
    }

    /// Grows the socket's buffers for a batch of `bytes` answered by `acks`
    /// acknowledgements, as `nft` does: the default send buffer refuses a datagram
    /// larger than itself (`EMSGSIZE`), and acknowledgements beyond the receive buffer
    /// are dropped (the read fails with `ENOBUFS` though the batch applied). Forcing
    /// the sizes needs `CAP_NET_ADMIN`, which changing nftables needs anyway.
    fn make_room(&mut self, bytes: usize, acks: usize) -> io::Result<()> {
        use nix::sys::socket::{getsockopt, setsockopt, sockopt};
        // Each acknowledgement costs a small buffer of its own in the kernel's account.
        const ACK_COST: usize = 2048;
        if bytes + 4096 > getsockopt(&self.sock, sockopt::SndBuf).map_err(io::Error::from)? {
            setsockopt(&self.sock, sockopt::SndBufForce, &(bytes + 4096)).map_err(io::Error::from)?;
        }
        if acks * ACK_COST > getsockopt(&self.sock, sockopt::RcvBuf).map_err(io::Error::from)? {
            setsockopt(&self.sock, sockopt::RcvBufForce, &(acks * ACK_COST)).map_err(io::Error::from)?;
        }
        Ok(())
    }

    /// Waits up to `timeout` for messages the kernel sends on its own (as NFLOG hands
    /// over logged packets) and returns those of the next datagram; none when the wait
    /// ends. Acknowledgements and errors are skipped.
    pub fn receive_unsolicited(&mut self, timeout: std::time::Duration) -> io::Result<Vec<P::Message>> {
        // Set only when it changes: a reader that waits the same each time (NFQUEUE's,
        // whose every packet waits for it) saves a system call per packet.
        if self.unsolicited_timeout != Some(timeout) {
            let tv = nix::sys::time::TimeVal::new(
                i64::try_from(timeout.as_secs()).unwrap_or(i64::MAX),
                i64::from(timeout.subsec_micros()),
            );
            nix::sys::socket::setsockopt(&self.sock, nix::sys::socket::sockopt::ReceiveTimeout, &tv)
                .map_err(io::Error::from)?;
            self.unsolicited_timeout = Some(timeout);
        }
        let n = match self.sock.recv(&mut &mut self.buf[..], 0) {
            Ok(n) => n,
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        let mut out = Vec::new();
        let mut off = 0;
        while off < n {
            let msg = decode::<P>(&self.buf[off..n])?;
            let len = msg.header.length as usize;
            off += if len == 0 { n } else { (len + 3) & !3 };
            if let NetlinkPayload::InnerMessage(m) = msg.payload {
                out.push(m);
            }
        }
        Ok(out)
    }
}

impl<P: Protocol> NetlinkSocket<P> {
    /// Joins multicast group `group` of the family (conntrack's events, say): the
    /// kernel sends the group's messages to this socket from now on.
    pub(crate) fn join_group(&mut self, group: u32) -> io::Result<()> {
        self.sock.add_membership(group)
    }

    /// Sets the socket's receive buffer to `bytes`, past the system's maximum
    /// (`SO_RCVBUFFORCE`, which needs `CAP_NET_ADMIN`): a burst of events beyond the
    /// buffer is dropped by the kernel and the next read fails with `ENOBUFS`.
    pub(crate) fn force_receive_buffer(&mut self, bytes: usize) -> io::Result<()> {
        use nix::sys::socket::{setsockopt, sockopt};
        setsockopt(&self.sock, sockopt::RcvBufForce, &bytes).map_err(io::Error::from)
    }

    /// The receive buffer the kernel granted (it doubles what was asked, for its
    /// bookkeeping).
    pub(crate) fn receive_buffer(&self) -> io::Result<usize> {
        use nix::sys::socket::{getsockopt, sockopt};
        getsockopt(&self.sock, sockopt::RcvBuf).map_err(io::Error::from)
    }

    /// Sets how long a read waits before it ends empty.
    pub(crate) fn set_receive_timeout(&mut self, timeout: std::time::Duration) -> io::Result<()> {
        let tv = nix::sys::time::TimeVal::new(
            i64::try_from(timeout.as_secs()).unwrap_or(i64::MAX),
            i64::from(timeout.subsec_micros()),
        );
        nix::sys::socket::setsockopt(&self.sock, nix::sys::socket::sockopt::ReceiveTimeout, &tv)
            .map_err(io::Error::from)
    }

    /// Reads the next datagram into the socket's buffer and returns it; empty when the
    /// receive timeout passed first (or at once, when `wait` is false and nothing is
    /// queued). Nothing is decoded or copied: a reader of many small messages
    /// (conntrack events) walks them in place.
    pub(crate) fn receive_datagram(&mut self, wait: bool) -> io::Result<&[u8]> {
        let flags = if wait { 0 } else { libc::MSG_DONTWAIT };
        match self.sock.recv(&mut &mut self.buf[..], flags) {
            Ok(n) => Ok(&self.buf[..n]),
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => Ok(&[]),
            Err(e) => Err(e),
        }
    }
}

/// A failed [`NetlinkSocket::batch_checked`]: the kernel's error and, when the kernel
/// named one, the index of the message it is about.
#[derive(Debug)]
pub struct BatchFailure {
    /// The index in the batch of the message that failed; `None` when the batch
    /// could not be sent or its answers read.
    pub message: Option<usize>,
    /// The error.
    pub error: io::Error,
}

fn decode<P: Protocol>(buf: &[u8]) -> io::Result<NetlinkMessage<P::Message>> {
    NetlinkMessage::<P::Message>::deserialize(buf)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("decoding netlink reply: {e}")))
}
