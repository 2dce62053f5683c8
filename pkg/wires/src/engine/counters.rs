//! Per-wire counters: kernel-carried ends (veth, VXLAN) are sampled from their
//! interfaces before each scrape; gRPC ends count in their workers, seeded from their
//! pod ends' kernel counters after a restart.

use std::collections::{BTreeMap, HashMap};

use super::{Engine, plan};
use crate::convert;
use crate::error::WireError;
use crate::metrics::{WireDirLabels, WireDropLabels};
use crate::plane::GrpcPlane;
use weft_kernel::LinkStats;
use weft_link::{WireEnd, WireReport, WireState};
use weft_store::StoreError;

impl<P: GrpcPlane> Engine<P> {
    /// Brings the per-wire counters of kernel-carried ends (veth, VXLAN) up to date from
    /// their interfaces' counters; gRPC ends count in their workers. Called before
    /// each scrape.
    pub async fn sample_counters(&self) {
        let Ok(records) = self.store.run(|db| db.wires()).await else {
            return;
        };
        let kernel: Vec<WireEnd> = records
            .into_iter()
            .filter(|r| self.carriers.get(r.kind).kernel_counters())
            .collect();
        let Ok(stats) = self.interface_stats(&kernel).await else {
            return;
        };
        let mut sampled = self.sampled.lock().expect("sampled lock");
        for r in &kernel {
            let Some(now) = stats.get(&r.id) else { continue };
            let was = sampled.get(&r.id).copied().unwrap_or_default();
            let labels = convert::labels(r);
            let grow = |a: u64, b: u64| if a >= b { a - b } else { a };
            for (dir, frames, bytes, drops) in [
                (
                    "rx",
                    grow(now.rx_packets, was.rx_packets),
                    grow(now.rx_bytes, was.rx_bytes),
                    grow(now.rx_dropped, was.rx_dropped),
                ),
                (
                    "tx",
                    grow(now.tx_packets, was.tx_packets),
                    grow(now.tx_bytes, was.tx_bytes),
                    grow(now.tx_dropped, was.tx_dropped),
                ),
            ] {
                let l = WireDirLabels {
                    wire: labels.clone(),
                    direction: dir,
                };
                self.metrics.frames.get_or_create(&l).inc_by(frames);
                self.metrics.bytes.get_or_create(&l).inc_by(bytes);
                if drops > 0 {
                    let reason = if dir == "rx" { "kernel_rx" } else { "kernel_tx" };
                    let d = WireDropLabels {
                        wire: labels.clone(),
                        reason,
                    };
                    self.metrics.drops.get_or_create(&d).inc_by(drops);
                }
            }
            sampled.insert(r.id, *now);
        }
        sampled.retain(|id, _| stats.contains_key(id));
    }

    /// The wire ends this node holds, each with its interface's kernel counters (read
    /// now; `None` when the interface cannot be read). The kernel keeps them across
    /// daemon restarts, gRPC ends' pairs included, so they never start again from zero.
    pub async fn report(&self) -> Result<Vec<WireReport>, StoreError> {
        let ends = self.wires().await?;
        let stats = self.interface_stats(&ends).await.unwrap_or_default();
        // Why each link of a local pod is not up, by its end's wire id.
        let mut unbuilt: BTreeMap<u64, WireReport> = BTreeMap::new();
        let pods = self.pods();
        for ((ns, name), links) in self.link_states() {
            for l in links {
                let netns = pods
                    .get(&(ns.clone(), name.clone()))
                    .map(|p| p.netns.clone())
                    .unwrap_or_default();
                let link = weft_topology::Link {
                    uid: l.uid,
                    peer_pod: l.peer_pod.clone(),
                    local_intf: l.local_intf.clone(),
                    peer_intf: l.peer_intf.clone(),
                    ..Default::default()
                };
                let mut end = plan::record(&ns, &name, &netns, &link, self.cfg.default_kind, String::new());
                end.state = WireState::Pending;
                unbuilt.insert(
                    end.id,
                    WireReport {
                        end,
                        counters: None,
                        emulation: None,
                        reason: l.reason,
                    },
                );
            }
        }
        let plane = self.plane.get();
        let mut out: Vec<WireReport> = ends
            .into_iter()
            .map(|end| WireReport {
                counters: stats.get(&end.id).map(convert::counters),
                emulation: plane.and_then(|p| p.emulation(end.id)),
                reason: unbuilt.remove(&end.id).map(|r| r.reason).unwrap_or_default(),
                end,
            })
            .collect();
        // Links with no end here yet (the peer pod runs nowhere, the pair is not
        // built): listed as pending, with why.
        out.extend(unbuilt.into_values());
        Ok(out)
    }

    /// Starts a re-attached gRPC end's frame and byte counters at its pod end's kernel
    /// counters (rx: written into the pod, tx: sent by the pod).
    pub(super) fn seed_counters(&self, r: &WireEnd, st: &LinkStats) {
        let labels = convert::labels(r);
        for (direction, frames, bytes) in [("rx", st.rx_packets, st.rx_bytes), ("tx", st.tx_packets, st.tx_bytes)] {
            let l = WireDirLabels {
                wire: labels.clone(),
                direction,
            };
            self.metrics.frames.get_or_create(&l).inc_by(frames);
            self.metrics.bytes.get_or_create(&l).inc_by(bytes);
        }
    }

    /// Reads the kernel counters of the interfaces of `ends` (those that can be found).
    async fn interface_stats(&self, ends: &[WireEnd]) -> Result<HashMap<u64, LinkStats>, WireError> {
        let ends: Vec<(u64, String, String)> = ends
            .iter()
            .map(|r| (r.id, r.netns.clone(), r.local_intf.clone()))
            .collect();
        self.kernel(move |k| {
            Ok(ends
                .into_iter()
                .filter_map(|(id, netns, intf)| Some((id, k.link_stats(&netns, &intf).ok()??)))
                .collect())
        })
        .await
    }
}
