//! Composing a node daemon out of the other crates: the start-up order, the adapters
//! between daemon, wires, store and topology, the periodic loops, the state-directory
//! lock, the servers, readiness, and the orderly shutdown.
//!
//! [`Node::start`] runs every start-up step in order and returns a node that serves;
//! [`Node::shutdown`] stops it. `weftd` only parses flags into a [`NodeConfig`] and
//! waits for a signal between the two.

pub mod adapters;
pub mod announce;
pub mod config;
pub mod error;
pub mod flows;
pub mod lock;
pub mod loops;
pub mod metrics;
pub mod netpol;
pub mod ready;
pub mod running;
pub mod servers;
pub mod source;
pub mod spool_watch;
pub mod steps;
pub mod sysctls;
pub mod trace;
pub mod uninstall;

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use tokio::sync::watch;
use tracing::{Instrument, info};
use weft_daemon::{KernelNetworking, Wiring};
use weft_store::Store;
use weft_telemetry::{CallLog, Metrics, Readiness};

pub use config::NodeConfig;
pub use error::{NodeError, RecoveryStep};
pub use lock::{LockError, StateLock};

use adapters::EngineWiring;
use running::Running;
use steps::{HandlerParts, Serving};

/// A running node daemon: what [`Node::shutdown`] needs to stop it in order.
pub struct Node {
    store: Store,
    run_id: i64,
    ready: Readiness,
    stop: watch::Sender<bool>,
    /// Servers, loops and threads, stopped in the reverse of their start.
    running: Running,
    // Held for the process's life; released when the node is dropped after shutdown.
    _lock: StateLock,
}

/// Resolves once `stop` says so (or its sender is gone).
async fn stopped(mut stop: watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// The span of one start-up step.
fn step(name: &'static str) -> tracing::Span {
    tracing::info_span!("start", step = name)
}

impl Node {
    /// Starts a node: takes the state directory, claims the socket, opens the store,
    /// finishes what a crash interrupted, brings the node network and the wires in step,
    /// reconciles the kernel with the store, and serves. Returns once it serves (it
    /// turns ready on its own once its caches are filled). Each step is a function of
    /// [`steps`], in its own span.
    pub async fn start(config: NodeConfig, metrics: Arc<Metrics>) -> Result<Node, NodeError> {
        let started_at = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        let state = steps::state(&config, &metrics).instrument(step("state")).await?;
        let store = state.store.clone();
        steps::sysctls(&config, &store).instrument(step("sysctls")).await?;
        let kernel = KernelNetworking::new(config.hostports_localhost);
        steps::recovery(&store, &kernel).instrument(step("recovery")).await?;
        let source = steps::source(&config).instrument(step("source")).await?;
        let nodenet = steps::node_network(&config, source.as_ref(), &store, &metrics)
            .instrument(step("node network"))
            .await?;
        let mut running = Running::default();
        let wires = steps::wires(&config, source.as_ref(), &store, &metrics, &mut running)
            .instrument(step("wires"))
            .await?;
        let wiring = wires
            .as_ref()
            .map(|w| Arc::new(EngineWiring(w.engine.clone())) as Arc<dyn Wiring>);
        let policy = step("policy").in_scope(|| steps::policy(&config, source.as_ref(), &store, &metrics));
        let flows = step("flows")
            .in_scope(|| {
                policy
                    .as_ref()
                    .filter(|_| config.flows.enabled)
                    .map(|engine| {
                        flows::NodeFlows::new(&config.node_name, config.flows.clone(), engine.clone(), &metrics)
                    })
                    .transpose()
            })
            .map_err(NodeError::FlowExport)?;
        // Before the handler's start-up replay reads the spool: see `spool_watch`.
        let (spool, spool_watch) = step("spool").in_scope(|| steps::spool(&config, &state.metrics));
        let parts = HandlerParts {
            nodenet: &nodenet,
            wiring: wiring.clone(),
            policy: policy.as_ref(),
            has_source: source.is_some(),
            spool: spool.clone(),
        };
        let handler = steps::handler(&config, &store, kernel, parts, &metrics)
            .instrument(step("handler"))
            .await?;
        let ready = Readiness::default();
        let (stop, stop_rx) = watch::channel(false);
        let serving = Serving {
            store: store.clone(),
            listener: state.listener,
            handler,
            calls: Arc::new(CallLog::new(config.calls_history)),
            nodenet: nodenet.clone(),
            wires,
            policy,
            flows,
            node_metrics: state.metrics,
            wiring,
            spool,
            spool_watch,
            started_at,
        };
        steps::serve(&config, serving, &ready, &metrics, &stop_rx, &mut running)
            .instrument(step("serve"))
            .await?;
        step("readiness").in_scope(|| steps::readiness(&config, &ready, &store, source, &nodenet));
        info!(socket = %config.socket.display(), http = %config.metrics_addr, parts = ?running.names(), "weftd ready");
        Ok(Node {
            store,
            run_id: state.run_id,
            ready,
            stop,
            running,
            _lock: state.lock,
        })
    }

    /// Whether the node is ready now (what `/readyz` answers).
    pub fn ready(&self) -> bool {
        self.ready.get()
    }

    /// Stops the node: no new calls, then every running part in the reverse of its
    /// start: the wire port, the loops, the socket (calls in flight finish, the socket
    /// goes, teardowns in flight get up to 10 s), the HTTP endpoints, the wire data
    /// plane's thread; and the store records a clean stop.
    pub async fn shutdown(self) {
        info!("shutting down: finishing calls in flight");
        self.ready.set(false);
        let _ = self.stop.send(true);
        self.running.stop().await;
        let run_id = self.run_id;
        if let Err(e) = self.store.run(move |db| db.end_run(run_id)).await {
            tracing::warn!(error = %e, "could not record the clean stop");
        }
        info!("weftd stopped");
    }
}
