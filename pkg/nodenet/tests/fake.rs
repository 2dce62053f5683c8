//! The engine against a fake kernel, without root: for any sequence of cluster states
//! (nodes coming, going, moving, changing podCIDRs; any routing mode), one pass brings
//! the kernel to the plan, a second pass finds nothing to do, the next state is reached
//! from wherever the last one left the kernel, routes that are not weft's are never
//! touched, and with export on the export table holds exactly this node's podCIDRs.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Duration;

use ipnet::IpNet;
use proptest::prelude::*;
use weft_kernel::KernelError;
use weft_nodenet::*;
use weft_topology::ClusterNode;

/// A kernel in memory: weft's routes (with a foreign one beside them), the device and
/// its entries, the masquerade table; answers on-link for 172.30.1.0/24 only.
#[derive(Default)]
struct Fake {
    routes: Vec<ObservedRoute>,
    foreign: Vec<ObservedRoute>,
    vxlan: Option<ObservedVxlan>,
    addresses: Vec<IpAddr>,
    fdb: Vec<(Mac, IpAddr)>,
    neighbours: BTreeMap<IpAddr, Mac>,
    masq: Option<MasqSets>,
    next_index: u32,
    /// Blackhole routes by (table, protocol).
    exported: BTreeMap<(u32, u8), Vec<IpNet>>,
    /// On-link questions asked.
    lookups: usize,
}

const UPLINK: u32 = 2;

impl NodeKernel for Fake {
    fn underlay_mtu(&mut self, _local: IpAddr) -> Result<Option<u32>, KernelError> {
        Ok(Some(1500))
    }
    fn on_link(&mut self, addr: IpAddr) -> Result<bool, KernelError> {
        self.lookups += 1;
        Ok("172.30.1.0/24".parse::<IpNet>().unwrap().contains(&addr))
    }
    fn observe(&mut self) -> Result<Observed, KernelError> {
        Ok(Observed {
            routes: self.routes.clone(),
            vxlan: self.vxlan.clone(),
            vxlan_addresses: self.addresses.clone(),
            fdb: self.fdb.clone(),
            neighbours: self.neighbours.iter().map(|(a, b)| (*a, *b)).collect(),
            exported: Vec::new(),
        })
    }
    fn exported(&mut self, e: RouteExport) -> Result<Vec<IpNet>, KernelError> {
        Ok(self.exported.get(&(e.table, e.protocol)).cloned().unwrap_or_default())
    }
    fn apply(&mut self, change: &Change) -> Result<(), KernelError> {
        let gone = || KernelError::os("fake", std::io::Error::from_raw_os_error(libc::ENODEV));
        match change {
            Change::CreateVxlan(s) => {
                assert!(self.vxlan.is_none(), "device created twice");
                self.next_index += 1;
                self.vxlan = Some(ObservedVxlan {
                    index: 100 + self.next_index,
                    vni: Some(s.vni),
                    port: Some(s.port),
                    local: Some(s.local),
                    mac: s.mac.to_vec(),
                    mtu: s.mtu,
                    up: true,
                });
            }
            Change::DeleteVxlan => {
                let v = self.vxlan.take().ok_or_else(gone)?;
                // Its routes and entries go with it, as in the kernel.
                self.routes.retain(|r| r.oif != Some(v.index));
                self.addresses.clear();
                self.fdb.clear();
                self.neighbours.clear();
            }
            Change::SetVxlanMac(m) => self.vxlan.as_mut().ok_or_else(gone)?.mac = m.to_vec(),
            Change::SetVxlanMtu(m) => self.vxlan.as_mut().ok_or_else(gone)?.mtu = *m,
            Change::SetVxlanUp => self.vxlan.as_mut().ok_or_else(gone)?.up = true,
            Change::AddAddress(a) => {
                self.vxlan.as_ref().ok_or_else(gone)?;
                assert!(!self.addresses.contains(a), "address added twice");
                self.addresses.push(*a);
            }
            Change::DeleteAddress(a) => self.addresses.retain(|x| x != a),
            Change::AddFdb(m, d) => {
                self.vxlan.as_ref().ok_or_else(gone)?;
                self.fdb.retain(|(mm, _)| mm != m);
                self.fdb.push((*m, *d));
            }
            Change::DeleteFdb(m, d) => self.fdb.retain(|e| e != &(*m, *d)),
            Change::AddNeighbour(ip, m) => {
                self.vxlan.as_ref().ok_or_else(gone)?;
                self.neighbours.insert(*ip, *m);
            }
            Change::DeleteNeighbour(ip) => {
                self.neighbours.remove(ip);
            }
            Change::AddRoute(r) => {
                let oif = if r.over_vxlan {
                    Some(self.vxlan.as_ref().ok_or_else(gone)?.index)
                } else {
                    Some(UPLINK)
                };
                assert!(
                    !self.routes.iter().chain(&self.foreign).any(|x| x.dst == r.dst),
                    "route {} added over an existing one",
                    r.dst
                );
                self.routes.push(ObservedRoute {
                    dst: r.dst,
                    gateway: Some(r.gateway),
                    oif,
                    unreachable: false,
                });
            }
            Change::AddUnreachable(dst) => {
                assert!(
                    !self.routes.iter().chain(&self.foreign).any(|x| x.dst == *dst),
                    "route {dst} added over an existing one"
                );
                self.routes.push(ObservedRoute {
                    dst: *dst,
                    gateway: None,
                    oif: None,
                    unreachable: true,
                });
            }
            Change::Export(dst, e) => {
                let t = self.exported.entry((e.table, e.protocol)).or_default();
                assert!(!t.contains(dst), "range {dst} exported twice");
                t.push(*dst);
            }
            Change::Withdraw(dst, e) => {
                let t = self.exported.entry((e.table, e.protocol)).or_default();
                let before = t.len();
                t.retain(|x| x != dst);
                assert_eq!(before, t.len() + 1, "withdrew a range that was not exported: {dst}");
            }
            Change::DeleteRoute(r) => {
                let before = self.routes.len();
                self.routes.retain(|x| x != r);
                assert_eq!(
                    before,
                    self.routes.len() + 1,
                    "deleted a route that was not weft's: {r:?}"
                );
            }
        }
        Ok(())
    }
    fn masquerade(&mut self) -> Result<MasqFound, KernelError> {
        Ok(match &self.masq {
            None => MasqFound::Absent,
            Some(s) => MasqFound::Sets(s.clone()),
        })
    }
    fn set_masquerade(&mut self, change: &MasqChange) -> Result<(), KernelError> {
        match change {
            MasqChange::Install(s) => self.masq = Some(s.clone()),
            MasqChange::Remove => self.masq = None,
            MasqChange::Update { add, delete } => {
                let m = self.masq.as_mut().expect("updated a missing table");
                for d in &delete.pods {
                    assert!(m.pods.remove(d), "deleted a missing element");
                }
                for d in &delete.exceptions {
                    assert!(m.exceptions.remove(d));
                }
                for a in &add.pods {
                    assert!(m.pods.insert(*a), "added an element twice");
                }
                for a in &add.exceptions {
                    assert!(m.exceptions.insert(*a));
                }
            }
        }
        Ok(())
    }
}

/// A cluster state: each of up to five peers absent or present with an address on-link
/// or behind a router, and one or two podCIDRs.
fn cluster() -> impl Strategy<Value = Vec<ClusterNode>> {
    proptest::collection::vec((0u8..4, any::<bool>(), 0u8..3), 5).prop_map(|peers| {
        let mut nodes = vec![ClusterNode {
            name: "n0".into(),
            addresses: vec!["172.30.1.10".parse().unwrap()],
            pod_cidrs: vec!["10.244.0.0/24".parse().unwrap()],
            ..Default::default()
        }];
        for (i, (place, two, shift)) in peers.into_iter().enumerate() {
            let i = i as u8 + 1;
            let address: IpAddr = match place {
                0 => continue,
                1 => format!("172.30.1.{}", 10 + i).parse().unwrap(),
                2 => format!("172.30.{}.2", 10 + i).parse().unwrap(),
                _ => format!("172.30.{}.3", 20 + i).parse().unwrap(),
            };
            let base = i * 10 + shift;
            let mut pod_cidrs: Vec<IpNet> = vec![format!("10.244.{base}.0/24").parse().unwrap()];
            if two {
                pod_cidrs.push(format!("fd00:10:244:{base:x}::/64").parse().unwrap());
            }
            nodes.push(ClusterNode {
                name: format!("n{i}"),
                addresses: vec![address],
                pod_cidrs,
                ..Default::default()
            });
        }
        nodes
    })
}

fn routing() -> impl Strategy<Value = PodRouting> {
    prop_oneof![
        Just(PodRouting::Auto),
        Just(PodRouting::Direct),
        Just(PodRouting::Vxlan),
        Just(PodRouting::None)
    ]
}

fn config(routing: PodRouting, masquerade: bool, export: bool) -> Config {
    Config {
        node_name: "n0".into(),
        node_address: None,
        routing,
        vxlan_port: DEFAULT_VXLAN_PORT,
        vxlan_vni: 1,
        masquerade,
        no_masquerade: vec![],
        resync: Duration::from_secs(60),
        export: export.then(|| RouteExport::new(119, 75).unwrap()),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn every_state_is_reached_in_one_pass_and_kept(
        states in proptest::collection::vec((cluster(), routing(), any::<bool>(), any::<bool>()), 1..6)
    ) {
        let mut k = Fake {
            foreign: vec![ObservedRoute { dst: "10.99.0.0/24".parse().unwrap(), gateway: Some("172.30.1.1".parse().unwrap()), oif: Some(UPLINK), unreachable: false }],
            ..Fake::default()
        };
        let mut previous: Option<Desired> = None;
        for (nodes, routing, masquerade, export) in states {
            let cfg = config(routing, masquerade, export);
            let (d, out) = run_pass(&cfg, &nodes, &[], previous.as_ref(), &mut k);
            prop_assert!(out.failures.is_empty(), "{:?}", out.failures);
            // The kernel holds the plan.
            let routes: std::collections::BTreeSet<_> = k.routes.iter().filter(|r| !r.unreachable).map(|r| (r.dst, r.gateway)).collect();
            let want: std::collections::BTreeSet<_> = d.routes.iter().map(|r| (r.dst, Some(r.gateway))).collect();
            prop_assert_eq!(routes, want);
            // This node's ranges are answered on the node, whatever the routing mode.
            let unreachable: std::collections::BTreeSet<_> = k.routes.iter().filter(|r| r.unreachable).map(|r| r.dst).collect();
            let own: std::collections::BTreeSet<IpNet> = nodes.iter().filter(|n| n.name == "n0").flat_map(|n| n.pod_cidrs.clone()).collect();
            prop_assert_eq!(&unreachable, &own);
            prop_assert_eq!(&unreachable, &d.unreachable);
            prop_assert_eq!(k.vxlan.is_some(), d.vxlan.is_some());
            let fdb: std::collections::BTreeSet<_> = k.fdb.iter().copied().collect();
            prop_assert_eq!(&fdb, &d.fdb);
            prop_assert_eq!(&k.masq, &d.masquerade);
            // Exported: this node's podCIDRs, in the export table, when export is on.
            if export {
                let found: std::collections::BTreeSet<IpNet> = k.exported.get(&(119, 75)).into_iter().flatten().copied().collect();
                prop_assert_eq!(&found, &own);
                prop_assert_eq!(&found, &d.exported);
            }
            // A second pass has nothing to do.
            let (d2, again) = run_pass(&cfg, &nodes, &[], Some(&d), &mut k);
            prop_assert_eq!(&d2, &d);
            prop_assert_eq!(again, PassOutcome::default());
            previous = Some(d);
        }
        prop_assert_eq!(k.foreign.len(), 1, "the foreign route is untouched");
    }
}

fn peer(i: u32) -> ClusterNode {
    ClusterNode {
        name: format!("n{i}"),
        addresses: vec![IpAddr::from([172, 30, (i / 250) as u8 + 1, (i % 250) as u8 + 2])],
        pod_cidrs: vec![IpNet::new(IpAddr::from([10, 200 + (i / 250) as u8, (i % 250) as u8, 0]), 24).unwrap()],
        ..Default::default()
    }
}

/// With the answers kept, a pass after one node changed asks the kernel about that
/// node only, whatever the size of the cluster; forgetting them asks about all again.
#[test]
fn on_link_answers_are_kept_so_a_change_costs_one_lookup() {
    let mut k = Fake::default();
    let cfg = config(PodRouting::Auto, false, false);
    let mut nodes: Vec<ClusterNode> = (0..500).map(peer).collect();
    let mut known = BTreeMap::new();
    let (d, _) = run_pass_with(&cfg, &nodes, &[], None, &mut k, &mut known);
    assert_eq!(k.lookups, 499, "every peer once");
    nodes[7].addresses = vec!["172.30.9.9".parse().unwrap()];
    let (d2, out) = run_pass_with(&cfg, &nodes, &[], Some(&d), &mut k, &mut known);
    assert_eq!(k.lookups, 500, "only the readdressed peer");
    assert!(out.failures.is_empty());
    assert_ne!(d2, d);
    assert_eq!(known.len(), 499, "the old address is forgotten");
    known.clear();
    run_pass_with(&cfg, &nodes, &[], Some(&d2), &mut k, &mut known);
    assert_eq!(k.lookups, 999, "a resync asks again");
}
