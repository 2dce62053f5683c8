//! The node's periodic work: the reconcile ticker (DEL spool replayed, kernel checked
//! against the store) and the gauges refreshed before each scrape.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tracing::info;
use weft_daemon::Handler;
use weft_store::Store;
use weft_telemetry::Metrics;
use weft_wires::Engine;

use crate::metrics::{NodeMetrics, RangeLabels};

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
    loop {
        tokio::select! {
            _ = &mut stop => return,
            _ = tick.tick() => {}
        }
        reconcile_once(&handler, &metrics).await;
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

/// One reconcile pass; what it repaired goes into `weft_reconcile_repairs_total`.
async fn reconcile_once<I: weft_daemon::Ipam, K: weft_daemon::PodNetworking>(
    handler: &Handler<I, K>,
    metrics: &Metrics,
) {
    // A DEL spooled by a plugin that missed weftd while it restarted, after the
    // start-up replay.
    let spooled = handler.replay_del_spool().await;
    if spooled.replayed + spooled.failed + spooled.set_aside > 0 {
        info!(?spooled, "DEL spool replayed");
    }
    match handler.reconcile().await {
        Ok(repaired) => {
            count_repairs(metrics, &repaired);
            if !repaired.is_empty() {
                info!(?repaired, "reconcile pass repaired kernel state");
            }
        }
        Err(e) => tracing::warn!(error = %e, "reconcile pass failed"),
    }
}

/// Sets the gauges read from the store (addresses per range, pods, whether it can
/// write) and the kernel wires' counters before a scrape.
pub fn refresh_gauges(store: Store, metrics: Arc<NodeMetrics>, engine: Option<Arc<Engine>>) -> weft_telemetry::Refresh {
    Arc::new(move || {
        let (store, metrics, engine) = (store.clone(), metrics.clone(), engine.clone());
        Box::pin(async move {
            metrics.store_writable.set(i64::from(store.writable()));
            if let Some(engine) = engine {
                engine.sample_counters().await;
            }
            let read = store.run(|db| Ok((db.range_usage()?, db.counts()?, db.ports()?.len())));
            if let Ok((usage, counts, ports)) = read.await {
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
            }
        })
    })
}
