//! ICMP echo from many namespaces at once, in this process: `lab check` at 1,500 links
//! and more. One `ping` process per probe (3,000 `ip netns exec ping` at once for 1,500
//! links, each re-run every 100 ms) starves a small machine of CPU until the window
//! passes and live links are reported dead; here each pod's namespace gets one raw
//! socket, every target of that pod is sent an echo at once, the unanswered ones again
//! every [`RESEND`] (the first echo of a link often only starts ARP, or a gRPC wire's
//! stream), and a bounded number of namespaces is worked on at a time.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::socket::{
    AddressFamily, MsgFlags, SockFlag, SockProtocol, SockType, SockaddrStorage, recvfrom, sendto, setsockopt, socket,
    sockopt,
};
use nix::sys::time::TimeVal;
use weft_harness::NamedNetns;

/// How long an unanswered echo waits before the next is sent to the same target.
pub const RESEND: Duration = Duration::from_millis(400);

/// How many namespaces are pinged from at the same time. Enough to keep the kernel and
/// the daemons busy, few enough that a 2-core machine is not swamped by the threads.
pub const PARALLEL_NAMESPACES: usize = 16;

/// What one probe found.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// The round-trip time of the echo that was answered, milliseconds.
    pub rtt_ms: Option<f64>,
    /// From the first echo to the answer (or until giving up), milliseconds.
    pub waited_ms: u64,
    /// How many echoes were sent.
    pub sent: u32,
    /// Why there was no answer (or `None`).
    pub reason: Option<String>,
}

/// At most this many targets share one socket's burst and sequence numbers.
const GROUP_MAX: usize = 1024;

/// Pings every `(namespace, address)` until it answers or `within` has passed since
/// its namespace's first echo; the outcomes in the order of `probes`. An address that
/// does not parse fails at once.
pub fn ping_all(probes: &[(String, String)], within: Duration) -> Vec<Outcome> {
    let out: Mutex<Vec<Option<Outcome>>> = Mutex::new(vec![None; probes.len()]);
    let mut parsed: Vec<IpAddr> = Vec::with_capacity(probes.len());
    let mut by_ns: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (i, (ns, addr)) in probes.iter().enumerate() {
        match addr.parse::<IpAddr>() {
            Ok(a) => {
                parsed.push(a);
                by_ns.entry(ns.as_str()).or_default().push(i);
            }
            Err(_) => {
                parsed.push(IpAddr::from([0, 0, 0, 0]));
                out.lock().expect("not poisoned")[i] = Some(Outcome {
                    rtt_ms: None,
                    waited_ms: 0,
                    sent: 0,
                    reason: Some(format!("{addr:?} is not an address")),
                });
            }
        }
    }
    let groups: Vec<(&str, Vec<usize>)> = by_ns
        .into_iter()
        .flat_map(|(ns, idx)| idx.chunks(GROUP_MAX).map(|c| (ns, c.to_vec())).collect::<Vec<_>>())
        .collect();
    let next = AtomicUsize::new(0);
    let workers = PARALLEL_NAMESPACES.min(groups.len()).max(1);
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| {
                loop {
                    let g = next.fetch_add(1, Ordering::Relaxed);
                    let Some((ns, idx)) = groups.get(g) else {
                        break;
                    };
                    let targets: Vec<IpAddr> = idx.iter().map(|&i| parsed[i]).collect();
                    // Echo ids tell this group's replies from any other's in the same
                    // namespace (a second `lab check` running at once).
                    let id = ((std::process::id() as usize).wrapping_mul(31).wrapping_add(g) & 0xffff) as u16;
                    let found = ping_group(ns, id, &targets, within);
                    let mut out = out.lock().expect("not poisoned");
                    for (k, &i) in idx.iter().enumerate() {
                        out[i] = Some(found[k].clone());
                    }
                }
            });
        }
    });
    out.into_inner()
        .expect("not poisoned")
        .into_iter()
        .map(|o| o.expect("every probe is in a group"))
        .collect()
}

fn failed_all(n: usize, reason: String) -> Vec<Outcome> {
    vec![
        Outcome {
            rtt_ms: None,
            waited_ms: 0,
            sent: 0,
            reason: Some(reason),
        };
        n
    ]
}

/// A raw ICMP (or ICMPv6) socket made inside namespace `ns`; it stays there wherever
/// it is used from.
fn raw_socket(ns: &str, v6: bool) -> Result<OwnedFd, String> {
    let netns = NamedNetns::existing(ns);
    if !NamedNetns::exists(ns) {
        return Err(format!("namespace {ns} does not exist"));
    }
    let (family, proto) = if v6 {
        (AddressFamily::Inet6, SockProtocol::IcmpV6)
    } else {
        (AddressFamily::Inet, SockProtocol::Icmp)
    };
    let fd = netns
        .within(|| socket(family, SockType::Raw, SockFlag::SOCK_CLOEXEC, proto))
        .map_err(|e| format!("entering {ns}: {e}"))?
        .map_err(|e| format!("raw ICMP socket in {ns}: {e}"))?;
    // A pod with hundreds of targets gets hundreds of replies at once: more than the
    // default receive buffer holds.
    let _ = setsockopt(&fd, sockopt::RcvBufForce, &(4 << 20));
    setsockopt(&fd, sockopt::ReceiveTimeout, &TimeVal::new(0, 10_000)).map_err(|e| format!("SO_RCVTIMEO: {e}"))?;
    Ok(fd)
}

fn checksum(data: &[u8]) -> u16 {
    let mut sum: u32 = data
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

fn echo(v6: bool, id: u16, seq: u16, stamp_us: u64) -> Vec<u8> {
    let mut p = vec![if v6 { 128 } else { 8 }, 0, 0, 0];
    p.extend(id.to_be_bytes());
    p.extend(seq.to_be_bytes());
    p.extend(stamp_us.to_be_bytes());
    p.extend(*b"weft-lab-check\0\0");
    if !v6 {
        // The kernel fills in ICMPv6's (it needs the pseudo-header); ICMP's is ours.
        let c = checksum(&p);
        p[2..4].copy_from_slice(&c.to_be_bytes());
    }
    p
}

/// An echo reply's (id, seq, stamp) from what a raw socket read: IPv4 sockets hand
/// over the IP header too, ICMPv6 ones only the message.
fn parse_reply(v6: bool, buf: &[u8]) -> Option<(u16, u16, u64)> {
    let icmp = if v6 {
        buf
    } else {
        let ihl = usize::from(buf.first()? & 0x0f) * 4;
        buf.get(ihl..)?
    };
    if icmp.len() < 16 || icmp[0] != if v6 { 129 } else { 0 } {
        return None;
    }
    Some((
        u16::from_be_bytes([icmp[4], icmp[5]]),
        u16::from_be_bytes([icmp[6], icmp[7]]),
        u64::from_be_bytes(icmp[8..16].try_into().ok()?),
    ))
}

fn ping_group(ns: &str, id: u16, targets: &[IpAddr], within: Duration) -> Vec<Outcome> {
    let mut sockets: [Option<OwnedFd>; 2] = [None, None];
    for v6 in [false, true] {
        if targets.iter().any(|t| t.is_ipv6() == v6) {
            match raw_socket(ns, v6) {
                Ok(fd) => sockets[usize::from(v6)] = Some(fd),
                Err(e) => return failed_all(targets.len(), e),
            }
        }
    }
    let start = Instant::now();
    let mut out: Vec<Outcome> = vec![
        Outcome {
            rtt_ms: None,
            waited_ms: 0,
            sent: 0,
            reason: None,
        };
        targets.len()
    ];
    let mut send_error: Vec<Option<String>> = vec![None; targets.len()];
    let mut left = targets.len();
    let mut buf = vec![0u8; 2048];
    while left > 0 && start.elapsed() < within {
        for (k, t) in targets.iter().enumerate() {
            if out[k].rtt_ms.is_some() {
                continue;
            }
            let fd = sockets[usize::from(t.is_ipv6())].as_ref().expect("made above");
            let stamp = start.elapsed().as_micros() as u64;
            let packet = echo(t.is_ipv6(), id, k as u16, stamp);
            let dest = SockaddrStorage::from(SocketAddr::new(*t, 0));
            out[k].sent += 1;
            match sendto(fd.as_raw_fd(), &packet, &dest, MsgFlags::MSG_DONTWAIT) {
                Ok(_) => send_error[k] = None,
                Err(e) => send_error[k] = Some(send_reason(e)),
            }
        }
        let round = Instant::now();
        while left > 0 && round.elapsed() < RESEND && start.elapsed() < within {
            for (v6, fd) in [false, true].into_iter().zip(&sockets) {
                let Some(fd) = fd else { continue };
                // Drain what has come; the socket's timeout paces the loop.
                while let Ok((n, _)) = recvfrom::<SockaddrStorage>(fd.as_raw_fd(), &mut buf) {
                    let Some((rid, seq, stamp)) = parse_reply(v6, &buf[..n]) else {
                        continue;
                    };
                    let k = usize::from(seq);
                    if rid != id || k >= targets.len() || targets[k].is_ipv6() != v6 || out[k].rtt_ms.is_some() {
                        continue;
                    }
                    let now = start.elapsed();
                    out[k].rtt_ms = Some((now.as_micros() as u64).saturating_sub(stamp) as f64 / 1000.0);
                    out[k].waited_ms = now.as_millis() as u64;
                    left -= 1;
                }
            }
        }
    }
    let waited = start.elapsed().as_millis() as u64;
    for (k, o) in out.iter_mut().enumerate() {
        if o.rtt_ms.is_none() {
            o.waited_ms = waited;
            o.reason = Some(match &send_error[k] {
                Some(e) => e.clone(),
                None => format!("no echo reply to {} echoes in {} ms", o.sent, waited),
            });
        }
    }
    out
}

fn send_reason(e: Errno) -> String {
    match e {
        Errno::ENETUNREACH => "no route to the peer address (interface missing or without its address)".into(),
        Errno::EHOSTUNREACH => "peer unreachable (no neighbour answer)".into(),
        Errno::EAGAIN => "send buffer full".into(),
        e => format!("sending the echo: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn echo_round_trips_through_the_parser() {
        let p = echo(true, 7, 9, 12345);
        let mut reply = p.clone();
        reply[0] = 129;
        assert_eq!(parse_reply(true, &reply), Some((7, 9, 12345)));
        let p4 = echo(false, 7, 9, 1);
        assert_eq!(checksum(&p4), 0, "a message with its checksum sums to zero");
        let mut ip = vec![0x45u8];
        ip.extend([0u8; 19]);
        let mut r = p4.clone();
        r[0] = 0;
        ip.extend(r);
        assert_eq!(parse_reply(false, &ip), Some((7, 9, 1)));
        assert_eq!(parse_reply(false, &ip[..20]), None);
    }
}
