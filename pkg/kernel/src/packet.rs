//! The kernel side of a gRPC wire end: a veth pair whose pod end is the link the pod
//! sees and whose node end weftd reads and writes as raw frames through an AF_PACKET
//! socket, with the virtio-net header so GSO super-frames cross the wire whole.
//!
//! Why a veth and not a TAP: a TAP cannot take GSO super-frames above 64 KiB, a veth
//! can (BIG TCP, Linux 6.3 and later for IPv4). Both ends offer [`GSO_MAX`], so a pod's
//! TCP hands the wire a quarter as many frames for the same bytes, and every per-frame
//! cost on the way (the reads and writes, the batches, the receiving pod's ACKs) falls
//! with it: in an AF_PACKET relay between two pods on this machine, 256 KiB frames
//! carried about twice what 64 KiB frames did. A receiving pod that forwards such a
//! frame onto a link with a smaller limit has the kernel segment it as usual.
//!
//! The pair lives as long as the pod's namespace: the pod keeps its link while weftd
//! restarts, and a new socket is bound to the node end, whose name derives from the
//! wire id. Written on libc directly: the packet-socket crates either lack the
//! virtio-net header or bring their own I/O model, while a wire needs only a
//! non-blocking descriptor for its own event loop. [`PacketSocket`] is that descriptor
//! with safe reads and writes, so the data plane needs no `unsafe` for its frames.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use bytes::{BufMut, BytesMut};

use crate::netlink::{Netlink, NewLink, VethPair};
use crate::{KernelError, NetNs, sysctl, wire};

/// Size of the virtio-net header in front of every frame (`struct virtio_net_hdr`).
pub const VNET_HDR_LEN: usize = 10;

/// Largest GSO super-frame either end of the pair accepts (`gso_max_size` and
/// `gso_ipv4_max_size`). Half of what the kernel allows, so a frame never comes near
/// the limit on fragments a socket buffer can hold.
pub const GSO_MAX: u32 = 256 * 1024;

/// Room one read needs: a super-frame of [`GSO_MAX`], its link header and the
/// virtio-net header, with slack (a frame longer than the buffer would be cut short).
pub const MAX_FRAME: usize = GSO_MAX as usize + VNET_HDR_LEN + 256;

/// Frames one [`PacketSocket::write_many`] hands to the kernel at most.
pub const WRITE_BATCH: usize = 64;

/// Frames one [`PacketSocket::read_many`] takes from the kernel at most.
pub const READ_BATCH: usize = 32;

/// A frame up to this long (virtio-net header included: an Ethernet frame of an MTU
/// up to 2,024 bytes) that [`PacketSocket::read_many`] takes after the first of a batch
/// costs one copy of its own bytes; a longer one two (see there).
pub const READ_SLOT: usize = 2048;

/// Kernel buffer of the socket in each direction: frames wait here while the wire's
/// thread is busy. Bounded, as everything on a wire is: beyond it frames are dropped
/// and the pod's TCP backs off, as on a full link.
const SOCKET_BUFFER: libc::c_int = 8 << 20;

// From <linux/if_packet.h>; not in the libc crate for every target.
const PACKET_VNET_HDR: libc::c_int = 15;
const PACKET_QDISC_BYPASS: libc::c_int = 20;
const PACKET_IGNORE_OUTGOING: libc::c_int = 23;

/// Name of the node end of wire end `id` (15 characters, within `IFNAMSIZ`).
pub fn node_end_name(id: u64) -> String {
    format!("wg{:013x}", id & ((1 << 52) - 1))
}

/// A locally administered, unicast MAC for a node end, from its wire id: never one a
/// pod's frame is addressed to, so the node's own stack drops what it sees there.
fn node_end_mac(id: u64) -> [u8; 6] {
    let b = id.to_be_bytes();
    [0x06, 0x77, b[4], b[5], b[6], b[7]]
}

fn os(step: &str) -> impl FnOnce(std::io::Error) -> KernelError + '_ {
    move |e| KernelError::os(step, e)
}

/// How a node end gets IPv6 off: by its namespace's default (a shard's, set when it is
/// made) or on the end itself. Each look at `/proc/sys/net` costs the more, the more
/// namespaces have looked there (the kernel keeps one `net` entry per namespace in one
/// hash chain, walked under one lock): a read took 7 µs on a bare host and 150 µs once
/// 1,500 namespaces had read a sysctl. An end made where the default is off already
/// need not be looked at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeEndIpv6 {
    /// The namespace turns IPv6 off for every new interface (a shard): nothing per end.
    OffByDefault,
    /// Turned off on the end itself, where the namespace's default may be on.
    PerEnd,
}

/// Creates the pair for wire end `id`: the pod end `name` inside `pod` (with `mac` and
/// `mtu`, left down for the caller to configure), the node end in the calling thread's
/// namespace, up, without IPv6 (turned off as `ipv6` says), both offering [`GSO_MAX`].
/// Whatever was created is removed again when a later step fails. A name that exists
/// already is `InterfaceExists`.
pub fn create(pod: &NetNs, name: &str, mac: [u8; 6], mtu: u32, id: u64, ipv6: NodeEndIpv6) -> Result<(), KernelError> {
    let node_end = node_end_name(id);
    let mut node = Netlink::new().map_err(os("opening netlink"))?;
    node.create_veth(&VethPair {
        local: NewLink {
            name: &node_end,
            mac: node_end_mac(id),
            netns: None,
        },
        peer: NewLink {
            name,
            mac,
            netns: Some(pod.raw_fd()),
        },
        mtu,
        alias: Some("weft gRPC wire end"),
    })
    .map_err(|e| {
        if e.raw_os_error() == Some(libc::EEXIST) {
            KernelError::InterfaceExists {
                ifname: format!("{name} or {node_end}"),
            }
        } else {
            KernelError::os("creating the gRPC wire end's veth pair", e)
        }
    })?;
    let done =
        wire::socket_in(pod).and_then(|mut in_pod| raise_pair(&mut node, &mut in_pod, &node_end, name, false, ipv6));
    if done.is_err() {
        let _ = node.delete_link(&node_end);
    }
    done
}

/// Finishes a pair whose node end `node_end` is in `node`'s namespace and whose other
/// end `pod_end` is in `in_pod`'s: IPv6 off on the node end as `ipv6` says (router
/// solicitations or MLD of the node's own stack have no business in a pod's link),
/// [`GSO_MAX`] on both ends, the pod end up when `pod_up` says so, the node end up
/// without ARP.
pub(crate) fn raise_pair(
    node: &mut Netlink,
    in_pod: &mut Netlink,
    node_end: &str,
    pod_end: &str,
    pod_up: bool,
    ipv6: NodeEndIpv6,
) -> Result<(), KernelError> {
    if ipv6 == NodeEndIpv6::PerEnd
        && let Err(e) = sysctl::ensure(&format!("net/ipv6/conf/{node_end}/disable_ipv6"), "1")
    {
        tracing::debug!(node_end, error = %e, "could not turn IPv6 off on a node end");
    }
    let missing = |name: &str| KernelError::os(name.to_string(), std::io::Error::from_raw_os_error(libc::ENODEV));
    let link = node
        .link_by_name(node_end)
        .map_err(os("looking up the node end"))?
        .ok_or_else(|| missing(node_end))?;
    let pod_link = wire::find(in_pod, pod_end)?.ok_or_else(|| missing(pod_end))?;
    // Kernels before 6.3 refuse BIG TCP for IPv4; the pair then carries 64 KiB
    // super-frames, as a TAP would.
    if let Err(e) = node
        .set_gso_max_size(link.index, GSO_MAX)
        .and_then(|()| in_pod.set_gso_max_size(pod_link.index, GSO_MAX))
    {
        tracing::info!(node_end, error = %e, "a node end without BIG TCP: super-frames stay at 64 KiB");
    }
    if pod_up {
        in_pod
            .set_up(pod_link.index, true)
            .map_err(os("setting the pod end up"))?;
    }
    node.set_up_without_arp(link.index)
        .map_err(os("setting the node end up"))
}

/// Whether the node end of wire end `id` exists in the calling thread's namespace.
pub fn exists(id: u64) -> Result<bool, KernelError> {
    let mut node = Netlink::new().map_err(os("opening netlink"))?;
    Ok(node
        .link_by_name(&node_end_name(id))
        .map_err(os("looking up the node end"))?
        .is_some())
}

/// Sets the node end of wire end `id` up or down: down drops the carrier of the pod end
/// (`NO-CARRIER`) while the pod keeps its interface up. Returns whether it exists.
pub fn set_node_end_up(id: u64, up: bool) -> Result<bool, KernelError> {
    let mut node = Netlink::new().map_err(os("opening netlink"))?;
    crate::wire::set_state(&mut node, &node_end_name(id), up)
}

/// Removes the node end of wire end `id` (and so the pair); returns whether it existed.
pub fn remove(id: u64) -> Result<bool, KernelError> {
    let mut node = Netlink::new().map_err(os("opening netlink"))?;
    node.delete_link(&node_end_name(id))
        .map_err(os("removing the node end"))
}

/// How many namespaces [`NodeEnds::Shards`] spreads a node's ends over unless told
/// otherwise (weftd's `--wire-ends-shards`).
pub const DEFAULT_SHARDS: u64 = 16;

/// The most shard namespaces a node may spread its ends over.
pub const MAX_SHARDS: u64 = 1024;

/// Where the node ends of a node's gRPC wire ends live.
///
/// Why it matters at scale: the kernel tells every packet socket of a namespace of every
/// interface event there (`packet_notifier`), under the RTNL lock. With every node end
/// (and its socket) in the node's own namespace, each end created costs a walk over all
/// the node's ends, and every pod's interface on the node a walk as well: bringing up a
/// lab grows with the square of its links. Spread over `count` namespaces of their
/// own, an event in the node's namespace walks no socket and one in a shard a
/// `count`th of them: the walks still grow with the square of the ends, divided by
/// `count`, so a node with more ends wants more shards.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum NodeEnds {
    /// In the calling thread's namespace (weftd's: the node's).
    #[default]
    Here,
    /// In the named namespaces `<prefix>0` to `<prefix>{count - 1}` under `/run/netns`,
    /// end `id` in `<prefix>{id % count}`, each made when first needed (IPv6 off by
    /// default in it) and kept across restarts: a pair lives as long as both its
    /// namespaces, so the shards outlive weftd as its pods do. Removing them is the
    /// installer's business ([`NodeEnds::delete_shards`]).
    ///
    /// `count` must stay the same while the ends exist: under another count an end is
    /// looked for in another shard, not found, and built again (its pod sees the link
    /// go down and up once); the old pair goes with the pod end it replaces.
    Shards {
        /// The namespaces' common prefix.
        prefix: String,
        /// How many namespaces (at least 1).
        count: u64,
    },
}

impl NodeEnds {
    /// How the node ends made here get IPv6 off: by a shard's default, or each on its own
    /// in the caller's namespace.
    pub fn ipv6(&self) -> NodeEndIpv6 {
        match self {
            NodeEnds::Here => NodeEndIpv6::PerEnd,
            NodeEnds::Shards { .. } => NodeEndIpv6::OffByDefault,
        }
    }

    /// The name of the namespace end `id`'s node end lives in, when not the caller's.
    pub fn shard_of(&self, id: u64) -> Option<String> {
        match self {
            NodeEnds::Here => None,
            NodeEnds::Shards { prefix, count } => Some(format!("{prefix}{}", id % (*count).max(1))),
        }
    }

    /// Runs `f` where end `id`'s node end lives: on the calling thread, or on a thread
    /// inside its shard (made first when missing).
    pub fn within<R: Send>(
        &self,
        id: u64,
        f: impl FnOnce() -> Result<R, KernelError> + Send,
    ) -> Result<R, KernelError> {
        match self.shard_of(id) {
            None => f(),
            Some(name) => crate::in_netns(&shard(&name)?, f),
        }
    }

    /// Sets the node end of wire end `id` up or down (see [`set_node_end_up`]).
    pub fn set_up(&self, id: u64, up: bool) -> Result<bool, KernelError> {
        self.within(id, || set_node_end_up(id, up))
    }

    /// Opens the packet socket of wire end `id` (see [`PacketSocket::open`]); it keeps
    /// working from any thread.
    pub fn open(&self, id: u64) -> Result<PacketSocket, KernelError> {
        self.within(id, || PacketSocket::open(id))
    }

    /// Deletes every shard namespace (the pairs in them go with their pods' ends):
    /// every `<prefix><number>` under `/run/netns`, so that shards made under an
    /// earlier count go too; nothing to do for [`NodeEnds::Here`].
    pub fn delete_shards(&self) -> Result<(), KernelError> {
        let NodeEnds::Shards { prefix, .. } = self else {
            return Ok(());
        };
        let entries = match std::fs::read_dir(crate::netns::RUN_DIR) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(KernelError::os(format!("listing {}", crate::netns::RUN_DIR), e)),
        };
        let shards: Vec<String> = entries
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|name| is_shard_of(prefix, name))
            .collect();
        shards.iter().try_for_each(|name| crate::delete_named(name))
    }
}

/// Whether namespace `name` is a shard of `prefix`: the prefix, then a number (so that
/// node `n1`'s prefix `lab-n1-e` does not take node `n10`'s `lab-n10-e0`).
fn is_shard_of(prefix: &str, name: &str) -> bool {
    name.strip_prefix(prefix)
        .is_some_and(|k| !k.is_empty() && k.bytes().all(|b| b.is_ascii_digit()))
}

/// The shard namespace `name`, made when missing.
fn shard(name: &str) -> Result<NetNs, KernelError> {
    let path = std::path::Path::new(crate::netns::RUN_DIR).join(name);
    if let Ok(ns) = NetNs::open(&path) {
        return Ok(ns);
    }
    // One maker at a time: two passes needing the same new shard make it once.
    static MAKING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _making = MAKING.lock().unwrap_or_else(|e| e.into_inner());
    if let Ok(ns) = NetNs::open(&path) {
        return Ok(ns);
    }
    // A file left by a start that died before mounting it is replaced.
    crate::delete_named(name)?;
    crate::create_named(name, || {
        // Router solicitations or MLD of a node end have no business in a pod's link:
        // no end made here gets IPv6 (a kernel without IPv6 has nothing to turn off).
        if let Err(e) = sysctl::write("net/ipv6/conf/default/disable_ipv6", "1") {
            tracing::debug!(shard = name, error = %e, "could not turn IPv6 off in a shard");
        }
        Ok(())
    })?;
    NetNs::open(&path)
}

fn setsockopt(
    fd: &OwnedFd,
    level: libc::c_int,
    opt: libc::c_int,
    value: libc::c_int,
    what: &str,
) -> Result<(), KernelError> {
    set_int_option(fd, level, opt, value).map_err(|e| KernelError::os(what.to_string(), e))
}

/// Sets an integer socket option (what every option of a packet socket here is).
pub(crate) fn set_int_option(fd: &OwnedFd, level: libc::c_int, opt: libc::c_int, value: libc::c_int) -> io::Result<()> {
    // SAFETY: the option value is a live c_int of the size passed.
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            opt,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r < 0 { Err(io::Error::last_os_error()) } else { Ok(()) }
}

/// Binds packet socket `fd` to every protocol on interface `index`: from then on it
/// sees that interface's frames only.
pub(crate) fn bind_to_interface(fd: &OwnedFd, index: u32) -> io::Result<()> {
    // SAFETY: sockaddr_ll is plain data; all-zeros is a valid start.
    let mut sa: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    sa.sll_family = libc::AF_PACKET as libc::c_ushort;
    sa.sll_protocol = (libc::ETH_P_ALL as u16).to_be();
    sa.sll_ifindex = index as libc::c_int;
    // SAFETY: binding to a live sockaddr_ll of the size passed.
    let r = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&sa as *const libc::sockaddr_ll).cast(),
            std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
        )
    };
    if r < 0 { Err(io::Error::last_os_error()) } else { Ok(()) }
}

/// Opens the packet socket of wire end `id` (see [`PacketSocket::open`]).
pub fn open(id: u64) -> Result<PacketSocket, KernelError> {
    PacketSocket::open(id)
}

/// Opens a non-blocking packet socket on interface `node_end` (in the calling thread's
/// namespace; the node end of a wire end or of a link detour): a read returns one
/// frame the pod sent, behind its virtio-net header; a write hands one frame, behind
/// its header, to the pod.
fn open_fd(node_end: &str) -> Result<OwnedFd, KernelError> {
    let node_end = node_end.to_string();
    let cname = std::ffi::CString::new(node_end.clone()).expect("no NUL in a generated name");
    // SAFETY: if_nametoindex reads a NUL-terminated string that outlives the call.
    let index = unsafe { libc::if_nametoindex(cname.as_ptr()) };
    if index == 0 {
        return Err(KernelError::os(
            format!("node end {node_end}"),
            std::io::Error::last_os_error(),
        ));
    }
    // Protocol 0 until bound: a socket opened for ETH_P_ALL would see every interface's
    // frames until `bind` narrows it to this one.
    // SAFETY: plain socket(2); the descriptor is owned right below.
    let raw = unsafe {
        libc::socket(
            libc::AF_PACKET,
            libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    };
    if raw < 0 {
        return Err(KernelError::os(
            "opening a packet socket",
            std::io::Error::last_os_error(),
        ));
    }
    // SAFETY: `raw` is a fresh descriptor nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    setsockopt(&fd, libc::SOL_PACKET, PACKET_VNET_HDR, 1, "PACKET_VNET_HDR")?;
    // Frames go straight to the veth: a qdisc on a point-to-point end only adds a queue.
    setsockopt(&fd, libc::SOL_PACKET, PACKET_QDISC_BYPASS, 1, "PACKET_QDISC_BYPASS")?;
    // What goes out of the node end into the pod is not the pod's to send back.
    setsockopt(
        &fd,
        libc::SOL_PACKET,
        PACKET_IGNORE_OUTGOING,
        1,
        "PACKET_IGNORE_OUTGOING",
    )?;
    setsockopt(
        &fd,
        libc::SOL_SOCKET,
        libc::SO_RCVBUFFORCE,
        SOCKET_BUFFER,
        "SO_RCVBUFFORCE",
    )?;
    setsockopt(
        &fd,
        libc::SOL_SOCKET,
        libc::SO_SNDBUFFORCE,
        SOCKET_BUFFER,
        "SO_SNDBUFFORCE",
    )?;
    bind_to_interface(&fd, index).map_err(|e| KernelError::os(format!("binding to node end {node_end}"), e))?;
    Ok(fd)
}

/// The non-blocking packet socket on the node end of one gRPC wire end: each read
/// returns one frame the pod sent and each write hands one frame to the pod, both
/// behind the virtio-net header ([`VNET_HDR_LEN`]). It owns its descriptor, closed on
/// drop, and lends it out ([`AsFd`], [`AsRawFd`]) so an event loop can wait on it.
#[derive(Debug)]
pub struct PacketSocket {
    fd: OwnedFd,
}

impl PacketSocket {
    /// Opens the socket on the node end of wire end `id`, in the calling thread's
    /// namespace; the pair must exist ([`create`]).
    pub fn open(id: u64) -> Result<Self, KernelError> {
        Self::open_named(&node_end_name(id))
    }

    /// Opens the socket on node-side interface `node_end` (see [`open`](Self::open)).
    pub(crate) fn open_named(node_end: &str) -> Result<Self, KernelError> {
        open_fd(node_end).map(|fd| Self { fd })
    }

    /// Reads one frame into `buf`: its length, or `WouldBlock` when none waits. A frame
    /// longer than `buf` is cut short, so `buf` should hold [`MAX_FRAME`].
    pub fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        // SAFETY: the kernel writes at most `buf.len()` bytes into a live buffer.
        let n = unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        usize::try_from(n).map_err(|_| io::Error::last_os_error())
    }

    /// Reads one frame into the spare room of `buf` (at most [`MAX_FRAME`] bytes, and
    /// no more than the room there is) and advances `buf` past it, without first
    /// zeroing the room: the frame path reads into one large buffer it splits frames
    /// off, and zeroing a quarter of a megabyte per frame would cost more than the read.
    /// Returns the frame's length, or `WouldBlock` when none waits.
    pub fn read_buf(&self, buf: &mut impl BufMut) -> io::Result<usize> {
        let room = buf.chunk_mut();
        let len = room.len().min(MAX_FRAME);
        // SAFETY: the kernel writes at most `len` bytes, all within the spare room.
        let n = unsafe { libc::read(self.fd.as_raw_fd(), room.as_mut_ptr().cast(), len) };
        let n = usize::try_from(n).map_err(|_| io::Error::last_os_error())?;
        // SAFETY: the kernel initialised the first `n` bytes (`n <= len`) of the room.
        unsafe { buf.advance_mut(n) };
        Ok(n)
    }

    /// Reads up to `max` frames (at most [`READ_BATCH`]) with one `recvmmsg` and appends
    /// them to `buf`, one behind the other, pushing each one's length to `lens`: how
    /// many were read, or `WouldBlock` when none waits.
    ///
    /// Why the scratch `room`: every frame of a batch needs room for a super-frame
    /// ([`MAX_FRAME`]) before the kernel says how long it is. The first is read straight
    /// into `buf`, as [`read_buf`](Self::read_buf) does; each later one into a
    /// [`READ_SLOT`] of `room`, with the rest of a super-frame's room in `room`'s
    /// overflow, and then copied behind the first. A small frame is so copied once more
    /// than by `read_buf` (a few dozen bytes, against a system call saved), a
    /// super-frame twice: callers read one frame at a time while frames are large.
    pub fn read_many(
        &self,
        buf: &mut BytesMut,
        room: &mut ReadRoom,
        max: usize,
        lens: &mut Vec<usize>,
    ) -> io::Result<usize> {
        let n = max.clamp(1, READ_BATCH);
        if buf.capacity() - buf.len() < MAX_FRAME {
            buf.reserve(MAX_FRAME);
        }
        let first = buf.spare_capacity_mut();
        let tail = MAX_FRAME - READ_SLOT;
        let mut iov = [libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        }; 2 * READ_BATCH];
        iov[0] = libc::iovec {
            iov_base: first.as_mut_ptr().cast(),
            iov_len: first.len().min(MAX_FRAME),
        };
        let slots = room.slots.as_mut_ptr();
        let overflow = room.overflow.as_mut_ptr();
        for i in 1..n {
            // Slot i and overflow i lie within `room`'s two buffers, which are
            // READ_BATCH - 1 slots and overflows long: the kernel writes only there.
            iov[2 * i] = libc::iovec {
                iov_base: slots.wrapping_add((i - 1) * READ_SLOT).cast(),
                iov_len: READ_SLOT,
            };
            iov[2 * i + 1] = libc::iovec {
                iov_base: overflow.wrapping_add((i - 1) * tail).cast(),
                iov_len: tail,
            };
        }
        // SAFETY: mmsghdr is plain data; all-zeros is a valid start (no name, no
        // control data).
        let mut msgs: [libc::mmsghdr; READ_BATCH] = unsafe { std::mem::zeroed() };
        msgs[0].msg_hdr.msg_iov = &mut iov[0];
        msgs[0].msg_hdr.msg_iovlen = 1;
        for (i, m) in msgs.iter_mut().enumerate().take(n).skip(1) {
            m.msg_hdr.msg_iov = &mut iov[2 * i];
            m.msg_hdr.msg_iovlen = 2;
        }
        // SAFETY: `msgs[..n]` point at `iov`, whose entries cover the spare room of
        // `buf` and `room`'s buffers, all outliving the call; the kernel writes at most
        // each iovec's length into its buffer. The socket is non-blocking, so the call
        // returns what waits (or EAGAIN) instead of waiting for `n` frames.
        let got = unsafe {
            libc::recvmmsg(
                self.fd.as_raw_fd(),
                msgs.as_mut_ptr(),
                n as libc::c_uint,
                0,
                std::ptr::null_mut(),
            )
        };
        let got = usize::try_from(got).map_err(|_| io::Error::last_os_error())?;
        if got == 0 {
            return Ok(0);
        }
        let len0 = (msgs[0].msg_len as usize).min(iov[0].iov_len);
        // SAFETY: the kernel initialised the first frame's bytes at the start of the
        // spare room.
        unsafe { buf.advance_mut(len0) };
        lens.push(len0);
        let more: usize = msgs[1..got].iter().map(|m| m.msg_len as usize).sum();
        buf.reserve(more);
        for (i, m) in msgs.iter().enumerate().take(got).skip(1) {
            let len = (m.msg_len as usize).min(MAX_FRAME);
            let slot = &room.slots[(i - 1) * READ_SLOT..i * READ_SLOT];
            buf.extend_from_slice(&slot[..len.min(READ_SLOT)]);
            if len > READ_SLOT {
                buf.extend_from_slice(&room.overflow[(i - 1) * tail..][..len - READ_SLOT]);
            }
            lens.push(len);
        }
        Ok(got)
    }

    /// Writes the first of `frames` (each behind its virtio-net header) to the pod and
    /// as many after it as one `sendmmsg` takes (at most [`WRITE_BATCH`]): how many
    /// went, in order, or the error of the first (no room, `WouldBlock`; the end gone).
    /// One system call for a burst of small frames instead of one each.
    pub fn write_many(&self, frames: &[&[u8]]) -> io::Result<usize> {
        let n = frames.len().min(WRITE_BATCH);
        if n == 0 {
            return Ok(0);
        }
        let mut iov: [libc::iovec; WRITE_BATCH] = [libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        }; WRITE_BATCH];
        // SAFETY: mmsghdr is plain data; all-zeros is a valid start (no name, no
        // control data).
        let mut msgs: [libc::mmsghdr; WRITE_BATCH] = unsafe { std::mem::zeroed() };
        for i in 0..n {
            iov[i] = libc::iovec {
                iov_base: frames[i].as_ptr() as *mut libc::c_void,
                iov_len: frames[i].len(),
            };
            msgs[i].msg_hdr.msg_iov = &mut iov[i];
            msgs[i].msg_hdr.msg_iovlen = 1;
        }
        // SAFETY: `msgs[..n]` point at `iov[..n]`, which point at the live frames, all
        // outliving the call; the kernel only reads them.
        let sent = unsafe { libc::sendmmsg(self.fd.as_raw_fd(), msgs.as_mut_ptr(), n as libc::c_uint, 0) };
        usize::try_from(sent).map_err(|_| io::Error::last_os_error())
    }

    /// Frames the kernel dropped since the last call because the socket's buffer was
    /// full (`PACKET_STATISTICS`, which the call resets).
    pub fn take_drops(&self) -> io::Result<u64> {
        // SAFETY: tpacket_stats is plain data; all-zeros is a valid start.
        let mut stats: libc::tpacket_stats = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::tpacket_stats>() as libc::socklen_t;
        // SAFETY: the kernel writes at most `len` bytes into the live struct.
        let r = unsafe {
            libc::getsockopt(
                self.fd.as_raw_fd(),
                libc::SOL_PACKET,
                libc::PACKET_STATISTICS,
                (&mut stats as *mut libc::tpacket_stats).cast(),
                &mut len,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(u64::from(stats.tp_drops))
    }

    /// Writes one frame (behind its virtio-net header) to the pod: the bytes taken, or
    /// an error when the socket has no room (`WouldBlock`) or the end is gone.
    pub fn write(&self, frame: &[u8]) -> io::Result<usize> {
        // SAFETY: the kernel reads at most `frame.len()` bytes from a live buffer.
        let n = unsafe { libc::write(self.fd.as_raw_fd(), frame.as_ptr().cast(), frame.len()) };
        usize::try_from(n).map_err(|_| io::Error::last_os_error())
    }
}

/// Scratch room for [`PacketSocket::read_many`]: a [`READ_SLOT`] for every frame of a
/// batch after the first, and beside each the rest of a super-frame's room. Meant to be
/// kept, one per thread that reads, rather than made per read: the overflow is some
/// 8 MiB of address space, of which only what super-frames read in batches ever wrote
/// takes memory (it is served by `mmap`, untouched pages cost nothing).
pub struct ReadRoom {
    slots: Vec<u8>,
    overflow: Vec<u8>,
}

impl ReadRoom {
    /// Room for batches of up to [`READ_BATCH`] frames.
    pub fn new() -> Self {
        Self {
            slots: vec![0; (READ_BATCH - 1) * READ_SLOT],
            overflow: vec![0; (READ_BATCH - 1) * (MAX_FRAME - READ_SLOT)],
        }
    }
}

impl Default for ReadRoom {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for ReadRoom {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadRoom").field("frames", &READ_BATCH).finish()
    }
}

impl PacketSocket {
    /// Registers the socket with the reactor of the tokio runtime the caller has
    /// entered (the one its reader will run on), for reading and writing.
    pub fn into_async(self) -> io::Result<tokio::io::unix::AsyncFd<PacketSocket>> {
        // SAFETY: the AsyncFd owns the socket, and so its descriptor, for its whole
        // life; a PacketSocket never replaces its descriptor, so it always lends the
        // same one, which nothing else can close.
        unsafe { tokio::io::unix::AsyncFd::register(self) }.map_err(io::Error::from)
    }
}

impl AsFd for PacketSocket {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl AsRawFd for PacketSocket {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl From<PacketSocket> for OwnedFd {
    fn from(s: PacketSocket) -> OwnedFd {
        s.fd
    }
}

/// Tunes glibc's allocator for the frame path; weftd's `main` calls it once, before
/// any wire carries frames. Frames move through buffers of 64 KiB to 1 MiB (pod-end
/// reads, encoded batches, HTTP/2 reads) that live for microseconds. glibc serves such
/// sizes from `mmap`, or gives the top of the heap back once 128 KiB-2 MiB are free, so
/// many came back as fresh pages: 30-40 thousand page faults a second in the receiving
/// daemon at 4 Gbit/s, about a fifth of its CPU in faulting, zeroing and unmapping.
/// Serving blocks below 4 MiB from the heap and trimming only past 16 MiB free keeps
/// them warm (a gigabyte then cost both daemons about a third less CPU); what a burst
/// leaves free is bounded by the trim threshold. Does nothing on other C libraries.
pub fn tune_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets allocator parameters; it is thread-safe.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 4 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 16 << 20);
    }
}

#[cfg(test)]
mod tests;
