//! The objects wires are described by.
//!
//! `Topology` is meshnet's (`networkop.co.uk/v1beta1`): one object per pod, named after
//! the pod, listing the pod's links. Existing meshnet and KNE topology files load
//! unchanged; weft adds optional fields (`local_mac`, `peer_mac`, `kind`) that meshnet
//! ignores. `WireState` is weft's own (`weft.dev/v1alpha1`, one per node, named after
//! the node): a mirror of the node's wire ends for a cluster-wide view (the node's
//! SQLite store stays the source of truth for its own ends).

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// How a link is carried: one type for every crate (see `weft-link`).
pub use weft_link::LinkKind;

/// One link of a pod: a point-to-point wire to an interface of a peer pod.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Link {
    /// The link's id; the same on both ends, unique within the namespace.
    pub uid: i64,
    /// The peer pod (same namespace).
    pub peer_pod: String,
    /// The interface name inside this pod.
    pub local_intf: String,
    /// The interface name inside the peer pod.
    pub peer_intf: String,
    /// Address (CIDR) for the local interface, if any.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub local_ip: String,
    /// Address (CIDR) of the peer interface, if any.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub peer_ip: String,
    /// weft: MAC address for the local interface.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local_mac: Option<String>,
    /// weft: MAC address of the peer interface.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer_mac: Option<String>,
    /// weft: how to carry the link when the pods are on different nodes (default: the
    /// daemon's `--inter-node-link`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<LinkKind>,
    /// weft: link emulation (netem) for the link's directions.
    #[serde(flatten)]
    pub impair: LinkImpairments,
}

/// weft: what a link does to the frames crossing it, in `tc netem`'s words; each value
/// applies to both directions (set on either end's entry; where both entries set a
/// parameter, each end's own value applies to what it sends). Meshnet files without
/// them load unchanged.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct LinkImpairments {
    /// weft: added latency, e.g. "20ms" (us, ms, s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay: Option<String>,
    /// weft: variation of the delay, e.g. "2ms", and optionally how successive delays
    /// are correlated, "2ms 25%" (needs a delay).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jitter: Option<String>,
    /// weft: the delay's distribution: "uniform" (the default), "normal", "pareto",
    /// "paretonormal" (needs a jitter).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub distribution: Option<String>,
    /// weft: frames lost, e.g. "1%", "1% 25%" (correlated), "gemodel 1% 10% 70% 0.1%"
    /// (Gilbert-Elliott), "state 1% 20%" (netem's 4-state model).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss: Option<String>,
    /// weft: sending rate, e.g. "100mbit" (bit, kbit, mbit, gbit; bps… for bytes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<String>,
    /// weft: frames corrupted (a bit flipped), e.g. "0.1%".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub corrupt: Option<String>,
    /// weft: frames duplicated, e.g. "0.1%".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duplicate: Option<String>,
    /// weft: frames sent ahead of delayed ones, e.g. "5%" (needs a delay).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reorder: Option<String>,
    /// weft: frames released in bursts, e.g. "800us 1ms packets 32" (MIN [MAX]
    /// [packets N] [bytes B]), as Wi-Fi and cellular links send.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slot: Option<String>,
    /// weft: "on" marks an ECN-capable frame Congestion Experienced instead of losing
    /// it (needs a loss).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ecn: Option<String>,
}

impl LinkImpairments {
    /// The values, parsed and checked.
    pub fn parse(&self) -> Result<weft_link::Impairment, weft_link::ImpairmentError> {
        let given = [
            ("delay", &self.delay),
            ("jitter", &self.jitter),
            ("distribution", &self.distribution),
            ("loss", &self.loss),
            ("rate", &self.rate),
            ("corrupt", &self.corrupt),
            ("duplicate", &self.duplicate),
            ("reorder", &self.reorder),
            ("slot", &self.slot),
            ("ecn", &self.ecn),
        ];
        weft_link::Impairment::from_params(given.into_iter().filter_map(|(k, v)| v.as_deref().map(|v| (k, v))))
    }
}

/// A link meshnet's protocol marked as skipped (kept for compatibility; weft decides
/// who builds a link deterministically and does not use it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SkippedLink {
    /// The pod that skipped.
    pub pod_name: String,
    /// The link.
    pub link_id: i64,
}

/// The links of one pod.
#[derive(CustomResource, Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "networkop.co.uk",
    version = "v1beta1",
    kind = "Topology",
    namespaced,
    status = "TopologyStatus",
    shortname = "topo",
    derive = "PartialEq",
    printcolumn = r#"{"name":"Node IP","type":"string","jsonPath":".status.src_ip"}"#
)]
pub struct TopologySpec {
    /// The pod's links.
    #[serde(default)]
    pub links: Vec<Link>,
    /// How long the pod's ADD waits for all its links to be up (weft's addition), such
    /// as "30s"; "0s" not at all. Unset: the network config's `waitForLinks`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_for_links: Option<String>,
}

impl TopologySpec {
    /// The pod's own wait for its links, when its topology sets one (checked when
    /// the topology is loaded, so a bad value reads as unset here).
    pub fn link_wait(&self) -> Option<std::time::Duration> {
        self.wait_for_links
            .as_deref()
            .and_then(|s| weft_link::parse_link_wait(s).ok())
    }
}

/// Where the pod runs, written by the daemon of its node when it is attached.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
pub struct TopologyStatus {
    /// Links skipped by meshnet's protocol (unused by weft).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<SkippedLink>,
    /// The address of the node the pod runs on (meshnet's name for it).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub src_ip: String,
    /// The pod's network namespace path.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub net_ns: String,
    /// The pod sandbox's container id.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub container_id: String,
    /// Each link of the pod and where it stands (weft's addition), written by the
    /// pod's node whenever a link's state changes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub links: Vec<LinkStatus>,
}

impl TopologyStatus {
    /// Whether the pod is up somewhere (meshnet's rule: node address and netns known).
    pub fn alive(&self) -> bool {
        !self.src_ip.is_empty() && !self.net_ns.is_empty()
    }
}

/// One wire end on a node: one type for every crate (see `weft-link`); the status
/// entry is its serialized form.
pub use weft_link::WireEnd;

/// One link of a pod and where it stands, as the Topology's status lists it.
pub use weft_link::{LinkPhase, LinkStatus};

/// The wire ends of one node (status only; spec is empty).
#[derive(CustomResource, Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "weft.dev",
    version = "v1alpha1",
    kind = "WireState",
    status = "WireStateStatus",
    shortname = "ws",
    derive = "PartialEq"
)]
pub struct WireStateSpec {}

/// The mirrored wire ends.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
pub struct WireStateStatus {
    /// Every wire end on the node.
    #[serde(default)]
    pub wires: Vec<WireEnd>,
}

/// The least time between two writes of a node's `WireState` of `ends` ends: a second,
/// or a millisecond per end when longer. Each write is the whole list, so a node writes
/// at most 1,000 ends a second whatever its size; a write held back by it is made when
/// it is up, so a `WireState` trails its node by at most this (and the time a pass takes
/// to end), and a reader that finds one written longer ago than that knows it current.
pub fn wire_state_interval(ends: usize) -> std::time::Duration {
    const AT_LEAST: std::time::Duration = std::time::Duration::from_secs(1);
    AT_LEAST.max(std::time::Duration::from_millis(1).saturating_mul(u32::try_from(ends).unwrap_or(u32::MAX)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A node writes no more ends a second into its `WireState` than a node of 1,000
    /// ends does, at any size, and may write once a second at least.
    #[test]
    fn wire_state_writes_do_not_grow_with_the_node() {
        for ends in [0usize, 1, 500, 1_000, 1_001, 3_300, 20_000] {
            let every = wire_state_interval(ends);
            assert!(every >= std::time::Duration::from_secs(1), "{ends} ends: {every:?}");
            let rate = ends as f64 / every.as_secs_f64();
            assert!(rate <= 1_000.0 + 1e-6, "{ends} ends written {rate:.3} a second");
        }
        assert_eq!(wire_state_interval(1_000), std::time::Duration::from_secs(1));
        assert_eq!(wire_state_interval(3_300), std::time::Duration::from_millis(3_300));
    }
}
