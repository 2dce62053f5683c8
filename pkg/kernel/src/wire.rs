//! The kernel side of wires (point-to-point links between pods): a veth pair between
//! two pods of this node, a VXLAN end living in a pod with its socket on the node's
//! underlay, the unicast FDB and neighbour entries a VXLAN end needs, and the per-end
//! operations (configure, state, counters, removal) run through a netlink socket
//! opened inside the pod's namespace.

use std::net::IpAddr;

use crate::netlink::{LinkStats, NewLink, VethPair, VxlanDevice};
use crate::{KernelError, Link, NetNs, Netlink, in_netns};

/// UDP port of weft's VXLAN ends (the IANA VXLAN port).
pub const VXLAN_PORT: u16 = 4789;

fn os(step: &str) -> impl FnOnce(std::io::Error) -> KernelError + '_ {
    move |e| KernelError::os(step, e)
}

/// A netlink socket inside `ns`, usable from the calling thread.
pub fn socket_in(ns: &NetNs) -> Result<Netlink, KernelError> {
    in_netns(ns, || {
        Netlink::new().map_err(|e| KernelError::os("opening netlink in the pod", e))
    })
}

/// One end of a wire inside a pod: the pod's namespace, the interface's name and MAC.
#[derive(Debug, Clone, Copy)]
pub struct PodEnd<'a> {
    /// The pod's network namespace.
    pub pod: &'a NetNs,
    /// The interface name inside it.
    pub name: &'a str,
    /// Its MAC address.
    pub mac: [u8; 6],
}

impl<'a> PodEnd<'a> {
    fn link(&self) -> NewLink<'a> {
        NewLink {
            name: self.name,
            mac: self.mac,
            netns: Some(self.pod.raw_fd()),
        }
    }
}

/// Creates a veth pair straight between two pods of this node, `a` and `b`, both ends
/// with `mtu`. A name that exists already in either pod is `InterfaceExists`.
pub fn veth_between(a: PodEnd<'_>, b: PodEnd<'_>, mtu: u32) -> Result<(), KernelError> {
    let mut node = Netlink::new().map_err(os("opening netlink"))?;
    node.create_veth(&VethPair {
        local: a.link(),
        peer: b.link(),
        mtu,
        alias: None,
    })
    .map_err(|e| {
        if e.raw_os_error() == Some(libc::EEXIST) {
            KernelError::InterfaceExists {
                ifname: format!("{} or {}", a.name, b.name),
            }
        } else {
            KernelError::os("creating the wire's veth pair", e)
        }
    })
}

/// Creates a VXLAN end (VNI `vni`) inside its pod; its UDP socket stays in the calling
/// thread's namespace, bound to the node's address `local`.
pub fn vxlan_into(end: PodEnd<'_>, vni: u32, local: IpAddr, mtu: u32) -> Result<(), KernelError> {
    let mut node = Netlink::new().map_err(os("opening netlink"))?;
    node.create_vxlan(&VxlanDevice {
        link: end.link(),
        vni,
        local,
        port: VXLAN_PORT,
        mtu,
        udp_csum: false,
    })
    .map_err(|e| {
        if e.raw_os_error() == Some(libc::EEXIST) {
            KernelError::InterfaceExists {
                ifname: end.name.to_string(),
            }
        } else {
            KernelError::os(format!("creating VXLAN end {} (VNI {vni})", end.name), e)
        }
    })
}

/// Looks up an end inside a pod.
pub fn find(pod: &mut Netlink, name: &str) -> Result<Option<Link>, KernelError> {
    pod.link_by_name(name).map_err(os("looking up the wire end"))
}

/// Gives an end its MAC, MTU and address and sets it up or down.
pub fn configure(
    pod: &mut Netlink,
    name: &str,
    mac: [u8; 6],
    mtu: u32,
    address: Option<(IpAddr, u8)>,
    up: bool,
) -> Result<(), KernelError> {
    let link = find(pod, name)?.ok_or_else(|| {
        KernelError::os(
            format!("wire end {name}"),
            std::io::Error::from_raw_os_error(libc::ENODEV),
        )
    })?;
    if link.mac != mac {
        pod.set_mac(link.index, mac).map_err(os("setting the wire end's MAC"))?;
    }
    if link.mtu != mtu {
        pod.set_mtu(link.index, mtu).map_err(os("setting the wire end's MTU"))?;
    }
    if let Some((ip, prefix)) = address {
        let have = pod
            .addresses(link.index)
            .map_err(os("listing the wire end's addresses"))?;
        if !have.contains(&(ip, prefix)) {
            pod.add_address(link.index, ip, prefix)
                .map_err(os("adding the wire end's address"))?;
        }
    }
    if link.up != up {
        pod.set_up(link.index, up).map_err(os("setting the wire end's state"))?;
    }
    Ok(())
}

/// Points a VXLAN end at its peer: every frame (the all-zeros FDB entry) and the peer's
/// MAC go unicast to the peer node's VTEP `vtep`, and the peer's address resolves to
/// its MAC without ARP, so the underlay never needs broadcast or multicast.
pub fn point_vxlan(
    pod: &mut Netlink,
    name: &str,
    vtep: IpAddr,
    peer_mac: [u8; 6],
    peer_ip: Option<IpAddr>,
) -> Result<(), KernelError> {
    let link = find(pod, name)?.ok_or_else(|| {
        KernelError::os(
            format!("VXLAN end {name}"),
            std::io::Error::from_raw_os_error(libc::ENODEV),
        )
    })?;
    pod.set_fdb(link.index, [0; 6], vtep)
        .map_err(os("setting the VXLAN default FDB entry"))?;
    pod.set_fdb(link.index, peer_mac, vtep)
        .map_err(os("setting the VXLAN peer FDB entry"))?;
    if let Some(ip) = peer_ip {
        pod.set_neighbour(link.index, ip, peer_mac)
            .map_err(os("setting the peer's neighbour entry"))?;
    }
    Ok(())
}

/// One FDB entry of a VXLAN end: frames for this MAC go to this VTEP.
pub type FdbEntry = ([u8; 6], IpAddr);

/// The FDB entries of the VXLAN end `name`; `None` when it does not exist.
pub fn vxlan_fdb(pod: &mut Netlink, name: &str) -> Result<Option<Vec<FdbEntry>>, KernelError> {
    let Some(link) = find(pod, name)? else { return Ok(None) };
    Ok(Some(pod.fdb(link.index).map_err(os("listing FDB entries"))?))
}

/// The VTEP every frame of a VXLAN end goes to (its all-zeros FDB entry), if set.
pub fn vxlan_vtep(pod: &mut Netlink, name: &str) -> Result<Option<IpAddr>, KernelError> {
    let Some(link) = find(pod, name)? else { return Ok(None) };
    Ok(pod
        .fdb(link.index)
        .map_err(os("listing FDB entries"))?
        .into_iter()
        .find(|(m, _)| *m == [0; 6])
        .map(|(_, d)| d))
}

/// Sets an end up or down; returns whether it exists.
pub fn set_state(pod: &mut Netlink, name: &str, up: bool) -> Result<bool, KernelError> {
    match find(pod, name)? {
        Some(l) => {
            if l.up != up {
                pod.set_up(l.index, up).map_err(os("setting the wire end's state"))?;
            }
            Ok(true)
        }
        None => Ok(false),
    }
}

/// An end's counters; `None` when it does not exist.
pub fn stats(pod: &mut Netlink, name: &str) -> Result<Option<(Link, LinkStats)>, KernelError> {
    pod.stats(name).map_err(os("reading the wire end's counters"))
}

/// Removes an end; returns whether it existed.
pub fn remove(pod: &mut Netlink, name: &str) -> Result<bool, KernelError> {
    pod.delete_link(name).map_err(os("removing the wire end"))
}

/// What became of an emulation asked of an end's root qdisc.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Emulated {
    /// In force (or removed, when none was asked).
    Applied,
    /// The end does not exist.
    NoSuchEnd,
    /// The kernel has no qdisc for it (no netem): weftd must carry the end's frames
    /// itself (see [`crate::detour`]). Whatever weft's qdisc the end had is removed.
    Unsupported,
}

/// Applies `netem` to what an end sends (`None`: removes weft's netem, leaving the
/// device's default qdisc). On a kernel without netem, an impairment that is only a
/// rate is applied with a token bucket instead, and any other is `Unsupported`.
pub fn set_netem(pod: &mut Netlink, name: &str, netem: Option<&crate::Netem>) -> Result<Emulated, KernelError> {
    let Some(link) = find(pod, name)? else {
        return Ok(Emulated::NoSuchEnd);
    };
    let clear = |pod: &mut Netlink| {
        pod.clear_netem(link.index)
            .map_err(|e| KernelError::os(format!("removing netem from wire end {name}"), e))
    };
    let Some(n) = netem else {
        clear(pod)?;
        return Ok(Emulated::Applied);
    };
    match pod.set_netem(link.index, n) {
        Ok(()) => Ok(Emulated::Applied),
        // The kernel answers a qdisc kind it does not know with ENOENT.
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
            let only_rate = n.rate_bytes > 0 && crate::Netem { rate_bytes: 0, ..*n } == crate::Netem::default();
            if only_rate {
                pod.set_tbf(link.index, &crate::Tbf::for_rate(n.rate_bytes))
                    .map_err(|e| KernelError::os(format!("setting tbf on wire end {name}"), e))?;
                return Ok(Emulated::Applied);
            }
            clear(pod)?;
            Ok(Emulated::Unsupported)
        }
        Err(e) => Err(KernelError::os(format!("setting netem on wire end {name}"), e)),
    }
}

/// Drops (or restores) an end's carrier by intent, keeping it administratively up;
/// returns whether the end exists.
pub fn set_proto_down(pod: &mut Netlink, name: &str, down: bool) -> Result<bool, KernelError> {
    let Some(link) = find(pod, name)? else { return Ok(false) };
    pod.set_proto_down(link.index, down)
        .map_err(|e| KernelError::os(format!("setting protodown on wire end {name}"), e))?;
    Ok(true)
}
