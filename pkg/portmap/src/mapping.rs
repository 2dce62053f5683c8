//! A host port mapping.

use std::fmt;
use std::net::IpAddr;

/// A transport protocol a host port can carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Protocol {
    /// TCP.
    Tcp,
    /// UDP.
    Udp,
    /// SCTP.
    Sctp,
}

impl Protocol {
    /// The IP protocol number.
    pub fn number(self) -> u8 {
        match self {
            Protocol::Tcp => 6,
            Protocol::Udp => 17,
            Protocol::Sctp => 132,
        }
    }

    /// The lowercase name (`tcp`, `udp`, `sctp`), as nft and the store spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
            Protocol::Sctp => "sctp",
        }
    }

    /// Parses a protocol name in any case.
    pub fn parse(s: &str) -> Option<Self> {
        match s.to_ascii_lowercase().as_str() {
            "tcp" => Some(Protocol::Tcp),
            "udp" => Some(Protocol::Udp),
            "sctp" => Some(Protocol::Sctp),
            _ => None,
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One host port: traffic to `host_ip:host_port/protocol` on the node goes to
/// `container_ip:container_port`. `host_ip` `None` means every local address of the
/// container address's family.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HostPort {
    /// The node address the port is bound to, `None` for all.
    pub host_ip: Option<IpAddr>,
    /// The port on the node.
    pub host_port: u16,
    /// The transport protocol.
    pub protocol: Protocol,
    /// The pod's address.
    pub container_ip: IpAddr,
    /// The port in the pod.
    pub container_port: u16,
}

impl HostPort {
    /// Whether this is an IPv6 mapping.
    pub fn is_v6(&self) -> bool {
        self.container_ip.is_ipv6()
    }

    /// The map the mapping's element lives in.
    pub fn map(&self) -> &'static str {
        match (self.is_v6(), self.host_ip.is_some()) {
            (false, true) => "hostports_v4",
            (false, false) => "hostports_v4_any",
            (true, true) => "hostports_v6",
            (true, false) => "hostports_v6_any",
        }
    }
}

impl fmt::Display for HostPort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let host = self.host_ip.map_or_else(
            || {
                if self.is_v6() {
                    "[::]".to_string()
                } else {
                    "0.0.0.0".to_string()
                }
            },
            |ip| match ip {
                IpAddr::V6(v6) => format!("[{v6}]"),
                IpAddr::V4(v4) => v4.to_string(),
            },
        );
        let pod = match self.container_ip {
            IpAddr::V6(v6) => format!("[{v6}]"),
            IpAddr::V4(v4) => v4.to_string(),
        };
        write!(
            f,
            "{host}:{}/{} -> {pod}:{}",
            self.host_port, self.protocol, self.container_port
        )
    }
}

/// A pod that is the target of host ports, by its host-side interface and address:
/// traffic the pod sends to its own host port comes back to it from its own address
/// unless it is masqueraded, so such "hairpin" traffic (arriving on this interface,
/// translated to this address) is.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Hairpin {
    /// The pod's host-side interface.
    pub ifname: String,
    /// One of the pod's addresses.
    pub addr: IpAddr,
}

impl Hairpin {
    /// The set the element lives in.
    pub fn set(&self) -> &'static str {
        if self.addr.is_ipv6() {
            "hairpin_v6"
        } else {
            "hairpin_v4"
        }
    }
}

/// Everything of the table's elements that one pod (or the whole node) accounts for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Entries {
    /// Host port map elements.
    pub ports: Vec<HostPort>,
    /// Hairpin set elements.
    pub hairpins: Vec<Hairpin>,
}

impl Entries {
    /// Whether there is nothing.
    pub fn is_empty(&self) -> bool {
        self.ports.is_empty() && self.hairpins.is_empty()
    }
}
