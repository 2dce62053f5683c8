//! Denied flows, explained: the first packet of a flow a group chain denied (or would
//! have, in audit mode) comes back from the kernel through NFLOG with the group's name
//! in its prefix; here it becomes an event naming both ends (pods as `namespace/name`,
//! or addresses), the port and protocol, the direction and the policies that isolate
//! the pod, none of which allowed it. Events are rate-limited per flow, kept in a ring
//! for `weftctl policy denies`, and handed to followers.

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::sync::broadcast;

use crate::model::Direction;

/// A flow as its first packet shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Flow {
    /// Source address.
    pub src: IpAddr,
    /// Destination address.
    pub dst: IpAddr,
    /// IP protocol number.
    pub protocol: u8,
    /// Destination port (TCP, UDP, SCTP).
    pub port: Option<u16>,
}

/// Reads the addresses, protocol and destination port of a packet's head (from its
/// network header on).
pub fn flow_of(packet: &[u8]) -> Option<Flow> {
    let version = packet.first()? >> 4;
    let (src, dst, protocol, l4) = match version {
        4 => {
            let ihl = usize::from(packet.first()? & 0x0f) * 4;
            let a: [u8; 4] = packet.get(12..16)?.try_into().ok()?;
            let b: [u8; 4] = packet.get(16..20)?.try_into().ok()?;
            (
                IpAddr::V4(Ipv4Addr::from(a)),
                IpAddr::V4(Ipv4Addr::from(b)),
                *packet.get(9)?,
                ihl,
            )
        }
        6 => {
            let a: [u8; 16] = packet.get(8..24)?.try_into().ok()?;
            let b: [u8; 16] = packet.get(24..40)?.try_into().ok()?;
            (
                IpAddr::V6(Ipv6Addr::from(a)),
                IpAddr::V6(Ipv6Addr::from(b)),
                *packet.get(6)?,
                40,
            )
        }
        _ => return None,
    };
    let port = match protocol {
        6 | 17 | 132 => packet.get(l4 + 2..l4 + 4).map(|p| u16::from_be_bytes([p[0], p[1]])),
        _ => None,
    };
    Some(Flow {
        src,
        dst,
        protocol,
        port,
    })
}

/// The name of IP protocol `n` as events show it.
pub fn protocol_name(n: u8) -> String {
    match n {
        1 => "icmp".into(),
        6 => "tcp".into(),
        17 => "udp".into(),
        58 => "icmpv6".into(),
        132 => "sctp".into(),
        other => other.to_string(),
    }
}

/// A denied (or, in audit mode, would-be denied) flow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DenyEvent {
    /// When it was seen (Unix ms).
    pub at_ms: i64,
    /// The direction that denied it.
    pub direction: Direction,
    /// Whether it was only audited (forwarded).
    pub audit: bool,
    /// The source: `namespace/name` of a pod, or its address.
    pub src: String,
    /// The destination, alike.
    pub dst: String,
    /// The flow.
    pub flow: Flow,
    /// The policies isolating the pod that denied it (`namespace/name`); none of their
    /// rules allowed the flow.
    pub policies: Vec<String>,
}

/// How often one flow is reported at most.
pub const PER_FLOW: Duration = Duration::from_secs(10);

/// How many events are kept for `weftctl policy denies`.
pub const KEPT: usize = 1024;

/// The recent denies, rate-limited per flow.
pub struct DenyLog {
    recent: Mutex<VecDeque<DenyEvent>>,
    /// When each flow was last reported, by flow, direction and whether it was audited
    /// (a flow denied, then audited once the namespace changed mode, is news).
    last: Mutex<HashMap<(Flow, Direction, bool), Instant>>,
    tx: broadcast::Sender<DenyEvent>,
}

impl Default for DenyLog {
    fn default() -> Self {
        Self {
            recent: Mutex::default(),
            last: Mutex::default(),
            tx: broadcast::channel(256).0,
        }
    }
}

impl DenyLog {
    /// Keeps `ev` unless its flow was reported within [`PER_FLOW`]; whether it was kept.
    pub fn record(&self, ev: DenyEvent) -> bool {
        let now = Instant::now();
        {
            let mut last = self.last.lock().expect("deny log lock");
            let key = (ev.flow, ev.direction, ev.audit);
            if last.get(&key).is_some_and(|t| now.duration_since(*t) < PER_FLOW) {
                return false;
            }
            if last.len() > 16 * KEPT {
                last.retain(|_, t| now.duration_since(*t) < PER_FLOW);
            }
            last.insert(key, now);
        }
        let mut recent = self.recent.lock().expect("deny log lock");
        if recent.len() == KEPT {
            recent.pop_front();
        }
        recent.push_back(ev.clone());
        let _ = self.tx.send(ev);
        true
    }

    /// The last `n` events, oldest first.
    pub fn recent(&self, n: usize) -> Vec<DenyEvent> {
        let r = self.recent.lock().expect("deny log lock");
        r.iter().skip(r.len().saturating_sub(n)).cloned().collect()
    }

    /// Every event from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<DenyEvent> {
        self.tx.subscribe()
    }
}

/// Now, in Unix milliseconds.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flows_read_from_ipv4_and_ipv6_heads() {
        let mut v4 = vec![0x45, 0, 0, 40, 0, 0, 0, 0, 64, 6, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2];
        v4.extend_from_slice(&[0x9c, 0x40, 0, 80]);
        assert_eq!(
            flow_of(&v4),
            Some(Flow {
                src: "10.0.0.1".parse().unwrap(),
                dst: "10.0.0.2".parse().unwrap(),
                protocol: 6,
                port: Some(80)
            })
        );
        let mut v6 = vec![0x60, 0, 0, 0, 0, 8, 17, 64];
        v6.extend_from_slice(&"fd00::1".parse::<Ipv6Addr>().unwrap().octets());
        v6.extend_from_slice(&"fd00::2".parse::<Ipv6Addr>().unwrap().octets());
        v6.extend_from_slice(&[0x9c, 0x40, 0, 53]);
        let f = flow_of(&v6).unwrap();
        assert_eq!((f.protocol, f.port), (17, Some(53)));
        assert_eq!(f.dst, "fd00::2".parse::<IpAddr>().unwrap());
        let icmp = [0x45, 0, 0, 28, 0, 0, 0, 0, 64, 1, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2, 8, 0];
        assert_eq!(flow_of(&icmp).unwrap().port, None);
        assert_eq!(flow_of(&[0x45, 0]), None);
    }

    #[test]
    fn one_flow_is_reported_once_per_window() {
        let log = DenyLog::default();
        let flow = Flow {
            src: "10.0.0.1".parse().unwrap(),
            dst: "10.0.0.2".parse().unwrap(),
            protocol: 6,
            port: Some(80),
        };
        let ev = |flow| DenyEvent {
            at_ms: 0,
            direction: Direction::Ingress,
            audit: false,
            src: "x/a".into(),
            dst: "x/b".into(),
            flow,
            policies: vec!["x/deny".into()],
        };
        let mut rx = log.subscribe();
        assert!(log.record(ev(flow)));
        assert!(!log.record(ev(flow)), "the same flow again");
        assert!(log.record(ev(Flow { port: Some(81), ..flow })));
        assert_eq!(log.recent(10).len(), 2);
        assert_eq!(rx.try_recv().unwrap().flow.port, Some(80));
    }
}
