//! The point-to-point pod network driver (what kindnet and the reference `ptp`
//! plugin build): a veth pair whose pod end is born inside the pod's namespace; the
//! pod holds a /32 (and /128) and routes everything through the range's gateway; the
//! host routes each pod address to its host end.
//!
//! ```text
//!  pod netns                              node netns
//!  eth0 10.244.1.5/32      <== veth ==>   weftXXXXXXXXXXX (no IPv4 address)
//!  10.244.1.1 dev eth0 scope link         10.244.1.5 dev weftXXXXXXXXXXX scope link src 10.244.1.1
//!  default via 10.244.1.1 dev eth0        weft-gw 10.244.1.1/32 (once per node)
//!  10.244.1.1 lladdr <host end's MAC> PERMANENT
//! ```
//!
//! An IPv4 gateway is held once per node, on [`GATEWAY_DEVICE`], and each pod finds it
//! at its host end's MAC through a permanent neighbour entry (no ARP, whatever the
//! node's `arp_ignore`). Held on every host end instead, as weft did before, the same
//! /32 on a thousand devices made each address change walk all of them (the kernel's
//! address lifetime check and its local route's aliases, under the rtnl lock every
//! netlink call waits for). An IPv6 gateway stays on the host end, which answers
//! neighbour discovery for it. A pod built the old way (its IPv4 gateway on the host
//! end, no neighbour entry) is brought to this form by the reconcile pass's repair.
//! Setup holds a gateway; [`release_gateways`] lets go of those no pod of the node
//! needs any more, which the caller (weftd's handler) knows from its store.
//!
//! A pod may have several such attachments (one per network, as Multus or podman
//! attach secondary networks: `eth0`, `net1`, ...). Which routes each installs
//! through its gateway is the caller's to say ([`RouteRequest`]); by default only the
//! pod's first attachment of a family installs the default route.

use std::fmt;
use std::io;
use std::net::IpAddr;
use std::path::PathBuf;

use crate::netlink::{NewLink, VethPair, host_prefix};
use crate::{Drift, KernelError, NetNs, Netlink, RouteEntry, in_netns, sysctl};

/// The device of the node's namespace that holds its pods' IPv4 gateways (one /32
/// per range), made by the first ADD that needs it: a dummy, or a bridge without ports
/// where the kernel has no dummy driver.
pub const GATEWAY_DEVICE: &str = "weft-gw";

/// One address of a pod with the gateway it routes through.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodAddress {
    /// The pod's address (held as a /32 or /128).
    pub address: IpAddr,
    /// The range's gateway (held where [`PodAddress::holder`] says).
    pub gateway: IpAddr,
}

/// Where the node holds a pod's gateway.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GatewayHolder {
    /// Once per node, on [`GATEWAY_DEVICE`]; the pod has a permanent neighbour entry
    /// for it at its host end's MAC, and the host route to the pod answers from it.
    Node,
    /// On the pod's host end.
    HostEnd,
}

impl PodAddress {
    /// Where the node holds this address's gateway: IPv4 on the node, IPv6 on the
    /// host end (see the module's documentation).
    pub fn holder(&self) -> GatewayHolder {
        if self.address.is_ipv4() {
            GatewayHolder::Node
        } else {
            GatewayHolder::HostEnd
        }
    }

    /// The source the host's route to the pod gives the node's own packets: the
    /// gateway, where the node holds it.
    fn route_source(&self) -> Option<IpAddr> {
        match self.holder() {
            GatewayHolder::Node => Some(self.gateway),
            GatewayHolder::HostEnd => None,
        }
    }
}

/// A route an attachment installs in the pod: to `dst`/`prefix_len` through
/// `gateway` (the gateway of the pod's address of that family, on the host end) over
/// the pod's interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PodRoute {
    /// The destination's network address (`0.0.0.0` or `::` for a default route).
    pub dst: IpAddr,
    /// The destination's prefix length (0 for a default route).
    pub prefix_len: u8,
    /// The next hop.
    pub gateway: IpAddr,
}

impl PodRoute {
    /// The default route of `gateway`'s family through it.
    pub fn default_via(gateway: IpAddr) -> Self {
        let dst = if gateway.is_ipv4() {
            IpAddr::from([0u8; 4])
        } else {
            IpAddr::from([0u8; 16])
        };
        Self {
            dst,
            prefix_len: 0,
            gateway,
        }
    }

    /// Whether this is a default route.
    pub fn is_default(&self) -> bool {
        self.prefix_len == 0
    }

    fn v6(&self) -> bool {
        self.dst.is_ipv6()
    }

    /// Whether the kernel's `r`, on interface `oif`, is this route.
    fn is(&self, r: &RouteEntry, oif: u32) -> bool {
        r.prefix_len == self.prefix_len
            && (self.is_default() || r.dst == Some(self.dst))
            && r.gateway == Some(self.gateway)
            && r.oif == Some(oif)
    }
}

impl fmt::Display for PodRoute {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{} via {}", self.dst, self.prefix_len, self.gateway)
    }
}

/// Which routes [`PodNetwork::setup_routes`] installs in the pod besides the link
/// route to each gateway.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteRequest {
    /// Installed as given. One the pod has already (another network of the pod
    /// installed it) fails the setup: see [`is_route_conflict`].
    pub routes: Vec<PodRoute>,
    /// For each family the pod gets an address in and `routes` gives no default route:
    /// the default route through that family's gateway, unless the pod has a default
    /// route of that family already (its first network installed it).
    pub default_unless_present: bool,
}

impl RouteRequest {
    /// A default route per family, where the pod has none yet: what a pod's only (or
    /// first) network wants.
    pub fn default_route() -> Self {
        Self {
            routes: Vec::new(),
            default_unless_present: true,
        }
    }
}

/// The step every failure to add a route in the pod is reported under.
const POD_ROUTE_STEP: &str = "adding the pod route";

/// Whether `e` is [`PodNetwork::setup_routes`] refusing a route the pod has already
/// (another network of the pod, or its runtime, installed one to the same
/// destination), rather than a kernel failure.
pub fn is_route_conflict(e: &KernelError) -> bool {
    matches!(e, KernelError::Os { step, .. } if step.starts_with(POD_ROUTE_STEP)) && e.errno() == Some(libc::EEXIST)
}

fn add_pod_route(pod: &mut Netlink, r: &PodRoute, oif: u32, ifname: &str) -> Result<(), KernelError> {
    let dst = (!r.is_default()).then_some(r.dst);
    pod.add_route(dst, r.prefix_len, Some(r.gateway), oif, r.v6())
        .map_err(|e| KernelError::os(format!("{POD_ROUTE_STEP} {r} dev {ifname}"), e))
}

/// The desired networking of one pod attachment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodNetwork {
    /// Path of the pod's network namespace (`CNI_NETNS`).
    pub netns: PathBuf,
    /// Interface name inside the pod (`CNI_IFNAME`).
    pub ifname: String,
    /// Name of the host end.
    pub host_ifname: String,
    /// MAC of the host end.
    pub host_mac: [u8; 6],
    /// MAC of the pod end.
    pub pod_mac: [u8; 6],
    /// MTU of both ends.
    pub mtu: u32,
    /// Addresses, at most one per family.
    pub addresses: Vec<PodAddress>,
    /// Alias put on the host end (`weft:<container id>/<ifname>`).
    pub alias: String,
}

/// Who builds a pod's networking: an ADD passes the `add.*` failpoints on the way,
/// a repair (which only rebuilds what an ADD once made) does not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Add,
    Repair,
}

fn os(step: &str) -> impl FnOnce(io::Error) -> KernelError + '_ {
    move |e| KernelError::os(step, e)
}

impl PodNetwork {
    fn has_v6(&self) -> bool {
        self.addresses.iter().any(|a| a.address.is_ipv6())
    }

    /// [`PodNetwork::setup_routes`] with [`RouteRequest::default_route`].
    pub fn setup(&self) -> Result<(), KernelError> {
        self.setup_routes(&RouteRequest::default_route()).map(|_| ())
    }

    /// Builds everything, or nothing: on failure the veth pair (and with it every
    /// address and route on it) is removed again. Returns the routes it installed
    /// through the gateways (`routes`, and the default routes it chose to add), which
    /// [`PodNetwork::check`] and [`PodNetwork::repair`] are given back later. All of it
    /// runs on the calling thread: a netlink socket for the pod's side is opened inside
    /// the pod's namespace by a short-lived thread and used from here. Each step is a
    /// `weft::phase` span.
    pub fn setup_routes(&self, routes: &RouteRequest) -> Result<Vec<PodRoute>, KernelError> {
        let ns = NetNs::open(&self.netns)?;
        let mut host = Netlink::new().map_err(os("opening netlink"))?;
        {
            let _phase = tracing::info_span!(target: "weft::phase", "veth").entered();
            self.create_veth(&mut host, &ns)?;
        }
        weft_failpoint::failpoint!("add.veth");
        let outcome = in_netns(&ns, || Netlink::new().map_err(os("opening netlink in the pod"))).and_then(|mut pod| {
            let routes = self.resolve(&mut pod, routes)?;
            self.configure(&mut host, &mut pod, Step::Add, &routes)?;
            Ok(routes)
        });
        if outcome.is_err() {
            let _ = host.delete_link(&self.host_ifname);
        }
        outcome
    }

    /// The routes to install for `req`: the default route of each of the pod's
    /// families it leaves to us and the pod lacks (decided before anything of ours is
    /// in the pod), then `req.routes`.
    fn resolve(&self, pod: &mut Netlink, req: &RouteRequest) -> Result<Vec<PodRoute>, KernelError> {
        let mut out = Vec::with_capacity(req.routes.len() + self.addresses.len());
        if req.default_unless_present {
            for a in &self.addresses {
                let v6 = a.address.is_ipv6();
                if req.routes.iter().any(|r| r.is_default() && r.v6() == v6) {
                    continue;
                }
                let present = pod
                    .routes(v6)
                    .map_err(os("listing pod routes"))?
                    .iter()
                    .any(|r| r.prefix_len == 0);
                if !present {
                    out.push(PodRoute::default_via(a.gateway));
                }
            }
        }
        out.extend(req.routes.iter().copied());
        Ok(out)
    }

    fn create_veth(&self, host: &mut Netlink, ns: &NetNs) -> Result<(), KernelError> {
        let create = |host: &mut Netlink| {
            host.create_veth(&VethPair {
                local: NewLink {
                    name: &self.host_ifname,
                    mac: self.host_mac,
                    netns: None,
                },
                peer: NewLink {
                    name: &self.ifname,
                    mac: self.pod_mac,
                    netns: Some(ns.raw_fd()),
                },
                mtu: self.mtu,
                alias: Some(&self.alias),
            })
        };
        match create(host) {
            Ok(()) => Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
                // Either our host-end name is taken, which only a stale weft link can
                // do (the name is derived from this attachment): remove it and retry;
                // or the pod already has an interface of that name.
                if host
                    .link_by_name(&self.host_ifname)
                    .map_err(os("looking up the host end"))?
                    .is_some()
                {
                    host.delete_link(&self.host_ifname)
                        .map_err(os("removing a stale host end"))?;
                    create(host).map_err(|e| match e.raw_os_error() {
                        Some(libc::EEXIST) => KernelError::InterfaceExists {
                            ifname: self.ifname.clone(),
                        },
                        _ => KernelError::os("creating the veth pair", e),
                    })
                } else {
                    Err(KernelError::InterfaceExists {
                        ifname: self.ifname.clone(),
                    })
                }
            }
            Err(e) => Err(KernelError::os("creating the veth pair", e)),
        }
    }

    /// Turns IPv6 off on the host end of a pod without IPv6, before the end comes up.
    /// Otherwise the kernel gives every host end a link-local address, an fe80::/64
    /// and a multicast route, and walks the node's whole IPv6 table each time a veth
    /// comes up or goes down, holding the RTNL lock every netlink call needs: with a
    /// thousand pods on the node that doubled the kernel's share of an ADD (0.6 to 1.3
    /// ms) and tripled the cost of cutting a pod off at DEL (0.4 to 1.2 ms). Best
    /// effort: a node without IPv6 has no such knob, and the pod works either way.
    fn disable_host_ipv6(&self) {
        let key = format!("net/ipv6/conf/{}/disable_ipv6", self.host_ifname);
        if !std::path::Path::new("/proc/sys").join(&key).exists() {
            return;
        }
        if let Err(e) = sysctl::write(&key, "1") {
            tracing::debug!(host_ifname = %self.host_ifname, error = %e, "could not turn IPv6 off on the host end");
        }
    }

    /// The link route to the gateway, which every route through it needs.
    fn add_gateway_route(&self, pod: &mut Netlink, a: &PodAddress, oif: u32) -> Result<(), KernelError> {
        pod.add_route(Some(a.gateway), host_prefix(&a.gateway), None, oif, a.address.is_ipv6())
            .map_err(|e| {
                KernelError::os(
                    format!("{POD_ROUTE_STEP} to gateway {} dev {}", a.gateway, self.ifname),
                    e,
                )
            })
    }

    /// The host end's addresses, read only when a gateway is held there: the dump
    /// reads every address of the node's namespace.
    fn host_end_addresses(&self, host: &mut Netlink, index: u32) -> Result<Vec<(IpAddr, u8)>, KernelError> {
        if self.addresses.iter().any(|a| a.holder() == GatewayHolder::HostEnd) {
            host.addresses(index).map_err(os("listing host addresses"))
        } else {
            Ok(Vec::new())
        }
    }

    /// The pod's permanent neighbour entry for a gateway the node holds: at the host
    /// end's MAC.
    fn add_gateway_neighbour(&self, pod: &mut Netlink, gateway: IpAddr, oif: u32) -> Result<(), KernelError> {
        pod.set_neighbour(oif, gateway, self.host_mac).map_err(|e| {
            KernelError::os(
                format!("adding the neighbour entry of gateway {gateway} dev {}", self.ifname),
                e,
            )
        })
    }

    /// The gateways the node holds whose permanent neighbour entry (at the host end's
    /// MAC) the pod lacks: a lookup each (see [`Netlink::neighbour`]).
    fn missing_gateway_neighbours(&self, pod: &mut Netlink, oif: u32) -> Result<Vec<IpAddr>, KernelError> {
        let mut missing = Vec::new();
        for a in self.addresses.iter().filter(|a| a.holder() == GatewayHolder::Node) {
            let entry = pod
                .neighbour(oif, a.gateway)
                .map_err(os("looking up the pod's neighbour entry of its gateway"))?;
            if entry != Some((self.host_mac, true)) {
                missing.push(a.gateway);
            }
        }
        Ok(missing)
    }

    fn configure(
        &self,
        host: &mut Netlink,
        pod: &mut Netlink,
        step: Step,
        routes: &[PodRoute],
    ) -> Result<(), KernelError> {
        let missing =
            |what: &str| KernelError::os(format!("looking up {what}"), io::Error::from_raw_os_error(libc::ENODEV));
        let link = host
            .link_by_name(&self.host_ifname)
            .map_err(os("looking up the host end"))?
            .ok_or_else(|| missing("the host end"))?;
        let eth = pod
            .link_by_name(&self.ifname)
            .map_err(os("looking up the pod end"))?
            .ok_or_else(|| missing("the pod end"))?;
        {
            let _phase = tracing::info_span!(target: "weft::phase", "addresses").entered();
            if self.has_v6() {
                // The host end must answer neighbour discovery from its link-local
                // address at once, not after a second of duplicate address detection.
                sysctl::write(&format!("net/ipv6/conf/{}/accept_dad", self.host_ifname), "0")?;
            } else {
                self.disable_host_ipv6();
            }
            for a in &self.addresses {
                match a.holder() {
                    GatewayHolder::Node => {
                        hold_gateway(host, a.gateway)?;
                    }
                    GatewayHolder::HostEnd => host
                        .add_address(link.index, a.gateway, host_prefix(&a.gateway))
                        .map_err(os("adding the gateway address to the host end"))?,
                }
                pod.add_address(eth.index, a.address, host_prefix(&a.address))
                    .map_err(os("adding the pod address"))?;
            }
            host.set_up(link.index, true).map_err(os("setting the host end up"))?;
            if let Some(lo) = pod.link_by_name("lo").map_err(os("looking up lo"))?
                && !lo.up
            {
                pod.set_up(lo.index, true).map_err(os("setting lo up"))?;
            }
            pod.set_up(eth.index, true).map_err(os("setting the pod end up"))?;
            // After the pod end is up: setting a link down flushes its neighbours,
            // permanent ones too.
            for a in self.addresses.iter().filter(|a| a.holder() == GatewayHolder::Node) {
                self.add_gateway_neighbour(pod, a.gateway, eth.index)?;
            }
        }
        if step == Step::Add {
            weft_failpoint::failpoint!("add.addresses");
        }
        let _phase = tracing::info_span!(target: "weft::phase", "routes").entered();
        for a in &self.addresses {
            host.add_host_route(a.address, link.index, a.route_source())
                .map_err(os("adding the host route to the pod"))?;
            self.add_gateway_route(pod, a, eth.index)?;
        }
        for r in routes {
            add_pod_route(pod, r, eth.index, &self.ifname)?;
        }
        if step == Step::Add {
            weft_failpoint::failpoint!("add.routes");
        }
        Ok(())
    }

    /// Brings the kernel back to this description with `routes` (what
    /// [`PodNetwork::setup_routes`] installed) and names what it repaired, one entry per
    /// item (`veth`: the pair was rebuilt whole, `link_up`, `address`, `route`,
    /// `neighbour`: the pod's entry for a gateway the node holds); empty
    /// when nothing had drifted. The pod must still exist. An interface of the pod's
    /// name that is not weft's (another MAC) is reported, never touched.
    pub fn repair(&self, routes: &[PodRoute]) -> Result<Vec<&'static str>, KernelError> {
        let ns = NetNs::open(&self.netns)?;
        let mut host = Netlink::new().map_err(os("opening netlink"))?;
        let mut pod = in_netns(&ns, || Netlink::new().map_err(os("opening netlink in the pod")))?;
        let link = host
            .link_by_name(&self.host_ifname)
            .map_err(os("looking up the host end"))?;
        let eth = pod.link_by_name(&self.ifname).map_err(os("looking up the pod end"))?;
        if let Some(e) = &eth
            && e.mac != self.pod_mac
        {
            return Err(Drift::ForeignInterface {
                ifname: self.ifname.clone(),
            }
            .into());
        }
        let (Some(mut link), Some(mut eth)) = (link, eth) else {
            // A veth pair lives and dies whole; a lone host end is a leftover.
            if host
                .link_by_name(&self.host_ifname)
                .map_err(os("looking up the host end"))?
                .is_some()
            {
                host.delete_link(&self.host_ifname)
                    .map_err(os("removing a lone host end"))?;
            }
            self.create_veth(&mut host, &ns)?;
            if let Err(e) = self.configure(&mut host, &mut pod, Step::Repair, routes) {
                let _ = host.delete_link(&self.host_ifname);
                return Err(e);
            }
            return Ok(vec!["veth"]);
        };
        let mut repaired = Vec::new();
        for (nl, l, what) in [(&mut host, &mut link, "host end"), (&mut pod, &mut eth, "pod end")] {
            if !l.up {
                nl.set_up(l.index, true)
                    .map_err(os(&format!("setting the {what} up")))?;
                l.up = true;
                repaired.push("link_up");
            }
        }
        let host_addrs = self.host_end_addresses(&mut host, link.index)?;
        let pod_addrs = pod.addresses(eth.index).map_err(os("listing pod addresses"))?;
        for a in &self.addresses {
            match a.holder() {
                GatewayHolder::Node => {
                    if hold_gateway(&mut host, a.gateway)? {
                        repaired.push("address");
                    }
                }
                GatewayHolder::HostEnd => {
                    if !host_addrs.contains(&(a.gateway, host_prefix(&a.gateway))) {
                        host.add_address(link.index, a.gateway, host_prefix(&a.gateway))
                            .map_err(os("adding the gateway address to the host end"))?;
                        repaired.push("address");
                    }
                }
            }
            if !pod_addrs.contains(&(a.address, host_prefix(&a.address))) {
                pod.add_address(eth.index, a.address, host_prefix(&a.address))
                    .map_err(os("adding the pod address"))?;
                repaired.push("address");
            }
        }
        for a in &self.addresses {
            let v6 = a.address.is_ipv6();
            if !host_routes_to(&mut host, a.address, link.index)? {
                host.add_host_route(a.address, link.index, a.route_source())
                    .map_err(os("adding the host route to the pod"))?;
                repaired.push("route");
            }
            let in_pod = pod.routes(v6).map_err(os("listing pod routes"))?;
            if !in_pod
                .iter()
                .any(|r| r.dst == Some(a.gateway) && r.oif == Some(eth.index))
            {
                self.add_gateway_route(&mut pod, a, eth.index)?;
                repaired.push("route");
            }
        }
        // Also what turns a pod built with its IPv4 gateway on the host end into this
        // form: the node holds the gateway now (above), the pod finds it here.
        for gw in self.missing_gateway_neighbours(&mut pod, eth.index)? {
            self.add_gateway_neighbour(&mut pod, gw, eth.index)?;
            repaired.push("neighbour");
        }
        // Only the routes this attachment installed: another network's are its own.
        for v6 in [false, true] {
            let mine: Vec<&PodRoute> = routes.iter().filter(|r| r.v6() == v6).collect();
            if mine.is_empty() {
                continue;
            }
            let in_pod = pod.routes(v6).map_err(os("listing pod routes"))?;
            for r in mine {
                if !in_pod.iter().any(|k| r.is(k, eth.index)) {
                    add_pod_route(&mut pod, r, eth.index, &self.ifname)?;
                    repaired.push("route");
                }
            }
        }
        Ok(repaired)
    }

    /// Compares the kernel with this description and `routes` (what
    /// [`PodNetwork::setup_routes`] installed) and reports the first difference.
    pub fn check(&self, routes: &[PodRoute]) -> Result<(), KernelError> {
        let drift = |d: Drift| Err(KernelError::Drift(d));
        let mut host = Netlink::new().map_err(os("opening netlink"))?;
        let Some(link) = host
            .link_by_name(&self.host_ifname)
            .map_err(os("looking up the host end"))?
        else {
            return drift(Drift::HostInterfaceMissing {
                ifname: self.host_ifname.clone(),
            });
        };
        if !link.up {
            return drift(Drift::HostInterfaceDown {
                ifname: self.host_ifname.clone(),
            });
        }
        let host_addrs = self.host_end_addresses(&mut host, link.index)?;
        let node_held = if self.addresses.iter().any(|a| a.holder() == GatewayHolder::Node) {
            held_gateways(&mut host)?
        } else {
            Vec::new()
        };
        for a in &self.addresses {
            let (held, ifname) = match a.holder() {
                GatewayHolder::Node => (node_held.contains(&a.gateway), GATEWAY_DEVICE),
                GatewayHolder::HostEnd => (
                    host_addrs.contains(&(a.gateway, host_prefix(&a.gateway))),
                    self.host_ifname.as_str(),
                ),
            };
            if !held {
                return drift(Drift::GatewayMissing {
                    gateway: a.gateway,
                    ifname: ifname.to_string(),
                });
            }
            if !host_routes_to(&mut host, a.address, link.index)? {
                return drift(Drift::HostRouteMissing {
                    address: a.address,
                    ifname: self.host_ifname.clone(),
                });
            }
        }
        let ns = NetNs::open(&self.netns)?;
        let mut pod = in_netns(&ns, || Netlink::new().map_err(os("opening netlink in the pod")))?;
        self.check_pod(&mut pod, routes)
    }

    fn check_pod(&self, pod: &mut Netlink, routes: &[PodRoute]) -> Result<(), KernelError> {
        let drift = |d: Drift| Err(KernelError::Drift(d));
        let ifname = || self.ifname.clone();
        let Some(eth) = pod.link_by_name(&self.ifname).map_err(os("looking up the pod end"))? else {
            return drift(Drift::PodInterfaceMissing { ifname: ifname() });
        };
        if !eth.up {
            return drift(Drift::PodInterfaceDown { ifname: ifname() });
        }
        if eth.mac != self.pod_mac {
            return drift(Drift::MacChanged { ifname: ifname() });
        }
        let addrs = pod.addresses(eth.index).map_err(os("listing pod addresses"))?;
        for a in &self.addresses {
            if !addrs.contains(&(a.address, host_prefix(&a.address))) {
                return drift(Drift::AddressMissing {
                    address: a.address,
                    prefix_len: host_prefix(&a.address),
                    ifname: ifname(),
                });
            }
            let in_pod = pod.routes(a.address.is_ipv6()).map_err(os("listing pod routes"))?;
            if !in_pod
                .iter()
                .any(|r| r.dst == Some(a.gateway) && r.oif == Some(eth.index))
            {
                return drift(Drift::GatewayRouteMissing {
                    gateway: a.gateway,
                    ifname: ifname(),
                });
            }
        }
        if let Some(&gateway) = self.missing_gateway_neighbours(pod, eth.index)?.first() {
            return drift(Drift::GatewayNeighbourMissing {
                gateway,
                ifname: ifname(),
            });
        }
        for v6 in [false, true] {
            let mine: Vec<&PodRoute> = routes.iter().filter(|r| r.v6() == v6).collect();
            if mine.is_empty() {
                continue;
            }
            let in_pod = pod.routes(v6).map_err(os("listing pod routes"))?;
            if let Some(r) = mine.iter().find(|r| !in_pod.iter().any(|k| r.is(k, eth.index))) {
                return drift(if r.is_default() {
                    Drift::DefaultRouteMissing {
                        gateway: r.gateway,
                        ifname: ifname(),
                    }
                } else {
                    Drift::RouteMissing {
                        route: **r,
                        ifname: ifname(),
                    }
                });
            }
        }
        Ok(())
    }
}

/// Makes the node hold `gw` on [`GATEWAY_DEVICE`], making the device and setting it up
/// where needed; returns whether anything was missing. Two ADDs may race to make the
/// device: the second finds it made.
fn hold_gateway(host: &mut Netlink, gw: IpAddr) -> Result<bool, KernelError> {
    let mut changed = false;
    let link = match host
        .link_by_name(GATEWAY_DEVICE)
        .map_err(os("looking up the gateway device"))?
    {
        Some(l) => l,
        None => {
            match host.create_address_holder(GATEWAY_DEVICE) {
                Ok(()) => {
                    changed = true;
                    // It holds IPv4 gateways only: no link-local address of its own.
                    let key = format!("net/ipv6/conf/{GATEWAY_DEVICE}/disable_ipv6");
                    if std::path::Path::new("/proc/sys").join(&key).exists() {
                        let _ = sysctl::write(&key, "1");
                    }
                }
                Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {}
                Err(e) => return Err(KernelError::os("creating the gateway device", e)),
            }
            host.link_by_name(GATEWAY_DEVICE)
                .map_err(os("looking up the gateway device"))?
                .ok_or_else(|| {
                    KernelError::os(
                        "looking up the gateway device",
                        io::Error::from_raw_os_error(libc::ENODEV),
                    )
                })?
        }
    };
    if !link.up {
        host.set_up(link.index, true)
            .map_err(os("setting the gateway device up"))?;
        changed = true;
    }
    match host.add_address(link.index, gw, host_prefix(&gw)) {
        Ok(()) => changed = true,
        Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {}
        Err(e) => return Err(KernelError::os("adding the gateway address to the gateway device", e)),
    }
    Ok(changed)
}

/// The gateways the node holds on [`GATEWAY_DEVICE`]: none while it is missing or down
/// (a down device's addresses are not the node's).
fn held_gateways(host: &mut Netlink) -> Result<Vec<IpAddr>, KernelError> {
    let Some(link) = host
        .link_by_name(GATEWAY_DEVICE)
        .map_err(os("looking up the gateway device"))?
    else {
        return Ok(Vec::new());
    };
    if !link.up {
        return Ok(Vec::new());
    }
    Ok(host
        .addresses(link.index)
        .map_err(os("listing the gateway device's addresses"))?
        .into_iter()
        .map(|(a, _)| a)
        .collect())
}

/// Stops holding the IPv4 gateways on [`GATEWAY_DEVICE`] that are not in `in_use`
/// (the gateways of the ranges the node's pods still hold addresses of), and deletes
/// the device once it holds none: a node without pods holds nothing of weft's. Returns
/// the gateways it let go. The caller makes sure no ADD is between holding a gateway
/// and routing to its pod meanwhile (deleting an address takes the routes that answer
/// from it along).
pub fn release_gateways(in_use: &[IpAddr]) -> Result<Vec<IpAddr>, KernelError> {
    let mut host = Netlink::new().map_err(os("opening netlink"))?;
    let Some(link) = host
        .link_by_name(GATEWAY_DEVICE)
        .map_err(os("looking up the gateway device"))?
    else {
        return Ok(Vec::new());
    };
    let held = host
        .addresses(link.index)
        .map_err(os("listing the gateway device's addresses"))?;
    let mut released = Vec::new();
    let mut kept = 0;
    for (addr, prefix) in held {
        if in_use.contains(&addr) {
            kept += 1;
            continue;
        }
        host.delete_address(link.index, addr, prefix)
            .map_err(os("deleting a gateway address from the gateway device"))?;
        released.push(addr);
    }
    if kept == 0 {
        host.delete_link(GATEWAY_DEVICE)
            .map_err(os("deleting the gateway device"))?;
    }
    Ok(released)
}

/// Cuts a pod off at once: sets the host end down, which withdraws its routes.
/// Returns whether the link existed. Fast, unlike deletion, which waits for an RCU
/// grace period (about 20 ms).
pub fn disconnect(host_ifname: &str) -> Result<bool, KernelError> {
    let mut host = Netlink::new().map_err(os("opening netlink"))?;
    match host.link_by_name(host_ifname).map_err(os("looking up the host end"))? {
        Some(l) => {
            host.set_up(l.index, false).map_err(os("setting the host end down"))?;
            Ok(true)
        }
        None => Ok(false),
    }
}

/// Deletes the veth pair by its host end (the pod end, addresses and routes go with
/// it). Returns whether it existed.
pub fn remove(host_ifname: &str) -> Result<bool, KernelError> {
    let mut host = Netlink::new().map_err(os("opening netlink"))?;
    host.delete_link(host_ifname).map_err(os("deleting the veth pair"))
}

/// Whether the host routes `addr` (a pod's address) straight out of its host end
/// `index`: one route lookup rather than a dump of the node's routes, so the reconcile
/// pass checks each of a node's thousands of pods in time of its own.
fn host_routes_to(host: &mut Netlink, addr: IpAddr, index: u32) -> Result<bool, KernelError> {
    Ok(host
        .route_get(addr)
        .map_err(|e| KernelError::os("looking up the host route to the pod", e))?
        .is_some_and(|r| r.oif == Some(index) && r.gateway.is_none()))
}
