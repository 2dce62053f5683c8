//! The cluster as policy sees it ([`ClusterView`]: pods by address, namespaces, the
//! policies that read), and the reference evaluation of one flow ([`ClusterView::verdict`]):
//! which policies isolate each side, and the rule that allows it or that none does.
//! `weftctl policy explain` answers with it, and the kernel's rules are tested against
//! it.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

use weft_topology::{PolicyNamespace, PolicyObjects, PolicyPod, PortProtocol};

use crate::model::{Direction, Namespaces, Peer, Policy, PolicyError, PortMatch, Ports, Rule};
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

/// A policy's rule that allowed a flow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleRef {
    /// `namespace/name` of the policy.
    pub policy: String,
    /// The rule's index in its direction's list.
    pub rule: usize,
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
    /// Whether the pod's namespace is in audit mode (a deny is only counted and logged).
    pub audit: bool,
}

impl SideVerdict {
    /// Whether the policies allow the flow this way.
    pub fn allows(&self) -> bool {
        !self.policed || self.isolating.is_empty() || self.allowed_by.is_some()
    }

    /// Whether the flow goes on this way: allowed, or denied only in audit mode.
    pub fn passes(&self) -> bool {
        self.allows() || self.audit
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
    /// Pods by address (this node's pods win over a stale API entry).
    pub by_ip: HashMap<IpAddr, Arc<PolicyPod>>,
    /// The policies that read, sorted by namespace and name.
    pub policies: Vec<Arc<Policy>>,
    /// The policies of each namespace.
    pub by_namespace: HashMap<String, Vec<Arc<Policy>>>,
    /// The policies that did not read, each with why.
    pub errors: Vec<PolicyError>,
    /// Node addresses, with the node's name.
    pub nodes: HashMap<IpAddr, String>,
    /// This node's pods as the store knows them, by `namespace/name`.
    pub local: BTreeMap<(String, String), LocalPod>,
    /// Local pods the API has no Pod object for yet (policed with no labels).
    pub unknown_local: Vec<(String, String)>,
}

static EMPTY: std::sync::LazyLock<Labels> = std::sync::LazyLock::new(Labels::new);

impl ClusterView {
    /// The view of `objects` from node `node` (name) running `local`, with the
    /// cluster's node addresses `nodes`.
    pub fn new(objects: &PolicyObjects, node: &str, local: &[LocalPod], nodes: HashMap<IpAddr, String>) -> Self {
        let mut v = ClusterView {
            nodes,
            ..ClusterView::default()
        };
        for n in &objects.namespaces {
            v.namespaces.insert(n.name.clone(), n.clone());
        }
        let mut pods: BTreeMap<(String, String), Arc<PolicyPod>> = objects
            .pods
            .iter()
            .map(|p| ((p.namespace.clone(), p.name.clone()), p.clone()))
            .collect();
        for l in local {
            let key = (l.namespace.clone(), l.name.clone());
            v.local.insert(key.clone(), l.clone());
            let merged = match pods.get(&key) {
                Some(p) => PolicyPod {
                    ips: l.ips.clone(),
                    node: node.to_string(),
                    ..(**p).clone()
                },
                None => {
                    v.unknown_local.push(key.clone());
                    PolicyPod {
                        namespace: l.namespace.clone(),
                        name: l.name.clone(),
                        ips: l.ips.clone(),
                        node: node.to_string(),
                        ..PolicyPod::default()
                    }
                }
            };
            pods.insert(key, Arc::new(merged));
        }
        // A pod of another node claiming a local pod's address is stale (the address was
        // freed and given again here): the local one wins.
        for p in pods.values() {
            for ip in &p.ips {
                let local_here = p.node == node && v.local.contains_key(&(p.namespace.clone(), p.name.clone()));
                match v.by_ip.get(ip) {
                    Some(existing) if !local_here && existing.node == node => {}
                    _ => {
                        v.by_ip.insert(*ip, p.clone());
                    }
                }
            }
        }
        v.pods = pods.into_values().collect();
        for np in &objects.policies {
            match Policy::from_k8s(np) {
                Ok(p) => v.policies.push(Arc::new(p)),
                Err(e) => v.errors.push(e),
            }
        }
        v.policies
            .sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        for p in &v.policies {
            v.by_namespace.entry(p.namespace.clone()).or_default().push(p.clone());
        }
        v
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
        self.pods
            .iter()
            .find(|p| p.namespace == namespace && p.name == name)
            .cloned()
    }

    /// The policies that select `pod` and isolate it for `dir`, in order.
    pub fn isolating<'a>(&'a self, pod: &'a PolicyPod, dir: Direction) -> impl Iterator<Item = &'a Arc<Policy>> + 'a {
        self.by_namespace
            .get(&pod.namespace)
            .into_iter()
            .flatten()
            .filter(move |p| p.rules(dir).is_some() && p.selector.matches(&pod.labels))
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

    fn rule_allows(
        &self,
        policy: &Policy,
        rule: &Rule,
        far: IpAddr,
        proto: PortProtocol,
        port: u16,
        dst: Option<&PolicyPod>,
    ) -> bool {
        let peer_ok = rule
            .peers
            .as_ref()
            .is_none_or(|peers| peers.iter().any(|p| self.is_peer(policy, p, far)));
        let port_ok = rule
            .ports
            .as_ref()
            .is_none_or(|ports| ports.iter().any(|pm| Self::port_matches(pm, proto, port, dst)));
        peer_ok && port_ok
    }

    fn side(
        &self,
        pod: Option<&PolicyPod>,
        dir: Direction,
        far: IpAddr,
        proto: PortProtocol,
        port: u16,
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
        for policy in self.isolating(pod, dir) {
            out.isolating.push(policy.full_name());
            if out.allowed_by.is_some() {
                continue;
            }
            let rules = policy.rules(dir).unwrap_or_default();
            if let Some(i) = rules
                .iter()
                .position(|r| self.rule_allows(policy, r, far, proto, port, dst))
            {
                out.allowed_by = Some(RuleRef {
                    policy: policy.full_name(),
                    rule: i,
                });
            }
        }
        out
    }

    /// What the policies say of a new connection from `src` to `dst` port
    /// `port`/`proto` (replies of allowed connections always pass and are not asked
    /// about).
    pub fn verdict(&self, src: IpAddr, dst: IpAddr, proto: PortProtocol, port: u16) -> Verdict {
        let (s, d) = (self.by_ip.get(&src).cloned(), self.by_ip.get(&dst).cloned());
        Verdict {
            egress: self.side(s.as_deref(), Direction::Egress, dst, proto, port, d.as_deref()),
            ingress: self.side(d.as_deref(), Direction::Ingress, src, proto, port, d.as_deref()),
        }
    }
}

#[cfg(test)]
mod tests;
