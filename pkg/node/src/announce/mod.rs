//! New pods' addresses to every other node before their ADD answers, over the wire
//! port: the `weft.wire.v1.Policy` service ([`PolicyService`], what a node told so does)
//! and its client ([`WireAnnouncer`], the policy engine's [`weft_policy::Announcer`]).
//!
//! Why: a pod's addresses reach the other nodes' policy sets through the API server
//! only after kubelet reports them and every watch caught up, and until then other
//! nodes drop the new pod's first connections that their policies allow. The engine
//! calls the announcer once the pod's own policies are in place; the ADD answers once
//! every peer answered or [`NodeConfig::policy_announce_timeout`] passed.
//!
//! Why a service of its own beside `Wire` (and not an RPC of it): the wire engine knows
//! nothing of network policy and admits any node its topologies know, while this one
//! needs each caller's Node name, and is served only where network policy runs (a node
//! without it answers `Unimplemented`). It shares the wire port, and so its TLS
//! acceptor (with `--wire-tls-dir` a caller proved in the handshake that its certificate
//! names the node at its address), and its proto file (for `Hello`).
//!
//! [`NodeConfig::policy_announce_timeout`]: crate::NodeConfig::policy_announce_timeout

mod peers;
mod serve;
#[cfg(test)]
mod tests;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use weft_telemetry::{Families, Metrics};

pub use peers::{CALL_TIMEOUT, FIRST_RETRY, SKIP_FOR, WireAnnouncer};
pub use serve::{Announcements, MAX_PODS, MAX_REQUEST, PeerAnswers, PolicyService, Refusal, caller};

/// What became of one peer in one announcement (the `result` of
/// `weft_policy_announce_total`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AnnounceLabels {
    /// `taken` (it answered and took every pod), `refused` (it answered and refused a
    /// pod or the call), `failed` (no answer: connect error, timeout), `skipped` (left
    /// out: it did not answer, and has not answered a try in the background since).
    pub result: &'static str,
}

/// The results of [`AnnounceLabels`].
pub const RESULTS: [&str; 4] = ["taken", "refused", "failed", "skipped"];

/// The announcer's families; get them with `metrics.families::<AnnounceMetrics>()`.
pub struct AnnounceMetrics {
    /// `weft_policy_announce_seconds`: how long an ADD waited for the other nodes.
    pub seconds: Histogram,
    /// `weft_policy_announce_total{result}`: one per peer and announcement.
    pub peers: Family<AnnounceLabels, Counter>,
}

impl Families for AnnounceMetrics {
    fn register(metrics: &Metrics) -> Self {
        let m = AnnounceMetrics {
            // 0.5 ms .. ~2 s, doubling: the default bound (250 ms) sits inside.
            seconds: Histogram::new(exponential_buckets(0.0005, 2.0, 13)),
            peers: Family::default(),
        };
        // Every result from the start, so a rate over them needs no series to appear.
        for result in RESULTS {
            let _ = m.peers.get_or_create(&AnnounceLabels { result });
        }
        metrics.register(
            "weft_policy_announce_seconds",
            "Time an ADD waited for the other nodes to take its pod's addresses into their policy sets",
            m.seconds.clone(),
        );
        metrics.register(
            "weft_policy_announce",
            "Peer nodes told of a new pod's addresses at its ADD, by result (taken, refused, failed, skipped)",
            m.peers.clone(),
        );
        m
    }
}
