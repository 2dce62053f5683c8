//! A wire end's counters: its frame and byte series looked up once, and its drops by
//! reason, made on first use.

use std::sync::{Arc, OnceLock};

use prometheus_client::metrics::counter::Counter;

use crate::metrics::{WireDirLabels, WireDropLabels, WireLabels, WireMetrics};

/// Why a wire end dropped a frame (`reason` of `weft_wire_drops_total`).
#[derive(Debug, Clone, Copy)]
pub(super) enum DropReason {
    /// The wire's peer end is down.
    PeerDown,
    /// No stream to the peer node is up.
    NoStream,
    /// The wire's queue to the peer node is full.
    QueueFull,
    /// The pod's end refused the frame.
    PodBusy,
}

impl DropReason {
    pub(super) fn label(self) -> &'static str {
        match self {
            Self::PeerDown => "peer_down",
            Self::NoStream => "no_stream",
            Self::QueueFull => "queue_full",
            Self::PodBusy => "pod_busy",
        }
    }
}

/// A wire end's series, looked up once: counting a frame is then two atomic adds,
/// not a label clone and hash lookup per frame. Drop series are made on first use so
/// that a wire that never dropped shows none.
pub(super) struct Counters {
    pub(super) labels: WireLabels,
    pub(super) metrics: Arc<WireMetrics>,
    pub(super) tx_frames: Counter,
    pub(super) tx_bytes: Counter,
    pub(super) rx_frames: Counter,
    pub(super) rx_bytes: Counter,
    pub(super) drops: [OnceLock<Counter>; 4],
}

impl Counters {
    pub(super) fn new(labels: WireLabels, metrics: Arc<WireMetrics>) -> Self {
        let dir = |direction| WireDirLabels {
            wire: labels.clone(),
            direction,
        };
        let counter = |family: &prometheus_client::metrics::family::Family<WireDirLabels, Counter>, direction| {
            family.get_or_create(&dir(direction)).clone()
        };
        Self {
            tx_frames: counter(&metrics.frames, "tx"),
            tx_bytes: counter(&metrics.bytes, "tx"),
            rx_frames: counter(&metrics.frames, "rx"),
            rx_bytes: counter(&metrics.bytes, "rx"),
            drops: Default::default(),
            labels,
            metrics,
        }
    }

    pub(super) fn dropped(&self, reason: DropReason, frames: u64) {
        if frames == 0 {
            return;
        }
        self.drops[reason as usize]
            .get_or_init(|| {
                self.metrics
                    .drops
                    .get_or_create(&WireDropLabels {
                        wire: self.labels.clone(),
                        reason: reason.label(),
                    })
                    .clone()
            })
            .inc_by(frames);
    }
}
