//! Planning, without I/O: what a link needs from this node given where its peer runs,
//! who builds a shared piece, and the records, specs and messages an end is described
//! by. Every decision here is by name and place, never by timing, so two nodes (or two
//! pods of one node) reach the same answer on their own.

use std::collections::{BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::Arc;

use weft_kernel::wire::FdbEntry;
use weft_link::{DownBy, EndSettings, Impairment, LinkChange, LinkPhase, LinkStatus, LinkView, WireEnd, WireState};
use weft_rpc::wire::End;
use weft_topology::{Link, LinkKind, Topology, TopologyStatus};

use super::LocalPod;
use crate::convert;
use crate::ids::{derived_mac, derived_vni, parse_mac, wire_id};
use crate::kernel::{EndSpec, VxlanPeer};

/// A pod by (namespace, name).
pub type PodKey = (String, String);

/// The pods the daemon attached on this node, by pod. A persistent map: a pass takes
/// it whole at no cost, and an ADD during the pass changes only the path to its pod
/// rather than copying every pod of the node.
pub type Pods = imbl::OrdMap<PodKey, LocalPod>;

/// What a link needs from this node, given where its peer is.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Want {
    /// Peer on this node: a veth pair, built by `builder`.
    Veth { peer: LocalPod, builder: bool },
    /// Peer on another node.
    Remote { kind: LinkKind, node: IpAddr },
    /// Peer not up anywhere (or not yet known).
    Absent,
}

/// Decides what link `link` of pod `pod` needs from where its peer is: `pods` are this
/// node's (alive) pods, `topology` reads the cluster's topologies, `me` is this node's
/// address and `default_kind` carries links between nodes that name no kind.
pub(crate) fn want(
    me: IpAddr,
    default_kind: LinkKind,
    ns: &str,
    pod: &str,
    link: &Link,
    pods: &Pods,
    topology: impl Fn(&str, &str) -> Option<Arc<Topology>>,
) -> Want {
    let peer_key = (ns.to_string(), link.peer_pod.clone());
    if let Some(peer) = pods.get(&peer_key) {
        // The peer builds when it lists the link too and its name is lower.
        let peer_lists = topology(ns, &link.peer_pod).is_some_and(|t| t.spec.links.iter().any(|l| l.uid == link.uid));
        let builder = !peer_lists || pod < link.peer_pod.as_str();
        return Want::Veth {
            peer: peer.clone(),
            builder,
        };
    }
    let Some(peer_t) = topology(ns, &link.peer_pod) else {
        return Want::Absent;
    };
    let Some(st) = peer_t.status.as_ref().filter(|s| s.alive()) else {
        return Want::Absent;
    };
    let Ok(node) = st.src_ip.parse::<IpAddr>() else {
        return Want::Absent;
    };
    if node == me {
        // Says it runs here but this daemon has not attached it (yet, or any more).
        return Want::Absent;
    }
    // A link that names a same-node kind is carried the default way across nodes.
    let kind = link.kind.filter(|k| k.crosses_nodes()).unwrap_or(default_kind);
    Want::Remote { kind, node }
}

/// Which pods list a link to each pod: the reverse of the topologies' links, kept by
/// the run task as topologies come, change and go, so a pass finds the local pods
/// linked to a pod that moved in time of that pod's links, not of the node's pods.
#[derive(Debug, Default)]
pub(crate) struct Listers(HashMap<PodKey, BTreeSet<PodKey>>);

impl Listers {
    /// The index of `topologies`.
    #[cfg(test)]
    pub(crate) fn of<'a>(topologies: impl IntoIterator<Item = &'a Topology>) -> Self {
        let mut l = Listers::default();
        for t in topologies {
            l.add(&key_of(t), t);
        }
        l
    }

    /// Notes the links of `t`, pod `key`'s topology.
    pub(crate) fn add(&mut self, key: &PodKey, t: &Topology) {
        for l in &t.spec.links {
            self.0
                .entry((key.0.clone(), l.peer_pod.clone()))
                .or_default()
                .insert(key.clone());
        }
    }

    /// Forgets the links of `t`, pod `key`'s topology as it was.
    pub(crate) fn remove(&mut self, key: &PodKey, t: &Topology) {
        for l in &t.spec.links {
            let peer = (key.0.clone(), l.peer_pod.clone());
            if let Some(set) = self.0.get_mut(&peer) {
                set.remove(key);
                if set.is_empty() {
                    self.0.remove(&peer);
                }
            }
        }
    }

    /// The pods whose topology lists a link to `pod`.
    pub(crate) fn listing(&self, pod: &PodKey) -> impl Iterator<Item = &PodKey> {
        self.0.get(pod).into_iter().flatten()
    }
}

/// The local pods a pass must look at when the pods `seeds` moved (their topology,
/// their attachment, a peer node's word, their run-time settings): the seeds that run
/// here, the local pods listing a link to a seed (what they want depends on where it
/// is: `listers` says which), and the local pods a seed lists a link to (one of the
/// two builds their veth pair). Every other local pod's links stand as the last pass
/// left them, so a pass costs what moved, not what the node holds.
pub(crate) fn affected(
    pods: &Pods,
    seeds: &BTreeSet<PodKey>,
    topology: impl Fn(&str, &str) -> Option<Arc<Topology>>,
    listers: &Listers,
) -> BTreeSet<PodKey> {
    let mut out = BTreeSet::new();
    for seed @ (ns, name) in seeds {
        if pods.contains_key(seed) {
            out.insert(seed.clone());
        }
        out.extend(listers.listing(seed).filter(|k| pods.contains_key(*k)).cloned());
        for l in topology(ns, name).iter().flat_map(|t| t.spec.links.iter()) {
            let peer = (ns.clone(), l.peer_pod.clone());
            if pods.contains_key(&peer) {
                out.insert(peer);
            }
        }
    }
    out
}

/// Whether end `r` of this node is still asked for: its pod runs here and lists the
/// link, or (the far end of a veth pair) the pod at its other end runs here and lists
/// the link to it, so builds the pair for both.
pub(crate) fn end_wanted(r: &WireEnd, pods: &Pods, topology: impl Fn(&str, &str) -> Option<Arc<Topology>>) -> bool {
    let here = |pod: &str| pods.contains_key(&(r.namespace.clone(), pod.to_string()));
    let lists = |pod: &str, peer: Option<&str>| {
        topology(&r.namespace, pod).is_some_and(|t| {
            t.spec
                .links
                .iter()
                .any(|l| l.uid == r.link_uid && peer.is_none_or(|p| l.peer_pod == p))
        })
    };
    here(&r.local_pod) && (lists(&r.local_pod, None) || (here(&r.peer_pod) && lists(&r.peer_pod, Some(&r.local_pod))))
}

/// The pod end `r` belongs to.
pub(crate) fn owner(r: &WireEnd) -> PodKey {
    (r.namespace.clone(), r.local_pod.clone())
}

/// Whether `pod`'s node proposes the VNI of its VXLAN link to `peer_pod` (the other
/// node waits for the offer).
pub(crate) fn proposes(pod: &str, peer_pod: &str) -> bool {
    pod < peer_pod
}

/// The VNI a proposer offers first: the one its end holds, else the link's derived one.
pub(crate) fn first_vni(rec: Option<&WireEnd>, ns: &str, uid: i64) -> u32 {
    rec.and_then(|r| r.vni).unwrap_or_else(|| derived_vni(ns, uid))
}

/// The MTU of a VXLAN end whose underlay is `me`: the wire MTU less the encapsulation.
pub(crate) fn vxlan_mtu(mtu: u32, me: IpAddr) -> u32 {
    let overhead = if me.is_ipv6() { 70 } else { 50 };
    mtu.saturating_sub(overhead)
}

/// Whether a VXLAN end's FDB sends every frame and the peer's MAC to `node`.
pub(crate) fn fdb_points(fdb: &[FdbEntry], node: IpAddr, peer_mac: [u8; 6]) -> bool {
    fdb.contains(&([0; 6], node)) && fdb.contains(&(peer_mac, node))
}

/// An address given as a CIDR (`None` when empty or unreadable).
pub(crate) fn address(cidr: &str) -> Option<(IpAddr, u8)> {
    if cidr.is_empty() {
        return None;
    }
    let net: ipnet::IpNet = cidr.parse().ok()?;
    Some((net.addr(), net.prefix_len()))
}

/// The MAC of an interface: the one the topology gives, else the derived one.
pub(crate) fn mac_of(given: Option<&str>, namespace: &str, pod: &str, intf: &str) -> [u8; 6] {
    given
        .and_then(parse_mac)
        .unwrap_or_else(|| derived_mac(namespace, pod, intf))
}

/// The pod a topology belongs to.
pub(crate) fn key_of(t: &Topology) -> PodKey {
    (
        t.metadata.namespace.clone().unwrap_or_else(|| "default".into()),
        t.metadata.name.clone().unwrap_or_default(),
    )
}

/// The local end of `link` of pod `pod` (namespace `ns`, network namespace `netns`).
pub(crate) fn local_spec(ns: &str, pod: &str, netns: &str, link: &Link, mtu: u32) -> EndSpec {
    EndSpec {
        netns: netns.into(),
        intf: link.local_intf.clone(),
        mac: mac_of(link.local_mac.as_deref(), ns, pod, &link.local_intf),
        mtu,
        address: address(&link.local_ip),
    }
}

/// The peer end of a same-node `link`, in the peer pod's namespace `netns`.
pub(crate) fn peer_spec(ns: &str, netns: &str, link: &Link, mtu: u32) -> EndSpec {
    EndSpec {
        netns: netns.into(),
        intf: link.peer_intf.clone(),
        mac: mac_of(link.peer_mac.as_deref(), ns, &link.peer_pod, &link.peer_intf),
        mtu,
        address: address(&link.peer_ip),
    }
}

/// Where a VXLAN end of `link` points: the peer node and the peer end.
pub(crate) fn vxlan_peer(ns: &str, link: &Link, node: IpAddr) -> VxlanPeer {
    VxlanPeer {
        vtep: node,
        mac: mac_of(link.peer_mac.as_deref(), ns, &link.peer_pod, &link.peer_intf),
        ip: address(&link.peer_ip).map(|(a, _)| a),
    }
}

/// The record of pod `pod`'s end of `link`, up.
pub(crate) fn record(ns: &str, pod: &str, netns: &str, link: &Link, kind: LinkKind, peer_node: String) -> WireEnd {
    WireEnd {
        id: wire_id(ns, link.uid, pod),
        namespace: ns.into(),
        link_uid: link.uid,
        local_pod: pod.into(),
        local_intf: link.local_intf.clone(),
        peer_pod: link.peer_pod.clone(),
        peer_intf: link.peer_intf.clone(),
        peer_id: wire_id(ns, link.uid, &link.peer_pod),
        kind,
        peer_node,
        vni: None,
        netns: netns.into(),
        state: WireState::Up,
    }
}

/// The record of the other end of a veth pair whose first end is `ours`, in the peer
/// pod's namespace `netns`.
pub(crate) fn mirror(ours: &WireEnd, netns: &str) -> WireEnd {
    WireEnd {
        id: ours.peer_id,
        local_pod: ours.peer_pod.clone(),
        local_intf: ours.peer_intf.clone(),
        peer_pod: ours.local_pod.clone(),
        peer_intf: ours.local_intf.clone(),
        peer_id: ours.id,
        netns: netns.into(),
        ..ours.clone()
    }
}

/// The status a pod of this node should carry: where it runs and where its links stand
/// (what meshnet's `skipped` says is kept).
pub(crate) fn status_for(
    me: IpAddr,
    pod: &LocalPod,
    current: Option<&TopologyStatus>,
    links: Vec<LinkStatus>,
) -> TopologyStatus {
    TopologyStatus {
        src_ip: me.to_string(),
        net_ns: pod.netns.clone(),
        container_id: pod.container_id.clone(),
        skipped: current.map(|s| s.skipped.clone()).unwrap_or_default(),
        links,
    }
}

/// What a pass did about one link of a local pod, as far as its state goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Attempt {
    /// Brought where the plan says (or nothing was needed).
    Done,
    /// The peer pod runs nowhere the topologies say.
    PeerAbsent,
    /// Failed; `transient` when waiting on the peer's node rather than refused here.
    Failed { transient: bool, error: String },
}

/// Where link `link` of pod `pod` stands after a pass: `rec` is its end as recorded,
/// `attempt` what the pass did, `down` whether an operator took it down, `waiting`
/// what a recorded end that is not built yet waits for (its carrier says).
pub(crate) fn link_status(
    pod: &str,
    link: &Link,
    rec: Option<&WireEnd>,
    attempt: &Attempt,
    down: Option<DownBy>,
    waiting: &str,
) -> LinkStatus {
    let (state, reason) = match (attempt, rec) {
        (Attempt::Failed { transient: true, error }, _) => (LinkPhase::Pending, error.clone()),
        (
            Attempt::Failed {
                transient: false,
                error,
            },
            _,
        ) => (LinkPhase::Failed, error.clone()),
        (_, Some(_)) if down.is_some() => (
            LinkPhase::Down,
            match down {
                Some(DownBy::Named) => format!("taken down by an operator at {pod}:{}", link.local_intf),
                _ => format!("taken down by an operator at {}:{}", link.peer_pod, link.peer_intf),
            },
        ),
        (Attempt::PeerAbsent, _) => (
            LinkPhase::Pending,
            format!("peer pod {} is not running on any node yet", link.peer_pod),
        ),
        (Attempt::Done, None) => (
            LinkPhase::Pending,
            format!("waiting for pod {}'s side to build the link", link.peer_pod),
        ),
        (Attempt::Done, Some(r)) => match r.state {
            WireState::Up => (LinkPhase::Up, String::new()),
            WireState::Down => (
                LinkPhase::Pending,
                format!("peer pod {} went away; the end waits for it", link.peer_pod),
            ),
            WireState::Pending => (LinkPhase::Pending, waiting.to_string()),
        },
    };
    LinkStatus {
        uid: link.uid,
        local_intf: link.local_intf.clone(),
        peer_pod: link.peer_pod.clone(),
        peer_intf: link.peer_intf.clone(),
        state,
        reason,
    }
}

/// The `Ends` message offering pod `pod`'s end of `link` (`vni`: the one proposed).
pub(crate) fn end_of(ns: &str, pod: &str, link: &Link, kind: LinkKind, vni: Option<u32>) -> End {
    let mut end = record(ns, pod, "", link, kind, String::new());
    end.vni = vni;
    convert::to_message(&end, true)
}

/// The settings both ends of a link get when an operator asks for `change` at one of
/// them: (the named end's, the other end's), each from its current settings.
pub(crate) fn settle_change(change: &LinkChange, named: EndSettings, other: EndSettings) -> (EndSettings, EndSettings) {
    let (mut a, mut b) = (named, other);
    match change {
        LinkChange::Set(imp) => (a.impairment, b.impairment) = (Some(*imp), Some(*imp)),
        LinkChange::Reset => (a.impairment, b.impairment) = (None, None),
        LinkChange::Down => (a.down, b.down) = (Some(DownBy::Named), Some(DownBy::Peer)),
        LinkChange::Up => (a.down, b.down) = (None, None),
    }
    (a, b)
}

/// What an end applies: the run-time override, else the topology's `topology`.
pub(crate) fn view(end: WireEnd, topology: Impairment, settings: EndSettings) -> LinkView {
    LinkView {
        end,
        topology,
        active: settings.impairment.unwrap_or(topology),
        overridden: settings.impairment.is_some(),
        down: settings.down,
        problem: None,
    }
}

/// The topology's impairment of link `uid` as the end of `pod` sends: its own entry's
/// values, and the peer entry's where its own leaves a parameter off.
pub(crate) fn topology_impairment(own: Option<&Link>, peer: Option<&Link>) -> Impairment {
    let parse = |l: Option<&Link>| l.and_then(|l| l.impair.parse().ok()).unwrap_or_default();
    parse(own).or(&parse(peer))
}

#[cfg(test)]
mod tests;
