//! The probes behind a matrix: listeners made in each pod's namespace, and connections
//! and datagrams from each source, all at once.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, UdpSocket};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::socket::{
    Backlog, SockFlag, SockaddrIn, SockaddrIn6, SockaddrLike, bind, connect, getsockopt, listen, setsockopt, socket,
    sockopt,
};

use super::{Cell, Family, Port, Protocol};

/// How often an unanswered UDP probe is sent again within the timeout.
pub(super) const UDP_RESEND: Duration = Duration::from_millis(200);

/// UDP probes bind source ports from this range, a block per run (see
/// [`Lab::matrix`]); below Linux's ephemeral ports, so the kernel never hands one out.
pub(super) const PROBE_PORTS: std::ops::Range<u32> = 20000..32000;

/// A listening socket of one pod, port and family.
pub(super) enum Listener {
    /// TCP or SCTP: accepted connections are closed at once.
    Stream(TcpListener),
    /// UDP: every datagram is sent back.
    Datagram(UdpSocket),
}

impl Listener {
    fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        match self {
            Listener::Stream(l) => l.as_fd(),
            Listener::Datagram(s) => s.as_fd(),
        }
    }

    /// Handles what has come, without waiting.
    fn serve(&self, buf: &mut [u8]) {
        match self {
            // The handshake is done by the kernel before accept: accepting only keeps
            // the backlog from filling.
            Listener::Stream(l) => while l.accept().is_ok() {},
            Listener::Datagram(s) => {
                while let Ok((n, from)) = s.recv_from(buf) {
                    let _ = s.send_to(&buf[..n], from);
                }
            }
        }
    }
}

pub(super) fn wildcard(family: Family, port: u16) -> Box<dyn SockaddrLike> {
    match family {
        Family::V4 => Box::new(SockaddrIn::from(std::net::SocketAddrV4::new(
            Ipv4Addr::UNSPECIFIED,
            port,
        ))),
        Family::V6 => Box::new(SockaddrIn6::from(std::net::SocketAddrV6::new(
            Ipv6Addr::UNSPECIFIED,
            port,
            0,
            0,
        ))),
    }
}

pub(super) fn sockaddr(a: SocketAddr) -> Box<dyn SockaddrLike> {
    match a {
        SocketAddr::V4(a) => Box::new(SockaddrIn::from(a)),
        SocketAddr::V6(a) => Box::new(SockaddrIn6::from(a)),
    }
}

/// A socket of `protocol` and `family` in the calling thread's namespace.
pub(super) fn new_socket(protocol: Protocol, family: Family) -> Result<OwnedFd, Errno> {
    let (ty, proto) = protocol.socket();
    let fd = socket(
        family.address_family(),
        ty,
        SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
        proto,
    )?;
    if family == Family::V6 {
        setsockopt(&fd, sockopt::Ipv6V6Only, &true)?;
    }
    Ok(fd)
}

/// Opens every listener of one pod (run inside its namespace).
pub(super) fn open_listeners(ports: &[Port], families: &[Family]) -> Result<Vec<Listener>, String> {
    let mut out = Vec::new();
    for &port in ports {
        for &family in families {
            let what = format!("{port} {family}");
            let fd = new_socket(port.protocol, family).map_err(|e| format!("{what}: socket: {e}"))?;
            setsockopt(&fd, sockopt::ReuseAddr, &true).map_err(|e| format!("{what}: SO_REUSEADDR: {e}"))?;
            bind(fd.as_raw_fd(), wildcard(family, port.number).as_ref()).map_err(|e| match e {
                Errno::EADDRINUSE => format!("{what}: something in the pod listens on it already"),
                e => format!("{what}: bind: {e}"),
            })?;
            out.push(match port.protocol {
                Protocol::Udp => Listener::Datagram(UdpSocket::from(fd)),
                // std's accept is accept4 on any stream socket, SCTP's too.
                Protocol::Tcp | Protocol::Sctp => {
                    listen(&fd, Backlog::new(1024).map_err(|e| format!("{what}: {e}"))?)
                        .map_err(|e| format!("{what}: listen: {e}"))?;
                    Listener::Stream(TcpListener::from(fd))
                }
            });
        }
    }
    Ok(out)
}

/// Serves every listener until `stop` is set.
pub(super) fn serve(listeners: &[Listener], stop: &AtomicBool) {
    let mut buf = vec![0u8; 2048];
    while !stop.load(Ordering::Relaxed) {
        let mut fds: Vec<PollFd> = listeners
            .iter()
            .map(|l| PollFd::new(l.fd(), PollFlags::POLLIN))
            .collect();
        if poll(&mut fds, PollTimeout::from(20u16)).unwrap_or(0) <= 0 {
            continue;
        }
        let ready: Vec<bool> = fds.iter().map(|f| f.any().unwrap_or(false)).collect();
        drop(fds);
        for (l, r) in listeners.iter().zip(ready) {
            if r {
                l.serve(&mut buf);
            }
        }
    }
}

/// Sets the flag when dropped: the listeners' thread ends however probing ends.
pub(super) struct StopOnDrop<'a>(pub(super) &'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// One probe from a source pod.
pub(super) struct Probe {
    /// Where its result goes: (table, destination).
    pub(super) at: (usize, usize),
    pub(super) to: SocketAddr,
    pub(super) protocol: Protocol,
    /// The UDP source port to bind (0: any).
    pub(super) source_port: u16,
    pub(super) sockets: Vec<OwnedFd>,
    pub(super) last_send: Instant,
    pub(super) result: Option<Cell>,
}

pub(super) const TOKEN: &[u8] = b"weft-lab-matrix";

impl Probe {
    /// Starts an attempt: a connection, or a datagram on a new connected socket.
    fn attempt(&mut self) {
        let family = Family::of(&self.to.ip());
        let fd = match new_socket(self.protocol, family) {
            Ok(fd) => fd,
            Err(e) => return self.fail(format!("socket: {e}")),
        };
        if self.protocol == Protocol::Udp && self.source_port != 0 {
            // Should the port be taken in this pod, connect picks one, as for any socket.
            let _ = bind(fd.as_raw_fd(), wildcard(family, self.source_port).as_ref());
        }
        match connect(fd.as_raw_fd(), sockaddr(self.to).as_ref()) {
            Ok(()) | Err(Errno::EINPROGRESS) => {}
            Err(e) => return self.fail(connect_error(e, self.to)),
        }
        if self.protocol == Protocol::Udp {
            self.send(fd.as_raw_fd());
        }
        self.sockets.push(fd);
    }

    fn send(&mut self, fd: std::os::fd::RawFd) {
        self.last_send = Instant::now();
        match nix::sys::socket::send(fd, TOKEN, nix::sys::socket::MsgFlags::MSG_DONTWAIT) {
            Ok(_) | Err(Errno::EAGAIN) => {}
            // The ICMP error of an earlier datagram, reported on this send.
            Err(e) => self.fail(connect_error(e, self.to)),
        }
    }

    fn fail(&mut self, why: String) {
        self.result.get_or_insert(Cell::Error(why));
    }

    /// Handles what socket `k` reported.
    fn ready(&mut self, k: usize) {
        let fd = &self.sockets[k];
        if self.protocol == Protocol::Udp {
            let mut buf = [0u8; 64];
            match nix::sys::socket::recv(fd.as_raw_fd(), &mut buf, nix::sys::socket::MsgFlags::MSG_DONTWAIT) {
                Ok(n) if &buf[..n] == TOKEN => {
                    self.result.get_or_insert(Cell::Reachable);
                }
                Ok(_) | Err(Errno::EAGAIN) => {}
                Err(e) => self.fail(connect_error(e, self.to)),
            }
            return;
        }
        match getsockopt(fd, sockopt::SocketError) {
            Ok(0) => {
                self.result.get_or_insert(Cell::Reachable);
            }
            // The kernel gave up retrying: still unanswered.
            Ok(e) if e == Errno::ETIMEDOUT as i32 => {}
            Ok(e) => self.fail(connect_error(Errno::from_raw(e), self.to)),
            Err(e) => self.fail(format!("SO_ERROR: {e}")),
        }
    }
}

pub(super) fn connect_error(e: Errno, to: SocketAddr) -> String {
    match e {
        Errno::ECONNREFUSED => format!("refused by {to}: nothing listens there (the listener is gone?)"),
        Errno::ENETUNREACH => format!("no route to {to} from the source pod"),
        Errno::EHOSTUNREACH => format!("{to} is unreachable (no neighbour answered)"),
        e => format!("{to}: {e}"),
    }
}

/// Runs the probes of one source pod (inside its namespace) until each has an answer
/// or `timeout` has passed; TCP and SCTP get a second connection half-way (a first SYN
/// lost to something other than policy would otherwise wait out the kernel's 1 s
/// retransmission), UDP a new datagram every [`UDP_RESEND`].
pub(super) fn run_probes(probes: &mut [Probe], timeout: Duration) {
    let start = Instant::now();
    for p in probes.iter_mut() {
        p.attempt();
    }
    let mut retried = false;
    loop {
        let now = Instant::now();
        if now >= start + timeout || probes.iter().all(|p| p.result.is_some()) {
            break;
        }
        if !retried && now >= start + timeout / 2 {
            retried = true;
            for p in probes
                .iter_mut()
                .filter(|p| p.result.is_none() && p.protocol != Protocol::Udp)
            {
                p.attempt();
            }
        }
        for p in probes
            .iter_mut()
            .filter(|p| p.result.is_none() && p.protocol == Protocol::Udp)
        {
            if now >= p.last_send + UDP_RESEND
                && let Some(fd) = p.sockets.first().map(|f| f.as_raw_fd())
            {
                p.send(fd);
            }
        }
        let mut owners = Vec::new();
        let mut fds = Vec::new();
        for (i, p) in probes.iter().enumerate().filter(|(_, p)| p.result.is_none()) {
            let events = if p.protocol == Protocol::Udp {
                PollFlags::POLLIN
            } else {
                PollFlags::POLLOUT
            };
            for (k, s) in p.sockets.iter().enumerate() {
                fds.push(PollFd::new(s.as_fd(), events));
                owners.push((i, k));
            }
        }
        let left = (start + timeout)
            .saturating_duration_since(now)
            .min(Duration::from_millis(20));
        let wait = PollTimeout::from(left.as_millis().clamp(1, 20) as u16);
        if poll(&mut fds, wait).unwrap_or(0) <= 0 {
            continue;
        }
        let ready: Vec<(usize, usize)> = fds
            .iter()
            .zip(&owners)
            .filter(|(f, _)| f.any().unwrap_or(false))
            .map(|(_, o)| *o)
            .collect();
        drop(fds);
        for (i, k) in ready {
            if probes[i].result.is_none() {
                probes[i].ready(k);
            }
        }
    }
    for p in probes.iter_mut() {
        p.result.get_or_insert(Cell::Blocked);
        // Closed here, in the pod's namespace thread; a connection still pending
        // simply goes.
        p.sockets.clear();
    }
}
