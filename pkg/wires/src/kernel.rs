//! The kernel seam of wires: the few procedures the engine runs on pods' namespaces,
//! as a trait ([`WireKernel`]) so its decisions are tested against a fake, and their
//! implementation over weft's netlink socket ([`HostWireKernel`]).
//!
//! Each method is one procedure that either leaves what it names in place or fails;
//! which procedure to run, and when, is the engine's business. The methods block
//! (they may enter a pod's namespace on a thread of their own): the engine calls them
//! off its async workers.

use std::net::IpAddr;
use std::path::Path;

use weft_kernel::detour;
use weft_kernel::packet::NodeEnds;
use weft_kernel::wire::{self as kwire, Emulated, FdbEntry};
use weft_kernel::{GoneNamespaces, KernelError, LinkStats, NetNs, Netem, NetemLoss, NetemSlot, Netlink, packet};
use weft_link::Impairment;

/// One end of a wire as the kernel should hold it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndSpec {
    /// The pod's network namespace path.
    pub netns: String,
    /// The interface name inside the pod.
    pub intf: String,
    /// Its MAC.
    pub mac: [u8; 6],
    /// Its MTU.
    pub mtu: u32,
    /// Its address and prefix length, if the link gives one.
    pub address: Option<(IpAddr, u8)>,
}

/// Where a VXLAN end sends its frames: the peer node's VTEP, and the peer end's MAC
/// and address (answered without ARP).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VxlanPeer {
    /// The peer node's address.
    pub vtep: IpAddr,
    /// The peer end's MAC.
    pub mac: [u8; 6],
    /// The peer end's address, if the link gives one.
    pub ip: Option<IpAddr>,
}

/// What the wire engine does to and asks of the kernel.
pub trait WireKernel: Send + Sync + 'static {
    /// Those of `netns` (pods' network namespace paths: every attached pod's) that are
    /// gone: a namespace that is gone belongs to a pod the daemon is collecting.
    fn gone<'a>(&self, netns: &[&'a str]) -> Vec<&'a str>;
    /// Those of `netns`, the paths of pods attached since a look at every pod's, that
    /// are gone. Only meaningful while [`WireKernel::gone_epoch`] stands.
    fn gone_new<'a>(&self, netns: &[&'a str]) -> Vec<&'a str> {
        self.gone(netns)
    }
    /// A number that moves whenever a namespace looked at and found present may have
    /// gone since; `None` when the kernel cannot tell, and every pass looks at every
    /// pod's (the default). While it stands a pass looks at the new pods' alone.
    fn gone_epoch(&self) -> Option<u64> {
        None
    }
    /// Whether the pod has an interface `intf` (false when it cannot be looked at).
    fn has_interface(&self, netns: &str, intf: &str) -> bool;
    /// Builds a veth pair straight between two pods, removing whatever was under
    /// either name first, and configures both ends up.
    fn create_veth(&self, a: &EndSpec, b: &EndSpec) -> Result<(), KernelError>;
    /// Builds the VXLAN end `end` with `vni`, its socket on the node's address `local`
    /// (keeping one that is there already with a VTEP set), configures it up and
    /// points it at `peer`.
    fn create_vxlan(&self, end: &EndSpec, vni: u32, local: IpAddr, peer: &VxlanPeer) -> Result<(), KernelError>;
    /// The FDB entries of a VXLAN end; `None` when it does not exist.
    fn vxlan_fdb(&self, netns: &str, intf: &str) -> Result<Option<Vec<FdbEntry>>, KernelError>;
    /// Puts a VXLAN end's unicast FDB and neighbour entries (back) in place.
    fn point_vxlan(&self, netns: &str, intf: &str, peer: &VxlanPeer) -> Result<(), KernelError>;
    /// Builds the veth pair of gRPC wire end `id` (pod end `end`, node end named after
    /// the id), taking over a whole pair left by an earlier run and replacing anything
    /// else under either name, and configures the pod end up.
    fn create_packet_end(&self, end: &EndSpec, id: u64) -> Result<(), KernelError>;
    /// Removes an interface from a pod (nothing to do when the pod is gone).
    fn remove_interface(&self, netns: &str, intf: &str) -> Result<(), KernelError>;
    /// Sets an interface up or down; returns whether it exists.
    fn set_interface_up(&self, netns: &str, intf: &str, up: bool) -> Result<bool, KernelError>;
    /// An interface's kernel counters; `None` when it does not exist.
    fn link_stats(&self, netns: &str, intf: &str) -> Result<Option<LinkStats>, KernelError>;
    /// Applies `imp` to what the interface sends with a qdisc (an empty one removes
    /// weft's); says whether the interface exists and whether the kernel could.
    fn set_impairment(&self, netns: &str, intf: &str, imp: &Impairment) -> Result<Emulated, KernelError>;
    /// Steers what the interface sends through the link detour of wire end `id`
    /// (built, or taken over from an earlier run); returns whether the interface exists.
    fn detour(&self, netns: &str, intf: &str, id: u64) -> Result<bool, KernelError>;
    /// Removes wire end `id`'s link detour from the interface; returns whether it had one.
    fn remove_detour(&self, netns: &str, intf: &str, id: u64) -> Result<bool, KernelError>;
    /// The wire ids (low 52 bits) of the link detours on this node.
    fn detours(&self) -> Result<Vec<u64>, KernelError>;
    /// Drops (or restores) a VXLAN end's carrier while it stays up; returns whether it
    /// exists.
    fn set_proto_down(&self, netns: &str, intf: &str, down: bool) -> Result<bool, KernelError>;
    /// Sets the node end of gRPC end `id` up or down (its pod end's carrier follows);
    /// returns whether it exists.
    fn set_node_end_up(&self, id: u64, up: bool) -> Result<bool, KernelError>;
}

/// An impairment in netem's units: microseconds to nanoseconds, parts per million to
/// the kernel's `u32` probabilities, bits to bytes per second.
pub fn netem_of(imp: &Impairment) -> Netem {
    use weft_link::model::LossModel;
    let p = |v: Option<u32>| weft_kernel::probability(v.unwrap_or(0));
    // The model with netem's defaults filled in (one definition: weft_link's).
    let loss_model = imp.loss_model.and_then(|m| match m.model() {
        LossModel::GilbertElliott { p, r, h, k1 } => Some(NetemLoss::GilbertElliott {
            p: p.0,
            r: r.0,
            h: h.0,
            k1: k1.0,
        }),
        LossModel::State {
            p13,
            p31,
            p32,
            p23,
            p14,
        } => Some(NetemLoss::FourState {
            p13: p13.0,
            p31: p31.0,
            p32: p32.0,
            p14: p14.0,
            p23: p23.0,
        }),
        // Random loss is the qopt's `loss` (a loss spec's model is never random).
        LossModel::Random { .. } => None,
    });
    let ns = |us: u64| i64::try_from(us.saturating_mul(1000)).unwrap_or(i64::MAX);
    let slot = imp.slot.map(|s| NetemSlot {
        min_delay_ns: ns(s.min_us),
        max_delay_ns: ns(s.max_us),
        max_packets: s.packets.map_or(0, |n| i32::try_from(n).unwrap_or(i32::MAX)),
        max_bytes: s.bytes.map_or(0, |n| i32::try_from(n).unwrap_or(i32::MAX)),
    });
    Netem {
        latency_ns: imp.delay_us.unwrap_or(0) * 1000,
        jitter_ns: imp.jitter_us.unwrap_or(0) * 1000,
        loss: if loss_model.is_some() { 0 } else { p(imp.loss_ppm) },
        duplicate: p(imp.duplicate_ppm),
        corrupt: p(imp.corrupt_ppm),
        reorder: p(imp.reorder_ppm),
        rate_bytes: imp.rate_bps.map_or(0, |b| (b / 8).max(1)),
        limit: 0,
        loss_model,
        delay_dist: imp.distribution.and_then(|d| d.netem_table()),
        slot,
        ecn: imp.ecn,
    }
}

/// [`WireKernel`] on the real kernel: every procedure opens the pod's namespace and a
/// netlink socket inside it; VXLAN sockets are created from the calling thread's
/// namespace (weftd's: the node's), the node ends of gRPC wire ends where
/// [`NodeEnds`] says.
#[derive(Debug, Default)]
pub struct HostWireKernel {
    /// Which pods' namespaces are gone, told by inotify rather than a `stat` of every
    /// pod at every pass ([`GoneNamespaces`]).
    gone: std::sync::Mutex<GoneNamespaces>,
    /// Where the node ends of gRPC wire ends live.
    node_ends: NodeEnds,
}

impl HostWireKernel {
    /// The host's kernel, with the node ends of gRPC wire ends in `node_ends`.
    pub fn new(node_ends: NodeEnds) -> Self {
        Self {
            gone: std::sync::Mutex::default(),
            node_ends,
        }
    }
}

/// A netlink socket inside the pod at `netns`, with the namespace it was opened in.
fn pod(netns: &str) -> Result<(NetNs, Netlink), KernelError> {
    let ns = NetNs::open(Path::new(netns))?;
    let nl = kwire::socket_in(&ns)?;
    Ok((ns, nl))
}

impl WireKernel for HostWireKernel {
    fn gone<'a>(&self, netns: &[&'a str]) -> Vec<&'a str> {
        self.gone.lock().expect("namespace watch lock").gone(netns)
    }

    fn gone_new<'a>(&self, netns: &[&'a str]) -> Vec<&'a str> {
        self.gone.lock().expect("namespace watch lock").gone_new(netns)
    }

    fn gone_epoch(&self) -> Option<u64> {
        self.gone.lock().expect("namespace watch lock").epoch()
    }

    fn has_interface(&self, netns: &str, intf: &str) -> bool {
        let Ok((_, mut nl)) = pod(netns) else {
            return false;
        };
        matches!(kwire::find(&mut nl, intf), Ok(Some(_)))
    }

    fn create_veth(&self, a: &EndSpec, b: &EndSpec) -> Result<(), KernelError> {
        let _ = self.remove_interface(&a.netns, &a.intf);
        let _ = self.remove_interface(&b.netns, &b.intf);
        let ans = NetNs::open(Path::new(&a.netns))?;
        let bns = NetNs::open(Path::new(&b.netns))?;
        kwire::veth_between(
            kwire::PodEnd {
                pod: &ans,
                name: &a.intf,
                mac: a.mac,
            },
            kwire::PodEnd {
                pod: &bns,
                name: &b.intf,
                mac: b.mac,
            },
            a.mtu,
        )?;
        kwire::configure(&mut kwire::socket_in(&ans)?, &a.intf, a.mac, a.mtu, a.address, true)?;
        kwire::configure(&mut kwire::socket_in(&bns)?, &b.intf, b.mac, b.mtu, b.address, true)?;
        Ok(())
    }

    fn create_vxlan(&self, end: &EndSpec, vni: u32, local: IpAddr, peer: &VxlanPeer) -> Result<(), KernelError> {
        let (ns, mut nl) = pod(&end.netns)?;
        let same = kwire::find(&mut nl, &end.intf)?.is_some() && kwire::vxlan_vtep(&mut nl, &end.intf)?.is_some();
        if !same {
            kwire::remove(&mut nl, &end.intf)?;
            let at = kwire::PodEnd {
                pod: &ns,
                name: &end.intf,
                mac: end.mac,
            };
            kwire::vxlan_into(at, vni, local, end.mtu)?;
        }
        kwire::configure(&mut nl, &end.intf, end.mac, end.mtu, end.address, true)?;
        kwire::point_vxlan(&mut nl, &end.intf, peer.vtep, peer.mac, peer.ip)
    }

    fn vxlan_fdb(&self, netns: &str, intf: &str) -> Result<Option<Vec<FdbEntry>>, KernelError> {
        let (_, mut nl) = pod(netns)?;
        kwire::vxlan_fdb(&mut nl, intf)
    }

    fn point_vxlan(&self, netns: &str, intf: &str, peer: &VxlanPeer) -> Result<(), KernelError> {
        let (_, mut nl) = pod(netns)?;
        kwire::point_vxlan(&mut nl, intf, peer.vtep, peer.mac, peer.ip)
    }

    fn create_packet_end(&self, end: &EndSpec, id: u64) -> Result<(), KernelError> {
        let (ns, mut nl) = pod(&end.netns)?;
        let pod_end = kwire::find(&mut nl, &end.intf)?.is_some();
        // A pair left by an earlier pass is taken over; anything else under either
        // name (half a pair, a TAP of an older weft) is replaced.
        // One trip into the node end's namespace for the whole decision.
        let ipv6 = self.node_ends.ipv6();
        self.node_ends.within(id, || {
            if !(pod_end && packet::exists(id)?) {
                if pod_end {
                    kwire::remove(&mut nl, &end.intf)?;
                }
                packet::remove(id)?;
                packet::create(&ns, &end.intf, end.mac, end.mtu, id, ipv6)?;
            }
            Ok(())
        })?;
        kwire::configure(&mut nl, &end.intf, end.mac, end.mtu, end.address, true)
    }

    fn remove_interface(&self, netns: &str, intf: &str) -> Result<(), KernelError> {
        let Ok(ns) = NetNs::open(Path::new(netns)) else {
            return Ok(());
        };
        kwire::remove(&mut kwire::socket_in(&ns)?, intf)?;
        Ok(())
    }

    fn set_interface_up(&self, netns: &str, intf: &str, up: bool) -> Result<bool, KernelError> {
        let Ok(ns) = NetNs::open(Path::new(netns)) else {
            return Ok(false);
        };
        kwire::set_state(&mut kwire::socket_in(&ns)?, intf, up)
    }

    fn link_stats(&self, netns: &str, intf: &str) -> Result<Option<LinkStats>, KernelError> {
        let (_, mut nl) = pod(netns)?;
        Ok(kwire::stats(&mut nl, intf)?.map(|(_, st)| st))
    }

    fn set_impairment(&self, netns: &str, intf: &str, imp: &Impairment) -> Result<Emulated, KernelError> {
        let Ok((_, mut nl)) = pod(netns) else {
            return Ok(Emulated::NoSuchEnd);
        };
        if !imp.netem_expressible() {
            // Correlations run in weft's detour on any kernel (netem's correlation is
            // not weft's): no netem.
            return match kwire::set_netem(&mut nl, intf, None)? {
                Emulated::NoSuchEnd => Ok(Emulated::NoSuchEnd),
                Emulated::Applied | Emulated::Unsupported => Ok(Emulated::Unsupported),
            };
        }
        let netem = (!imp.is_empty()).then(|| netem_of(imp));
        kwire::set_netem(&mut nl, intf, netem.as_ref())
    }

    fn detour(&self, netns: &str, intf: &str, id: u64) -> Result<bool, KernelError> {
        let Ok(ns) = NetNs::open(Path::new(netns)) else {
            return Ok(false);
        };
        detour::create(&ns, intf, id)
    }

    fn remove_detour(&self, netns: &str, intf: &str, id: u64) -> Result<bool, KernelError> {
        detour::remove(netns, intf, id)
    }

    fn detours(&self) -> Result<Vec<u64>, KernelError> {
        detour::list()
    }

    fn set_proto_down(&self, netns: &str, intf: &str, down: bool) -> Result<bool, KernelError> {
        let Ok((_, mut nl)) = pod(netns) else {
            return Ok(false);
        };
        kwire::set_proto_down(&mut nl, intf, down)
    }

    fn set_node_end_up(&self, id: u64, up: bool) -> Result<bool, KernelError> {
        self.node_ends.set_up(id, up)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn netem_gets_models_with_their_defaults_tables_slots_and_ecn() {
        let imp = Impairment::from_params([
            ("delay", "20ms"),
            ("jitter", "5ms"),
            ("distribution", "pareto"),
            ("loss", "gemodel 1% 10%"),
            ("slot", "800us 1ms packets 32"),
            ("ecn", "on"),
        ])
        .unwrap();
        let n = netem_of(&imp);
        let p = weft_link::model::Prob::from_ppm;
        // gemodel's defaults: 1-h 100% (h 0), 1-k 0%.
        assert_eq!(
            n.loss_model,
            Some(NetemLoss::GilbertElliott {
                p: p(10_000).0,
                r: p(100_000).0,
                h: 0,
                k1: 0
            })
        );
        assert_eq!(n.loss, 0, "the model, not random loss");
        let table = n.delay_dist.unwrap();
        assert_eq!(table.len(), weft_link::model::TABLE_SIZE);
        assert!(table.windows(2).all(|w| w[0] <= w[1]), "quantiles, in order");
        assert_eq!(*table.last().unwrap(), i16::MAX, "Pareto's tail clamped to 16 bits");
        assert_eq!(
            n.slot,
            Some(NetemSlot {
                min_delay_ns: 800_000,
                max_delay_ns: 1_000_000,
                max_packets: 32,
                max_bytes: 0
            })
        );
        assert!(n.ecn);
        let state = netem_of(&Impairment::from_params([("loss", "state 1% 20%")]).unwrap());
        assert!(matches!(state.loss_model, Some(NetemLoss::FourState { p23, p32: 0, p14: 0, .. }) if p23 == u32::MAX));
        let plain = netem_of(&Impairment::from_params([("loss", "1%")]).unwrap());
        assert_eq!(
            (plain.loss, plain.loss_model, plain.delay_dist),
            (weft_kernel::probability(10_000), None, None)
        );
    }
}
