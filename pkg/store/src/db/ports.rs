//! The `port_mappings` table: the host ports each attachment holds, one row per family.

use rusqlite::{OptionalExtension, Transaction, params};

use super::Db;
use crate::{StoreError, attachment::*};

impl Db {
    /// Every host port held on the node, with the pod holding it.
    pub fn ports(&mut self) -> Result<Vec<HeldPort>, StoreError> {
        let mut stmt = self.conn.prepare(
            "SELECT p.host_ip, p.host_port, p.protocol, p.container_ip, p.container_port,
                    a.network, a.container_id, a.ifname, a.pod_namespace, a.pod_name, a.pod_uid, a.host_ifname
             FROM port_mappings p JOIN attachments a ON p.attachment_id = a.id
             ORDER BY p.host_port, p.protocol, p.family, p.host_ip",
        )?;
        let rows = stmt.query_map([], |r| {
            Ok(HeldPort {
                mapping: port_row(r)?,
                key: AttachmentKey {
                    network: r.get(5)?,
                    container_id: r.get(6)?,
                    ifname: r.get(7)?,
                },
                pod: PodRef {
                    namespace: r.get(8)?,
                    name: r.get(9)?,
                    uid: r.get(10)?,
                },
                host_ifname: r.get(11)?,
            })
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }
}

pub(super) fn port_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<PortMapping> {
    let host: String = r.get(0)?;
    let container: String = r.get(3)?;
    Ok(PortMapping {
        host_ip: host.parse().ok(),
        host_port: r.get(1)?,
        protocol: r.get(2)?,
        container_ip: container.parse().map_err(|_| rusqlite::Error::InvalidQuery)?,
        container_port: r.get(4)?,
    })
}

fn holder(
    tx: &Transaction<'_>,
    family: i64,
    host_ip: &str,
    port: u16,
    proto: &str,
) -> Result<Option<String>, StoreError> {
    Ok(tx
        .query_row(
            "SELECT a.pod_namespace, a.pod_name, a.container_id FROM port_mappings p
             JOIN attachments a ON p.attachment_id = a.id
             WHERE p.family = ?1 AND p.host_port = ?2 AND p.protocol = ?3
               AND (p.host_ip = ?4 OR p.host_ip = '' OR ?4 = '')
             LIMIT 1",
            params![family, port, proto, host_ip],
            |r| {
                let (ns, name, cid): (String, String, String) = (r.get(0)?, r.get(1)?, r.get(2)?);
                Ok(if name.is_empty() {
                    format!("container {cid}")
                } else {
                    format!("pod {ns}/{name}")
                })
            },
        )
        .optional()?)
}

/// Holds the requested host ports for attachment `id`, one row per family: a request
/// without a host IP binds every family the pod has an address in. A port is taken
/// when another mapping of the same family, port and protocol binds the same address
/// or binds all addresses.
pub(super) fn hold_ports(
    tx: &Transaction<'_>,
    id: i64,
    requests: &[PortRequest],
    addresses: &[Allocation],
) -> Result<Vec<PortMapping>, StoreError> {
    let mut held = Vec::new();
    for req in requests {
        let targets: Vec<&Allocation> = match req.host_ip {
            Some(ip) => {
                let a = addresses
                    .iter()
                    .find(|a| a.address.is_ipv6() == ip.is_ipv6())
                    .ok_or_else(|| {
                        StoreError::PortInvalid(format!(
                            "{ip}:{}/{}: the pod has no {} address",
                            req.host_port,
                            req.protocol,
                            if ip.is_ipv6() { "IPv6" } else { "IPv4" }
                        ))
                    })?;
                vec![a]
            }
            None => {
                let t: Vec<&Allocation> = addresses
                    .iter()
                    .filter(|a| req.family.is_none_or(|f| (f == Family::V6) == a.address.is_ipv6()))
                    .collect();
                if t.is_empty() {
                    return Err(StoreError::PortInvalid(format!(
                        "{}/{}: the pod has no {} address",
                        req.host_port,
                        req.protocol,
                        req.family.map_or("matching".to_string(), |f| f.to_string())
                    )));
                }
                t
            }
        };
        for a in targets {
            let family = if a.address.is_ipv6() { 6 } else { 4 };
            let host = req.host_ip.map(|h| h.to_string()).unwrap_or_default();
            let shown = match (&req.host_ip, family) {
                (Some(h), _) => format!("{h}:{}/{}", req.host_port, req.protocol),
                (None, 4) => format!("0.0.0.0:{}/{}", req.host_port, req.protocol),
                (None, _) => format!("[::]:{}/{}", req.host_port, req.protocol),
            };
            if let Some(holder) = holder(tx, family, &host, req.host_port, &req.protocol)? {
                return Err(StoreError::PortTaken { mapping: shown, holder });
            }
            tx.prepare_cached("INSERT INTO port_mappings (attachment_id, family, host_ip, host_port, protocol, container_ip, container_port)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)")?.execute(
                params![id, family, host, req.host_port, req.protocol, a.address.to_string(), req.container_port],
            )?;
            held.push(PortMapping {
                host_ip: req.host_ip,
                host_port: req.host_port,
                protocol: req.protocol.clone(),
                container_ip: a.address,
                container_port: req.container_port,
            });
        }
    }
    Ok(held)
}
