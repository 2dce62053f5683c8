//! A link detour: how weftd emulates a link (delay, loss, ...) on a veth or VXLAN end
//! when the kernel has no `netem`. What the pod sends on the end is steered, by a tc
//! program on the end's egress, out of a second veth pair whose node side weftd reads
//! through a packet socket; weftd delays, drops or corrupts each frame as the link's
//! settings say and writes it back, and a tc program on the pair's pod side marks it
//! and sends it out of the end it came from, where the steering program lets a marked
//! frame through. The end itself is not touched: the pod keeps its interface, its
//! addresses and its carrier, and removing the detour restores the direct path.
//!
//! ```text
//!   pod:  [stack] -> e1 egress --steer--> wd<id> ==veth==> wh<id> (node) -> weftd
//!         e1 egress <--hand back, marked-- wd<id> <==veth== wh<id> <- weftd
//! ```
//!
//! The pair's pod side has no address and no IPv6 (it sends nothing of its own); the
//! pair lives as long as the pod or until the detour is removed.

use std::path::Path;

use netlink_packet_core::{NLM_F_CREATE, NLM_F_EXCL, NLM_F_REPLACE};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_packet_route::tc::{TcAttribute, TcBpfFlags, TcFilterBpfOption, TcHandle, TcMessage, TcOption};
use std::os::fd::{AsRawFd, OwnedFd};

use crate::netlink::{NewLink, VethPair};
use crate::packet::{self, PacketSocket};
use crate::{KernelError, NetNs, Netlink, bpf, in_netns, sysctl, wire};

/// MTU of both sides of the pair: the largest a veth takes, so a frame of any end
/// (whatever its MTU) fits through.
const DETOUR_MTU: u32 = 65535;
/// Priority of weft's filters on the clsact hooks.
const FILTER_PRIO: u16 = 1;
/// Handle of weft's filters.
const FILTER_HANDLE: u16 = 1;

/// Name of the detour's side in the pod, for wire end `id` (within `IFNAMSIZ`).
pub fn pod_side_name(id: u64) -> String {
    format!("wd{:013x}", id & ((1 << 52) - 1))
}

/// Name of the detour's side in the node, for wire end `id`.
pub fn node_side_name(id: u64) -> String {
    format!("wh{:013x}", id & ((1 << 52) - 1))
}

/// A locally administered MAC for a side of the detour (`side` 0: pod, 1: node).
fn side_mac(id: u64, side: u8) -> [u8; 6] {
    let b = id.to_be_bytes();
    [0x06, 0x78 | side, b[4], b[5], b[6], b[7]]
}

fn os(step: &str) -> impl FnOnce(std::io::Error) -> KernelError + '_ {
    move |e| KernelError::os(step, e)
}

/// Puts the detour of wire end `id` in place on interface `intf` of `pod`, taking over
/// a pair an earlier run left and loading its programs afresh (they carry interface
/// indexes, which change when an end is rebuilt). Returns false when `intf` does not
/// exist. The caller starts weftd's reader on [`open`] before or right after: until it
/// runs, what the pod sends on `intf` is lost.
pub fn create(pod: &NetNs, intf: &str, id: u64) -> Result<bool, KernelError> {
    let mut in_pod = wire::socket_in(pod)?;
    let Some(end) = wire::find(&mut in_pod, intf)? else {
        return Ok(false);
    };
    let (pod_side, node_side) = (pod_side_name(id), node_side_name(id));
    let mut node = Netlink::new().map_err(os("opening netlink"))?;
    let whole = node
        .link_by_name(&node_side)
        .map_err(os("looking up a detour"))?
        .is_some()
        && wire::find(&mut in_pod, &pod_side)?.is_some();
    if !whole {
        let _ = node.delete_link(&node_side);
        let _ = in_pod.delete_link(&pod_side);
        build_pair(pod, &mut node, &mut in_pod, id)?;
    }
    let detour = wire::find(&mut in_pod, &pod_side)?
        .ok_or_else(|| KernelError::os(pod_side.clone(), std::io::Error::from_raw_os_error(libc::ENODEV)))?;
    // The way back first, so no frame steered away finds it missing.
    let back = bpf::load_sched_cls(&bpf::hand_back(end.index), "weft_hand_back")
        .map_err(os("loading the detour's hand-back program"))?;
    in_pod
        .add_clsact(detour.index)
        .map_err(os("adding clsact to the detour"))?;
    in_pod
        .attach_bpf(detour.index, false, &back, "weft_hand_back")
        .map_err(os("attaching the detour's hand-back program"))?;
    let steer = bpf::load_sched_cls(&bpf::steer(detour.index), "weft_steer")
        .map_err(os("loading the detour's steering program"))?;
    in_pod
        .add_clsact(end.index)
        .map_err(|e| KernelError::os(format!("adding clsact to {intf}"), e))?;
    in_pod
        .attach_bpf(end.index, true, &steer, "weft_steer")
        .map_err(|e| KernelError::os(format!("attaching the steering program to {intf}"), e))?;
    Ok(true)
}

/// Creates the pair of wire end `id`'s detour: the node side in the calling thread's
/// namespace, the pod side in `pod`, both up, without IPv6, offering
/// [`GSO_MAX`](packet::GSO_MAX).
fn build_pair(pod: &NetNs, node: &mut Netlink, in_pod: &mut Netlink, id: u64) -> Result<(), KernelError> {
    let (pod_side, node_side) = (pod_side_name(id), node_side_name(id));
    node.create_veth(&VethPair {
        local: NewLink {
            name: &node_side,
            mac: side_mac(id, 1),
            netns: None,
        },
        peer: NewLink {
            name: &pod_side,
            mac: side_mac(id, 0),
            netns: Some(pod.raw_fd()),
        },
        mtu: DETOUR_MTU,
        alias: Some("weft link detour"),
    })
    .map_err(os("creating a link detour's veth pair"))?;
    // Neither side may send frames of its own: they would reach the link.
    let path = format!("net/ipv6/conf/{pod_side}/disable_ipv6");
    if let Err(e) = in_netns(pod, || sysctl::write(&path, "1")) {
        tracing::debug!(pod_side, error = %e, "could not turn IPv6 off on a detour's pod side");
    }
    let done = packet::raise_pair(node, in_pod, &node_side, &pod_side, true, packet::NodeEndIpv6::PerEnd);
    if done.is_err() {
        let _ = node.delete_link(&node_side);
    }
    done
}

/// Removes the detour of wire end `id` from interface `intf` of the pod at `netns`
/// (what the pod sends goes straight out again); returns whether there was one. A pod
/// that is gone took its side with it; the node side is removed all the same.
pub fn remove(netns: &str, intf: &str, id: u64) -> Result<bool, KernelError> {
    if let Ok(ns) = NetNs::open(Path::new(netns)) {
        let mut in_pod = wire::socket_in(&ns)?;
        if let Some(end) = wire::find(&mut in_pod, intf)? {
            in_pod
                .detach_bpf(end.index, true)
                .map_err(|e| KernelError::os(format!("removing the steering program from {intf}"), e))?;
        }
    }
    let mut node = Netlink::new().map_err(os("opening netlink"))?;
    node.delete_link(&node_side_name(id))
        .map_err(os("removing a link detour"))
}

/// The wire ids (their low 52 bits, as the names keep them) of every detour whose node
/// side is in the calling thread's namespace.
pub fn list() -> Result<Vec<u64>, KernelError> {
    let mut node = Netlink::new().map_err(os("opening netlink"))?;
    Ok(node
        .links()
        .map_err(os("listing links"))?
        .into_iter()
        .filter_map(|l| l.name.strip_prefix("wh").and_then(|h| u64::from_str_radix(h, 16).ok()))
        .collect())
}

/// Opens weftd's packet socket on the node side of wire end `id`'s detour: a read
/// returns a frame the pod sent on the end, a write hands one back to go out of it.
pub fn open(id: u64) -> Result<PacketSocket, KernelError> {
    PacketSocket::open_named(&node_side_name(id))
}

fn filter_message(index: u32, egress: bool) -> TcMessage {
    let mut msg = TcMessage::default();
    msg.header.index = index as i32;
    msg.header.parent = TcHandle {
        major: 0xffff,
        minor: if egress {
            TcHandle::MIN_EGRESS
        } else {
            TcHandle::MIN_INGRESS
        },
    };
    msg.header.handle = TcHandle {
        major: 0,
        minor: FILTER_HANDLE,
    };
    // TC_H_MAKE(prio << 16, protocol): every protocol, in network order.
    msg.header.info = (u32::from(FILTER_PRIO) << 16) | u32::from((libc::ETH_P_ALL as u16).to_be());
    msg
}

impl Netlink {
    /// Adds the `clsact` qdisc to link `index` (kept when it has one).
    pub(crate) fn add_clsact(&mut self, index: u32) -> std::io::Result<()> {
        let mut msg = TcMessage::default();
        msg.header.index = index as i32;
        msg.header.parent = TcHandle::CLSACT;
        msg.header.handle = TcHandle {
            major: 0xffff,
            minor: 0,
        };
        msg.attributes = vec![TcAttribute::Kind("clsact".into())];
        match self.execute(RouteNetlinkMessage::NewQueueDiscipline(msg), NLM_F_CREATE | NLM_F_EXCL) {
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => Ok(()),
            other => other,
        }
    }

    /// Attaches (or replaces) weft's direct-action BPF filter `prog` on link `index`'s
    /// egress or ingress hook.
    pub(crate) fn attach_bpf(&mut self, index: u32, egress: bool, prog: &OwnedFd, name: &str) -> std::io::Result<()> {
        let mut msg = filter_message(index, egress);
        msg.attributes = vec![
            TcAttribute::Kind("bpf".into()),
            TcAttribute::Options(vec![
                TcOption::Bpf(TcFilterBpfOption::ProgFd(prog.as_raw_fd() as u32)),
                TcOption::Bpf(TcFilterBpfOption::ProgName(name.into())),
                TcOption::Bpf(TcFilterBpfOption::Flags(TcBpfFlags::DirectAction)),
            ]),
        ];
        self.execute(RouteNetlinkMessage::NewTrafficFilter(msg), NLM_F_CREATE | NLM_F_REPLACE)
    }

    /// Removes weft's BPF filter from link `index`'s egress or ingress hook; returns
    /// whether there was one.
    pub(crate) fn detach_bpf(&mut self, index: u32, egress: bool) -> std::io::Result<bool> {
        let mut msg = filter_message(index, egress);
        msg.attributes = vec![TcAttribute::Kind("bpf".into())];
        // No clsact at all answers EINVAL; no such filter, ENOENT.
        match self.execute_if_present(RouteNetlinkMessage::DelTrafficFilter(msg), libc::ENOENT) {
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(false),
            other => other,
        }
    }
}
