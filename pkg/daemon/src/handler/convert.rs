//! Conversions between a call, the store's records and the kernel's descriptions:
//! the pod a call names, its host ports, its network and routes, and the CNI result.

use std::path::PathBuf;

use ipnet::IpNet;
use weft_cni::args::{K8S_POD_NAME, K8S_POD_NAMESPACE, K8S_POD_UID};
use weft_cni::{CNIResult, Cmd, CniError, Code, HostIp, Interface, IpConfig, NetworkConfig, Route, validate};
use weft_kernel::ptp::{PodAddress, PodNetwork, PodRoute, RouteRequest};
use weft_portmap::{Entries, Hairpin, HostPort, Protocol};
use weft_store::{Attachment, AttachmentKey, Family, InstalledRoute, PodRef, PortMapping, PortRequest};

use crate::call::CniCall;
use crate::naming;

/// The pod an attachment belongs to, from `CNI_ARGS`.
pub(super) fn pod_ref(args: &CniCall) -> PodRef {
    let get = |k: &str| args.args.get(k).cloned().unwrap_or_default();
    PodRef {
        namespace: get(K8S_POD_NAMESPACE),
        name: get(K8S_POD_NAME),
        uid: get(K8S_POD_UID),
    }
}

/// Decodes the config for `cmd`, checks the container id and interface name, and
/// returns the config with the attachment's key: the common start of ADD, DEL, CHECK.
pub(super) fn decode(args: &CniCall, cmd: Cmd) -> Result<(NetworkConfig, AttachmentKey), CniError> {
    let conf = NetworkConfig::parse(&args.config, cmd)?;
    validate::container_id(&args.container_id)?;
    validate::ifname(&args.ifname)?;
    let key = AttachmentKey {
        network: conf.name.clone(),
        container_id: args.container_id.clone(),
        ifname: args.ifname.clone(),
    };
    Ok((conf, key))
}

/// The store's form of the host ports a config asks for.
pub(super) fn port_requests(conf: &NetworkConfig) -> Vec<PortRequest> {
    conf.port_mappings
        .iter()
        .map(|m| {
            let (host_ip, family) = match m.host_ip {
                HostIp::Any => (None, None),
                HostIp::AnyV4 => (None, Some(Family::V4)),
                HostIp::AnyV6 => (None, Some(Family::V6)),
                HostIp::Addr(ip) => (Some(ip), None),
            };
            PortRequest {
                host_ip,
                family,
                host_port: m.host_port,
                protocol: m.protocol.clone(),
                container_port: m.container_port,
            }
        })
        .collect()
}

/// The kernel's form of one attachment's host ports: the map elements, and a hairpin
/// element for each pod address that is a target (so the pod reaches itself through
/// its own host port).
pub fn host_port_entries(host_ifname: &str, ports: &[PortMapping]) -> Entries {
    let mut e = Entries::default();
    for p in ports {
        let Some(protocol) = Protocol::parse(&p.protocol) else {
            continue;
        };
        e.ports.push(HostPort {
            host_ip: p.host_ip,
            host_port: p.host_port,
            protocol,
            container_ip: p.container_ip,
            container_port: p.container_port,
        });
        let h = Hairpin {
            ifname: host_ifname.to_string(),
            addr: p.container_ip,
        };
        if !e.hairpins.contains(&h) {
            e.hairpins.push(h);
        }
    }
    e
}

/// The kernel description of a stored attachment.
pub(crate) fn pod_network(att: &Attachment) -> PodNetwork {
    let (host_mac, derived) = naming::macs(&att.key.container_id, &att.key.ifname);
    let pod_mac = att.pod_mac.unwrap_or(derived);
    PodNetwork {
        netns: PathBuf::from(&att.netns),
        ifname: att.key.ifname.clone(),
        host_ifname: att.host_ifname.clone(),
        host_mac,
        pod_mac,
        mtu: att.mtu,
        addresses: att
            .addresses
            .iter()
            .map(|a| PodAddress {
                address: a.address,
                gateway: a.gateway,
            })
            .collect(),
        alias: format!("weft:{}", att.key),
    }
}

/// The kernel's form of a route the store keeps.
pub(super) fn pod_route(r: &InstalledRoute) -> PodRoute {
    PodRoute {
        dst: r.dst.network(),
        prefix_len: r.dst.prefix_len(),
        gateway: r.gateway,
    }
}

/// The store's form of a route the kernel installed.
pub(super) fn installed_route(r: &PodRoute) -> InstalledRoute {
    InstalledRoute {
        dst: IpNet::new(r.dst, r.prefix_len).expect("routes are built from valid prefixes"),
        gateway: r.gateway,
    }
}

/// The routes of a stored attachment, as the kernel checks and repairs them.
pub(super) fn pod_routes(att: &Attachment) -> Vec<PodRoute> {
    att.routes.iter().map(pod_route).collect()
}

/// The routes an ADD asks the kernel for, through the pod's gateways: a default route
/// per family with `defaultRoute: true`, then the config's `routes` (those of a family
/// the pod has no address in are skipped: one config may serve single- and
/// dual-stack nodes). With `defaultRoute` unset, the kernel adds a default route for
/// each family the pod has none of yet, so a pod's first network gets them and a
/// second one does not.
pub(super) fn route_request(conf: &NetworkConfig, att: &Attachment) -> Result<RouteRequest, CniError> {
    let of_family = |v6: bool| att.addresses.iter().find(|a| a.address.is_ipv6() == v6);
    let mut routes = Vec::new();
    if conf.default_route == Some(true) {
        for a in &att.addresses {
            let listed = conf
                .routes
                .iter()
                .any(|r| r.dst.prefix_len() == 0 && r.dst.addr().is_ipv6() == a.address.is_ipv6());
            if !listed {
                routes.push(PodRoute::default_via(a.gateway));
            }
        }
    }
    for r in &conf.routes {
        let Some(a) = of_family(r.dst.addr().is_ipv6()) else {
            continue;
        };
        if let Some(gw) = r.gw
            && gw != a.gateway
        {
            return Err(CniError::new(
                Code::InvalidConfig,
                format!(
                    "`routes`: the route to {} names gw {gw}, but the pod's address {} came from range {}, whose \
                     gateway {} is its only next hop; leave `gw` out",
                    r.dst, a.address, a.range, a.gateway
                ),
            ));
        }
        routes.push(PodRoute {
            dst: r.dst.network(),
            prefix_len: r.dst.prefix_len(),
            gateway: a.gateway,
        });
    }
    Ok(RouteRequest {
        routes,
        default_unless_present: conf.default_route.is_none(),
    })
}

/// The CNI result (current layout) describing an attachment and the routes it
/// installed.
pub(crate) fn cni_result(att: &Attachment, net: &PodNetwork, installed: &[InstalledRoute]) -> CNIResult {
    let interfaces = vec![
        Interface {
            name: net.host_ifname.clone(),
            mac: naming::mac_string(&net.host_mac),
            mtu: Some(net.mtu),
            sandbox: None,
            socket_path: None,
            pci_id: None,
        },
        Interface {
            name: net.ifname.clone(),
            mac: naming::mac_string(&net.pod_mac),
            mtu: Some(net.mtu),
            sandbox: Some(att.netns.clone()),
            socket_path: None,
            pci_id: None,
        },
    ];
    let ips = att
        .addresses
        .iter()
        .map(|a| IpConfig {
            interface: Some(1),
            address: ipnet::IpNet::new(a.address, if a.address.is_ipv4() { 32 } else { 128 }).expect("host prefix"),
            gateway: Some(a.gateway),
        })
        .collect();
    let routes = installed
        .iter()
        .map(|r| Route {
            dst: r.dst,
            gw: Some(r.gateway),
            mtu: None,
            advmss: None,
            priority: None,
            table: None,
            scope: None,
        })
        .collect();
    CNIResult {
        interfaces,
        ips,
        routes,
        dns: None,
    }
}
