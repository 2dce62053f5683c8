//! Deciding: from the cluster and this node's pods, the nftables objects weft's policy
//! table should hold ([`plan`]), as typed rules ([`crate::rule`]) over typed names
//! ([`crate::names`]). Pure, so every decision is tested without root, and the plan is
//! checked against the evaluator by running it ([`crate::interp`]).
//!
//! The shape (see docs/policy.md): two base chains on the forward hook, `egress` (a
//! local pod's traffic entering the node from its host end) and `ingress` (traffic
//! leaving towards a local pod's host end), each accepting established and related
//! traffic, a pod's traffic to itself (hairpin) and connections it allowed before
//! first, then sending the pod's traffic to its *entry chain* (by a set of host
//! interfaces per chain): the pods of one namespace that the same policies isolate that
//! way share one, so a pod that comes or goes changes set elements only. An entry chain
//! is the Admin tier's rules (`a`) in front of a group chain (`g`: the NetworkPolicy
//! tier: a jump to each policy's chain, then a logged, counted drop) or of the Baseline
//! tier's rules (`b`). A policy chain's rules match the peer sets and ports of its
//! rules; sets hold addresses (pods: one set per distinct set of pods, shared by every
//! rule that takes them), ranges (ipBlocks, networks, nodes) and, for named ports,
//! address-protocol-port triples. Names carry a hash of what they hold.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;

use sha2::{Digest, Sha256};
use weft_fqdn::DomainPattern;
use weft_topology::{CnpAction, CnpTier, PolicyPod};

use crate::cnp::{ClusterPeer, ClusterPolicy};
use crate::eval::ClusterView;
use crate::model::{Direction, Peer, Policy, PolicyId, PortMatch, Ports};
use crate::names::{Chain, Counter, LogPrefix, SetName, SetRole};
use crate::rule::{Match, Rule, Side, Verdict};

mod addition;
mod delta;
mod sets;

pub use addition::{Addition, addition};
pub use delta::{Delta, delta};
use sets::merge;
pub use sets::{Element, NamespaceScope, PodScope, SetKind, SetSource, SetSpec, block_ranges};

/// The name of weft's policy table (family `inet`).
pub const TABLE: &str = "weft-policy";

/// The table that copies DNS answers to this node's pods (and from a DNS server on
/// the node) to the learner: a table apart, added and removed whole as `domainNames`
/// rules come and go, and never on the answers' path (a copy, not a hold).
pub const DNS_TABLE: &str = "weft-dns";

/// The NFLOG group the DNS answers' copies go to, sent as each answer passes.
pub const DNS_LOG_GROUP: u16 = 21847;

pub use crate::rule::{
    ALLOWED_EGRESS_MARK, ALLOWED_INGRESS_MARK, HELD_MARK, HOLD_QUEUE, LOG_GROUP, LOG_RATE, allowed_mark,
};

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
    pub counter: Counter,
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

/// The state weft's policy table should be in on this node. The base chains, the
/// dispatch and its member sets, and the hairpin set follow from `egress` and
/// `ingress` ([`Desired::fixed_chain`], [`Desired::members`], [`Desired::hairpin`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Desired {
    /// Sets of addresses and ports by name (member and hairpin sets aside).
    pub sets: BTreeMap<SetName, SetSpec>,
    /// Regular chains (policy, group and tier chains) with their rules.
    pub chains: BTreeMap<Chain, Vec<Rule>>,
    /// Named counters.
    pub counters: BTreeSet<Counter>,
    /// Local pods isolated for egress: host interface to entry chain.
    pub egress: BTreeMap<String, Chain>,
    /// Local pods isolated for ingress: host interface to entry chain.
    pub ingress: BTreeMap<String, Chain>,
    /// Group chains and what they stand for.
    pub groups: BTreeMap<Chain, Group>,
    /// Policy chains and what they stand for.
    pub policy_chains: BTreeMap<Chain, PolicyChain>,
    /// Each policy chain by policy and direction.
    pub chain_of: BTreeMap<(PolicyId, Direction), Chain>,
    /// ClusterNetworkPolicy rules by their counter.
    pub cluster_rules: BTreeMap<Counter, ClusterRuleRef>,
    /// What decides the elements of each set that depends on pods.
    pub sources: BTreeMap<SetName, SetSource>,
    /// The learnt sets (`domainNames`), each with the names whose addresses it holds:
    /// the learner's to fill.
    pub learnt: BTreeMap<SetName, Vec<DomainPattern>>,
}

impl Desired {
    /// What a rule of chain `chain` (as nft prints both) stands for, for a trace
    /// through the table: the ClusterNetworkPolicy rule or NetworkPolicy whose counter
    /// the rule names, else what the chain is. `None` for a name weft does not write.
    pub fn meaning(&self, chain: &str, rule: &str) -> Option<String> {
        let counted = rule
            .split("counter name ")
            .nth(1)
            .and_then(|t| t.trim_start_matches('"').split(['"', ' ']).next())
            .and_then(Counter::parse);
        let policy_chain = |c: &Chain| {
            self.policy_chains
                .get(c)
                .map(|p| format!("NetworkPolicy {}/{} ({})", p.namespace, p.name, p.direction))
        };
        let group = |c: &Chain| {
            self.groups.get(c).map(|g| {
                format!(
                    "pods of {} isolated ({}) by {}{}",
                    g.namespace,
                    g.direction,
                    g.policies.join(", "),
                    if g.audit { ", audit mode" } else { "" }
                )
            })
        };
        match counted {
            Some(Counter::ClusterRule { .. }) => {
                let r = self.cluster_rules.get(counted.as_ref()?)?;
                let name = if r.rule_name.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", r.rule_name)
                };
                return Some(format!(
                    "ClusterNetworkPolicy {} {:?} tier, {} rule {}{name}: {:?}",
                    r.policy, r.tier, r.direction, r.rule, r.action
                ));
            }
            Some(Counter::Policy { id, direction }) => {
                return policy_chain(self.chain_of.get(&(id, direction))?).map(|m| format!("{m}: allows"));
            }
            Some(Counter::Group { .. }) => {
                return group(&counted?.group_chain()?).map(|m| format!("{m}: no rule allows"));
            }
            None => {}
        }
        // A group's jump to one of its policies names the policy.
        if let Some(to) = rule
            .split("jump ")
            .nth(1)
            .and_then(|t| Chain::parse(t.split(' ').next().unwrap_or("")))
            .filter(|t| matches!(t, Chain::Policy { .. }))
        {
            return policy_chain(&to).map(|m| format!("to {m}"));
        }
        let c = Chain::parse(chain)?;
        match &c {
            Chain::Base(d) => Some(format!("weft's {d} base chain")),
            Chain::Dispatch(d) => Some(format!("weft's {d} dispatch (by the pod's host interface)")),
            Chain::Policy { .. } => policy_chain(&c),
            Chain::Group { .. } => group(&c),
            Chain::Admin { direction, .. } => Some(format!("ClusterNetworkPolicy Admin tier ({direction})")),
            Chain::Baseline { direction, .. } => Some(format!("ClusterNetworkPolicy Baseline tier ({direction})")),
            Chain::Hold => Some(
                "weft's hold of a new connection a domainNames rule could allow, until the DNS answers before it are learnt"
                    .into(),
            ),
        }
    }

    /// The dispatch of `dir`: host interface to entry chain.
    pub fn dispatch(&self, dir: Direction) -> &BTreeMap<String, Chain> {
        match dir {
            Direction::Egress => &self.egress,
            Direction::Ingress => &self.ingress,
        }
    }

    /// A direction's entry chains, each with the host interfaces entering it (its
    /// member set's elements).
    pub fn members(&self, dir: Direction) -> BTreeMap<&Chain, BTreeSet<&str>> {
        let mut out: BTreeMap<&Chain, BTreeSet<&str>> = BTreeMap::new();
        for (ifname, chain) in self.dispatch(dir) {
            out.entry(chain).or_default().insert(ifname.as_str());
        }
        out
    }

    /// The host interfaces whose own traffic (hairpin: the pod to itself, through a
    /// Service or a node port) passes unpoliced: those of every isolated local pod.
    pub fn hairpin(&self) -> BTreeSet<&str> {
        self.egress
            .keys()
            .chain(self.ingress.keys())
            .map(String::as_str)
            .collect()
    }

    /// The rules of a base or dispatch chain (the same on every node but for the
    /// dispatch's entries).
    pub fn fixed_chain(&self, chain: &Chain) -> Vec<Rule> {
        match chain {
            Chain::Base(dir) => base_rules(*dir),
            Chain::Dispatch(dir) => self
                .members(*dir)
                .into_keys()
                .map(|entry| dispatch_rule(*dir, entry))
                .collect(),
            Chain::Policy { .. } | Chain::Group { .. } | Chain::Admin { .. } | Chain::Baseline { .. } | Chain::Hold => {
                self.chains.get(chain).cloned().unwrap_or_default()
            }
        }
    }

    /// Whether a set of this plan holds IPv6 elements (for tests and metrics).
    pub fn is_v6(&self, set: &SetName) -> Option<bool> {
        self.sets.get(set).map(|s| s.kind.v6())
    }
}

/// A base chain's rules: what passes without asking policy (established and related
/// traffic: replies, ICMP errors of a connection; a connection this direction allowed
/// before; a pod's traffic to itself), then the dispatch. The mark comes before the
/// hairpin lookup: every packet of a one-way flow (no reply makes it established)
/// meets the rules up to the mark, and a hairpin connection is rare.
pub fn base_rules(dir: Direction) -> Vec<Rule> {
    vec![
        Rule::new(vec![Match::Established], Verdict::Accept),
        Rule::new(vec![Match::Marked(dir)], Verdict::Accept),
        Rule::new(vec![Match::IfacePair(SetName::Hairpin)], Verdict::Accept),
        Rule::new(Vec::new(), Verdict::Jump(Chain::Dispatch(dir))),
    ]
}

/// The rule of entry chain `entry` in its direction's dispatch chain: its member set
/// matched on the host interface the traffic enters (egress) or leaves (ingress) by.
pub fn dispatch_rule(dir: Direction, entry: &Chain) -> Rule {
    Rule::new(
        vec![Match::Iface {
            input: dir == Direction::Egress,
            set: SetName::Members(entry.clone()),
        }],
        Verdict::Jump(entry.clone()),
    )
}

/// The version of how a policy's rules are written as nft rules, part of every policy
/// chain's name: a weftd that writes them differently replaces the chains an older one
/// left. 3: typed rules, range sets named after their ranges.
const RENDERING: &str = "3";

/// A hash of `parts`, in lower-case hex digits (ten of them unless cut).
pub(crate) fn short_hash(parts: &[&str]) -> String {
    let mut h = Sha256::new();
    for p in parts {
        h.update(p.as_bytes());
        h.update([0]);
    }
    let d = h.finalize();
    d[..5].iter().map(|b| format!("{b:02x}")).collect()
}

/// One alternative of a rule's peers or ports: its matches, and the family they bind
/// (`None`: either).
type Alt = (Vec<Match>, Option<bool>);

/// Builds a [`Desired`], or the objects a plan lacks for one more pod: with `known`,
/// an object it holds is taken as it is (a name says everything about what it holds)
/// and only new ones are built, filled from every pod of the view.
pub(crate) struct Planner<'v> {
    pub(crate) view: &'v ClusterView,
    pub(crate) known: Option<&'v Desired>,
    pub(crate) d: Desired,
}

impl<'v> Planner<'v> {
    /// A planner over `view`, extending `known` if given.
    pub(crate) fn new(view: &'v ClusterView, known: Option<&'v Desired>) -> Self {
        Planner {
            view,
            known,
            d: Desired::default(),
        }
    }

    /// Whether chain `name` is planned already, here or in the known plan.
    fn has_chain(&self, name: &Chain) -> bool {
        self.d.chains.contains_key(name) || self.known.is_some_and(|k| k.chains.contains_key(name))
    }

    fn has_set(&self, name: &SetName) -> bool {
        self.d.sets.contains_key(name) || self.known.is_some_and(|k| k.sets.contains_key(name))
    }

    fn counter(&mut self, c: Counter) -> Counter {
        if !self.known.is_some_and(|k| k.counters.contains(&c)) {
            self.d.counters.insert(c.clone());
        }
        c
    }

    /// Adds the pod-dependent set of `source` (filled from every pod) and returns its
    /// name.
    fn pod_set(&mut self, source: SetSource) -> SetName {
        let name = source.set_name();
        if self.has_set(&name) {
            return name;
        }
        let elements = self
            .view
            .pods
            .iter()
            .flat_map(|p| source.elements(self.view, p))
            .collect();
        self.d.sets.insert(
            name.clone(),
            SetSpec {
                kind: source.kind(),
                elements,
            },
        );
        self.d.sources.insert(name.clone(), source);
        name
    }

    /// The address matches of pod peers `scopes` (each once), one per scope and family.
    fn scope_matches(&mut self, dir: Direction, scopes: BTreeSet<PodScope>) -> Vec<Alt> {
        let mut out = Vec::new();
        for scope in scopes {
            for v6 in [false, true] {
                let set = self.pod_set(SetSource::Pods {
                    scope: scope.clone(),
                    v6,
                });
                out.push((
                    vec![Match::Addr {
                        side: Side::of_peer(dir),
                        v6,
                        set,
                    }],
                    Some(v6),
                ));
            }
        }
        out
    }

    /// Adds sets of ranges (their elements follow from the ranges alone, so the name
    /// is a hash of them and rules with the same ranges share one); the matches.
    fn range_sets(&mut self, dir: Direction, nets: [Vec<(IpAddr, IpAddr)>; 2]) -> Vec<Alt> {
        let mut out = Vec::new();
        for (v6, ranges) in nets.into_iter().enumerate() {
            if ranges.is_empty() {
                continue;
            }
            let v6 = v6 == 1;
            let elements = merge(ranges);
            let text: Vec<String> = elements.iter().map(ToString::to_string).collect();
            let set = SetName::Data {
                role: SetRole::Ranges,
                hash: short_hash(&[&text.join(",")]),
                v6,
            };
            if !self.has_set(&set) {
                let kind = if v6 { SetKind::Net6 } else { SetKind::Net4 };
                self.d.sets.insert(set.clone(), SetSpec { kind, elements });
            }
            out.push((
                vec![Match::Addr {
                    side: Side::of_peer(dir),
                    v6,
                    set,
                }],
                Some(v6),
            ));
        }
        out
    }

    /// The address matches of a NetworkPolicy rule's peers, each with the family it
    /// binds; `[([], None)]` when the rule takes every peer.
    fn peers(&mut self, policy: &Policy, peers: Option<&[Peer]>, dir: Direction) -> Vec<Alt> {
        let Some(peers) = peers else {
            return vec![(Vec::new(), None)];
        };
        let scopes = peers.iter().filter_map(|p| PodScope::of_peer(policy, p)).collect();
        let mut out = self.scope_matches(dir, scopes);
        let mut nets: [Vec<(IpAddr, IpAddr)>; 2] = [Vec::new(), Vec::new()];
        for p in peers {
            if let Peer::Block { cidr, except } = p {
                nets[usize::from(cidr.addr().is_ipv6())].extend(block_ranges(cidr, except));
            }
        }
        out.extend(self.range_sets(dir, nets));
        out
    }

    /// The address matches of a ClusterNetworkPolicy rule's peers; `[([], None)]` when
    /// a peer takes every address; none when nothing can match.
    fn cluster_peers(&mut self, peers: &[ClusterPeer], dir: Direction) -> Vec<Alt> {
        if peers.contains(&ClusterPeer::All) {
            return vec![(Vec::new(), None)];
        }
        let scopes = peers.iter().filter_map(PodScope::of_cluster_peer).collect();
        let mut out = self.scope_matches(dir, scopes);
        let mut nets: [Vec<(IpAddr, IpAddr)>; 2] = [Vec::new(), Vec::new()];
        for p in peers {
            match p {
                ClusterPeer::Networks(list) => {
                    for n in list {
                        nets[usize::from(n.addr().is_ipv6())].push((n.network(), n.broadcast()));
                    }
                }
                ClusterPeer::Nodes(sel) => {
                    for (ip, node) in &self.view.nodes {
                        if sel.matches(self.view.node_labels(node)) {
                            nets[usize::from(ip.is_ipv6())].push((*ip, *ip));
                        }
                    }
                }
                ClusterPeer::Pods { .. } | ClusterPeer::Domains(_) | ClusterPeer::All => {}
            }
        }
        out.extend(self.range_sets(dir, nets));
        let mut names: Vec<DomainPattern> = peers
            .iter()
            .filter_map(|p| match p {
                ClusterPeer::Domains(d) => Some(d),
                _ => None,
            })
            .flatten()
            .cloned()
            .collect();
        if !names.is_empty() {
            names.sort();
            names.dedup();
            out.extend(self.learnt_sets(dir, names));
        }
        out
    }

    /// The sets of addresses learnt for `names` (one per family, shared by every rule
    /// with the same names), empty as planned: the learner fills them, the kernel
    /// expires what it put.
    fn learnt_sets(&mut self, dir: Direction, names: Vec<DomainPattern>) -> Vec<Alt> {
        let text: Vec<String> = names.iter().map(ToString::to_string).collect();
        let hash = short_hash(&["domains", &text.join(",")]);
        let mut out = Vec::new();
        for v6 in [false, true] {
            let set = SetName::Data {
                role: SetRole::Learnt,
                hash: hash.clone(),
                v6,
            };
            if !self.has_set(&set) {
                let kind = if v6 { SetKind::Learnt6 } else { SetKind::Learnt4 };
                self.d.sets.insert(
                    set.clone(),
                    SetSpec {
                        kind,
                        elements: BTreeSet::new(),
                    },
                );
            }
            self.d.learnt.insert(set.clone(), names.clone());
            out.push((
                vec![Match::Addr {
                    side: Side::of_peer(dir),
                    v6,
                    set,
                }],
                Some(v6),
            ));
        }
        out
    }

    /// The port matches of a rule, each with the family it binds; `[([], None)]` when
    /// the rule takes every port. Named ports resolve on the destination pod: for
    /// ingress, this node's pods of the rule's subject; for egress, any pod.
    fn ports(&mut self, ports: Option<&[PortMatch]>, subject: &PodScope, dir: Direction) -> Vec<Alt> {
        let Some(ports) = ports else {
            return vec![(Vec::new(), None)];
        };
        let mut out = Vec::new();
        for pm in ports {
            let protocol = pm.protocol;
            match &pm.ports {
                Ports::All => out.push((vec![Match::Proto(protocol)], None)),
                Ports::One(p) => out.push((
                    vec![Match::Port {
                        protocol,
                        from: *p,
                        to: *p,
                    }],
                    None,
                )),
                Ports::Range(a, b) => out.push((
                    vec![Match::Port {
                        protocol,
                        from: *a,
                        to: *b,
                    }],
                    None,
                )),
                Ports::Named(port_name) => {
                    for v6 in [false, true] {
                        let set = self.pod_set(SetSource::Named {
                            dest: (dir == Direction::Ingress).then(|| subject.clone()),
                            name: port_name.clone(),
                            protocol,
                            v6,
                        });
                        out.push((vec![Match::DestPort { v6, set }], Some(v6)));
                    }
                }
            }
        }
        out
    }

    /// One policy's chain for `dir`: its sets and rules.
    fn policy(&mut self, policy: &Arc<Policy>, dir: Direction) -> Chain {
        // Naming a chain hashes the policy's rules: an ADD's path takes the name the
        // plan has.
        if let Some(name) = self.known.and_then(|k| k.chain_of.get(&(policy.id, dir))) {
            return name.clone();
        }
        let rules = policy.rules(dir).unwrap_or_default();
        let chain = Chain::Policy {
            id: policy.id,
            direction: dir,
            hash: short_hash(&[RENDERING, &format!("{rules:?}")])[..4].to_string(),
        };
        if self.has_chain(&chain) {
            return chain;
        }
        let counter = self.counter(Counter::Policy {
            id: policy.id,
            direction: dir,
        });
        let subject = PodScope::subject_of(policy);
        let mut lines = Vec::new();
        for rule in rules {
            let peers = self.peers(policy, rule.peers.as_deref(), dir);
            let ports = self.ports(rule.ports.as_deref(), &subject, dir);
            for m in combine(&peers, &ports) {
                lines.push(Rule::allow(m, counter.clone(), dir));
            }
        }
        self.d.chains.insert(chain.clone(), lines);
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
    fn group(&mut self, pod: &PolicyPod, isolating: &[&Arc<Policy>], dir: Direction) -> Chain {
        let audit = self.view.audit(&pod.namespace);
        let jumps: Vec<Chain> = isolating.iter().map(|p| self.policy(p, dir)).collect();
        let mut key: Vec<String> = jumps.iter().map(ToString::to_string).collect();
        key.push(if audit { "audit" } else { "enforce" }.into());
        let refs: Vec<&str> = key.iter().map(String::as_str).collect();
        let chain = Chain::Group {
            hash: short_hash(&refs),
            direction: dir,
        };
        if !self.has_chain(&chain) {
            let Chain::Group { hash, .. } = &chain else {
                unreachable!()
            };
            let counter = self.counter(Counter::Group {
                hash: hash.clone(),
                direction: dir,
            });
            let mut rules: Vec<Rule> = jumps
                .into_iter()
                .map(|j| Rule::new(Vec::new(), Verdict::Jump(j)))
                .collect();
            rules.push(Rule::log(
                Vec::new(),
                LogPrefix::Group {
                    chain: chain.clone(),
                    audit,
                },
            ));
            // An audited flow is remembered as allowed too: it is reported and counted
            // once, like an allowed one.
            rules.push(if audit {
                Rule::allow(Vec::new(), counter, dir)
            } else {
                Rule::new(Vec::new(), Verdict::Drop).counted(counter)
            });
            self.d.chains.insert(chain.clone(), rules);
            self.d.groups.insert(
                chain.clone(),
                Group {
                    direction: dir,
                    namespace: pod.namespace.clone(),
                    policies: isolating.iter().map(|p| p.full_name()).collect(),
                    audit,
                },
            );
        }
        chain
    }

    /// The rules of one tier's ClusterNetworkPolicies for `dir`, inline and in order:
    /// the first that matches decides (accept, or a logged drop) or, for Pass, does
    /// `on_pass` (a goto to the next tier's chain, or a return to the default).
    fn cluster_rules(&mut self, cnps: &[&Arc<ClusterPolicy>], dir: Direction, on_pass: &Verdict) -> Vec<Rule> {
        let mut out = Vec::new();
        for cnp in cnps {
            let subject = PodScope::subject_of_cluster(cnp);
            for (i, rule) in cnp.rules(dir).iter().enumerate() {
                let counter = self.counter(Counter::ClusterRule {
                    id: cnp.id,
                    direction: dir,
                    rule: i,
                });
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
                let peers = self.cluster_peers(&rule.peers, dir);
                let ports = self.ports(rule.ports.as_deref(), &subject, dir);
                // A domainNames rule (Accept only) holds what it could allow once an
                // answer is learnt, after its own rules: see `HOLD_QUEUE`.
                let holds = rule.peers.iter().any(|p| matches!(p, ClusterPeer::Domains(_)));
                let hold_rules: Vec<Rule> = if holds {
                    self.d
                        .chains
                        .insert(Chain::Hold, vec![Rule::new(Vec::new(), Verdict::Hold)]);
                    ports
                        .iter()
                        .map(|(m, _)| {
                            let matches = std::iter::once(Match::Unheld).chain(m.iter().cloned()).collect();
                            Rule::new(matches, Verdict::Jump(Chain::Hold))
                        })
                        .collect()
                } else {
                    Vec::new()
                };
                for m in combine(&peers, &ports) {
                    match rule.action {
                        CnpAction::Accept => out.push(Rule::allow(m, counter.clone(), dir)),
                        CnpAction::Deny => {
                            out.push(Rule::log(m.clone(), LogPrefix::ClusterDeny(counter.clone())));
                            out.push(Rule::new(m, Verdict::Drop).counted(counter.clone()));
                        }
                        CnpAction::Pass => out.push(Rule::new(m, on_pass.clone()).counted(counter.clone())),
                    }
                }
                out.extend(hold_rules);
            }
        }
        out
    }

    /// Adds a tier chain named after what it holds.
    fn tier_chain(&mut self, tier: CnpTier, dir: Direction, rules: Vec<Rule>) -> Chain {
        let text: Vec<String> = rules.iter().map(ToString::to_string).collect();
        let refs: Vec<&str> = text.iter().map(String::as_str).collect();
        let hash = short_hash(&refs);
        let chain = match tier {
            CnpTier::Admin => Chain::Admin { hash, direction: dir },
            CnpTier::Baseline => Chain::Baseline { hash, direction: dir },
        };
        if !self.has_chain(&chain) {
            self.d.chains.insert(chain.clone(), rules);
        }
        chain
    }

    /// The chain `pod`'s traffic in `dir` jumps to, with everything it needs; `None`
    /// when no policy applies to it that way.
    pub(crate) fn entry(&mut self, pod: &PolicyPod, dir: Direction) -> Option<Chain> {
        let view = self.view;
        let admin: Vec<&Arc<ClusterPolicy>> = view.cluster_selecting(pod, dir, CnpTier::Admin).collect();
        let baseline: Vec<&Arc<ClusterPolicy>> = view.cluster_selecting(pod, dir, CnpTier::Baseline).collect();
        let isolating: Vec<&Arc<Policy>> = view.isolating(pod, dir).collect();
        // NetworkPolicy decides for the pods it isolates; the Baseline tier only for
        // the others.
        let tail = if !isolating.is_empty() {
            Some(self.group(pod, &isolating, dir))
        } else if !baseline.is_empty() {
            let rules = self.cluster_rules(&baseline, dir, &Verdict::Return);
            Some(self.tier_chain(CnpTier::Baseline, dir, rules))
        } else {
            None
        };
        if admin.is_empty() {
            return tail;
        }
        let on_pass = tail.clone().map_or(Verdict::Return, Verdict::Goto);
        let mut rules = self.cluster_rules(&admin, dir, &on_pass);
        if let Some(t) = tail {
            rules.push(Rule::new(Vec::new(), Verdict::Goto(t)));
        }
        Some(self.tier_chain(CnpTier::Admin, dir, rules))
    }
}

/// The matches of every peer alternative with every port alternative of the same
/// family (or of none).
fn combine(peers: &[Alt], ports: &[Alt]) -> Vec<Vec<Match>> {
    let mut out = Vec::new();
    for peer in peers {
        for port in ports {
            // A family-bound match on one side rules out the other family.
            if let (Some(a), Some(b)) = (peer.1, port.1)
                && a != b
            {
                continue;
            }
            out.push(peer.0.iter().chain(&port.0).cloned().collect());
        }
    }
    out
}

/// This node's pods, with what the view knows of them (labels from the API).
fn local_pods(view: &ClusterView) -> Vec<(String, Arc<PolicyPod>)> {
    view.local
        .values()
        .filter_map(|l| view.pod(&l.namespace, &l.name).map(|p| (l.host_ifname.clone(), p)))
        .filter(|(_, p)| !p.host_network)
        .collect()
}

/// Plans weft's policy table for this node (its pods are `view.local`).
pub fn plan(view: &ClusterView) -> Desired {
    let mut p = Planner::new(view, None);
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

#[cfg(test)]
mod tests;
