//! The cluster as policy sees it ([`ClusterView`]: pods by address, namespaces, the
//! policies that read), and the reference evaluation of one flow ([`ClusterView::verdict`]):
//! which policies isolate each side, and the rule that allows it or that none does.
//! `weftctl policy explain` answers with it, and the kernel's rules are tested against
//! it.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

use weft_topology::{CnpAction, CnpTier, PolicyNamespace, PolicyObjects, PolicyPod, PortProtocol};

use crate::cnp::{ClusterPeer, ClusterPolicy, ClusterRule};
use crate::model::{Direction, Namespaces, Peer, Policy, PolicyMode, PortMatch, Ports, Rule};
use crate::problem::{Cause, Effect, ObjectKind, Problem};
use crate::selector::Labels;

/// A pod this node runs, as its store knows it: addresses and host interface are
/// certain here before the API server has them.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LocalPod {
    /// Its namespace (`default` when the runtime gave none).
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Its addresses.
    pub ips: Vec<IpAddr>,
    /// The node side of its `eth0`: where its traffic enters and leaves the node.
    pub host_ifname: String,
}

/// A node of the cluster as policy sees it: `nodes` peers of ClusterNetworkPolicy select
/// nodes by label and take every address in their status, and a pod's traffic with its
/// own node is never policed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeInfo {
    /// The Node's name.
    pub name: String,
    /// Every address of its status (internal and external).
    pub addresses: Vec<IpAddr>,
    /// Its labels.
    pub labels: Labels,
}

/// One side of a flow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// A pod.
    Pod(Arc<PolicyPod>),
    /// An address that is no pod's: outside the cluster, a node, a pod not known yet.
    Address(IpAddr),
}

impl Endpoint {
    /// The pod, if it is one.
    pub fn pod(&self) -> Option<&PolicyPod> {
        match self {
            Endpoint::Pod(p) => Some(p),
            Endpoint::Address(_) => None,
        }
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Endpoint::Pod(p) => write!(f, "{}/{}", p.namespace, p.name),
            Endpoint::Address(a) => write!(f, "{a}"),
        }
    }
}

/// A flow's port protocol and destination port; `None` for an IP protocol without
/// ports (ICMP, ICMPv6, ...).
pub type L4 = Option<(PortProtocol, u16)>;

/// A policy's rule that allowed a flow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleRef {
    /// `namespace/name` of the policy.
    pub policy: String,
    /// The rule's index in its direction's list.
    pub rule: usize,
}

/// The ClusterNetworkPolicy rule that decided a flow (Accept or Deny) in its tier.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterDecision {
    /// The tier.
    pub tier: CnpTier,
    /// The policy's name.
    pub policy: String,
    /// The rule's index in its direction's list.
    pub rule: usize,
    /// The rule's name (may be empty).
    pub rule_name: String,
    /// Accept or Deny.
    pub action: CnpAction,
    /// When the rule took the far side by a `domainNames` peer: the names learnt for its
    /// address that the rule takes (the answers that allowed it).
    pub domains: Vec<String>,
}

/// What one direction's policies say of a flow: egress of its source pod, ingress of its
/// destination pod.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SideVerdict {
    /// Whether this side is a pod policy applies to (not an address, not a host-network
    /// pod, not traffic to or from the pod's own node).
    pub policed: bool,
    /// The policies that select the pod for this direction (`namespace/name`); none:
    /// the pod is not isolated this way and everything passes.
    pub isolating: Vec<String>,
    /// The first rule that allows the flow, if one does.
    pub allowed_by: Option<RuleRef>,
    /// Whether the pod's namespace is in audit mode (a NetworkPolicy deny is only
    /// counted and logged).
    pub audit: bool,
    /// The ClusterNetworkPolicy rule that decided, in the Admin tier (before any
    /// NetworkPolicy) or the Baseline tier (for a pod no NetworkPolicy isolates).
    pub cluster: Option<ClusterDecision>,
}

impl SideVerdict {
    /// Whether the policies allow the flow this way.
    pub fn allows(&self) -> bool {
        match &self.cluster {
            Some(d) => d.action == CnpAction::Accept,
            None => !self.policed || self.isolating.is_empty() || self.allowed_by.is_some(),
        }
    }

    /// Whether the flow goes on this way: allowed, or denied by NetworkPolicy only in
    /// audit mode (a ClusterNetworkPolicy deny is the cluster admin's, never audited).
    pub fn passes(&self) -> bool {
        self.allows() || (self.audit && self.cluster.is_none())
    }
}

/// The verdict on one flow: it passes when both sides let it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Verdict {
    /// The source pod's egress.
    pub egress: SideVerdict,
    /// The destination pod's ingress.
    pub ingress: SideVerdict,
}

impl Verdict {
    /// Whether the flow is forwarded.
    pub fn passes(&self) -> bool {
        self.egress.passes() && self.ingress.passes()
    }

    /// Whether every side allows it (audit aside).
    pub fn allowed(&self) -> bool {
        self.egress.allows() && self.ingress.allows()
    }
}

/// The cluster as policy reads it, indexed for evaluation and compilation.
#[derive(Debug, Clone, Default)]
pub struct ClusterView {
    /// Every namespace known, by name.
    pub namespaces: HashMap<String, Arc<PolicyNamespace>>,
    /// Every pod known (this node's from its store, with the API's labels), sorted.
    pub pods: Vec<Arc<PolicyPod>>,
    /// Pods by address (this node's pods win over a stale API entry: [`Self::owner`]).
    pub by_ip: HashMap<IpAddr, Arc<PolicyPod>>,
    /// Every pod that claims an address, in name order (a freed address may still be
    /// claimed by a finished pod's stale object): what [`Self::by_ip`] is chosen from,
    /// and what a set's elements of one address come from.
    pub claims: HashMap<IpAddr, Vec<Arc<PolicyPod>>>,
    /// This node's name.
    pub node: String,
    /// The policies that read, sorted by namespace and name.
    pub policies: Vec<Arc<Policy>>,
    /// The policies of each namespace.
    pub by_namespace: HashMap<String, Vec<Arc<Policy>>>,
    /// The ClusterNetworkPolicies that read, by tier, then priority, then name.
    pub cluster_policies: Vec<Arc<ClusterPolicy>>,
    /// What could not be read in the policies, each with what is enforced instead.
    pub problems: Vec<Problem>,
    /// Node addresses, with the node's name.
    pub nodes: HashMap<IpAddr, String>,
    /// Node labels, by node name.
    pub node_labels: HashMap<String, Labels>,
    /// This node's pods as the store knows them, by `namespace/name`.
    pub local: BTreeMap<(String, String), LocalPod>,
    /// Local pods the API has no Pod object for yet (policed with no labels).
    pub unknown_local: Vec<(String, String)>,
    /// The policies marked `staged`: evaluated by [`Self::staged`], never enforced.
    pub staged_policies: Vec<Arc<Policy>>,
    /// The ClusterNetworkPolicies marked `staged`.
    pub staged_cluster_policies: Vec<Arc<ClusterPolicy>>,
    /// The addresses this node learnt from DNS answers, by name (shared with the
    /// engine's learner: a `domainNames` peer matches what is learnt now).
    pub learnt: LearntNames,
}

/// The node's learnt names, as views and the learner share them.
pub type LearntNames = Arc<std::sync::RwLock<weft_fqdn::Learnt>>;

static EMPTY: std::sync::LazyLock<Labels> = std::sync::LazyLock::new(Labels::new);

impl ClusterView {
    /// The view of `objects` from node `node` (name) running `local`, in a cluster of
    /// `nodes`.
    pub fn new<'a>(
        objects: &PolicyObjects,
        node: &str,
        local: impl IntoIterator<Item = &'a LocalPod>,
        nodes: &[NodeInfo],
    ) -> Self {
        let mut v = ClusterView {
            node: node.to_string(),
            ..ClusterView::default()
        };
        for n in nodes {
            for a in &n.addresses {
                v.nodes.insert(*a, n.name.clone());
            }
            v.node_labels.insert(n.name.clone(), n.labels.clone());
        }
        for n in &objects.namespaces {
            v.namespaces.insert(n.name.clone(), n.clone());
        }
        let mut pods: BTreeMap<(String, String), Arc<PolicyPod>> = objects
            .pods
            .values()
            .map(|p| ((p.namespace.clone(), p.name.clone()), p.clone()))
            .collect();
        for l in local {
            let key = (l.namespace.clone(), l.name.clone());
            v.local.insert(key.clone(), l.clone());
            let merged = v.merge_local(l, pods.get(&key).map(|p| &**p));
            pods.insert(key, Arc::new(merged));
        }
        for p in pods.values() {
            for ip in &p.ips {
                v.claims.entry(*ip).or_default().push(p.clone());
            }
        }
        let owners: Vec<(IpAddr, Arc<PolicyPod>)> = v
            .claims
            .iter()
            .filter_map(|(ip, claims)| v.owner(claims).map(|o| (*ip, o)))
            .collect();
        v.by_ip = owners.into_iter().collect();
        v.pods = pods.into_values().collect();
        for np in &objects.policies {
            let read = Policy::read(np);
            match read.policy.map(Arc::new) {
                Some(p) if p.mode == PolicyMode::Staged => v.staged_policies.push(p),
                Some(p) => v.policies.push(p),
                None => {}
            }
            v.problems.extend(read.problems);
        }
        v.policies
            .sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        for c in &objects.cluster_policies {
            let read = ClusterPolicy::read(c);
            match read.policy.map(Arc::new) {
                Some(c) if c.mode == PolicyMode::Staged => v.staged_cluster_policies.push(c),
                Some(c) => v.cluster_policies.push(c),
                None => {}
            }
            v.problems.extend(read.problems);
        }
        for u in &objects.unreadable {
            v.problems.push(Problem {
                kind: if u.kind == "NetworkPolicy" {
                    ObjectKind::NetworkPolicy
                } else {
                    ObjectKind::ClusterNetworkPolicy
                },
                namespace: u.namespace.clone(),
                name: u.name.clone(),
                field: "(object)".into(),
                reason: format!("does not decode: {}", u.error),
                effect: Effect::Refused,
                cause: Cause::Invalid,
            });
        }
        v.cluster_policies
            .sort_by(|a, b| (a.tier, a.priority, &a.name).cmp(&(b.tier, b.priority, &b.name)));
        for p in &v.policies {
            v.by_namespace.entry(p.namespace.clone()).or_default().push(p.clone());
        }
        v
    }

    /// Whether any policy is staged (for enforcement or for removal).
    pub fn has_staged(&self) -> bool {
        !self.staged_policies.is_empty()
            || !self.staged_cluster_policies.is_empty()
            || self.policies.iter().any(|p| p.mode == PolicyMode::StagedRemoval)
            || self
                .cluster_policies
                .iter()
                .any(|c| c.mode == PolicyMode::StagedRemoval)
    }

    /// The view as it would be were the staged changes made: the `staged` policies
    /// enforced, the `staged-removal` ones gone; `None` when nothing is staged. Its
    /// verdicts are the preview flows show beside the enforced ones (a copy: pods and
    /// policies are shared, only the maps are new).
    pub fn staged(&self) -> Option<ClusterView> {
        if !self.has_staged() {
            return None;
        }
        let mut v = self.clone();
        v.policies = (self.policies.iter().chain(&self.staged_policies))
            .filter(|p| p.mode != PolicyMode::StagedRemoval)
            .cloned()
            .collect();
        v.policies
            .sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        v.cluster_policies = (self.cluster_policies.iter().chain(&self.staged_cluster_policies))
            .filter(|c| c.mode != PolicyMode::StagedRemoval)
            .cloned()
            .collect();
        v.cluster_policies
            .sort_by(|a, b| (a.tier, a.priority, &a.name).cmp(&(b.tier, b.priority, &b.name)));
        v.by_namespace = HashMap::new();
        for p in &v.policies {
            v.by_namespace.entry(p.namespace.clone()).or_default().push(p.clone());
        }
        v.staged_policies.clear();
        v.staged_cluster_policies.clear();
        Some(v)
    }

    /// A pod of this node as the view has it: its addresses from the store (`l`), its
    /// labels and ports from its Pod object when the API has one (`api`; until then it
    /// has no labels, and is remembered as unknown).
    fn merge_local(&mut self, l: &LocalPod, api: Option<&PolicyPod>) -> PolicyPod {
        match api {
            Some(p) => PolicyPod {
                ips: l.ips.clone(),
                node: self.node.clone(),
                ..p.clone()
            },
            None => {
                self.unknown_local.push((l.namespace.clone(), l.name.clone()));
                PolicyPod {
                    namespace: l.namespace.clone(),
                    name: l.name.clone(),
                    ips: l.ips.clone(),
                    node: self.node.clone(),
                    ..PolicyPod::default()
                }
            }
        }
    }

    /// Which of the pods claiming one address (in name order) it belongs to: a pod of
    /// this node its store knows wins over another's claim (that one is stale: the
    /// address was freed and given again here); otherwise the last claim.
    pub fn owner(&self, claims: &[Arc<PolicyPod>]) -> Option<Arc<PolicyPod>> {
        let mut owner: Option<&Arc<PolicyPod>> = None;
        for p in claims {
            let local_here = p.node == self.node && self.local.contains_key(&(p.namespace.clone(), p.name.clone()));
            match owner {
                Some(o) if !local_here && o.node == self.node => {}
                _ => owner = Some(p),
            }
        }
        owner.cloned()
    }

    /// Puts pod `key` in the view as `pod` (`None`: takes it out), keeping every index
    /// as [`ClusterView::new`] would have built it; returns the addresses whose claims
    /// changed (the old pod's and the new one's).
    pub fn set_pod(&mut self, key: (String, String), pod: Option<Arc<PolicyPod>>) -> BTreeSet<IpAddr> {
        let at = self
            .pods
            .binary_search_by(|p| (p.namespace.as_str(), p.name.as_str()).cmp(&(key.0.as_str(), key.1.as_str())));
        let old = match (at, &pod) {
            (Ok(i), Some(p)) => Some(std::mem::replace(&mut self.pods[i], p.clone())),
            (Ok(i), None) => Some(self.pods.remove(i)),
            (Err(i), Some(p)) => {
                self.pods.insert(i, p.clone());
                None
            }
            (Err(_), None) => None,
        };
        let mut affected = BTreeSet::new();
        for ip in old.iter().flat_map(|o| o.ips.iter()) {
            affected.insert(*ip);
            if let Some(claims) = self.claims.get_mut(ip) {
                claims.retain(|c| (c.namespace.as_str(), c.name.as_str()) != (key.0.as_str(), key.1.as_str()));
            }
        }
        for ip in pod.iter().flat_map(|p| p.ips.iter()) {
            affected.insert(*ip);
            let claims = self.claims.entry(*ip).or_default();
            let pos = claims
                .binary_search_by(|c| (c.namespace.as_str(), c.name.as_str()).cmp(&(key.0.as_str(), key.1.as_str())))
                .unwrap_or_else(|i| i);
            claims.insert(pos, pod.clone().expect("a pod"));
        }
        for ip in &affected {
            let owner = self.claims.get(ip).and_then(|c| self.owner(c));
            match owner {
                Some(o) => {
                    self.by_ip.insert(*ip, o);
                }
                None => {
                    self.by_ip.remove(ip);
                    self.claims.remove(ip);
                }
            }
        }
        affected
    }

    /// Adds a pod of this node that its store knows now, as [`ClusterView::new`] would
    /// have had it among `local`; returns the addresses whose claims changed.
    pub fn add_local(&mut self, l: &LocalPod) -> BTreeSet<IpAddr> {
        let key = (l.namespace.clone(), l.name.clone());
        let api = self.pod(&l.namespace, &l.name);
        let merged = self.merge_local(l, api.as_deref());
        self.local.insert(key.clone(), l.clone());
        self.set_pod(key, Some(Arc::new(merged)))
    }

    /// The labels of namespace `name` (none when it is not known).
    pub fn namespace_labels(&self, name: &str) -> &Labels {
        self.namespaces.get(name).map_or(&EMPTY, |n| &n.labels)
    }

    /// Whether namespace `name` is in audit mode.
    pub fn audit(&self, name: &str) -> bool {
        self.namespaces.get(name).is_some_and(|n| n.audit)
    }

    /// The pod or address at `ip`.
    pub fn endpoint(&self, ip: IpAddr) -> Endpoint {
        match self.by_ip.get(&ip) {
            Some(p) => Endpoint::Pod(p.clone()),
            None => Endpoint::Address(ip),
        }
    }

    /// The pod `namespace/name`, if known.
    pub fn pod(&self, namespace: &str, name: &str) -> Option<Arc<PolicyPod>> {
        // `pods` is sorted by namespace and name.
        self.pods
            .binary_search_by(|p| (p.namespace.as_str(), p.name.as_str()).cmp(&(namespace, name)))
            .ok()
            .map(|i| self.pods[i].clone())
    }

    /// The policies that select `pod` and isolate it for `dir`, in order.
    pub fn isolating<'a>(&'a self, pod: &'a PolicyPod, dir: Direction) -> impl Iterator<Item = &'a Arc<Policy>> + 'a {
        self.by_namespace
            .get(&pod.namespace)
            .into_iter()
            .flatten()
            .filter(move |p| p.rules(dir).is_some() && p.selector.matches(&pod.labels))
    }

    /// The ClusterNetworkPolicies of `tier` whose subject is `pod` and that have rules
    /// for `dir`, in the order they are evaluated.
    pub fn cluster_selecting<'a>(
        &'a self,
        pod: &'a PolicyPod,
        dir: Direction,
        tier: CnpTier,
    ) -> impl Iterator<Item = &'a Arc<ClusterPolicy>> + 'a {
        self.cluster_policies.iter().filter(move |c| {
            c.tier == tier
                && !c.rules(dir).is_empty()
                && !pod.host_network
                && c.subject_namespaces.matches(self.namespace_labels(&pod.namespace))
                && c.subject_pods.matches(&pod.labels)
        })
    }

    /// The labels of node `name` (none when it is not known).
    pub fn node_labels(&self, name: &str) -> &Labels {
        self.node_labels.get(name).unwrap_or(&EMPTY)
    }

    /// Whether the far side at `ip` is `peer` of a ClusterNetworkPolicy rule.
    pub fn cluster_peer_matches(&self, peer: &ClusterPeer, ip: IpAddr) -> bool {
        match peer {
            ClusterPeer::Pods { namespaces, pods } => self.by_ip.get(&ip).is_some_and(|p| {
                !p.host_network && namespaces.matches(self.namespace_labels(&p.namespace)) && pods.matches(&p.labels)
            }),
            ClusterPeer::Networks(nets) => nets.iter().any(|n| n.contains(&ip)),
            ClusterPeer::Nodes(sel) => self.nodes.get(&ip).is_some_and(|n| sel.matches(self.node_labels(n))),
            ClusterPeer::Domains(names) => self
                .learnt
                .read()
                .expect("learnt names lock")
                .names_of(ip)
                .iter()
                .any(|n| names.iter().any(|d| d.matches(n))),
            ClusterPeer::All => true,
        }
    }

    /// The learnt names of `far` that a `domainNames` peer of `rule` takes.
    fn domains_of(&self, rule: &ClusterRule, far: IpAddr) -> Vec<String> {
        let patterns: Vec<&weft_fqdn::DomainPattern> = rule
            .peers
            .iter()
            .filter_map(|p| match p {
                ClusterPeer::Domains(d) => Some(d),
                _ => None,
            })
            .flatten()
            .collect();
        if patterns.is_empty() {
            return Vec::new();
        }
        let learnt = self.learnt.read().expect("learnt names lock");
        learnt
            .names_of(far)
            .iter()
            .filter(|n| patterns.iter().any(|p| p.matches(n)))
            .cloned()
            .collect()
    }

    fn cluster_rule_matches(&self, rule: &ClusterRule, far: IpAddr, l4: L4, dst: Option<&PolicyPod>) -> bool {
        rule.peers.iter().any(|p| self.cluster_peer_matches(p, far))
            && rule
                .ports
                .as_ref()
                .is_none_or(|ports| ports.iter().any(|pm| Self::l4_matches(pm, l4, dst)))
    }

    /// The first rule of `tier` that matches: `Some(decision)` for Accept or Deny,
    /// `None` when none matches or a Pass hands over to the next tier.
    #[allow(clippy::too_many_arguments)]
    fn tier_decides(
        &self,
        tier: CnpTier,
        pod: &PolicyPod,
        dir: Direction,
        far: IpAddr,
        l4: L4,
        dst: Option<&PolicyPod>,
    ) -> Option<ClusterDecision> {
        for c in self.cluster_selecting(pod, dir, tier) {
            for (i, r) in c.rules(dir).iter().enumerate() {
                if !self.cluster_rule_matches(r, far, l4, dst) {
                    continue;
                }
                if r.action == CnpAction::Pass {
                    return None;
                }
                return Some(ClusterDecision {
                    tier,
                    policy: c.name.clone(),
                    rule: i,
                    rule_name: r.name.clone(),
                    action: r.action,
                    domains: self.domains_of(r, far),
                });
            }
        }
        None
    }

    /// Whether `pod` is a pod peer `peer` of `policy` names (host-network pods never are).
    pub fn pod_is_peer(&self, policy: &Policy, peer: &Peer, pod: &PolicyPod) -> bool {
        match peer {
            Peer::Pods { namespaces, pods } => {
                !pod.host_network
                    && match namespaces {
                        Namespaces::Own => pod.namespace == policy.namespace,
                        Namespaces::Matching(sel) => sel.matches(self.namespace_labels(&pod.namespace)),
                    }
                    && pods.matches(&pod.labels)
            }
            Peer::Block { .. } => false,
        }
    }

    /// Whether the far side of a flow, at `ip` (a pod or not), is `peer` of `policy`.
    pub fn is_peer(&self, policy: &Policy, peer: &Peer, ip: IpAddr) -> bool {
        match peer {
            Peer::Pods { .. } => self.by_ip.get(&ip).is_some_and(|p| self.pod_is_peer(policy, peer, p)),
            Peer::Block { cidr, except } => cidr.contains(&ip) && !except.iter().any(|x| x.contains(&ip)),
        }
    }

    /// Whether `rule` takes traffic to destination port `port`/`proto` at pod `dst`
    /// (`None`: the destination is no pod, which no named port matches).
    pub fn port_matches(pm: &PortMatch, proto: PortProtocol, port: u16, dst: Option<&PolicyPod>) -> bool {
        pm.protocol == proto
            && match &pm.ports {
                Ports::All => true,
                Ports::One(p) => *p == port,
                Ports::Range(a, b) => (*a..=*b).contains(&port),
                Ports::Named(name) => dst.is_some_and(|d| {
                    d.ports
                        .iter()
                        .any(|np| &np.name == name && np.protocol == proto && np.port == port)
                }),
            }
    }

    /// [`Self::port_matches`] for a flow that may have no ports: none matches no port
    /// rule.
    fn l4_matches(pm: &PortMatch, l4: L4, dst: Option<&PolicyPod>) -> bool {
        l4.is_some_and(|(proto, port)| Self::port_matches(pm, proto, port, dst))
    }

    fn rule_allows(&self, policy: &Policy, rule: &Rule, far: IpAddr, l4: L4, dst: Option<&PolicyPod>) -> bool {
        let peer_ok = rule
            .peers
            .as_ref()
            .is_none_or(|peers| peers.iter().any(|p| self.is_peer(policy, p, far)));
        let port_ok = rule
            .ports
            .as_ref()
            .is_none_or(|ports| ports.iter().any(|pm| Self::l4_matches(pm, l4, dst)));
        peer_ok && port_ok
    }

    fn side(
        &self,
        pod: Option<&PolicyPod>,
        dir: Direction,
        far: IpAddr,
        l4: L4,
        dst: Option<&PolicyPod>,
    ) -> SideVerdict {
        let Some(pod) = pod.filter(|p| !p.host_network) else {
            return SideVerdict::default();
        };
        // Traffic between a pod and its own node always passes (kubelet's probes).
        if self.nodes.get(&far).is_some_and(|n| *n == pod.node) {
            return SideVerdict::default();
        }
        let mut out = SideVerdict {
            policed: true,
            audit: self.audit(&pod.namespace),
            ..SideVerdict::default()
        };
        if let Some(d) = self.tier_decides(CnpTier::Admin, pod, dir, far, l4, dst) {
            out.cluster = Some(d);
            return out;
        }
        for policy in self.isolating(pod, dir) {
            out.isolating.push(policy.full_name());
            if out.allowed_by.is_some() {
                continue;
            }
            let rules = policy.rules(dir).unwrap_or_default();
            if let Some(i) = rules.iter().position(|r| self.rule_allows(policy, r, far, l4, dst)) {
                out.allowed_by = Some(RuleRef {
                    policy: policy.full_name(),
                    rule: i,
                });
            }
        }
        if out.isolating.is_empty() {
            out.cluster = self.tier_decides(CnpTier::Baseline, pod, dir, far, l4, dst);
        }
        out
    }

    /// What the policies say of a new connection from `src` to `dst` port
    /// `port`/`proto` (replies of allowed connections always pass and are not asked
    /// about).
    pub fn verdict(&self, src: IpAddr, dst: IpAddr, proto: PortProtocol, port: u16) -> Verdict {
        self.verdict_l4(src, dst, Some((proto, port)))
    }

    /// The verdict on a flow of any IP protocol: `l4` is its port protocol and
    /// destination port, or `None` for one without ports (ICMP, say), which only a
    /// rule naming no ports takes.
    pub fn verdict_l4(&self, src: IpAddr, dst: IpAddr, l4: L4) -> Verdict {
        let (s, d) = (self.by_ip.get(&src).cloned(), self.by_ip.get(&dst).cloned());
        // A pod's traffic to itself (hairpin: through a Service or a node port that
        // leads back to it) is not policed (network-policy-api PR #390).
        if let (Some(a), Some(b)) = (&s, &d)
            && Arc::ptr_eq(a, b)
        {
            return Verdict::default();
        }
        // A host-network pod's address is its node's: no named port of it is a pod's.
        let dst_pod = d.as_deref().filter(|p| !p.host_network);
        Verdict {
            egress: self.side(s.as_deref(), Direction::Egress, dst, l4, dst_pod),
            ingress: self.side(d.as_deref(), Direction::Ingress, src, l4, dst_pod),
        }
    }
}

#[cfg(test)]
mod tests;
