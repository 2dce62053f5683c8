//! The kernel seam of network policy: read weft's policy table, apply one transaction,
//! add one pod ([`PolicyKernel`]), so the engine's decisions are tested against a fake;
//! and its implementation over `nft` and nfnetlink in the caller's network namespace
//! ([`NftKernel`]).

use std::collections::{BTreeMap, BTreeSet};

use weft_kernel::KernelError;
use weft_kernel::nftbatch as nb;
use weft_kernel::nftset::{self, NFPROTO_INET, SetElement, key_addr, key_port};

use crate::names::{Chain, SetName};
use crate::nft::{self, Observed};
use crate::plan::{Addition, DNS_LOG_GROUP, DNS_TABLE, Delta, Element, SetKind, TABLE, dispatch_rule};

pub use crate::nft::LearntElement;

/// What network policy asks of and does to the kernel of the node's namespace.
pub trait PolicyKernel: Send + 'static {
    /// What weft's policy table holds (an absent table: [`Observed::default`]).
    fn observe(&mut self) -> Result<Observed, KernelError>;
    /// Applies one nft transaction: all of it or nothing.
    fn apply(&mut self, script: &str) -> Result<(), KernelError>;
    /// The packet counts of the table's named counters (what its rules accepted and
    /// its group chains denied), by name.
    fn counters(&mut self) -> Result<BTreeMap<String, u64>, KernelError> {
        Ok(self
            .observe()?
            .counters
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect())
    }
    /// Takes out and adds set elements in one transaction (a change of pods elsewhere
    /// in the cluster): the same as applying [`nft::delta_script`], which is what this
    /// does unless the kernel has a quicker way.
    fn update(&mut self, delta: &Delta) -> Result<(), KernelError> {
        match nft::delta_script(delta) {
            Some(s) => self.apply(&s),
            None => Ok(()),
        }
    }
    /// Puts addresses learnt from DNS answers in their learnt sets, each with its
    /// timeout and its name as comment, in one transaction: the same as applying
    /// [`nft::learn_script`], which is what this does unless the kernel has a quicker
    /// way.
    fn learn(&mut self, elements: &[LearntElement]) -> Result<(), KernelError> {
        match nft::learn_script(elements) {
            Some(s) => self.apply(&s),
            None => Ok(()),
        }
    }
    /// Copies DNS answers to this node's pods, and from a DNS server on the node, to
    /// the learner (`on`: the [`DNS_TABLE`](crate::plan::DNS_TABLE) table, logging
    /// them to [`DNS_LOG_GROUP`](crate::plan::DNS_LOG_GROUP); the answers themselves
    /// go on at once, and the policy table's hold chain gets its queue rule, which
    /// scripts cannot write), or no longer (the table goes). Doing it twice is doing
    /// it once; after a script, it is done again.
    fn copy_dns_answers(&mut self, on: bool) -> Result<(), KernelError>;
    /// Adds one pod (an ADD's path), atomically: the same as applying
    /// [`nft::addition_script`], which is what this does unless the kernel has a
    /// quicker way.
    fn add(&mut self, add: &Addition) -> Result<(), KernelError> {
        match nft::addition_script(add) {
            Some(s) => self.apply(&s),
            None => Ok(()),
        }
    }
}

/// An addition's set elements as nfnetlink elements, when that is all it holds: no new
/// object, no new entry chain.
fn elements_only(add: &Addition) -> Option<Vec<SetElement>> {
    if !add.elements_only() {
        return None;
    }
    let mut out = Vec::new();
    for (set, elements) in &add.elements {
        for e in elements {
            let key = match e {
                Element::Addr(ip) => key_addr(*ip),
                Element::AddrPort(ip, proto, port) => {
                    let mut k = key_addr(*ip);
                    k.extend(nftset::key_proto(proto.number()));
                    k.extend(key_port(*port));
                    k
                }
                // Ranges are the policies' own, never a pod's.
                Element::Range(..) => return None,
            };
            out.push(SetElement {
                set: set.to_string(),
                key,
                data: None,
                expiry: None,
            });
        }
    }
    for entries in [&add.egress, &add.ingress] {
        for (ifname, chain) in entries {
            out.push(SetElement {
                set: SetName::Members(chain.clone()).to_string(),
                key: nftset::key_ifname(ifname),
                data: None,
                expiry: None,
            });
        }
    }
    for ifname in &add.hairpin {
        let mut key = nftset::key_ifname(ifname);
        key.extend(nftset::key_ifname(ifname));
        out.push(SetElement {
            set: SetName::Hairpin.to_string(),
            key,
            data: None,
            expiry: None,
        });
    }
    Some(out)
}

/// A set of the plan as the kernel batch declares it.
fn batch_set(name: &SetName, kind: SetKind) -> nb::Set {
    let key = match kind {
        SetKind::Addr4 | SetKind::Net4 | SetKind::Learnt4 => nb::KeyType::Ipv4Addr,
        SetKind::Addr6 | SetKind::Net6 | SetKind::Learnt6 => nb::KeyType::Ipv6Addr,
        SetKind::AddrPort4 => nb::KeyType::Ipv4AddrProtoPort,
        SetKind::AddrPort6 => nb::KeyType::Ipv6AddrProtoPort,
    };
    match kind {
        SetKind::Net4 | SetKind::Net6 => nb::Set::interval(name.to_string(), key),
        SetKind::Learnt4 | SetKind::Learnt6 => nb::Set::timeout(name.to_string(), key),
        SetKind::Addr4 | SetKind::Addr6 | SetKind::AddrPort4 | SetKind::AddrPort6 => {
            nb::Set::new(name.to_string(), key)
        }
    }
}

fn batch_element(e: &Element) -> nb::Element {
    match e {
        Element::Addr(ip) => nb::Element::addr(*ip),
        Element::Range(a, b) => nb::Element::Range(key_addr(*a), key_addr(*b)),
        Element::AddrPort(ip, proto, port) => nb::Element::addr_proto_port(*ip, proto.number(), *port),
    }
}

/// The batch's form of a set of pods' elements (of one address family, one kind).
fn pod_set(name: &SetName, elements: &BTreeSet<Element>) -> Option<nb::Set> {
    let kind = match elements.iter().next()? {
        Element::AddrPort(ip, ..) if ip.is_ipv6() => SetKind::AddrPort6,
        Element::AddrPort(..) => SetKind::AddrPort4,
        Element::Addr(ip) if ip.is_ipv6() => SetKind::Addr6,
        Element::Addr(_) => SetKind::Addr4,
        // Ranges are the policies' own, never a pod's.
        Element::Range(..) => return None,
    };
    Some(batch_set(name, kind))
}

/// A delta as one nfnetlink batch: what goes, then what comes.
fn batch_of_delta(delta: &Delta) -> nb::Batch {
    let mut b = nb::Batch::new(TABLE);
    for (name, elements) in &delta.del {
        if let Some(set) = pod_set(name, elements) {
            b.delete_elements(&set, elements.iter().map(batch_element));
        }
    }
    for (name, elements) in &delta.add {
        if let Some(set) = pod_set(name, elements) {
            b.add_elements(&set, elements.iter().map(batch_element));
        }
    }
    b
}

/// An addition as one nfnetlink batch, in the order of [`nft::addition_script`]: new
/// sets (filled), member sets, counters, chains; elements; rules, a chain before the
/// chains that jump to it; dispatch members, hairpin pairs, dispatch rules.
fn batch_of(add: &Addition) -> Result<nb::Batch, KernelError> {
    let mut b = nb::Batch::new(TABLE);
    for (name, set) in &add.new.sets {
        b.add_set(&batch_set(name, set.kind), set.elements.iter().map(batch_element));
    }
    let member = |chain: &Chain| nb::Set::new(SetName::Members(chain.clone()).to_string(), nb::KeyType::Ifname);
    for entry in &add.entries {
        b.add_set(&member(entry), []);
    }
    for c in &add.new.counters {
        b.add_counter(c.to_string());
    }
    for c in add.new.chains.keys() {
        b.add_chain(c.to_string());
    }
    for (name, elements) in &add.elements {
        if let Some(set) = pod_set(name, elements) {
            b.add_elements(&set, elements.iter().map(batch_element));
        }
    }
    let mut chains: Vec<&Chain> = add.new.chains.keys().collect();
    chains.sort_by_key(|c| (c.rank(), (*c).clone()));
    let rule = |r: &crate::rule::Rule| {
        r.exprs().ok_or_else(|| {
            KernelError::os(
                "adding a pod to the policy table",
                std::io::Error::other(format!("a rule only nft writes: {r}")),
            )
        })
    };
    for c in chains {
        for r in &add.new.chains[c] {
            b.add_rule(c.to_string(), rule(r)?);
        }
    }
    for (ifname, chain) in add.egress.iter().chain(&add.ingress) {
        b.add_elements(&member(chain), [nb::Element::ifname(ifname)]);
    }
    if !add.hairpin.is_empty() {
        let hairpin = nb::Set::new(SetName::Hairpin.to_string(), nb::KeyType::IfnamePair);
        b.add_elements(&hairpin, add.hairpin.iter().map(|i| nb::Element::ifname_pair(i, i)));
    }
    for entry in &add.entries {
        let dir = entry.direction();
        b.add_rule(Chain::Dispatch(dir).to_string(), rule(&dispatch_rule(dir, entry))?);
    }
    Ok(b)
}

/// [`PolicyKernel`] through `nft` (package nftables) and nfnetlink, in the namespace of
/// the calling thread: weftd's, the node's. One value serves one namespace: it keeps
/// the nfnetlink socket of the ADD's path open between pods.
#[derive(Debug, Default)]
pub struct NftKernel {
    session: nftset::Session,
    /// Whether the DNS table is in place, as last made so (`None`: not known yet).
    copy_dns_answers: Option<bool>,
}

impl PolicyKernel for NftKernel {
    fn observe(&mut self) -> Result<Observed, KernelError> {
        // Read back means not trusted: the DNS table is made so again too.
        self.copy_dns_answers = None;
        match weft_kernel::nft::run(&["-j", "list", "table", "inet", TABLE], None) {
            Ok(json) => {
                nft::parse(&json).map_err(|e| KernelError::os("reading the policy table", std::io::Error::other(e)))
            }
            Err(e) if e.contains("No such file or directory") => Ok(Observed::default()),
            Err(e) => Err(KernelError::os("reading the policy table", std::io::Error::other(e))),
        }
    }

    fn apply(&mut self, script: &str) -> Result<(), KernelError> {
        // A script may have made or flushed the hold chain, whose rule it cannot write.
        self.copy_dns_answers = None;
        weft_kernel::nft::run(&["-f", "-"], Some(script))
            .map(|_| ())
            .map_err(|e| KernelError::os("writing the policy table", std::io::Error::other(e)))
    }

    fn add(&mut self, add: &Addition) -> Result<(), KernelError> {
        match elements_only(add) {
            // One nfnetlink batch: no nft process on an ADD's path.
            Some(elements) if elements.is_empty() => Ok(()),
            Some(elements) => self
                .session
                .transact(TABLE, NFPROTO_INET, &elements, true)
                .map_err(|e| KernelError::os("adding a pod's elements to the policy table", e)),
            // New chains, sets and counters too (the first pod of a new group): one
            // batch all the same, about 0.1 ms where `nft -f` takes 3-5 ms.
            None => batch_of(add)?
                .commit(&mut self.session)
                .map_err(|e| KernelError::os("adding a pod to the policy table", std::io::Error::other(e.to_string()))),
        }
    }

    fn learn(&mut self, elements: &[LearntElement]) -> Result<(), KernelError> {
        let elements: Vec<SetElement> = elements
            .iter()
            .map(|e| SetElement {
                set: e.set.to_string(),
                key: key_addr(e.ip),
                data: None,
                expiry: Some(nftset::Expiry {
                    timeout_ms: e.timeout_ms,
                    comment: e.name.clone(),
                }),
            })
            .collect();
        self.session
            .transact(TABLE, NFPROTO_INET, &elements, true)
            .map_err(|e| KernelError::os("adding learnt addresses to the policy table", e))
    }

    fn copy_dns_answers(&mut self, on: bool) -> Result<(), KernelError> {
        if self.copy_dns_answers == Some(on) {
            return Ok(());
        }
        let fail = |e: String| KernelError::os("writing the DNS answers table", std::io::Error::other(e));
        if on {
            // Answers forwarded to a pod, and answers a DNS server on the node sends
            // (the output hook); over UDP and TCP. Only a copy: nothing waits here.
            // The chains are declared (a no-op when they exist), then their rules are
            // replaced in one transaction: answers are never let past uncopied while
            // the table is made so again (as it is after every read-back).
            weft_kernel::nft::run(
                &["-f", "-"],
                Some(&format!(
                    "table inet {DNS_TABLE} {{\n  chain answers {{\n    type filter hook forward priority -10; policy accept;\n  }}\n  chain local_answers {{\n    type filter hook output priority -10; policy accept;\n  }}\n}}\n"
                )),
            )
            .map_err(fail)?;
            let mut b = nb::Batch::new(DNS_TABLE);
            for chain in ["answers", "local_answers"] {
                b.flush_chain(chain);
                for proto in [nb::L4Proto::Udp, nb::L4Proto::Tcp] {
                    b.add_rule(
                        chain,
                        [
                            nb::Expr::Sport { proto, port: 53 },
                            // Only a reply to a query the pod sent to that server: a
                            // peer cannot teach the learner with answers nobody asked.
                            nb::Expr::CtReply,
                            nb::Expr::Log {
                                group: DNS_LOG_GROUP,
                                prefix: "weft dns".into(),
                            },
                        ],
                    );
                }
            }
            b.commit(&mut self.session).map_err(|e| fail(e.to_string()))?;
            // The hold chain's one rule, replaced whole in one transaction (never
            // empty meanwhile): the planner declares the chain wherever a rule has
            // names, and only this writes its rule.
            let mut hold = nb::Batch::new(TABLE);
            let chain = Chain::Hold.to_string();
            hold.add_chain(chain.clone());
            hold.flush_chain(chain.clone());
            hold.add_rule(
                chain,
                crate::rule::Rule::new(Vec::new(), crate::rule::Verdict::Hold)
                    .exprs()
                    .expect("the hold is written over nfnetlink"),
            );
            hold.commit(&mut self.session).map_err(|e| fail(e.to_string()))?;
        } else {
            match weft_kernel::nft::run(&["delete", "table", "inet", DNS_TABLE], None) {
                Ok(_) => {}
                Err(e) if e.contains("No such file or directory") => {}
                Err(e) => return Err(fail(e)),
            }
        }
        self.copy_dns_answers = Some(on);
        Ok(())
    }

    fn update(&mut self, delta: &Delta) -> Result<(), KernelError> {
        if delta.is_empty() {
            return Ok(());
        }
        batch_of_delta(delta).commit(&mut self.session).map_err(|e| {
            KernelError::os(
                "changing pods' elements in the policy table",
                std::io::Error::other(e.to_string()),
            )
        })
    }

    fn counters(&mut self) -> Result<BTreeMap<String, u64>, KernelError> {
        // One netlink dump of the counter objects: `nft list counters` would read (and
        // parse) every set element first, 0.26 s and 77 MB at 200,000 elements, on
        // every metrics scrape.
        nftset::counters(TABLE, NFPROTO_INET).map_err(|e| KernelError::os("reading the policy counters", e))
    }
}
