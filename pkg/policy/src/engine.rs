//! The run loop: a pass reads the cluster's pods, namespaces and policies (the watch
//! cache), this node's pods (its store) and the node addresses, plans the node's policy
//! table and applies the difference in one transaction. Passes run at start, whenever
//! what they read changes, before an ADD answers (so a new pod is policed from its
//! first packet), and every resync interval (put off while passes keep finding pods
//! that moved, for at most one more interval: [`weft_topology::resync`]), when the
//! kernel is read back and drift is repaired.
//!
//! Never open: until the cache has listed every kind once, a pass changes nothing, so a
//! restarted weftd leaves the last enforced table in place; a lost watch keeps the last
//! objects (the source says the state is stale) and the table with them.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::future::Future;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use imbl::ordmap::DiffItem;
use tokio::sync::Notify;
use tracing::{debug, info, warn};
use weft_topology::resync::{RESYNC_QUIET, Resync};
use weft_topology::{PolicyObjects, PolicyPod, PolicyPods, TopologySource};

use weft_topology::PortProtocol;

use crate::denies::{DenyEvent, DenyLog, flow_of, now_ms};
use crate::eval::{ClusterView, LocalPod, NodeInfo, Verdict};
use crate::kernel::PolicyKernel;
use crate::metrics::InvalidLabels;
use crate::metrics::PolicyMetrics;
use crate::names::{Counter, LogPrefix, SetName};
use crate::nft::{self, Observed};
use crate::plan::{Desired, plan};

/// This node's pods, read at each pass (from the store). A listing that returns the
/// very same map as the one before (`ptr_eq`) says nothing changed, so a pass of other
/// nodes' pods need not compare the node's pods one by one (a new map is always safe).
pub type LocalPods = Arc<dyn Fn() -> BoxFuture<'static, Result<LocalListing, String>> + Send + Sync>;

/// A listing of this node's pods, in the source's order (the store's: by attachment
/// id). A persistent map that the source changes in place at every change of the
/// node's pods (each ADD of a bring-up): a pod that did not change is the same `Arc` in
/// the next listing, and two listings share all but what changed, so what moved
/// between them is their difference, not a walk of the node's pods.
pub type LocalListing = imbl::OrdMap<i64, Arc<LocalPod>>;

/// A listing of `pods` in their order (keyed by position), for a source without ids of
/// its own.
pub fn local_listing(pods: impl IntoIterator<Item = LocalPod>) -> LocalListing {
    (0..).zip(pods.into_iter().map(Arc::new)).collect()
}

/// How the engine runs.
#[derive(Debug, Clone)]
pub struct Config {
    /// This node's name.
    pub node_name: String,
    /// How often the kernel is read back and repaired.
    pub resync: Duration,
    /// How long an ADD waits for the cache to list everything once before it is
    /// answered "try again later".
    pub sync_wait: Duration,
    /// The bounds of the addresses learnt for `domainNames` rules (minimum TTL, per
    /// name, in all).
    pub learnt: weft_fqdn::Limits,
}

/// What one pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PassOutcome {
    /// Whether the cluster's objects were known (else nothing was touched).
    pub synced: bool,
    /// The transaction applied, if any.
    pub script: Option<String>,
    /// Whether it repaired drift (the kernel read back differed from the last plan).
    pub repaired: bool,
    /// Whether it only added one pod to the last plan (an ADD's fast path).
    pub incremental: bool,
}

/// What the engine keeps between passes (the plan last applied is [`Latest`]).
#[derive(Default)]
struct State {
    /// Whether the next pass must read the kernel back rather than trust the last plan
    /// (a transaction failed: the kernel holds the plan before it, or something else).
    must_observe: bool,
    /// Problems of policies already logged (each is logged once, until it goes).
    logged: std::collections::HashSet<crate::problem::Problem>,
    /// Local pods with no Pod object, already logged.
    unknown_logged: Vec<(String, String)>,
    /// Pods whose ADD put their policies in place and has not committed them to the
    /// store yet, by host interface: a pass in between plans them too (the store does
    /// not list them), so it never takes out what an ADD just answered for.
    pending: BTreeMap<String, (LocalPod, Instant)>,
    /// The listing of this node's pods (and `pending` as it then stood, by its
    /// `pending_epoch`) that the last plan's view was built from or found to hold: while
    /// both stand, a pass of pods only takes the node's pods as unchanged.
    local_confirmed: Option<(LocalListing, u64)>,
    /// Moves whenever `pending` changes.
    pending_epoch: u64,
    /// The host interfaces of the last listing `merge_pending` looked at (how many of
    /// its pods have each), brought to the next listing by their difference: whether a
    /// pending pod is listed is a lookup, not a walk of the node's pods.
    listed: Option<(LocalListing, HashMap<String, usize>)>,
    /// Pods of other nodes announced by them before the API has their addresses.
    announced: announce::Announcements,
    /// How many announcements of the engine's queue ([`PolicyEngine::queued`]) a pass
    /// that ended well has taken in: an announcement whose number is within it is in
    /// the sets, and its caller runs no pass of its own.
    announced_upto: u64,
    /// When a pass last ran for something that moved (an ADD, an announcement, a
    /// change of the cache or of this node's pods) rather than for a resync: a due
    /// resync waits while they keep coming.
    last_moved: Option<Instant>,
}

/// How long a pod stays pending without its ADD committing it: an ADD commits within
/// milliseconds of placing its policies, so an entry this old is an ADD that died.
const PENDING_TTL: Duration = Duration::from_secs(60);

/// What the last pass planned from and decided: what names a denied packet's group
/// and ends, and what `explain` evaluates against.
#[derive(Clone)]
pub struct Latest {
    /// The cluster as the pass saw it.
    pub view: Arc<ClusterView>,
    /// The plan it applied.
    pub desired: Arc<Desired>,
    /// The generation of the source's policy objects and the nodes it was planned
    /// from: a pod's ADD may add to this plan only while neither moved.
    generation: Generation,
    /// The objects it was planned from: a change of pods only is found against them.
    objects: Arc<PolicyObjects>,
}

/// The verdict of one flow with the ends resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Explanation {
    /// The source as given, resolved (`namespace/name` of a pod, or an address).
    pub src: String,
    /// The destination, alike.
    pub dst: String,
    /// The source address evaluated.
    pub src_ip: IpAddr,
    /// The destination address evaluated.
    pub dst_ip: IpAddr,
    /// The verdict.
    pub verdict: Verdict,
    /// What weft could not read in the policies that may apply to either end: the
    /// NetworkPolicies of their namespaces and every ClusterNetworkPolicy.
    pub problems: Vec<crate::problem::Problem>,
}

/// Network policy on this node, for operators.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Status {
    /// Whether the cluster's objects have been listed.
    pub synced: bool,
    /// Whether a watch is lost (the last state stays enforced).
    pub stale: bool,
    /// Valid NetworkPolicies known.
    pub policies: usize,
    /// Valid ClusterNetworkPolicies known.
    pub cluster_policies: usize,
    /// What weft could not read in the policies, each with what it enforces instead
    /// (`ClusterNetworkPolicy admin: spec.ingress[0].x: not a field weft knows; ...`).
    pub invalid: Vec<String>,
    /// This node's pods isolated for ingress.
    pub isolated_ingress: usize,
    /// The same for egress.
    pub isolated_egress: usize,
}

/// The network policy engine of one node. Cheap to share: wrap it in an `Arc`.
pub struct PolicyEngine<K> {
    cfg: Config,
    source: Arc<dyn TopologySource>,
    local: LocalPods,
    kernel: Arc<Mutex<K>>,
    state: tokio::sync::Mutex<State>,
    metrics: Arc<PolicyMetrics>,
    wake: Notify,
    latest: Mutex<Option<Latest>>,
    denies: DenyLog,
    /// Kernel counter values at the last sample, by counter name.
    sampled: Mutex<HashMap<String, u64>>,
    /// Host interfaces detached since the last pass (a DEL, or an ADD that failed after
    /// its policies were placed): if pending, they are no longer.
    detached: Mutex<Vec<String>>,
    /// How this node tells the others about its new pods, if it does.
    announcer: Mutex<Option<Arc<dyn Announcer>>>,
    /// Announcements taken and not yet in a pass: every pass takes them all in, so that
    /// the announcements of a burst of ADDs elsewhere cost this node one pass rather
    /// than one each.
    queued: Mutex<announce::Queue>,
    /// The addresses learnt from DNS answers for `domainNames` rules.
    learnt: crate::eval::LearntNames,
    /// When the learnt table last forgot what expired (Unix ms).
    learnt_expired_ms: std::sync::atomic::AtomicI64,
}

/// An end of a connection in `view`: a pod by name, or an address (see
/// [`PolicyEngine::resolve`]).
fn resolve(view: &ClusterView, what: &str) -> Result<(String, Vec<IpAddr>), String> {
    if let Ok(ip) = what.parse::<IpAddr>() {
        return Ok((view.endpoint(ip).to_string(), vec![ip]));
    }
    let (ns, name) = what.split_once('/').unwrap_or(("default", what));
    let pod = view
        .pod(ns, name)
        .ok_or_else(|| format!("no pod {ns}/{name} is known"))?;
    if pod.ips.is_empty() {
        return Err(format!("pod {ns}/{name} has no address yet"));
    }
    Ok((format!("{ns}/{name}"), pod.ips.clone()))
}

impl<K: PolicyKernel> PolicyEngine<K> {
    /// An engine over `kernel`, reading the cluster from `source` and this node's pods
    /// from `local`.
    pub fn new(
        cfg: Config,
        source: Arc<dyn TopologySource>,
        local: LocalPods,
        kernel: K,
        metrics: Arc<PolicyMetrics>,
    ) -> Self {
        let learnt = Arc::new(std::sync::RwLock::new(weft_fqdn::Learnt::new(cfg.learnt)));
        Self {
            cfg,
            source,
            local,
            kernel: Arc::new(Mutex::new(kernel)),
            state: tokio::sync::Mutex::new(State::default()),
            metrics,
            wake: Notify::new(),
            latest: Mutex::new(None),
            denies: DenyLog::default(),
            sampled: Mutex::default(),
            detached: Mutex::default(),
            announcer: Mutex::default(),
            queued: Mutex::default(),
            learnt,
            learnt_expired_ms: std::sync::atomic::AtomicI64::new(0),
        }
    }

    /// The addresses this node learnt for `domainNames` rules (`weftctl policy names`).
    pub fn learnt(&self) -> Vec<weft_fqdn::LearntAddress> {
        self.learnt.read().expect("learnt names lock").list()
    }

    /// What the last pass planned from and decided, once one ran.
    pub fn latest(&self) -> Option<Latest> {
        self.latest.lock().expect("latest lock").clone()
    }

    /// What `weftctl status` says of policy on this node.
    pub fn status(&self) -> Status {
        let objects = self.source.policy_objects();
        let latest = self.latest();
        Status {
            synced: objects.synced,
            stale: objects.stale,
            policies: latest.as_ref().map_or(0, |l| l.view.policies.len()),
            cluster_policies: latest.as_ref().map_or(0, |l| l.view.cluster_policies.len()),
            invalid: latest
                .as_ref()
                .map(|l| l.view.problems.iter().map(ToString::to_string).collect())
                .unwrap_or_default(),
            isolated_ingress: latest.as_ref().map_or(0, |l| l.desired.ingress.len()),
            isolated_egress: latest.as_ref().map_or(0, |l| l.desired.egress.len()),
        }
    }

    /// The denied flows seen.
    pub fn denies(&self) -> &DenyLog {
        &self.denies
    }

    /// Evaluates a new connection from `src` to `dst` (each a pod as `namespace/name`
    /// or an address) on `port`/`protocol`, against what the last pass saw.
    pub fn explain(&self, src: &str, dst: &str, protocol: PortProtocol, port: u16) -> Result<Explanation, String> {
        let latest = self
            .latest()
            .ok_or("the policy objects of the cluster are not listed yet")?;
        let v = &latest.view;
        let (s, s_ips) = resolve(v, src)?;
        let (d, d_ips) = resolve(v, dst)?;
        let (src_ip, dst_ip) = s_ips
            .iter()
            .find_map(|a| d_ips.iter().find(|b| a.is_ipv6() == b.is_ipv6()).map(|b| (*a, *b)))
            .ok_or_else(|| format!("{s} and {d} have no address of one family"))?;
        let namespaces: Vec<String> = [src_ip, dst_ip]
            .iter()
            .filter_map(|ip| v.endpoint(*ip).pod().map(|p| p.namespace.clone()))
            .collect();
        let problems = v
            .problems
            .iter()
            .filter(|p| p.kind == crate::problem::ObjectKind::ClusterNetworkPolicy || namespaces.contains(&p.namespace))
            .cloned()
            .collect();
        Ok(Explanation {
            src: s,
            dst: d,
            src_ip,
            dst_ip,
            verdict: v.verdict(src_ip, dst_ip, protocol, port),
            problems,
        })
    }

    /// An end of a connection as `explain` takes it (a pod as `namespace/name`, or
    /// `name` in namespace default, or an address): its name as reports write it and
    /// its addresses.
    pub fn resolve(&self, what: &str) -> Result<(String, Vec<IpAddr>), String> {
        let latest = self
            .latest()
            .ok_or("the policy objects of the cluster are not listed yet")?;
        resolve(&latest.view, what)
    }

    /// What a step of a trace through weft's policy table stands for (see
    /// [`crate::plan::Desired::meaning`]), by the last pass; `None` for another table's
    /// or a name weft does not know.
    pub fn trace_meaning(&self, table: &str, chain: &str, rule: &str) -> Option<String> {
        if table != format!("inet {}", crate::plan::TABLE) {
            return None;
        }
        self.latest()?.desired.meaning(chain, rule)
    }

    /// Learns from a DNS answer to one of this node's pods (`payload`: the DNS
    /// message, a copy of it as it passed): the addresses of a name some `domainNames`
    /// rule takes go into its learnt sets, with their TTL (at least the table's
    /// minimum) and the name as comment, in one transaction. Blocks until written
    /// (call it from the learner's reader, never a runtime worker: a held connection
    /// waits for it); what it did.
    pub fn dns_answer(&self, payload: &[u8]) -> &'static str {
        let result = self.learn_answer(payload);
        self.metrics
            .dns_answers
            .get_or_create(&crate::metrics::ResultLabels { result })
            .inc();
        result
    }

    /// Counts a new connection the hold kept until the answers before it were learnt.
    pub fn dns_held(&self) {
        self.metrics.dns_held.inc();
    }

    fn learn_answer(&self, payload: &[u8]) -> &'static str {
        let answer = match weft_fqdn::read_response(payload) {
            Ok(Some(a)) => a,
            Ok(None) => return "ignored",
            Err(_) => return "unreadable",
        };
        let Some(latest) = self.latest() else {
            return "unmatched";
        };
        let sets: Vec<&SetName> = latest
            .desired
            .learnt
            .iter()
            .filter(|(_, names)| names.iter().any(|n| n.matches(&answer.query)))
            .map(|(set, _)| set)
            .collect();
        if sets.is_empty() {
            return "unmatched";
        }
        let now = now_ms();
        let mut elements = Vec::new();
        {
            let mut learnt = self.learnt.write().expect("learnt names lock");
            self.expire_learnt(&mut learnt, now);
            for a in &answer.addresses {
                let (outcome, _) = learnt.learn(&answer.query, a.ip, a.ttl, now);
                if !matches!(outcome, weft_fqdn::Outcome::New | weft_fqdn::Outcome::Extended) {
                    continue;
                }
                let timeout_ms = u64::try_from(learnt.expiry(a.ttl, now) - now).unwrap_or(0);
                for set in &sets {
                    if matches!(set, SetName::Data { v6, .. } if *v6 == a.ip.is_ipv6()) {
                        elements.push(crate::kernel::LearntElement {
                            set: (*set).clone(),
                            ip: a.ip,
                            timeout_ms,
                            name: answer.query.clone(),
                        });
                    }
                }
            }
            self.learnt_gauges(&learnt);
        }
        if elements.is_empty() {
            return "learnt";
        }
        match self.kernel.lock().expect("policy kernel lock").learn(&elements) {
            Ok(()) => "learnt",
            Err(e) => {
                warn!(error = %e, name = %answer.query, "cannot write learnt addresses: connections to them are refused until a new answer");
                "failed"
            }
        }
    }

    /// Forgets what expired, at most once a second (the kernel expires its elements
    /// itself; this keeps the table, `explain` and the gauges in step).
    fn expire_learnt(&self, learnt: &mut weft_fqdn::Learnt, now: i64) {
        let last = self.learnt_expired_ms.load(std::sync::atomic::Ordering::Relaxed);
        if now - last < 1000 {
            return;
        }
        self.learnt_expired_ms.store(now, std::sync::atomic::Ordering::Relaxed);
        learnt.expire(now);
    }

    fn learnt_gauges(&self, learnt: &weft_fqdn::Learnt) {
        let m = &self.metrics;
        m.learnt_names.set(i64::try_from(learnt.names()).unwrap_or(i64::MAX));
        m.learnt_addresses
            .set(i64::try_from(learnt.addresses()).unwrap_or(i64::MAX));
        let (ev, re) = (learnt.evictions, learnt.refused);
        m.learnt_evictions.inc_by(ev.saturating_sub(m.learnt_evictions.get()));
        m.learnt_refused.inc_by(re.saturating_sub(m.learnt_refused.get()));
    }

    /// The learnt addresses a plan's new learnt sets start with: what the node holds
    /// for names they take, with what is left of each timeout. `last`: the plan the
    /// kernel held before (`None`: not known, every learnt set is filled).
    fn refill(&self, d: &Desired, last: Option<&Desired>) -> Vec<crate::kernel::LearntElement> {
        let new: Vec<(&SetName, &Vec<weft_fqdn::DomainPattern>)> = d
            .learnt
            .iter()
            .filter(|(set, _)| last.is_none_or(|l| !l.learnt.contains_key(*set)))
            .collect();
        if new.is_empty() {
            return Vec::new();
        }
        let now = now_ms();
        let learnt = self.learnt.read().expect("learnt names lock");
        let mut out = Vec::new();
        for a in learnt.list().into_iter().filter(|a| a.expires_ms > now) {
            for (set, names) in &new {
                let family = matches!(set, SetName::Data { v6, .. } if *v6 == a.ip.is_ipv6());
                if family && names.iter().any(|n| n.matches(&a.name)) {
                    out.push(crate::kernel::LearntElement {
                        set: (*set).clone(),
                        ip: a.ip,
                        timeout_ms: u64::try_from(a.expires_ms - now).unwrap_or(0),
                        name: a.name.clone(),
                    });
                }
            }
        }
        out
    }

    /// Turns a packet a group chain logged into a deny event (kept unless its flow was
    /// reported just before); `None` for a packet that is not weft's or not a flow.
    pub fn logged(&self, prefix: &str, payload: &[u8]) -> Option<DenyEvent> {
        let prefix = LogPrefix::parse(prefix)?;
        let flow = flow_of(payload)?;
        let latest = self.latest()?;
        let (direction, audit, policies) = match prefix {
            // A ClusterNetworkPolicy Deny rule, by its counter.
            LogPrefix::ClusterDeny(counter) => {
                let r = latest.desired.cluster_rules.get(&counter)?;
                let rule = if r.rule_name.is_empty() {
                    format!("rule {}", r.rule)
                } else {
                    format!("rule {} ({})", r.rule, r.rule_name)
                };
                (
                    r.direction,
                    false,
                    vec![format!("clusternetworkpolicy {} {rule}", r.policy)],
                )
            }
            // A NetworkPolicy group chain's end.
            LogPrefix::Group { chain, audit } => {
                let group = latest.desired.groups.get(&chain)?;
                (group.direction, audit, group.policies.clone())
            }
        };
        let ev = DenyEvent {
            at_ms: now_ms(),
            direction,
            audit,
            src: latest.view.endpoint(flow.src).to_string(),
            dst: latest.view.endpoint(flow.dst).to_string(),
            flow,
            policies,
        };
        self.denies.record(ev.clone()).then_some(ev)
    }

    /// Reads the kernel's counters into `weft_policy_verdicts_total` (what rules
    /// accepted, per policy; what group chains denied or audited, per isolating
    /// policy). A counter recreated since the last sample counts from zero.
    pub async fn sample_verdicts(&self) {
        let Some(latest) = self.latest() else { return };
        let kernel = self.kernel.clone();
        let read = tokio::task::spawn_blocking(move || kernel.lock().expect("policy kernel lock").counters()).await;
        let Ok(Ok(counters)) = read else { return };
        let d = &latest.desired;
        let by_counter: HashMap<&Counter, &crate::plan::PolicyChain> =
            d.policy_chains.values().map(|p| (&p.counter, p)).collect();
        let mut sampled = self.sampled.lock().expect("sample lock");
        for (name, value) in &counters {
            let before = sampled.get(name).copied().unwrap_or(0);
            let delta = if *value >= before { value - before } else { *value };
            sampled.insert(name.clone(), *value);
            let Some(counter) = Counter::parse(name).filter(|_| delta > 0) else {
                continue;
            };
            if let Some(p) = by_counter.get(&counter) {
                self.metrics.verdict(p.direction, "allow", &p.namespace, &p.name, delta);
            } else if let Some(r) = d.cluster_rules.get(&counter) {
                let action = match r.action {
                    weft_topology::CnpAction::Accept => "allow",
                    weft_topology::CnpAction::Deny => "deny",
                    weft_topology::CnpAction::Pass => "pass",
                };
                self.metrics.verdict(r.direction, action, "", &r.policy, delta);
            } else if let Some(g) = counter.group_chain().and_then(|c| d.groups.get(&c)) {
                let action = if g.audit { "audit" } else { "deny" };
                for policy in &g.policies {
                    let name = policy.split_once('/').map_or(policy.as_str(), |(_, n)| n);
                    self.metrics.verdict(g.direction, action, &g.namespace, name, delta);
                }
            }
        }
        sampled.retain(|k, _| counters.contains_key(k));
    }

    /// This node's pods: the store's ready ones (`listing`) and those whose ADD is under
    /// way (`pending`), dropping from `pending` those `listing` has, those detached
    /// since, and those whose ADD has not committed for too long.
    fn merge_pending(&self, state: &mut State, listing: &LocalListing) -> Vec<Arc<LocalPod>> {
        let before = state.pending.len();
        for ifname in std::mem::take(&mut *self.detached.lock().expect("detached lock")) {
            state.pending.remove(&ifname);
        }
        if !state.pending.is_empty() {
            let listed = listed_interfaces(&mut state.listed, listing);
            state
                .pending
                .retain(|ifname, (_, since)| !listed.contains_key(ifname) && since.elapsed() < PENDING_TTL);
        }
        if state.pending.len() != before {
            state.pending_epoch += 1;
        }
        let mut local: Vec<Arc<LocalPod>> = listing.values().cloned().collect();
        for (p, _) in state.pending.values() {
            local.push(Arc::new(p.clone()));
        }
        local
    }

    /// Whether `local` holds the pods `view` has, no more and no fewer: compared in
    /// name order, without a lookup (and its key's copy) per pod.
    fn same_local(local: &[Arc<LocalPod>], view: &BTreeMap<(String, String), LocalPod>) -> bool {
        if local.len() != view.len() {
            return false;
        }
        let mut sorted: Vec<&LocalPod> = local.iter().map(|p| &**p).collect();
        sorted.sort_unstable_by(|a, b| {
            (a.namespace.as_str(), a.name.as_str()).cmp(&(b.namespace.as_str(), b.name.as_str()))
        });
        sorted
            .iter()
            .zip(view)
            .all(|(l, ((ns, name), v))| l.namespace == *ns && l.name == *name && *l == v)
    }

    /// `local` with `extra` (the pod being attached now) in place of any of its name.
    fn with_extra(mut local: Vec<Arc<LocalPod>>, extra: Option<&LocalPod>) -> Vec<Arc<LocalPod>> {
        if let Some(p) = extra {
            local.retain(|l| l.host_ifname != p.host_ifname);
            local.push(Arc::new(p.clone()));
        }
        local
    }

    /// The view a pass plans from `objects`, with this node's pods `local`.
    fn view(&self, objects: &PolicyObjects, local: &[Arc<LocalPod>]) -> ClusterView {
        let nodes: Vec<NodeInfo> = self
            .source
            .nodes()
            .into_iter()
            .map(|n| NodeInfo {
                addresses: n.addresses.iter().chain(&n.external_addresses).copied().collect(),
                labels: n.labels,
                name: n.name,
            })
            .collect();
        let mut v = ClusterView::new(objects, &self.cfg.node_name, local.iter().map(|p| &**p), &nodes);
        v.learnt = self.learnt.clone();
        v
    }

    /// Runs one pass; `resync` reads the kernel back instead of trusting the last plan.
    pub async fn pass(&self, resync: bool) -> Result<PassOutcome, String> {
        self.pass_with(None, resync).await
    }

    /// The source's generation of policy objects and its nodes now.
    fn generation(&self) -> Generation {
        Generation {
            policy: *self.source.policy_changes().borrow(),
            nodes: self.source.nodes(),
        }
    }

    async fn pass_with(&self, extra: Option<&LocalPod>, resync: bool) -> Result<PassOutcome, String> {
        let mut state = self.state.lock().await;
        let out = self.pass_locked(&mut state, extra, resync).await?;
        if let Some(p) = extra
            && out.synced
        {
            // Planned now, in the store only once its ADD commits.
            state.pending.insert(p.host_ifname.clone(), (p.clone(), Instant::now()));
            state.pending_epoch += 1;
        }
        Ok(out)
    }

    async fn pass_locked(
        &self,
        state: &mut State,
        extra: Option<&LocalPod>,
        resync: bool,
    ) -> Result<PassOutcome, String> {
        if !resync {
            state.last_moved = Some(now());
        }
        if let Some(pod) = extra
            && !resync
            && !state.must_observe
            && let Some(out) = self.add_one(state, pod).await?
        {
            return Ok(out);
        }
        // What was announced until now goes into this pass, whichever path it takes.
        let upto = self.take_announced(state);
        if !resync
            && !state.must_observe
            && let Some(out) = self.pods_only(state).await?
        {
            state.announced_upto = upto;
            let Some(pod) = extra else { return Ok(out) };
            // Pods of other nodes had moved since the last plan (in a bring-up, nearly
            // always): taken in, the ADD's pod is added alone, rather than the whole
            // cluster being planned again at every ADD.
            if let Some(added) = self.add_one(state, pod).await? {
                return Ok(PassOutcome {
                    script: match (out.script, added.script) {
                        (Some(a), Some(b)) => Some(format!("{a}{b}")),
                        (a, b) => a.or(b),
                    },
                    ..added
                });
            }
        }
        let started = Instant::now();
        let generation = self.generation();
        let objects = state.announced.patch(self.source.policy_objects());
        self.metrics.synced.set(i64::from(objects.synced));
        self.metrics.stale.set(i64::from(objects.stale));
        if !objects.synced {
            // Nothing to apply them to yet: the pass once the cache is synced takes them.
            state.announced_upto = upto;
            return Ok(PassOutcome::default());
        }
        let listing = (self.local)().await?;
        let local = Self::with_extra(self.merge_pending(state, &listing), extra);
        let view = self.view(&objects, &local);
        self.report(&view, state);
        let desired = Arc::new(plan(&view));
        let last = self.latest().map(|l| l.desired);
        let base = match (&last, resync || state.must_observe) {
            (Some(last), false) => Some(Observed::after(last)),
            _ => None,
        };
        let kernel = self.kernel.clone();
        let d = desired.clone();
        let refill = self.refill(&desired, base.as_ref().and(last.as_deref()));
        let work = tokio::task::spawn_blocking(move || {
            let mut k = kernel.lock().expect("policy kernel lock");
            let mut observed = match base {
                Some(b) => b,
                None => k.observe().map_err(|e| e.to_string())?,
            };
            let restored = std::mem::take(&mut observed.learnt);
            let script = nft::diff(&d, &observed);
            let repaired = script.is_some() && last.as_ref().is_some_and(|l| **l == *d);
            if let Some(s) = &script {
                k.apply(s).map_err(|e| e.to_string())?;
            }
            // What is learnt already goes into learnt sets new in this plan; answers
            // are held for the learner only while a rule has names.
            if let Err(e) = k.learn(&refill) {
                warn!(error = %e, "cannot write learnt addresses into new learnt sets");
            }
            if let Err(e) = k.copy_dns_answers(!d.learnt.is_empty()) {
                warn!(error = %e, "cannot hold DNS answers for domainNames rules: their names' addresses are not learnt (refused)");
            }
            Ok::<_, String>((script, repaired, restored))
        })
        .await
        .map_err(|e| format!("policy pass panicked: {e}"))?;
        let (script, repaired, restored) = match work {
            Ok(r) => r,
            Err(e) => {
                self.metrics.failures.inc();
                // The transaction is atomic, but the kernel may not hold the last plan
                // either: the next pass reads it back.
                state.must_observe = true;
                return Err(e);
            }
        };
        state.must_observe = false;
        if !restored.is_empty() {
            // The kernel's learnt elements carry their names: what a weftd before this
            // one learnt is known again (explain, `policy names`), with the time left.
            let now = now_ms();
            let mut learnt = self.learnt.write().expect("learnt names lock");
            let n = restored.len();
            for (ip, name, left) in restored {
                learnt.restore(&name, ip, now + i64::from(left) * 1000);
            }
            self.learnt_gauges(&learnt);
            info!(addresses = n, "learnt addresses read back from the policy table");
        }
        if script.is_some() {
            let kind = if repaired { "repair" } else { "change" };
            self.metrics
                .changes
                .get_or_create(&crate::metrics::ChangeLabels { kind })
                .inc();
            if repaired {
                warn!("the policy table had drifted from the plan: repaired");
            }
        }
        self.metrics.pass_seconds.observe(started.elapsed().as_secs_f64());
        self.metrics.isolated(&desired);
        // The view's pods are the listing's and the pending ones as they stand now
        // (with an extra pod it holds more than them: not a base to trust).
        state.local_confirmed = extra.is_none().then_some((listing, state.pending_epoch));
        state.announced_upto = upto;
        *self.latest.lock().expect("latest lock") = Some(Latest {
            view: Arc::new(view),
            desired,
            generation,
            objects,
        });
        Ok(PassOutcome {
            synced: true,
            script,
            repaired,
            incremental: false,
        })
    }

    /// A change of pods only (elsewhere in the cluster, or a local pod's Pod object
    /// that changes nothing the view has of it), applied as set elements for the
    /// addresses it touches, without planning the table again: one small transaction
    /// whatever the cluster's size. `None`: something else moved (namespaces, policies,
    /// nodes, this node's pods, the cache's state), and a full pass is needed.
    async fn pods_only(&self, state: &mut State) -> Result<Option<PassOutcome>, String> {
        let started = Instant::now();
        let generation = self.generation();
        let objects = state.announced.patch(self.source.policy_objects());
        let listing = (self.local)().await?;
        // The same listing and pending pods as the last plan was found to hold: the
        // node's pods are as it has them, without comparing each (a pass of pods only
        // comes at every pod another node announces).
        let confirmed = state
            .local_confirmed
            .as_ref()
            .is_some_and(|(l, epoch)| l.ptr_eq(&listing) && *epoch == state.pending_epoch)
            && self.detached.lock().expect("detached lock").is_empty();
        let local = (!confirmed).then(|| self.merge_pending(state, &listing));
        let delta = {
            let mut slot = self.latest.lock().expect("latest lock");
            let Some(latest) = slot.as_mut() else { return Ok(None) };
            let old = &latest.objects;
            let local_same = local
                .as_ref()
                .is_none_or(|local| Self::same_local(local, &latest.view.local));
            if latest.generation.nodes != generation.nodes
                || !objects.synced
                || (objects.synced, objects.stale) != (old.synced, old.stale)
                || !same(&objects.namespaces, &old.namespaces)
                || !same(&objects.policies, &old.policies)
                || !same(&objects.cluster_policies, &old.cluster_policies)
                || !local_same
            {
                return Ok(None);
            }
            let changes = changed_pods(&old.pods, &objects.pods);
            // A pod of this node whose Pod object changes what the view has of it (its
            // labels, ports, or its object's coming or going) may change its group: a
            // full pass. Checked before anything is changed.
            let view = &latest.view;
            for (key, new) in &changes {
                if let Some(l) = view.local.get(key) {
                    let merged = new.as_ref().map(|p| PolicyPod {
                        ips: l.ips.clone(),
                        node: view.node.clone(),
                        ..(**p).clone()
                    });
                    if merged.is_none() || view.pod(&key.0, &key.1).as_deref() != merged.as_ref() {
                        return Ok(None);
                    }
                }
            }
            let view = Arc::make_mut(&mut latest.view);
            let mut ips = BTreeSet::new();
            for (key, new) in changes {
                if !view.local.contains_key(&key) {
                    ips.extend(view.set_pod(key, new));
                }
            }
            let d = Arc::make_mut(&mut latest.desired);
            let delta = crate::plan::delta(view, d, &ips);
            delta.apply_to(d);
            latest.generation = generation;
            latest.objects = objects;
            delta
        };
        // The view's pods are the listing's (and the pending ones) as they stand now.
        state.local_confirmed = Some((listing, state.pending_epoch));
        let script = nft::delta_script(&delta);
        if !delta.is_empty() {
            let applied = self.kernel.lock().expect("policy kernel lock").update(&delta);
            if let Err(e) = applied {
                self.metrics.failures.inc();
                state.must_observe = true;
                return Err(e.to_string());
            }
            self.metrics
                .changes
                .get_or_create(&crate::metrics::ChangeLabels { kind: "change" })
                .inc();
        }
        self.metrics.pass_seconds.observe(started.elapsed().as_secs_f64());
        Ok(Some(PassOutcome {
            synced: true,
            script,
            repaired: false,
            incremental: true,
        }))
    }

    /// An ADD's pod added to the last plan alone, when nothing it was planned from has
    /// moved and the pod needs no chain the plan lacks: its dispatch entries and its
    /// elements in existing sets, one small transaction. `None`: a full pass is needed.
    async fn add_one(&self, state: &mut State, pod: &LocalPod) -> Result<Option<PassOutcome>, String> {
        let started = Instant::now();
        let generation = self.generation();
        let add = {
            let mut slot = self.latest.lock().expect("latest lock");
            let Some(latest) = slot.as_mut() else { return Ok(None) };
            let key = (pod.namespace.clone(), pod.name.clone());
            if latest.generation != generation
                || latest.view.local.contains_key(&key)
                || latest.view.local.values().any(|l| l.host_ifname == pod.host_ifname)
                || latest.desired.egress.contains_key(&pod.host_ifname)
                || latest.desired.ingress.contains_key(&pod.host_ifname)
            {
                return Ok(None);
            }
            // Readers (explain, the deny log) hold these only for a moment: the plan is
            // changed in place, not copied.
            let view = Arc::make_mut(&mut latest.view);
            view.add_local(pod);
            let Some(p) = view.pod(&pod.namespace, &pod.name) else {
                return Ok(None);
            };
            let add = crate::plan::addition(view, &latest.desired, &p, Some(&pod.host_ifname));
            add.apply_to(Arc::make_mut(&mut latest.desired));
            self.metrics.isolated(&latest.desired);
            add
        };
        let script = nft::addition_script(&add);
        if !add.is_empty() {
            // Written on this thread: a few set elements in one nfnetlink batch take
            // about 0.06 ms, and handing the call to the blocking pool and back cost
            // 0.2 ms (two thread wake-ups on the ADD's path); `block_in_place` hands the
            // worker's place to a new thread each time, each of which gets a malloc
            // arena of its own (43 MiB more RSS at 10,000 pods).
            let applied = self.kernel.lock().expect("policy kernel lock").add(&add);
            if let Err(e) = applied {
                self.metrics.failures.inc();
                // The plan says the pod's rules are in; the kernel does not hold them:
                // the next pass reads the kernel back (and this ADD fails).
                state.must_observe = true;
                return Err(e.to_string());
            }
            self.metrics
                .changes
                .get_or_create(&crate::metrics::ChangeLabels { kind: "change" })
                .inc();
        }
        if !add.new.learnt.is_empty() {
            // The pod's rules brought learnt sets (the first pod a domainNames rule
            // takes on this node): they start with what is learnt, and answers are
            // held from now on, before its ADD answers.
            let fill = self.refill(&add.new, None);
            let mut k = self.kernel.lock().expect("policy kernel lock");
            if let Err(e) = k.learn(&fill) {
                warn!(error = %e, "cannot write learnt addresses into new learnt sets");
            }
            if let Err(e) = k.copy_dns_answers(true) {
                warn!(error = %e, "cannot hold DNS answers for domainNames rules: their names' addresses are not learnt (refused)");
            }
        }
        self.metrics.pass_seconds.observe(started.elapsed().as_secs_f64());
        Ok(Some(PassOutcome {
            synced: true,
            script,
            repaired: false,
            incremental: true,
        }))
    }

    /// Logs and counts what the view says once: invalid policies, local pods the API
    /// does not know yet.
    fn report(&self, view: &ClusterView, state: &mut State) {
        let mut objects = std::collections::BTreeSet::new();
        for e in &view.problems {
            if !state.logged.contains(e) {
                warn!(
                    kind = e.kind.as_str(),
                    namespace = %e.namespace,
                    policy = %e.name,
                    field = %e.field,
                    error = %e.reason,
                    effect = %e.effect,
                    "{}: {} cannot be read: {}; {}", e.object(), e.field, e.reason, e.effect
                );
            }
            // Objects are counted, not problems: one object may have several.
            let labels = InvalidLabels {
                kind: e.kind.as_str(),
                namespace: e.namespace.clone(),
                effect: e.effect.label(),
            };
            objects.insert((labels, e.name.clone()));
        }
        state.logged = view.problems.iter().cloned().collect();
        let mut invalid: HashMap<InvalidLabels, i64> = HashMap::new();
        for (labels, _) in objects {
            *invalid.entry(labels).or_default() += 1;
        }
        self.metrics.set_invalid(&invalid);
        for key in &view.unknown_local {
            if !state.unknown_logged.contains(key) {
                info!(namespace = %key.0, pod = %key.1, "no Pod object for a pod of this node yet: policed as having no labels until there is");
            }
        }
        state.unknown_logged = view.unknown_local.clone();
    }

    /// Before an ADD answers: the pod's policies are in the kernel (or the ADD fails).
    /// Waits up to the configured bound for the cache to list everything once.
    pub async fn pod_attached(&self, pod: LocalPod) -> Result<(), String> {
        let deadline = Instant::now() + self.cfg.sync_wait;
        let mut changes = self.source.policy_changes();
        loop {
            let out = self.pass_with(Some(&pod), false).await?;
            if out.synced {
                // The other nodes put its addresses in their sets before the ADD answers.
                self.announce(&pod).await;
                return Ok(());
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(format!(
                    "network policy state not known yet (the pods, namespaces and NetworkPolicies of the cluster have not been listed within {} s)",
                    self.cfg.sync_wait.as_secs()
                ));
            }
            // Woken by the cache (or polled: a source without a counter never moves).
            let _ = tokio::time::timeout(left.min(Duration::from_millis(200)), changes.changed()).await;
        }
    }

    /// Says this node's pods changed (a DEL): the next pass comes at once.
    pub fn local_pods_changed(&self) {
        self.wake.notify_one();
    }

    /// Says the pod at `host_ifname` was detached (a DEL, or an ADD that failed after
    /// placing its policies): it is no longer pending, and the next pass comes at once.
    pub fn pod_detached(&self, host_ifname: &str) {
        self.detached
            .lock()
            .expect("detached lock")
            .push(host_ifname.to_string());
        self.wake.notify_one();
    }

    /// Runs passes until `stop`: at once, whenever the cache's policy objects or the
    /// node's pods change (a burst of changes costs one pass: the loop waits a few
    /// milliseconds for the rest), and a pass that reads the kernel back once per resync
    /// interval, put off while passes keep finding things that moved for at most one
    /// more interval ([`weft_topology::resync`]): such a pass plans the whole cluster
    /// and holds every ADD of the node meanwhile, and in a bring-up the passes of the
    /// arriving pods are building what it would repair.
    pub async fn run(self: Arc<Self>, stop: impl Future<Output = ()>) {
        let mut changes = self.source.policy_changes();
        // Moves with the source's topologies as well as its nodes: only a change of the
        // nodes (node peers, node addresses) wakes a pass; a lab's topology statuses,
        // written at every pod's arrival, would otherwise cost a pass each.
        let mut source = self.source.changes();
        let mut nodes = self.source.nodes();
        let interval = self.cfg.resync;
        tokio::pin!(stop);
        // When the last resync started; `None` until the first, which comes at once.
        let mut last_full: Option<Instant> = None;
        // Whether something moved since the last pass of this loop.
        let mut woken = true;
        loop {
            let moved = self.state.lock().await.last_moved;
            let due = weft_topology::resync::resync(last_full, moved, interval, now());
            if due == Resync::Waits {
                debug!("a policy resync is due; it waits until the pods stop moving");
            }
            let resync = due == Resync::Now;
            if woken || resync {
                if resync {
                    last_full = Some(now());
                }
                // A failed pass makes the next one, whatever wakes it, read the kernel
                // back; a resync that failed is not tried again at once.
                if let Err(e) = self.pass(resync).await {
                    warn!(error = %e, "policy pass failed; retried");
                }
            }
            woken = false;
            let wait = match due {
                Resync::Waits => RESYNC_QUIET,
                _ => last_full.map_or(Duration::ZERO, |t| (t + interval).saturating_duration_since(now())),
            };
            let changed = async {
                loop {
                    tokio::select! {
                        r = changes.changed() => if r.is_err() { std::future::pending::<()>().await } else { return },
                        r = source.changed() => {
                            if r.is_err() {
                                std::future::pending::<()>().await
                            }
                            let now = self.source.nodes();
                            if now != nodes {
                                nodes = now;
                                return;
                            }
                        }
                        _ = self.wake.notified() => return,
                    }
                }
            };
            tokio::select! {
                _ = &mut stop => return,
                _ = changed => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    woken = true;
                }
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }
}

/// The time the run loop reasons in: Tokio's clock (so a test can pause it), as the
/// standard `Instant` the resync rule takes.
fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}

/// What a plan was made from besides the pods: the source's generation of policy
/// objects, and the nodes (their addresses and labels, for node peers).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Generation {
    policy: u64,
    nodes: Vec<weft_topology::ClusterNode>,
}

/// The host interfaces of `listing` and how many of its pods have each, from `index`
/// (those of the listing it last saw) brought up to date by the two listings'
/// difference: what the source changed since, not every pod of the node.
fn listed_interfaces<'a>(
    index: &'a mut Option<(LocalListing, HashMap<String, usize>)>,
    listing: &LocalListing,
) -> &'a HashMap<String, usize> {
    let (seen, counts) = index.get_or_insert_with(Default::default);
    if !seen.ptr_eq(listing) {
        for d in seen.diff(listing) {
            let (gone, came) = match d {
                DiffItem::Add(_, p) => (None, Some(p)),
                DiffItem::Remove(_, p) => (Some(p), None),
                DiffItem::Update { old, new } => (Some(old.1), Some(new.1)),
            };
            if let Some(p) = gone
                && let std::collections::hash_map::Entry::Occupied(mut e) = counts.entry(p.host_ifname.clone())
            {
                *e.get_mut() -= 1;
                if *e.get() == 0 {
                    e.remove();
                }
            }
            if let Some(p) = came {
                *counts.entry(p.host_ifname.clone()).or_default() += 1;
            }
        }
        *seen = listing.clone();
    }
    counts
}

/// A pod (`namespace`, `name`) as a newer snapshot has it (`None`: gone).
type PodChange = ((String, String), Option<Arc<PolicyPod>>);

/// Whether two lists hold the same objects: the very same (a source keeps an unchanged
/// object's `Arc` from one snapshot to the next), or equal ones (a source may read an
/// unchanged object anew: a file too recent to trust its timestamps).
fn same<T: PartialEq>(a: &[Arc<T>], b: &[Arc<T>]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| Arc::ptr_eq(x, y) || x == y)
}

/// The pods that differ between two snapshots, in key order, with what the newer has
/// (`None`: gone). A source changes its map in place, so the two share all but the pods
/// that changed, and their difference skips the rest: its cost is the change's, not the
/// cluster's.
fn changed_pods(old: &PolicyPods, new: &PolicyPods) -> Vec<PodChange> {
    old.diff(new)
        .map(|d| match d {
            DiffItem::Add(k, p) | DiffItem::Update { new: (k, p), .. } => (k.clone(), Some(p.clone())),
            DiffItem::Remove(k, _) => (k.clone(), None),
        })
        .collect()
}

mod announce;
pub use announce::{ANNOUNCED_TTL, Announced, Announcer, Taken};

#[cfg(test)]
mod tests;
