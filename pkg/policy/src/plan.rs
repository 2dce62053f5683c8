//! Deciding: from the cluster and this node's pods, the nftables objects weft's policy
//! table should hold ([`plan`]). Pure, so every decision is tested without root.
//!
//! The shape (see docs/policy.md): two base chains on the forward hook, `egress` (a
//! local pod's traffic entering the node from its host end) and `ingress` (traffic
//! leaving towards a local pod's host end), each accepting established and related
//! traffic first, then sending the pod's traffic to the chain of its *group* (by a set
//! of host interfaces per chain, see [`crate::nft`]): the pods of one namespace that
//! the same policies isolate that way share a chain, so a pod that comes or goes
//! changes set elements only. A group chain jumps to each of its policies' chains,
//! where a rule that matches accepts (counted per policy), and ends in a logged,
//! counted drop (in an audit namespace: a logged, counted accept). A policy chain's
//! rules match the peer sets and ports of its rules; sets hold addresses (pods: single
//! addresses, one set per distinct set of pods, shared by every rule that takes them;
//! `ipBlock`s: ranges with `except` cut out) and, for named ports, address-protocol-port
//! triples. Object names carry a hash of what they hold, so a changed policy gets new
//! chains and sets and a name says everything about its rules.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use sha2::{Digest, Sha256};
use weft_topology::PolicyPod;

use weft_topology::{CnpAction, CnpTier};

use crate::cnp::{ClusterPeer, ClusterPolicy};
use crate::eval::ClusterView;
use crate::model::{Direction, Peer, Policy, PolicyId, PortMatch, Ports};

mod addition;
mod sets;

pub use addition::{Addition, addition};
use sets::merge;
pub use sets::{Element, NamespaceScope, PodScope, SetKind, SetSource, SetSpec, block_ranges};

/// The name of weft's policy table (family `inet`).
pub const TABLE: &str = "weft-policy";

/// The NFLOG group denied (and audited) flows are logged to.
pub const LOG_GROUP: u16 = 21845;

/// How many denied packets per second a group chain logs at most (a flood of one flow
/// must not drown the log; the rest are still counted).
pub const LOG_RATE: u32 = 20;

/// The conntrack mark bit a connection carries once this node's egress policy allowed
/// its first packet. A flow that sees no reply (a one-way UDP stream) stays `new` in
/// conntrack, so without it every one of its packets would walk the policy chains.
pub const ALLOWED_EGRESS_MARK: u32 = 0x0010_0000;

/// The same for ingress (both decide on the same conntrack entry on one node).
pub const ALLOWED_INGRESS_MARK: u32 = 0x0020_0000;

/// The conntrack mark bit of `dir`.
pub fn allowed_mark(dir: Direction) -> u32 {
    match dir {
        Direction::Egress => ALLOWED_EGRESS_MARK,
        Direction::Ingress => ALLOWED_INGRESS_MARK,
    }
}

/// How an allowing rule of `dir` ends: the verdict is remembered on the connection
/// (other mark bits kept), then the packet accepted.
fn allow(dir: Direction) -> String {
    format!("ct mark set ct mark or {:#010x} accept", allowed_mark(dir))
}

/// The local pods one group chain serves: same namespace, same policies isolating them
/// the same way.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Group {
    /// The direction.
    pub direction: Direction,
    /// The namespace.
    pub namespace: String,
    /// The isolating policies' names, sorted.
    pub policies: Vec<String>,
    /// Whether the namespace is in audit mode.
    pub audit: bool,
}

/// What a policy chain stands for.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PolicyChain {
    /// The policy's namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// The direction.
    pub direction: Direction,
    /// The counter of what its rules accepted.
    pub counter: String,
}

/// What a ClusterNetworkPolicy rule's counter stands for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ClusterRuleRef {
    /// The policy's name.
    pub policy: String,
    /// Its tier.
    pub tier: CnpTier,
    /// The direction.
    pub direction: Direction,
    /// The rule's index.
    pub rule: usize,
    /// The rule's name.
    pub rule_name: String,
    /// What it does.
    pub action: CnpAction,
}

/// The state weft's policy table should be in on this node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Desired {
    /// Sets by name.
    pub sets: BTreeMap<String, SetSpec>,
    /// Regular chains by name, with their rules in nft syntax.
    pub chains: BTreeMap<String, Vec<String>>,
    /// Named counters.
    pub counters: BTreeSet<String>,
    /// Local pods isolated for egress: host interface to group chain.
    pub egress: BTreeMap<String, String>,
    /// Local pods isolated for ingress: host interface to group chain.
    pub ingress: BTreeMap<String, String>,
    /// Group chains and what they stand for.
    pub groups: BTreeMap<String, Group>,
    /// Policy chains and what they stand for.
    pub policy_chains: BTreeMap<String, PolicyChain>,
    /// Each policy chain's name by policy and direction.
    pub chain_of: BTreeMap<(PolicyId, Direction), String>,
    /// ClusterNetworkPolicy rules by their counter.
    pub cluster_rules: BTreeMap<String, ClusterRuleRef>,
    /// What decides the elements of each set that depends on pods.
    pub sources: BTreeMap<String, SetSource>,
}

/// The version of how a policy's rules are written as nft rules, part of every policy
/// chain's name: a weftd that writes them differently replaces the chains an older one
/// left (a chain is compared by name and rule count only). 2: pod peer sets named after
/// the pods they take, shared between rules.
const RENDERING: &str = "2";

pub(crate) fn short_hash(parts: &[&str]) -> String {
    let mut h = Sha256::new();
    for p in parts {
        h.update(p.as_bytes());
        h.update([0]);
    }
    let d = h.finalize();
    d[..5].iter().map(|b| format!("{b:02x}")).collect()
}

/// Builds a [`Desired`]: with `fill`, every pod-dependent set gets its elements from
/// every pod of the view; without, the objects are only named (to learn which chains a
/// pod would use).
struct Planner<'v> {
    view: &'v ClusterView,
    fill: bool,
    /// A plan whose chains are taken as they are: a chain's name says everything about
    /// its rules, so one it holds need not be built again. It was planned from the
    /// policies of `view`, so its chain of a policy is that policy's chain now.
    known: Option<&'v Desired>,
    d: Desired,
}

impl Planner<'_> {
    /// Whether chain `name` is planned already, here or in the known plan.
    fn has_chain(&self, name: &str) -> bool {
        self.d.chains.contains_key(name) || self.known.is_some_and(|k| k.chains.contains_key(name))
    }

    /// Adds the pod-dependent set of `source` (filled from every pod when filling) and
    /// returns its name.
    fn pod_set(&mut self, source: SetSource) -> String {
        let name = source.set_name();
        if self.d.sets.contains_key(&name) {
            return name;
        }
        let kind = source.kind();
        let elements = if self.fill {
            self.view
                .pods
                .iter()
                .flat_map(|p| source.elements(self.view, p))
                .collect()
        } else {
            BTreeSet::new()
        };
        self.d.sets.insert(name.clone(), SetSpec { kind, elements });
        self.d.sources.insert(name.clone(), source);
        name
    }

    /// The address matches of pod peers `scopes` (each once), one per scope and family.
    fn scope_matches(&mut self, dir: Direction, scopes: BTreeSet<PodScope>) -> Vec<(String, Option<bool>)> {
        let mut out = Vec::new();
        for scope in scopes {
            for v6 in [false, true] {
                let name = self.pod_set(SetSource::Pods {
                    scope: scope.clone(),
                    v6,
                });
                out.push((format!("{} @{name}", addr_match(dir, v6)), Some(v6)));
            }
        }
        out
    }

    /// Adds sets of ranges (their elements follow from the policy alone); the matches.
    fn net_sets(
        &mut self,
        dir: Direction,
        prefix: &str,
        nets: [Vec<(IpAddr, IpAddr)>; 2],
    ) -> Vec<(String, Option<bool>)> {
        let mut out = Vec::new();
        for (v6, ranges) in nets.into_iter().enumerate() {
            if ranges.is_empty() {
                continue;
            }
            let v6 = v6 == 1;
            let name = format!("{prefix}_nets{}", if v6 { 6 } else { 4 });
            let kind = if v6 { SetKind::Net6 } else { SetKind::Net4 };
            self.d.sets.insert(
                name.clone(),
                SetSpec {
                    kind,
                    elements: merge(ranges),
                },
            );
            out.push((format!("{} @{name}", addr_match(dir, v6)), Some(v6)));
        }
        out
    }

    /// The address matches of a NetworkPolicy rule's peers, each with the family it
    /// binds (`None`: every family); `[("", None)]` when the rule takes every peer.
    fn peers(
        &mut self,
        policy: &std::sync::Arc<Policy>,
        ri: usize,
        dir: Direction,
        prefix: &str,
    ) -> Vec<(String, Option<bool>)> {
        let Some(peers) = policy.rules(dir).and_then(|r| r.get(ri)).and_then(|r| r.peers.clone()) else {
            return vec![(String::new(), None)];
        };
        let scopes = peers.iter().filter_map(|p| PodScope::of_peer(policy, p)).collect();
        let mut out = self.scope_matches(dir, scopes);
        let mut nets: [Vec<(IpAddr, IpAddr)>; 2] = [Vec::new(), Vec::new()];
        for p in &peers {
            if let Peer::Block { cidr, except } = p {
                nets[usize::from(cidr.addr().is_ipv6())].extend(block_ranges(cidr, except));
            }
        }
        out.extend(self.net_sets(dir, prefix, nets));
        out
    }

    /// The address matches of a ClusterNetworkPolicy rule's peers; `[("", None)]` when
    /// a peer weft cannot evaluate makes a Deny or Pass rule match everything (fail
    /// closed); none when nothing can match.
    fn cluster_peers(
        &mut self,
        cnp: &std::sync::Arc<ClusterPolicy>,
        ri: usize,
        dir: Direction,
        prefix: &str,
    ) -> Vec<(String, Option<bool>)> {
        let rule = &cnp.rules(dir)[ri];
        if rule.action != CnpAction::Accept && rule.peers.iter().any(|p| matches!(p, ClusterPeer::FailClosed(_))) {
            return vec![(String::new(), None)];
        }
        let scopes = rule.peers.iter().filter_map(PodScope::of_cluster_peer).collect();
        let mut out = self.scope_matches(dir, scopes);
        let mut nets: [Vec<(IpAddr, IpAddr)>; 2] = [Vec::new(), Vec::new()];
        for p in &rule.peers {
            match p {
                ClusterPeer::Networks(list) => {
                    for n in list {
                        nets[usize::from(n.addr().is_ipv6())].push((n.network(), n.broadcast()));
                    }
                }
                ClusterPeer::AllNodes => {
                    for ip in self.view.nodes.keys() {
                        nets[usize::from(ip.is_ipv6())].push((*ip, *ip));
                    }
                }
                ClusterPeer::Pods { .. } | ClusterPeer::FailClosed(_) => {}
            }
        }
        out.extend(self.net_sets(dir, prefix, nets));
        out
    }

    /// The port matches of a rule, each with the family it binds; `[("", None)]` when
    /// the rule takes every port. Named ports resolve on the destination pod.
    fn ports(
        &mut self,
        ports: Option<&Vec<PortMatch>>,
        subject: &PodScope,
        dir: Direction,
    ) -> Vec<(String, Option<bool>)> {
        let Some(ports) = ports else {
            return vec![(String::new(), None)];
        };
        let mut out = Vec::new();
        for pm in ports {
            let proto = pm.protocol.as_str();
            match &pm.ports {
                Ports::All => out.push((format!("meta l4proto {proto}"), None)),
                Ports::One(p) => out.push((format!("meta l4proto {proto} th dport {p}"), None)),
                Ports::Range(a, b) => out.push((format!("meta l4proto {proto} th dport {a}-{b}"), None)),
                Ports::Named(port_name) => {
                    for v6 in [false, true] {
                        let name = self.pod_set(SetSource::Named {
                            dest: (dir == Direction::Ingress).then(|| subject.clone()),
                            name: port_name.clone(),
                            protocol: pm.protocol,
                            v6,
                        });
                        let daddr = if v6 { "ip6 daddr" } else { "ip daddr" };
                        out.push((format!("{daddr} . meta l4proto . th dport @{name}"), Some(v6)));
                    }
                }
            }
        }
        out
    }

    /// One policy's chain for `dir`: its sets and rules.
    fn policy(&mut self, policy: &std::sync::Arc<Policy>, dir: Direction) -> String {
        // Naming a chain hashes the policy's rules: an ADD's fast path takes the name
        // the plan has.
        if let Some(name) = self.known.and_then(|k| k.chain_of.get(&(policy.id, dir))) {
            return name.clone();
        }
        let rules = policy.rules(dir).unwrap_or_default();
        let spec_text = format!("{:?}", rules);
        let chain = format!(
            "p{}{}{}",
            policy.id,
            dir.letter(),
            &short_hash(&[RENDERING, &spec_text])[..4]
        );
        if self.has_chain(&chain) {
            return chain;
        }
        let counter = format!("a{}{}", policy.id, dir.letter());
        self.d.counters.insert(counter.clone());
        let subject = PodScope::subject_of(policy);
        let mut text = Vec::new();
        for (ri, rule) in rules.iter().enumerate() {
            let prefix = format!("{chain}r{ri}");
            let peers = self.peers(policy, ri, dir, &prefix);
            let ports = self.ports(rule.ports.as_ref(), &subject, dir);
            for m in combine(&peers, &ports) {
                text.push(format!("{m}counter name \"{counter}\" {}", allow(dir)));
            }
        }
        self.d.chains.insert(chain.clone(), text);
        self.d.chain_of.insert((policy.id, dir), chain.clone());
        self.d.policy_chains.insert(
            chain.clone(),
            PolicyChain {
                namespace: policy.namespace.clone(),
                name: policy.name.clone(),
                direction: dir,
                counter,
            },
        );
        chain
    }

    /// The NetworkPolicy tier of the pods `isolating` isolates for `dir`: a chain that
    /// jumps to each policy's chain (a rule that matches accepts) and ends in a logged,
    /// counted drop (an accept in an audit namespace). Pods of one namespace with the
    /// same policies share it.
    fn group(&mut self, pod: &PolicyPod, isolating: &[&std::sync::Arc<Policy>], dir: Direction) -> String {
        let audit = self.view.audit(&pod.namespace);
        let jumps: Vec<String> = isolating.iter().map(|p| self.policy(p, dir)).collect();
        let mut key: Vec<&str> = jumps.iter().map(String::as_str).collect();
        key.push(if audit { "audit" } else { "enforce" });
        let name = format!("g{}{}", short_hash(&key), dir.letter());
        if !self.has_chain(&name) {
            let counter = format!("d{}", &name[1..]);
            self.d.counters.insert(counter.clone());
            let mut rules: Vec<String> = jumps.iter().map(|j| format!("jump {j}")).collect();
            // An audited flow is remembered as allowed too: it is reported and counted
            // once, like an allowed one.
            let (word, verdict) = if audit {
                ("audit", allow(dir))
            } else {
                ("deny", "drop".to_string())
            };
            rules.push(format!(
                "limit rate {LOG_RATE}/second burst {LOG_RATE} packets log group {LOG_GROUP} prefix \"weft {word} {name}\""
            ));
            rules.push(format!("counter name \"{counter}\" {verdict}"));
            self.d.chains.insert(name.clone(), rules);
            self.d.groups.insert(
                name.clone(),
                Group {
                    direction: dir,
                    namespace: pod.namespace.clone(),
                    policies: isolating.iter().map(|p| p.full_name()).collect(),
                    audit,
                },
            );
        }
        name
    }

    /// The rules of one tier's ClusterNetworkPolicies for `dir`, inline and in order:
    /// the first that matches decides (accept, or a logged drop) or, for Pass, does
    /// `on_pass` (a goto to the next tier's chain, or a return to the default).
    fn cluster_lines(&mut self, cnps: &[&std::sync::Arc<ClusterPolicy>], dir: Direction, on_pass: &str) -> Vec<String> {
        let mut lines = Vec::new();
        for cnp in cnps {
            let subject = PodScope::subject_of_cluster(cnp);
            for (i, rule) in cnp.rules(dir).iter().enumerate() {
                let counter = format!("k{}{}{i}", cnp.id, dir.letter());
                self.d.counters.insert(counter.clone());
                self.d.cluster_rules.insert(
                    counter.clone(),
                    ClusterRuleRef {
                        policy: cnp.name.clone(),
                        tier: cnp.tier,
                        direction: dir,
                        rule: i,
                        rule_name: rule.name.clone(),
                        action: rule.action,
                    },
                );
                let spec_hash = short_hash(&[&format!("{rule:?}")]);
                let prefix = format!("{counter}{}", &spec_hash[..4]);
                let peers = self.cluster_peers(cnp, i, dir, &prefix);
                let ports = self.ports(rule.ports.as_ref(), &subject, dir);
                for m in combine(&peers, &ports) {
                    match rule.action {
                        CnpAction::Accept => lines.push(format!("{m}counter name \"{counter}\" {}", allow(dir))),
                        CnpAction::Deny => {
                            lines.push(format!(
                                "{m}limit rate {LOG_RATE}/second burst {LOG_RATE} packets log group {LOG_GROUP} prefix \"weft cnp {counter}\""
                            ));
                            lines.push(format!("{m}counter name \"{counter}\" drop"));
                        }
                        CnpAction::Pass => lines.push(format!("{m}counter name \"{counter}\" {on_pass}")),
                    }
                }
            }
        }
        lines
    }

    /// Adds a chain named after what it holds (`letter`, a hash, the direction).
    fn named_chain(&mut self, letter: char, dir: Direction, lines: Vec<String>) -> String {
        let refs: Vec<&str> = lines.iter().map(String::as_str).collect();
        let name = format!("{letter}{}{}", short_hash(&refs), dir.letter());
        self.d.chains.entry(name.clone()).or_insert(lines);
        name
    }

    /// The chain `pod`'s traffic in `dir` jumps to, with everything it needs; `None`
    /// when no policy applies to it that way.
    fn entry(&mut self, pod: &PolicyPod, dir: Direction) -> Option<String> {
        let view = self.view;
        let admin: Vec<&std::sync::Arc<ClusterPolicy>> = view.cluster_selecting(pod, dir, CnpTier::Admin).collect();
        let baseline: Vec<&std::sync::Arc<ClusterPolicy>> =
            view.cluster_selecting(pod, dir, CnpTier::Baseline).collect();
        let isolating: Vec<&std::sync::Arc<Policy>> = view.isolating(pod, dir).collect();
        // NetworkPolicy decides for the pods it isolates; the Baseline tier only for
        // the others.
        let tail = if !isolating.is_empty() {
            Some(self.group(pod, &isolating, dir))
        } else if !baseline.is_empty() {
            let lines = self.cluster_lines(&baseline, dir, "return");
            Some(self.named_chain('b', dir, lines))
        } else {
            None
        };
        if admin.is_empty() {
            return tail;
        }
        let on_pass = tail.as_ref().map_or("return".to_string(), |t| format!("goto {t}"));
        let mut lines = self.cluster_lines(&admin, dir, &on_pass);
        if let Some(t) = &tail {
            lines.push(format!("goto {t}"));
        }
        Some(self.named_chain('a', dir, lines))
    }
}

/// The rule texts of every peer match with every port match of the same family (or
/// of none), each ending in a space.
fn combine(peers: &[(String, Option<bool>)], ports: &[(String, Option<bool>)]) -> Vec<String> {
    let mut out = Vec::new();
    for peer in peers {
        for port in ports {
            // A family-bound match on one side rules out the other family.
            if let (Some(a), Some(b)) = (peer.1, port.1)
                && a != b
            {
                continue;
            }
            out.push(
                [peer.0.as_str(), port.0.as_str()]
                    .iter()
                    .filter(|x| !x.is_empty())
                    .map(|x| format!("{x} "))
                    .collect(),
            );
        }
    }
    out
}

/// The peer-match expression of one side (`saddr` for ingress, `daddr` for egress).
fn addr_match(dir: Direction, v6: bool) -> &'static str {
    match (dir, v6) {
        (Direction::Ingress, false) => "ip saddr",
        (Direction::Ingress, true) => "ip6 saddr",
        (Direction::Egress, false) => "ip daddr",
        (Direction::Egress, true) => "ip6 daddr",
    }
}

/// This node's pods, with what the view knows of them (labels from the API).
fn local_pods(view: &ClusterView) -> Vec<(String, std::sync::Arc<PolicyPod>)> {
    view.local
        .values()
        .filter_map(|l| view.pod(&l.namespace, &l.name).map(|p| (l.host_ifname.clone(), p)))
        .filter(|(_, p)| !p.host_network)
        .collect()
}

/// Plans weft's policy table for this node (its pods are `view.local`).
pub fn plan(view: &ClusterView) -> Desired {
    let mut p = Planner {
        view,
        fill: true,
        known: None,
        d: Desired::default(),
    };
    for dir in Direction::BOTH {
        for (host_ifname, pod) in local_pods(view) {
            let Some(entry) = p.entry(&pod, dir) else { continue };
            let map = match dir {
                Direction::Egress => &mut p.d.egress,
                Direction::Ingress => &mut p.d.ingress,
            };
            map.insert(host_ifname, entry);
        }
    }
    p.d
}

impl Desired {
    /// Whether a set of this plan holds IPv6 elements (for tests and metrics).
    pub fn is_v6(&self, set: &str) -> Option<bool> {
        self.sets.get(set).map(|s| s.kind.v6())
    }
}

#[cfg(test)]
mod tests;
