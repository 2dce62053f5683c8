//! The run loop: a pass reads the Node objects, asks the kernel the few facts planning
//! needs, plans, and applies the difference; passes run at start, whenever the source
//! says something changed, and every resync interval (which is how drift is repaired).
//! What each pass decided is published as a [`NodeView`] (the pod ranges and MTU the
//! CNI handler serves ADDs with) and counted in metrics.

use std::collections::BTreeMap;
use std::future::Future;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use ipnet::IpNet;
use tokio::sync::watch;
use tracing::{info, warn};
use weft_telemetry::Metrics;
use weft_telemetry::metrics::RepairLabels;
use weft_topology::{ClusterNode, TopologySource};

use crate::kernel::NodeKernel;
use crate::masq::{MasqChange, masq_diff};
use crate::metrics::{NodeChangeLabels, NodeFailureLabels, NodeModeLabels, NodeNetMetrics};
use crate::model::*;
use crate::plan::{addresses_to_look_up, diff, local_address, plan};

/// What pods of this node get from the node network, as last decided.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeView {
    /// Whether a pass has run (before, nothing below is known).
    pub synced: bool,
    /// Whether this node's Node object is known.
    pub node_known: bool,
    /// This node's pod ranges (its Node's podCIDRs), in order.
    pub ranges: Vec<IpNet>,
    /// The pod MTU when a network config sets none.
    pub pod_mtu: Option<u32>,
    /// Every peer node and how it is reached.
    pub peers: Vec<PeerReport>,
    /// This node's underlay address.
    pub address: Option<IpAddr>,
}

/// Pod ranges this node serves from network configs (not from its Node), read fresh at
/// each pass.
pub type LocalRanges = Arc<dyn Fn() -> BoxFuture<'static, Vec<IpNet>> + Send + Sync>;

/// What one pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PassOutcome {
    /// Changes made because what the cluster says changed.
    pub changes: Vec<Change>,
    /// Changes made because the kernel had drifted from an unchanged plan.
    pub repairs: Vec<Change>,
    /// What the kernel refused.
    pub failures: Vec<Failure>,
    /// The masquerade change made, if any.
    pub masquerade: Option<MasqChange>,
}

/// A change or lookup the kernel refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// The metric label: `route`, `fdb`, `neighbour`, `device`, `address`,
    /// `masquerade` or `lookup`.
    pub kind: &'static str,
    /// What was tried.
    pub what: String,
    /// The kernel's answer.
    pub error: String,
}

impl Failure {
    fn new(kind: &'static str, what: impl Into<String>, error: impl ToString) -> Self {
        Self {
            kind,
            what: what.into(),
            error: error.to_string(),
        }
    }
}

/// The node network engine. Cheap to share: wrap it in an `Arc`.
pub struct NodeNetwork<K> {
    cfg: Config,
    source: Option<Arc<dyn TopologySource>>,
    kernel: Arc<Mutex<K>>,
    metrics: Arc<NodeNetMetrics>,
    local_ranges: LocalRanges,
    view: watch::Sender<NodeView>,
    last: tokio::sync::Mutex<Option<Desired>>,
    /// Woken when a network config may have brought a new local range.
    ranges: tokio::sync::Notify,
    /// Whether each peer address is on-link, as last looked up (see [`run_pass_with`]);
    /// emptied at each resync.
    on_link: std::sync::Mutex<BTreeMap<IpAddr, bool>>,
}

impl<K: NodeKernel> NodeNetwork<K> {
    /// An engine over `kernel`, reading nodes from `source` (none: a standalone node,
    /// which only masquerades), counting into its families in `metrics`.
    pub fn new(
        cfg: Config,
        source: Option<Arc<dyn TopologySource>>,
        kernel: K,
        metrics: &Metrics,
        local_ranges: LocalRanges,
    ) -> Self {
        Self {
            cfg,
            source,
            kernel: Arc::new(Mutex::new(kernel)),
            metrics: metrics.families::<NodeNetMetrics>(),
            local_ranges,
            view: watch::channel(NodeView::default()).0,
            last: tokio::sync::Mutex::new(None),
            ranges: tokio::sync::Notify::new(),
            on_link: std::sync::Mutex::default(),
        }
    }

    /// Says a pod was given an address from a range this node may not have served
    /// before (a network config's `ranges`): the run loop looks at once, so the range's
    /// unreachable route and masquerade are in place before weftd could be stopped.
    pub fn local_ranges_changed(&self) {
        self.ranges.notify_one();
    }

    /// What the last pass decided, and every later decision.
    pub fn view(&self) -> watch::Receiver<NodeView> {
        self.view.subscribe()
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// Runs one pass: plan from the nodes known now, apply the difference, publish.
    pub async fn pass(&self) -> PassOutcome {
        // Before the caches are filled, "no nodes" means "not known yet", not "every
        // peer is gone": planning then would tear down every route at each restart.
        if self.source.as_ref().is_some_and(|s| !s.ready()) {
            return PassOutcome::default();
        }
        let nodes: Vec<ClusterNode> = self.source.as_ref().map(|s| s.nodes()).unwrap_or_default();
        let local_ranges = (self.local_ranges)().await;
        let mut last = self.last.lock().await;
        let (cfg, kernel) = (self.cfg.clone(), self.kernel.clone());
        let (nodes2, previous) = (nodes.clone(), last.clone());
        let mut known = std::mem::take(&mut *self.on_link.lock().expect("on-link lock"));
        let before: std::collections::BTreeSet<IpAddr> = known.keys().copied().collect();
        let work = tokio::task::spawn_blocking(move || {
            let mut k = kernel.lock().expect("node kernel lock");
            let r = run_pass_with(&cfg, &nodes2, &local_ranges, previous.as_ref(), &mut *k, &mut known);
            (r, known)
        })
        .await;
        let (desired, outcome) = match work {
            Ok((r, known)) => {
                let looked_up = known.keys().filter(|a| !before.contains(a)).count();
                self.metrics.lookups.inc_by(looked_up as u64);
                *self.on_link.lock().expect("on-link lock") = known;
                r
            }
            Err(e) => {
                warn!(error = %e, "node network pass panicked");
                return PassOutcome::default();
            }
        };
        self.account(&desired, last.as_ref(), &outcome);
        let view = NodeView {
            synced: true,
            node_known: nodes.iter().any(|n| n.name == self.cfg.node_name),
            ranges: desired.ranges.clone(),
            pod_mtu: desired.pod_mtu,
            peers: desired.peers.clone(),
            address: local_address(&self.cfg, &nodes),
        };
        self.view.send_if_modified(|v| {
            if *v == view {
                false
            } else {
                *v = view;
                true
            }
        });
        *last = Some(desired);
        outcome
    }

    fn account(&self, desired: &Desired, previous: Option<&Desired>, outcome: &PassOutcome) {
        let m = &self.metrics;
        for c in &outcome.changes {
            info!(change = %c, "pod routing changed");
        }
        for c in &outcome.repairs {
            warn!(change = %c, "pod routing had drifted from what the Node objects say: repaired");
        }
        for c in outcome.changes.iter().chain(&outcome.repairs) {
            let (kind, op) = c.labels();
            m.changes.get_or_create(&NodeChangeLabels { kind, op }).inc();
        }
        for c in &outcome.repairs {
            let kind = match c.labels().0 {
                "route" => "node_route",
                "fdb" => "node_fdb",
                "neighbour" => "node_neighbour",
                "address" => "node_address",
                "export" => "node_export",
                _ => "node_vxlan",
            };
            m.repairs.get_or_create(&RepairLabels { kind }).inc();
        }
        for f in &outcome.failures {
            warn!(change = %f.what, error = %f.error, "the kernel refused a pod routing change; retried at the next pass");
            m.failures.get_or_create(&NodeFailureLabels { kind: f.kind }).inc();
        }
        if let Some(mc) = &outcome.masquerade {
            let (added, deleted) = mc.size();
            let drift = previous.is_some_and(|p| p.masquerade == desired.masquerade);
            if drift {
                warn!("the masquerade table had drifted: repaired");
                m.repairs.get_or_create(&RepairLabels { kind: "masquerade" }).inc();
            } else {
                info!(added, deleted, "masquerade sets changed");
            }
            for (op, n) in [("add", added), ("delete", deleted)] {
                if n > 0 {
                    m.changes
                        .get_or_create(&NodeChangeLabels { kind: "masquerade", op })
                        .inc_by(n);
                }
            }
        }
        for mode in PeerMode::ALL {
            let n = desired.peers.iter().filter(|p| p.mode == mode).count();
            m.peers
                .get_or_create(&NodeModeLabels { mode: mode.as_str() })
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
        m.pod_mtu.set(i64::from(desired.pod_mtu.unwrap_or(0)));
        let before: BTreeMap<&str, &PeerReport> = previous
            .map(|p| p.peers.iter().map(|r| (r.name.as_str(), r)).collect())
            .unwrap_or_default();
        let now: std::collections::BTreeSet<&str> = desired.peers.iter().map(|p| p.name.as_str()).collect();
        for p in &desired.peers {
            let was = before.get(p.name.as_str());
            if was.map(|w| (w.mode, &w.problem)) != Some((p.mode, &p.problem)) {
                match &p.problem {
                    Some(problem) => {
                        warn!(peer = %p.name, mode = p.mode.as_str(), problem = %problem, "peer node not fully reached")
                    }
                    None => info!(peer = %p.name, mode = p.mode.as_str(), "peer node reached"),
                }
            }
        }
        for name in before.keys() {
            if !now.contains(name) {
                info!(peer = %name, "peer node gone");
            }
        }
        if let Some(p) = previous
            && !p.ranges.is_empty()
            && p.ranges != desired.ranges
        {
            m.pod_cidr_changes.inc();
            warn!(
                before = ?p.ranges.iter().map(ToString::to_string).collect::<Vec<_>>(),
                after = ?desired.ranges.iter().map(ToString::to_string).collect::<Vec<_>>(),
                "this node's podCIDRs changed: pods keep their addresses, new pods get addresses from the new ranges"
            );
        }
    }

    /// What a pass plans from: the nodes known and the local ranges.
    async fn inputs(&self) -> (Vec<ClusterNode>, Vec<IpNet>) {
        let nodes = self.source.as_ref().map(|s| s.nodes()).unwrap_or_default();
        (nodes, (self.local_ranges)().await)
    }

    /// Runs passes until `stop`: at once, whenever what a pass plans from changes (the
    /// source also announces Topology changes, which pod routing does not read: those
    /// cost no pass; [`NodeNetwork::local_ranges_changed`] announces new local ranges),
    /// and every resync interval, which is how drift is repaired.
    pub async fn run(self: Arc<Self>, stop: impl Future<Output = ()>) {
        let mut changes = self.source.as_ref().map(|s| s.changes());
        let mut tick = tokio::time::interval(self.cfg.resync);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        tokio::pin!(stop);
        loop {
            let planned_from = self.inputs().await;
            self.pass().await;
            loop {
                let changed = async {
                    match changes.as_mut() {
                        Some(rx) => {
                            if rx.changed().await.is_err() {
                                std::future::pending::<()>().await;
                            }
                        }
                        None => std::future::pending::<()>().await,
                    }
                };
                tokio::select! {
                    _ = &mut stop => return,
                    _ = changed => {
                        if planned_from != self.inputs().await {
                            break;
                        }
                    }
                    _ = self.ranges.notified() => {
                        if planned_from != self.inputs().await {
                            break;
                        }
                    }
                    _ = tick.tick() => {
                        // A peer may have moved on or off link: ask again.
                        self.on_link.lock().expect("on-link lock").clear();
                        break;
                    }
                }
            }
        }
    }
}

/// One pass on the blocking side: facts, plan, observe, diff, apply. Returns the plan
/// and what was done. `previous` is the last pass's plan: changes made under an
/// unchanged plan are repairs of drift. Every peer address is looked up afresh.
pub fn run_pass<K: NodeKernel + ?Sized>(
    cfg: &Config,
    nodes: &[ClusterNode],
    local_ranges: &[IpNet],
    previous: Option<&Desired>,
    k: &mut K,
) -> (Desired, PassOutcome) {
    run_pass_with(cfg, nodes, local_ranges, previous, k, &mut BTreeMap::new())
}

/// [`run_pass`], asking the kernel whether a peer address is on-link only for
/// addresses `known` has no answer for (and remembering the answers there; addresses
/// no longer needed are forgotten). With the answers kept between passes, one node's
/// change costs the kernel the same requests in a cluster of 5,000 nodes as in one of
/// 5; the run loop forgets them at each resync, which is how a peer that moved on or
/// off link is noticed.
pub fn run_pass_with<K: NodeKernel + ?Sized>(
    cfg: &Config,
    nodes: &[ClusterNode],
    local_ranges: &[IpNet],
    previous: Option<&Desired>,
    k: &mut K,
    known: &mut BTreeMap<IpAddr, bool>,
) -> (Desired, PassOutcome) {
    let mut outcome = PassOutcome::default();
    let mut facts = Facts::default();
    if let Some(local) = local_address(cfg, nodes) {
        match k.underlay_mtu(local) {
            Ok(m) => facts.underlay_mtu = m,
            Err(e) => outcome.failures.push(Failure::new(
                "lookup",
                format!("look up the underlay link of {local}"),
                e,
            )),
        }
    }
    let wanted = addresses_to_look_up(cfg, nodes);
    known.retain(|a, _| wanted.binary_search(a).is_ok());
    for a in wanted {
        if let Some(on) = known.get(&a) {
            facts.on_link.insert(a, *on);
            continue;
        }
        match k.on_link(a) {
            Ok(on) => {
                facts.on_link.insert(a, on);
                known.insert(a, on);
            }
            Err(e) => outcome
                .failures
                .push(Failure::new("lookup", format!("look up the route to {a}"), e)),
        }
    }
    let desired = plan(cfg, nodes, local_ranges, &facts);
    let drift = previous == Some(&desired);
    let observed = k.observe().and_then(|mut o| {
        if let Some(e) = cfg.export {
            o.exported = k.exported(e)?;
        }
        Ok(o)
    });
    match observed {
        Ok(observed) => {
            for c in diff(&desired, &observed) {
                match k.apply(&c) {
                    Ok(()) if drift => outcome.repairs.push(c),
                    Ok(()) => outcome.changes.push(c),
                    Err(e) => outcome.failures.push(Failure::new(c.labels().0, c.to_string(), e)),
                }
            }
        }
        Err(e) => outcome
            .failures
            .push(Failure::new("lookup", "read weft's pod routing", e)),
    }
    match k.masquerade() {
        Ok(found) => {
            if let Some(mc) = masq_diff(desired.masquerade.as_ref(), &found) {
                match k.set_masquerade(&mc) {
                    Ok(()) => outcome.masquerade = Some(mc),
                    Err(e) => outcome
                        .failures
                        .push(Failure::new("masquerade", "write the masquerade table", e)),
                }
            }
        }
        Err(e) => outcome
            .failures
            .push(Failure::new("masquerade", "read the masquerade table", e)),
    }
    (desired, outcome)
}
