//! What the wire and pod-network benchmarks measure over one path, pass after pass: TCP
//! throughput and retransmissions, and 64-byte UDP floods, with their medians. One
//! type, flattened into each benchmark's result, so both report them the same way.

use serde::Serialize;

use crate::median;
use crate::udp::Flood;

/// One path's TCP and UDP results over its passes.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Traffic {
    /// TCP throughput per pass (Gbit/s, at the receiver).
    pub tcp_gbps: Vec<f64>,
    /// TCP retransmissions per pass.
    pub tcp_retransmits: Vec<u64>,
    /// The UDP floods, per pass.
    pub udp: Vec<Flood>,
    /// Median TCP throughput (Gbit/s).
    pub tcp_gbps_median: f64,
    /// Median 64-byte frames per second received.
    pub udp_fps_median: f64,
    /// Median 64-byte frames per second sent.
    pub udp_sent_fps_median: f64,
}

impl Traffic {
    /// Adds one pass: its TCP throughput and retransmissions, and its flood.
    pub(crate) fn push(&mut self, gbps: f64, retransmits: u64, flood: Flood) {
        self.tcp_gbps.push(gbps);
        self.tcp_retransmits.push(retransmits);
        self.udp.push(flood);
    }

    /// Sets the medians from the passes so far.
    pub(crate) fn settle(&mut self) {
        self.tcp_gbps_median = median(&self.tcp_gbps);
        self.udp_fps_median = median(&self.udp.iter().map(Flood::received_per_s).collect::<Vec<_>>());
        self.udp_sent_fps_median = median(&self.udp.iter().map(Flood::sent_per_s).collect::<Vec<_>>());
    }

    /// The median of the retransmissions per pass.
    pub(crate) fn retransmits_median(&self) -> f64 {
        median(&self.tcp_retransmits.iter().map(|&x| x as f64).collect::<Vec<_>>())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_follow_the_passes() {
        let mut t = Traffic::default();
        for (g, r) in [(1.0, 3), (3.0, 1), (2.0, 2)] {
            t.push(g, r, Flood::default());
        }
        t.settle();
        assert_eq!(t.tcp_gbps_median, 2.0);
        assert_eq!(t.retransmits_median(), 2.0);
        assert_eq!(t.udp.len(), 3);
        let v = serde_json::to_value(&t).unwrap();
        assert_eq!(v["tcp_gbps_median"], 2.0);
    }
}
