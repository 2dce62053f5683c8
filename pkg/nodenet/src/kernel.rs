//! The kernel seam of the node network: the few questions and changes the engine needs,
//! as a trait ([`NodeKernel`]) so its decisions are tested against a fake, and its
//! implementation over weft's netlink socket and `nft` ([`HostKernel`]).

use std::net::IpAddr;

use weft_kernel::{KernelError, NODE_ROUTE_PROTOCOL, NetNs, Netlink, in_netns};

use crate::masq::{self, MasqChange, MasqFound};
use crate::model::*;

/// What the node network asks of and does to the kernel of the node's namespace.
pub trait NodeKernel: Send + 'static {
    /// The MTU of the link holding address `local`, if one does.
    fn underlay_mtu(&mut self, local: IpAddr) -> Result<Option<u32>, KernelError>;
    /// Whether `addr` is reached on a directly connected link (no gateway).
    fn on_link(&mut self, addr: IpAddr) -> Result<bool, KernelError>;
    /// What the kernel holds of weft's pod routing.
    fn observe(&mut self) -> Result<Observed, KernelError>;
    /// Makes one change.
    fn apply(&mut self, change: &Change) -> Result<(), KernelError>;
    /// What the kernel holds of the masquerade table.
    fn masquerade(&mut self) -> Result<MasqFound, KernelError>;
    /// Changes the masquerade table.
    fn set_masquerade(&mut self, change: &MasqChange) -> Result<(), KernelError>;
    /// The ranges weft exported to `export`'s table (its blackhole routes there).
    fn exported(&mut self, export: RouteExport) -> Result<Vec<ipnet::IpNet>, KernelError>;
}

/// [`NodeKernel`] on the real kernel: the namespace of the thread that made it, whichever
/// thread uses it later (its netlink socket keeps that namespace; `nft` and sysctls are
/// run inside it).
pub struct HostKernel {
    nl: Netlink,
    ns: NetNs,
    /// The VXLAN device's index as last found (by `observe` or a lookup), so a pass
    /// that adds thousands of entries does not look the device up before each; cleared
    /// when weft creates or deletes it. A device replaced behind weft's back fails the
    /// pass's changes, and the next pass's `observe` finds the new one.
    vxlan_ix: Option<u32>,
}

fn os(step: &str) -> impl FnOnce(std::io::Error) -> KernelError + '_ {
    move |e| KernelError::os(step, e)
}

fn host_prefix(a: &IpAddr) -> u8 {
    if a.is_ipv4() { 32 } else { 128 }
}

impl HostKernel {
    /// Opens a netlink socket in the calling thread's namespace (weftd's: the node's).
    pub fn new() -> Result<Self, KernelError> {
        Ok(Self {
            nl: Netlink::new().map_err(os("opening netlink"))?,
            ns: NetNs::current()?,
            vxlan_ix: None,
        })
    }

    /// Runs `f` in this kernel's namespace: on this thread when it is there already (as
    /// in weftd), else on a thread of its own that enters it.
    fn inside<R: Send>(&self, f: impl FnOnce() -> Result<R, KernelError> + Send) -> Result<R, KernelError> {
        if NetNs::current()?.same_as(&self.ns) {
            f()
        } else {
            in_netns(&self.ns, f)
        }
    }

    fn vxlan_index(&mut self) -> Result<u32, KernelError> {
        if let Some(i) = self.vxlan_ix {
            return Ok(i);
        }
        let i = self.find_vxlan()?;
        self.vxlan_ix = Some(i);
        Ok(i)
    }

    fn find_vxlan(&mut self) -> Result<u32, KernelError> {
        self.nl
            .link_by_name(VXLAN_DEVICE)
            .map_err(os("looking up the VXLAN device"))?
            .map(|l| l.index)
            .ok_or_else(|| {
                KernelError::os(
                    "looking up the VXLAN device",
                    std::io::Error::from_raw_os_error(libc::ENODEV),
                )
            })
    }
}

impl NodeKernel for HostKernel {
    fn underlay_mtu(&mut self, local: IpAddr) -> Result<Option<u32>, KernelError> {
        let Some(index) = self.nl.address_owner(local).map_err(os("finding the underlay link"))? else {
            return Ok(None);
        };
        Ok(self
            .nl
            .links()
            .map_err(os("listing links"))?
            .into_iter()
            .find(|l| l.index == index)
            .map(|l| l.mtu))
    }

    fn on_link(&mut self, addr: IpAddr) -> Result<bool, KernelError> {
        Ok(self
            .nl
            .route_get(addr)
            .map_err(os("looking up the route to a peer"))?
            .is_some_and(|r| r.on_link()))
    }

    fn observe(&mut self) -> Result<Observed, KernelError> {
        let mut o = Observed::default();
        for v6 in [false, true] {
            match self.nl.routes_of_protocol(v6, NODE_ROUTE_PROTOCOL) {
                Ok(routes) => o.routes.extend(routes.into_iter().map(|r| ObservedRoute {
                    dst: r.dst,
                    gateway: r.gateway,
                    oif: r.oif,
                    unreachable: r.unreachable,
                })),
                // A node without IPv6 has no IPv6 routes to own.
                Err(e) if v6 && e.raw_os_error() == Some(libc::EAFNOSUPPORT) => {}
                Err(e) => return Err(KernelError::os("listing weft's node routes", e)),
            }
        }
        // Every pass starts from what is there now.
        self.vxlan_ix = None;
        let Some(link) = self
            .nl
            .link_by_name(VXLAN_DEVICE)
            .map_err(os("looking up the VXLAN device"))?
        else {
            return Ok(o);
        };
        self.vxlan_ix = Some(link.index);
        let params = self
            .nl
            .vxlan_params(VXLAN_DEVICE)
            .map_err(os("reading the VXLAN device"))?
            .unwrap_or(weft_kernel::VxlanParams {
                vni: None,
                port: None,
                local: None,
            });
        o.vxlan_addresses = self
            .nl
            .addresses(link.index)
            .map_err(os("listing the VXLAN device's addresses"))?
            .into_iter()
            .filter(|(a, p)| {
                *p == host_prefix(a) && !matches!(a, IpAddr::V6(v6) if v6.segments()[0] & 0xffc0 == 0xfe80)
            })
            .map(|(a, _)| a)
            .collect();
        o.fdb = self.nl.fdb(link.index).map_err(os("listing the VXLAN device's FDB"))?;
        o.neighbours = self
            .nl
            .permanent_neighbours(link.index)
            .map_err(os("listing the VXLAN device's neighbours"))?;
        o.vxlan = Some(ObservedVxlan {
            index: link.index,
            vni: params.vni,
            port: params.port,
            local: params.local,
            mac: link.mac,
            mtu: link.mtu,
            up: link.up,
        });
        Ok(o)
    }

    fn apply(&mut self, change: &Change) -> Result<(), KernelError> {
        match change {
            Change::CreateVxlan(s) => {
                self.vxlan_ix = None;
                self.nl
                    .create_vxlan(&weft_kernel::VxlanDevice {
                        link: weft_kernel::NewLink {
                            name: VXLAN_DEVICE,
                            mac: s.mac,
                            netns: None,
                        },
                        vni: s.vni,
                        local: s.local,
                        port: s.port,
                        mtu: s.mtu,
                        udp_csum: true,
                    })
                    .map_err(os("creating the VXLAN device"))?;
                let index = self.vxlan_index()?;
                // Only weft's permanent entries decide where frames go; the kernel's own
                // IPv6 link-local address and its neighbour discovery have nothing to do
                // on this device.
                let _ = self
                    .inside(|| weft_kernel::sysctl::write(&format!("net/ipv6/conf/{VXLAN_DEVICE}/accept_dad"), "0"));
                self.nl.set_up(index, true).map_err(os("setting the VXLAN device up"))
            }
            Change::DeleteVxlan => {
                self.vxlan_ix = None;
                self.nl
                    .delete_link(VXLAN_DEVICE)
                    .map(|_| ())
                    .map_err(os("deleting the VXLAN device"))
            }
            Change::SetVxlanMac(m) => {
                let i = self.vxlan_index()?;
                self.nl.set_mac(i, *m).map_err(os("setting the VXLAN device's MAC"))
            }
            Change::SetVxlanMtu(m) => {
                let i = self.vxlan_index()?;
                self.nl.set_mtu(i, *m).map_err(os("setting the VXLAN device's MTU"))
            }
            Change::SetVxlanUp => {
                let i = self.vxlan_index()?;
                self.nl.set_up(i, true).map_err(os("setting the VXLAN device up"))
            }
            Change::AddAddress(a) => {
                let i = self.vxlan_index()?;
                self.nl
                    .add_address(i, *a, host_prefix(a))
                    .map_err(os("adding an address to the VXLAN device"))
            }
            Change::DeleteAddress(a) => {
                let i = self.vxlan_index()?;
                self.nl
                    .delete_address(i, *a, host_prefix(a))
                    .map(|_| ())
                    .map_err(os("removing an address from the VXLAN device"))
            }
            Change::AddFdb(mac, dst) => {
                let i = self.vxlan_index()?;
                // The pass removed the MAC's stale entries before: a plain add, no read
                // of the whole table per entry.
                self.nl.add_fdb(i, *mac, *dst).map_err(os("adding an FDB entry"))
            }
            Change::DeleteFdb(mac, dst) => {
                let i = self.vxlan_index()?;
                self.nl
                    .delete_fdb(i, *mac, *dst)
                    .map(|_| ())
                    .map_err(os("removing an FDB entry"))
            }
            Change::AddNeighbour(ip, mac) => {
                let i = self.vxlan_index()?;
                self.nl
                    .set_neighbour(i, *ip, *mac)
                    .map_err(os("adding a neighbour entry"))
            }
            Change::DeleteNeighbour(ip) => {
                let i = self.vxlan_index()?;
                self.nl
                    .delete_neighbour(i, *ip)
                    .map(|_| ())
                    .map_err(os("removing a neighbour entry"))
            }
            Change::AddRoute(r) => {
                let oif = if r.over_vxlan { Some(self.vxlan_index()?) } else { None };
                self.nl
                    .add_proto_route(r.dst, r.gateway, oif, NODE_ROUTE_PROTOCOL)
                    .map_err(os("adding a route to a peer's pod range"))
            }
            Change::AddUnreachable(dst) => self
                .nl
                .add_unreachable_route(*dst, NODE_ROUTE_PROTOCOL)
                .map_err(os("adding the unreachable route of a pod range of this node")),
            Change::DeleteRoute(r) => self
                .nl
                .delete_proto_route(r.dst, r.gateway, r.oif, NODE_ROUTE_PROTOCOL, r.unreachable)
                .map(|_| ())
                .map_err(os("removing a route of weft's")),
            Change::Export(dst, e) => self
                .nl
                .add_blackhole_route(*dst, e.table, e.protocol)
                .map_err(os("exporting a pod range of this node")),
            Change::Withdraw(dst, e) => self
                .nl
                .delete_blackhole_route(*dst, e.table, e.protocol)
                .map(|_| ())
                .map_err(os("withdrawing an exported pod range")),
        }
    }

    fn masquerade(&mut self) -> Result<MasqFound, KernelError> {
        match weft_kernel::nft::run(&["-j", "list", "table", "inet", masq::TABLE], None) {
            Ok(json) => Ok(masq::parse(&json)),
            Err(e) if e.contains("No such file or directory") => Ok(MasqFound::Absent),
            Err(e) => Err(KernelError::os(
                "reading the masquerade table",
                std::io::Error::other(e),
            )),
        }
    }

    fn exported(&mut self, export: RouteExport) -> Result<Vec<ipnet::IpNet>, KernelError> {
        let mut out = Vec::new();
        for v6 in [false, true] {
            match self.nl.blackholes_in_table(v6, export.table, export.protocol) {
                Ok(found) => out.extend(found),
                Err(e) if v6 && e.raw_os_error() == Some(libc::EAFNOSUPPORT) => {}
                Err(e) => return Err(KernelError::os("listing the exported pod ranges", e)),
            }
        }
        Ok(out)
    }

    fn set_masquerade(&mut self, change: &MasqChange) -> Result<(), KernelError> {
        let script = masq::script(change);
        self.inside(|| {
            weft_kernel::nft::run(&["-f", "-"], Some(&script))
                .map(|_| ())
                .map_err(|e| KernelError::os("writing the masquerade table", std::io::Error::other(e)))
        })
    }
}
