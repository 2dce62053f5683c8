//! What a wire end is: its identity, how it is carried (`LinkKind`) and its state
//! (`WireState`), as one domain type, [`WireEnd`].
//!
//! Every boundary converts from this type in one place: the store's columns
//! (`weft-store`), the `WireState` object's status (`weft-topology`), the admin and
//! node-to-node protocols (`weft-daemon`, `weft-wires`) and the metric labels
//! (`weft-wires`). Kinds and states are enums everywhere in between, so a typo is a
//! compile error rather than a wire that never matches.

use std::fmt;
use std::str::FromStr;

pub mod capture;
pub mod impair;
pub mod live;
pub mod model;
pub mod scenario;
pub mod status;

pub use capture::CapturedFrame;
pub use impair::{DownBy, EndSettings, Impairment, ImpairmentError, LinkChange, LinkView};
pub use status::{LinkPhase, LinkStatus, MAX_LINK_WAIT, parse_link_wait};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A kind or state name that is not one of the known ones (a store written by a newer
/// weftd, or a corrupted row).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} {value:?}")]
pub struct UnknownName {
    /// What was being parsed (`link kind`, `wire state`).
    pub what: &'static str,
    /// The name found.
    pub value: String,
}

/// An operator named a link end (`pod:intf`, in a namespace or not) that this node
/// cannot pick out.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EndNotFound {
    /// No end of that name here.
    #[error(
        "no wire end {pod}:{intf} on this node{} (not a link of a pod here, or not built yet)",
        namespace.as_ref().map(|n| format!(" in namespace {n}")).unwrap_or_default()
    )]
    Missing {
        /// The namespace named, if one was.
        namespace: Option<String>,
        /// The pod.
        pod: String,
        /// Its interface.
        intf: String,
    },
    /// Ends of that name in several namespaces, and none was named.
    #[error("{pod}:{intf} is in several namespaces ({}); name one", namespaces.join(", "))]
    Ambiguous {
        /// The pod.
        pod: String,
        /// Its interface.
        intf: String,
        /// The namespaces that have such an end.
        namespaces: Vec<String>,
    },
}

/// Declares [`LinkKind`] from one list, each kind with its name: the enum, [`LinkKind::ALL`]
/// and [`LinkKind::as_str`] all come from it, so a kind cannot be added to one and
/// forgotten in another (parsing goes through `ALL`).
macro_rules! link_kinds {
    ($($(#[$doc:meta])* $kind:ident => $name:literal,)+) => {
        /// How a link between two pods is carried.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema)]
        #[serde(rename_all = "lowercase")]
        pub enum LinkKind {
            $($(#[$doc])* $kind,)+
        }

        impl LinkKind {
            /// Every kind, in a stable order (for tables and metric families).
            pub const ALL: &'static [LinkKind] = &[$(LinkKind::$kind),+];

            /// The lowercase name used in files, the store, the protocols and metric
            /// labels (serde's name too: a test keeps them equal).
            pub fn as_str(self) -> &'static str {
                match self {
                    $(LinkKind::$kind => $name,)+
                }
            }
        }
    };
}

link_kinds! {
    /// A veth pair straight between two pods (same node only).
    Veth => "veth",
    /// A kernel VXLAN tunnel with unicast FDB and neighbour entries.
    Vxlan => "vxlan",
    /// Frames carried by weftd over a gRPC stream between the nodes.
    Grpc => "grpc",
}

impl LinkKind {
    /// Whether the link crosses nodes (its far end is another node's).
    pub fn crosses_nodes(self) -> bool {
        match self {
            LinkKind::Veth => false,
            LinkKind::Vxlan | LinkKind::Grpc => true,
        }
    }
}

impl fmt::Display for LinkKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for LinkKind {
    type Err = UnknownName;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        LinkKind::ALL
            .iter()
            .copied()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| UnknownName {
                what: "link kind",
                value: s.to_string(),
            })
    }
}

/// Where a wire end stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum WireState {
    /// Recorded, waiting on the peer (its pod, its node, or a VNI agreement).
    #[default]
    Pending,
    /// Built, carrier up.
    Up,
    /// Built, carrier down: the peer is away.
    Down,
}

impl WireState {
    /// Every state, in a stable order.
    pub const ALL: [WireState; 3] = [WireState::Pending, WireState::Up, WireState::Down];

    /// The lowercase name used in the store, the protocols and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            WireState::Pending => "pending",
            WireState::Up => "up",
            WireState::Down => "down",
        }
    }

    /// Whether frames pass.
    pub fn is_up(self) -> bool {
        self == WireState::Up
    }
}

impl fmt::Display for WireState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for WireState {
    type Err = UnknownName;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        WireState::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| UnknownName {
                what: "wire state",
                value: s.to_string(),
            })
    }
}

/// One end of a point-to-point link, on the node of its local pod.
//
// It serializes as an entry of the `WireState` object's status (the id as `local_id`;
// the node-local netns and VNI stay out of the cluster-wide object), and the doc line
// above is that entry's description in the generated CRD.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct WireEnd {
    /// Topology namespace.
    pub namespace: String,
    /// The link's uid (the same on both ends).
    pub link_uid: i64,
    /// The local pod.
    pub local_pod: String,
    /// The interface in the local pod.
    pub local_intf: String,
    /// The peer pod.
    pub peer_pod: String,
    /// The interface in the peer pod.
    pub peer_intf: String,
    /// The peer pod's node address (empty on the same node or when unknown).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub peer_node: String,
    /// How the link is carried.
    pub kind: LinkKind,
    /// This end's wire id (stable across restarts).
    #[serde(rename = "local_id")]
    pub id: u64,
    /// The peer end's wire id.
    pub peer_id: u64,
    /// Where the end stands.
    pub state: WireState,
    /// The VXLAN network id (VXLAN ends).
    #[serde(skip)]
    pub vni: Option<u32>,
    /// The local pod's network namespace path.
    #[serde(skip)]
    pub netns: String,
}

/// Kernel counters of a wire end's interface, seen from the pod.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct WireCounters {
    /// Frames the pod sent into the wire.
    pub tx_frames: u64,
    /// Their bytes.
    pub tx_bytes: u64,
    /// Frames delivered to the pod.
    pub rx_frames: u64,
    /// Their bytes.
    pub rx_bytes: u64,
    /// Frames the interface dropped either way.
    pub dropped: u64,
}

/// What a link's emulation did to the frames its end sent, counted by weft's own
/// emulation (a link detour's or a gRPC end's worker): its drops are kept apart from
/// the kernel's, which [`WireCounters::dropped`] counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct EmulationCounts {
    /// Frames the loss model took (`loss`).
    pub lost: u64,
    /// Frames lost because the emulation's queue held its limit already.
    pub overflow: u64,
    /// ECN-capable frames marked Congestion Experienced instead of lost (`ecn`).
    pub ecn_marked: u64,
    /// Frames with a bit flipped (`corrupt`).
    pub corrupted: u64,
    /// Frames sent twice (`duplicate`).
    pub duplicated: u64,
    /// Frames sent at once, ahead of delayed ones (`reorder`).
    pub reordered: u64,
}

impl EmulationCounts {
    /// Each count with its name (the `outcome` label of `weft_wire_emulation_total`).
    /// Destructured, so that a new count cannot be left out.
    pub fn by_outcome(&self) -> [(&'static str, u64); 6] {
        let Self {
            lost,
            overflow,
            ecn_marked,
            corrupted,
            duplicated,
            reordered,
        } = *self;
        [
            ("lost", lost),
            ("overflow", overflow),
            ("ecn_marked", ecn_marked),
            ("corrupted", corrupted),
            ("duplicated", duplicated),
            ("reordered", reordered),
        ]
    }

    /// The emulation's own drops: lost and overflowed frames.
    pub fn drops(&self) -> u64 {
        self.lost + self.overflow
    }
}

/// A wire end with its counters, as an operator sees it (`weftctl wires`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WireReport {
    /// The end.
    pub end: WireEnd,
    /// Its interface's counters, when the interface could be read.
    pub counters: Option<WireCounters>,
    /// What weft's own emulation did to what the end sent, when weft emulates it
    /// (netem's work is the kernel's and shows in no such count).
    pub emulation: Option<EmulationCounts>,
    /// Why the link is not up (pending, down by intent or failed); empty when it is.
    pub reason: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_names_are_refused() {
        for &k in LinkKind::ALL {
            assert_eq!(k.as_str().parse::<LinkKind>(), Ok(k));
            assert_eq!(serde_json::to_value(k).unwrap(), k.as_str(), "serde's name is the name");
        }
        for s in WireState::ALL {
            assert_eq!(s.as_str().parse::<WireState>(), Ok(s));
        }
        let e = "Up".parse::<WireState>().unwrap_err();
        assert_eq!(e.to_string(), "unknown wire state \"Up\"");
        assert!("tunnel".parse::<LinkKind>().is_err());
    }

    #[test]
    fn an_end_serializes_as_a_status_entry() {
        let end = WireEnd {
            namespace: "lab".into(),
            link_uid: 3,
            local_pod: "r1".into(),
            local_intf: "e1".into(),
            peer_pod: "r2".into(),
            peer_intf: "e1".into(),
            peer_node: String::new(),
            kind: LinkKind::Vxlan,
            id: 7,
            peer_id: 8,
            state: WireState::Up,
            vni: Some(5000),
            netns: "/run/netns/x".into(),
        };
        let v = serde_json::to_value(&end).unwrap();
        assert_eq!(v["local_id"], 7);
        assert_eq!(v["kind"], "vxlan");
        assert_eq!(v["state"], "up");
        assert!(v.get("peer_node").is_none());
        assert!(v.get("vni").is_none() && v.get("netns").is_none());
        let back: WireEnd = serde_json::from_value(v).unwrap();
        assert_eq!(back.vni, None);
        assert_eq!(back.id, 7);
    }
}
