//! The kernel seam of network policy: read weft's policy table, apply one transaction
//! ([`PolicyKernel`]), so the engine's decisions are tested against a fake; and its
//! implementation over `nft` in the caller's network namespace ([`NftKernel`]).

use std::collections::BTreeMap;

use weft_kernel::KernelError;
use weft_kernel::nftset::{self, NFPROTO_INET, SetElement, key_addr, key_port};

use crate::nft::{self, Observed};
use crate::plan::{Addition, Element, TABLE};

/// What network policy asks of and does to the kernel of the node's namespace.
pub trait PolicyKernel: Send + 'static {
    /// What weft's policy table holds (an absent table: [`Observed::default`]).
    fn observe(&mut self) -> Result<Observed, KernelError>;
    /// Applies one nft transaction: all of it or nothing.
    fn apply(&mut self, script: &str) -> Result<(), KernelError>;
    /// The packet counts of the table's named counters (what its rules accepted and
    /// its group chains denied).
    fn counters(&mut self) -> Result<BTreeMap<String, u64>, KernelError> {
        Ok(self.observe()?.counters)
    }
    /// Adds one pod's elements (an ADD's fast path): the same as applying
    /// [`nft::addition_script`], which is what this does unless the kernel has a
    /// quicker way.
    fn add_elements(&mut self, add: &Addition) -> Result<(), KernelError> {
        match nft::addition_script(add) {
            Some(s) => self.apply(&s),
            None => Ok(()),
        }
    }
}

/// An addition's elements as nfnetlink set elements.
fn set_elements(add: &Addition) -> Vec<SetElement> {
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
                Element::Range(..) => continue,
            };
            out.push(SetElement {
                set: set.clone(),
                key,
                data: None,
            });
        }
    }
    for entries in [&add.egress, &add.ingress] {
        for (ifname, chain) in entries {
            out.push(SetElement {
                set: nft::member_set(chain),
                key: nftset::key_ifname(ifname),
                data: None,
            });
        }
    }
    out
}

/// [`PolicyKernel`] through `nft` (package nftables), in the namespace of the calling
/// thread: weftd's, the node's. One value serves one namespace: it keeps the nfnetlink
/// socket of the ADD's fast path open between pods.
#[derive(Debug, Default)]
pub struct NftKernel {
    session: nftset::Session,
}

impl PolicyKernel for NftKernel {
    fn observe(&mut self) -> Result<Observed, KernelError> {
        match weft_kernel::nft::run(&["-j", "list", "table", "inet", TABLE], None) {
            Ok(json) => {
                nft::parse(&json).map_err(|e| KernelError::os("reading the policy table", std::io::Error::other(e)))
            }
            Err(e) if e.contains("No such file or directory") => Ok(Observed::default()),
            Err(e) => Err(KernelError::os("reading the policy table", std::io::Error::other(e))),
        }
    }

    fn apply(&mut self, script: &str) -> Result<(), KernelError> {
        weft_kernel::nft::run(&["-f", "-"], Some(script))
            .map(|_| ())
            .map_err(|e| KernelError::os("writing the policy table", std::io::Error::other(e)))
    }

    fn add_elements(&mut self, add: &Addition) -> Result<(), KernelError> {
        // One nfnetlink batch: no nft process on an ADD's path.
        self.session
            .transact(TABLE, NFPROTO_INET, &set_elements(add), true)
            .map_err(|e| KernelError::os("adding a pod's elements to the policy table", e))
    }

    fn counters(&mut self) -> Result<BTreeMap<String, u64>, KernelError> {
        // One netlink dump of the counter objects: `nft list counters` would read (and
        // parse) every set element first, 0.26 s and 77 MB at 200,000 elements, on
        // every metrics scrape.
        nftset::counters(TABLE, NFPROTO_INET).map_err(|e| KernelError::os("reading the policy counters", e))
    }
}
