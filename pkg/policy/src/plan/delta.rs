//! A change of pods elsewhere in the cluster (a pod that comes, goes, or changes its
//! labels or addresses): the set elements it adds and takes out, computed for the
//! addresses whose claims changed only, so its cost and its batch do not grow with the
//! cluster. The sets' elements of one address are those of the pods claiming it, as a
//! full plan fills them.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use crate::eval::ClusterView;
use crate::names::SetName;

use super::{Desired, Element};

/// Set elements to add and to take out, by set.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Delta {
    /// To add.
    pub add: BTreeMap<SetName, BTreeSet<Element>>,
    /// To take out.
    pub del: BTreeMap<SetName, BTreeSet<Element>>,
}

impl Delta {
    /// Whether it changes nothing.
    pub fn is_empty(&self) -> bool {
        self.add.is_empty() && self.del.is_empty()
    }

    /// Applies it to `d`.
    pub fn apply_to(&self, d: &mut Desired) {
        for (set, elements) in &self.del {
            if let Some(s) = d.sets.get_mut(set) {
                for e in elements {
                    s.elements.remove(e);
                }
            }
        }
        for (set, elements) in &self.add {
            if let Some(s) = d.sets.get_mut(set) {
                s.elements.extend(elements.iter().copied());
            }
        }
    }
}

/// The elements of `set` whose address is `ip`.
fn at(set: &BTreeSet<Element>, ip: IpAddr) -> impl Iterator<Item = &Element> {
    use weft_topology::PortProtocol;
    let one = set.get(&Element::Addr(ip));
    let ports =
        set.range(Element::AddrPort(ip, PortProtocol::Tcp, 0)..=Element::AddrPort(ip, PortProtocol::Sctp, u16::MAX));
    one.into_iter().chain(ports)
}

/// What `d`'s pod-dependent sets should change for the claims of `ips` as `view` has
/// them now.
pub fn delta(view: &ClusterView, d: &Desired, ips: &BTreeSet<IpAddr>) -> Delta {
    let mut out = Delta::default();
    for (name, source) in &d.sources {
        let Some(set) = d.sets.get(name) else { continue };
        for ip in ips.iter().filter(|ip| ip.is_ipv6() == source.v6()) {
            let want: BTreeSet<Element> = view
                .claims
                .get(ip)
                .into_iter()
                .flatten()
                .flat_map(|p| source.elements(view, p))
                .filter(|e| e.ip() == Some(*ip))
                .collect();
            let have: BTreeSet<Element> = at(&set.elements, *ip).copied().collect();
            let add: BTreeSet<Element> = want.difference(&have).copied().collect();
            let del: BTreeSet<Element> = have.difference(&want).copied().collect();
            if !add.is_empty() {
                out.add.entry(name.clone()).or_default().extend(add);
            }
            if !del.is_empty() {
                out.del.entry(name.clone()).or_default().extend(del);
            }
        }
    }
    out
}
