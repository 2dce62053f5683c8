//! CNI semantics: what ADD, DEL, CHECK, STATUS and GC do, over the [`Ipam`] and
//! [`PodNetworking`] seams. Every input is validated before anything is touched; a
//! failed ADD undoes what it did; DEL and GC are idempotent.
//!
//! The handler and its seams are here; each command is in its own file (`add.rs`,
//! `del.rs`, `inspect.rs` for CHECK, STATUS, GC and the reconcile pass), the checks of
//! a request in `checks.rs`, conversions between calls, records and kernel descriptions
//! in `convert.rs`, and the mapping of store and kernel failures to CNI codes in
//! `errors.rs`. The DEL spool replays through [`Handler::replay_del_spool`]; the spool
//! itself (`crate::spool`) knows nothing of the handler.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;

use ipnet::IpNet;
use tokio::sync::watch;
use weft_cni::{Cmd, CniError, NetworkConfig, validate};
use weft_store::{Attachment, AttachmentKey};

use crate::defaults::{self, PodDefaults};
use crate::gateways::{self, GatewayLock};
use crate::locks::{KeyedLocks, Teardowns};
use crate::seams::{Ipam, POLICED_IFNAME, PodNetworking, PolicedPod, PolicyHook, WiredPod, Wiring};
use crate::spool::DelSpool;

mod checks;
mod convert;
mod errors;

pub use convert::host_port_entries;
pub(crate) use convert::{cni_result, pod_network};
pub use errors::STORE_CANNOT_WRITE;
use errors::kernel_err;

/// A span for one phase of a call; closed phases become
/// `weft_cni_phase_duration_seconds{phase=...}` observations and trace spans.
macro_rules! phase {
    ($name:literal) => {
        tracing::info_span!(target: "weft::phase", $name)
    };
}

// After the macro: these use it.
mod add;
mod del;
mod inspect;

/// Facts about the node the handler reports.
#[derive(Debug, Clone, Default)]
pub struct NodeInfo {
    /// The node's name.
    pub name: String,
}

/// Handles CNI calls. Cheap to share: wrap it in an `Arc`.
pub struct Handler<I, K> {
    ipam: Arc<I>,
    net: Arc<K>,
    locks: KeyedLocks,
    teardowns: Arc<Teardowns>,
    node: NodeInfo,
    wiring: Option<Arc<dyn Wiring>>,
    defaults: Option<watch::Receiver<PodDefaults>>,
    del_spool: Option<Arc<DelSpool>>,
    new_range: Option<NewRange>,
    policy: Option<Arc<dyn PolicyHook>>,
    /// Ranges ADDs gave addresses from since start (a new one is announced once).
    seen_ranges: std::sync::Mutex<HashSet<IpNet>>,
    /// Between holding a gateway and routing from it, and its release (see
    /// [`crate::gateways`]).
    gateways: Arc<GatewayLock>,
}

/// Called when an ADD gave an address from a range no ADD used since start.
pub type NewRange = Arc<dyn Fn() + Send + Sync>;

impl<I, K> Handler<I, K> {
    /// Lets network configs leave `ranges` and `mtu` to the node: ADD and STATUS then
    /// use the node's pod ranges and pod MTU as `rx` holds them at the time of the
    /// call. Without it (a standalone node), a config must give `ranges`.
    pub fn with_pod_defaults(mut self, rx: watch::Receiver<PodDefaults>) -> Self {
        self.defaults = Some(rx);
        self
    }

    /// The ranges and MTU a config resolves to on this node for `cmd`.
    fn effective(&self, conf: &NetworkConfig, cmd: Cmd) -> Result<defaults::Effective, CniError> {
        let node = self.defaults.as_ref().map(|rx| rx.borrow().clone());
        defaults::resolve(conf, node.as_ref(), cmd)
    }
}

impl<I: Ipam, K: PodNetworking> Handler<I, K> {
    /// A handler over `ipam` and `net`.
    pub fn new(ipam: I, net: K, node: NodeInfo) -> Self {
        Self {
            ipam: Arc::new(ipam),
            net: Arc::new(net),
            locks: KeyedLocks::new(256),
            teardowns: Arc::new(Teardowns::default()),
            node,
            wiring: None,
            defaults: None,
            del_spool: None,
            new_range: None,
            policy: None,
            seen_ranges: Default::default(),
            gateways: Default::default(),
        }
    }

    /// Lets go of the gateways the node holds for ranges whose last address `released`
    /// gave back; nothing when `released` had no address of a node-held gateway.
    async fn release_gateways_of(&self, released: &Attachment) {
        if holds_node_gateway(released) {
            gateways::release_unused(self.ipam.as_ref(), self.net.as_ref(), &self.gateways).await;
        }
    }

    /// Adds network policy: an ADD of a pod's `eth0` answers only once its policies are
    /// in the kernel.
    pub fn with_policy(mut self, policy: Arc<dyn PolicyHook>) -> Self {
        self.policy = Some(policy);
        self
    }

    /// The pod network policy sees for `att`, if policy applies to it.
    fn policed(att: &Attachment) -> Option<PolicedPod> {
        (att.key.ifname == POLICED_IFNAME && !att.pod.name.is_empty()).then(|| PolicedPod {
            namespace: att.pod.namespace_or_default().to_string(),
            name: att.pod.name.clone(),
            ips: att.addresses.iter().map(|a| a.address).collect(),
            host_ifname: att.host_ifname.clone(),
        })
    }

    /// Calls `f` when an ADD gives an address from a range no ADD used since start, so
    /// the node network takes up a range a network config brought (its unreachable
    /// route, masquerade) at once rather than at its next pass.
    pub fn on_new_range(mut self, f: NewRange) -> Self {
        self.new_range = Some(f);
        self
    }

    fn note_ranges(&self, att: &Attachment) {
        let Some(f) = &self.new_range else { return };
        let new = {
            let mut seen = self.seen_ranges.lock().expect("ranges lock");
            // Every range is recorded, not only up to the first new one.
            att.addresses.iter().filter(|a| seen.insert(a.range)).count() > 0
        };
        if new {
            f();
        }
    }

    /// Adds the DEL spool the plugin writes to while weftd is down: an ADD first
    /// replays a DEL spooled for its attachment (see [`crate::spool`]).
    pub fn with_del_spool(mut self, spool: Arc<DelSpool>) -> Self {
        self.del_spool = Some(spool);
        self
    }

    /// The DEL spool, if the handler has one.
    pub fn del_spool(&self) -> Option<&Arc<DelSpool>> {
        self.del_spool.as_ref()
    }

    /// Replays every DEL in the spool with this handler's DEL (see [`DelSpool`]).
    /// Without a spool, does nothing.
    pub async fn replay_del_spool(&self) -> crate::spool::Replayed {
        match self.del_spool() {
            Some(spool) => {
                spool
                    .replay_all(&|call| Box::pin(async move { self.del_now(&call).await }))
                    .await
            }
            None => crate::spool::Replayed::default(),
        }
    }

    /// Whether a DEL of `key` waits in the spool (one stat).
    pub(crate) fn del_waits_in_spool(&self, key: &AttachmentKey) -> bool {
        self.del_spool().is_some_and(|s| s.waits(key))
    }

    /// Before an ADD: replays a DEL spooled for `key`, so it is not applied after the
    /// ADD. Fails the ADD (try again later) when that DEL cannot be done now.
    pub(crate) async fn replay_spooled_del(&self, key: &AttachmentKey) -> Result<(), CniError> {
        match self.del_spool() {
            Some(spool) => {
                spool
                    .replay_key(key, &|call| Box::pin(async move { self.del_now(&call).await }))
                    .await
            }
            None => Ok(()),
        }
    }

    /// Adds the wiring seam (pods with a Topology get their links after `eth0`).
    pub fn with_wiring(mut self, wiring: Arc<dyn Wiring>) -> Self {
        self.wiring = Some(wiring);
        self
    }

    fn wired_pod(att: &Attachment) -> Option<WiredPod> {
        (!att.pod.name.is_empty()).then(|| WiredPod {
            namespace: att.pod.namespace_or_default().to_string(),
            name: att.pod.name.clone(),
            netns: att.netns.clone(),
            container_id: att.key.container_id.clone(),
        })
    }

    /// The node this handler serves.
    pub fn node(&self) -> &NodeInfo {
        &self.node
    }

    /// The IPAM seam.
    pub fn ipam(&self) -> &I {
        &self.ipam
    }

    /// Teardowns accepted but not finished.
    pub fn pending_teardowns(&self) -> usize {
        self.teardowns.len()
    }

    /// Waits until every accepted teardown has finished (at shutdown, and after the
    /// start-up replay of the DEL spool).
    pub async fn drain_teardowns(&self) {
        self.teardowns.wait_all().await;
    }

    async fn check_netns(&self, path: &str) -> Result<(), CniError> {
        validate::netns_path(path)?;
        self.net.validate_netns(PathBuf::from(path)).await.map_err(kernel_err)
    }
}

/// Whether the node holds a gateway of one of `att`'s addresses (their IPv4 ones:
/// `weft_kernel::ptp::PodAddress::holder`), so releasing them may free it.
fn holds_node_gateway(att: &Attachment) -> bool {
    att.addresses.iter().any(|a| {
        weft_kernel::ptp::PodAddress {
            address: a.address,
            gateway: a.gateway,
        }
        .holder()
            == weft_kernel::ptp::GatewayHolder::Node
    })
}
