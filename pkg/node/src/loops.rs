//! The node's periodic work: the reconcile ticker (DEL spool replayed, kernel checked
//! against the store) and the gauges (pod traffic, policy verdicts) refreshed before
//! each scrape.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use tracing::{info, warn};
use weft_daemon::Handler;
use weft_kernel::Netlink;
use weft_store::{Attachment, State, Store};
use weft_telemetry::Metrics;
use weft_wires::Engine;

use crate::metrics::{NodeMetrics, RangeLabels, pod_traffic};

/// Checks the kernel against the store every `every` until `stop` (see
/// [`Handler::reconcile`]), counting what it repaired.
pub async fn reconcile<I: weft_daemon::Ipam, K: weft_daemon::PodNetworking>(
    handler: Arc<Handler<I, K>>,
    metrics: Arc<Metrics>,
    every: Duration,
    stop: impl Future<Output = ()>,
) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    tokio::pin!(stop);
    // The pods the start-up pass checked (none known: the first pass checks every pod).
    let mut known = handler.ready_ids().await.ok();
    loop {
        tokio::select! {
            _ = &mut stop => return,
            _ = tick.tick() => {}
        }
        known = reconcile_once(&handler, &metrics, known.as_ref()).await;
    }
}

/// Adds what a reconcile pass repaired to `weft_reconcile_repairs_total`.
pub fn count_repairs(metrics: &Metrics, repaired: &BTreeMap<&'static str, u64>) {
    for (kind, n) in repaired {
        metrics
            .reconcile_repairs
            .get_or_create(&weft_telemetry::metrics::RepairLabels { kind })
            .inc_by(*n);
    }
}

/// One reconcile pass of the pods ready at the last (`known`, see
/// [`Handler::reconcile_known`]); what it repaired goes into
/// `weft_reconcile_repairs_total`. Returns the pods ready now (none known when the pass
/// failed: the next checks every pod).
async fn reconcile_once<I: weft_daemon::Ipam, K: weft_daemon::PodNetworking>(
    handler: &Handler<I, K>,
    metrics: &Metrics,
    known: Option<&HashSet<i64>>,
) -> Option<HashSet<i64>> {
    // A DEL spooled by a plugin that missed weftd while it restarted, after the
    // start-up replay.
    let spooled = handler.replay_del_spool().await;
    if spooled.replayed + spooled.failed + spooled.set_aside > 0 {
        info!(?spooled, "DEL spool replayed");
    }
    match handler.reconcile_known(known).await {
        Ok((repaired, now)) => {
            count_repairs(metrics, &repaired);
            if !repaired.is_empty() {
                info!(?repaired, "reconcile pass repaired kernel state");
            }
            Some(now)
        }
        Err(e) => {
            tracing::warn!(error = %e, "reconcile pass failed");
            None
        }
    }
}

/// Sets the gauges read from the store (addresses per range, pods, whether it can
/// write), the kernel wires' counters and the pods' traffic before a scrape.
pub fn refresh_gauges(
    store: Store,
    metrics: Arc<NodeMetrics>,
    engine: Option<Arc<Engine>>,
    policy: Option<Arc<crate::netpol::Engine>>,
) -> weft_telemetry::Refresh {
    Arc::new(move || {
        let (store, metrics, engine, policy) = (store.clone(), metrics.clone(), engine.clone(), policy.clone());
        Box::pin(async move {
            metrics.store_writable.set(i64::from(store.writable()));
            if let Some(engine) = engine {
                engine.sample_counters().await;
            }
            if let Some(policy) = policy {
                policy.sample_verdicts().await;
            }
            let read = store.run(|db| {
                Ok((
                    db.range_usage()?,
                    db.counts()?,
                    db.ports()?.len(),
                    db.list(None, Some(State::Ready))?,
                ))
            });
            let Ok((usage, counts, ports, ready)) = read.await else {
                // Series of pods the store cannot name now would be stale ones.
                metrics.pod_traffic.replace(Default::default());
                return;
            };
            metrics.hostports.set(i64::try_from(ports).unwrap_or(i64::MAX));
            for u in usage {
                let range = u.range.to_string();
                let free = u.capacity.saturating_sub(u.allocated);
                for (state, v) in [("allocated", u.allocated), ("free", free)] {
                    metrics
                        .ipam_addresses
                        .get_or_create(&RangeLabels {
                            range: range.clone(),
                            state,
                        })
                        .set(v as f64);
                }
            }
            metrics.pods.set(i64::try_from(counts.1).unwrap_or(i64::MAX));
            sample_pod_traffic(&metrics, ready).await;
        })
    })
}

/// Replaces the pods' traffic sample with the counters of their host ends, from one
/// link dump of the node's namespace (this process's, which the blocking pool's
/// threads are in). Only ready attachments count: a pod whose DEL was accepted has no
/// series from then on, though its veth may live a moment longer.
async fn sample_pod_traffic(metrics: &NodeMetrics, ready: Vec<Attachment>) {
    let dump = tokio::task::spawn_blocking(|| Netlink::new().and_then(|mut nl| nl.links_with_stats()))
        .await
        .unwrap_or_else(|e| Err(std::io::Error::other(e)));
    let pods = match dump {
        Ok(links) => pod_traffic::sample(&ready, &links),
        Err(e) => {
            // No series rather than the last ones: counters that stop moving would
            // read as a pod gone quiet.
            warn!(error = %e, "could not read the pods' traffic counters");
            Default::default()
        }
    };
    metrics.pod_traffic.replace(pods);
}
