//! The `port_mappings` table: the host ports each attachment holds, one row per family.

use rusqlite::{OptionalExtension, Transaction, params};

use super::Db;
use crate::{StoreError, attachment::*};

impl Db {
    /// Every host port held on the node, with the pod holding it.
    pub fn ports(&mut self) -> Result<Vec<HeldPort>, StoreError> {
        let mut stmt = self.conn.prepare_cached(
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

/// A mapping found in the way of a request.
struct Found {
    /// Who holds it, for people.
    holder: String,
    /// Whether the request may share it: the same container asking for the very same
    /// mapping (host address, port, protocol and container port) on another network.
    shareable: bool,
}

/// The mappings of `family` that bind the requested host port: the same address, or
/// every address (either side binding all addresses overlaps everything).
fn in_the_way(
    tx: &Transaction<'_>,
    family: i64,
    req: &PortRequest,
    host_ip: &str,
    container_id: &str,
) -> Result<Vec<Found>, StoreError> {
    let mut stmt = tx.prepare_cached(
        "SELECT a.pod_namespace, a.pod_name, a.container_id, p.host_ip, p.container_port FROM port_mappings p
         JOIN attachments a ON p.attachment_id = a.id
         WHERE p.family = ?1 AND p.host_port = ?2 AND p.protocol = ?3
           AND (p.host_ip = ?4 OR p.host_ip = '' OR ?4 = '')",
    )?;
    let rows = stmt.query_map(params![family, req.host_port, req.protocol, host_ip], |r| {
        let pod = PodRef {
            namespace: r.get(0)?,
            name: r.get(1)?,
            uid: String::new(),
        };
        let cid: String = r.get(2)?;
        let (ip, cport): (String, u16) = (r.get(3)?, r.get(4)?);
        Ok(Found {
            holder: pod.describe(&cid),
            shareable: cid == container_id && ip == host_ip && cport == req.container_port,
        })
    })?;
    Ok(rows.collect::<Result<_, _>>()?)
}

/// Holds the requested host ports for attachment `id`, one row per family: a request
/// without a host IP binds every family the pod has an address in. A port is taken
/// when another mapping of the same family, port and protocol binds the same address
/// or binds all addresses.
///
/// The same container asking on another of its networks for a mapping it holds already
/// (a runtime sends a container's `portMappings` to every network that takes them) is
/// no conflict: the mapping stays with the attachment that asked first, and this one is
/// recorded as sharing it ([`release_ports`] hands the mapping over when the first
/// goes). Only the mappings this attachment holds itself are returned.
pub(super) fn hold_ports(
    tx: &Transaction<'_>,
    id: i64,
    container_id: &str,
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
            let mapping = PortMapping {
                host_ip: req.host_ip,
                host_port: req.host_port,
                protocol: req.protocol.clone(),
                container_ip: a.address,
                container_port: req.container_port,
            };
            if held.contains(&mapping) {
                // Listed twice in one config: one mapping.
                continue;
            }
            let found = in_the_way(tx, family, req, &host, container_id)?;
            if let Some(other) = found.iter().find(|f| !f.shareable) {
                return Err(StoreError::PortTaken {
                    mapping: shown,
                    holder: other.holder.clone(),
                });
            }
            if !found.is_empty() {
                tx.prepare_cached(
                    "INSERT OR IGNORE INTO port_shares (attachment_id, family, host_ip, host_port, protocol, container_ip, container_port)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                )?
                .execute(params![id, family, host, req.host_port, req.protocol, a.address.to_string(), req.container_port])?;
                continue;
            }
            tx.prepare_cached("INSERT INTO port_mappings (attachment_id, family, host_ip, host_port, protocol, container_ip, container_port)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)")?.execute(
                params![id, family, host, req.host_port, req.protocol, a.address.to_string(), req.container_port],
            )?;
            held.push(mapping);
        }
    }
    Ok(held)
}

/// Releases attachment `id`'s host ports: the mappings it only shared go, and each
/// mapping it held passes to the oldest other attachment (not being deleted) that asked
/// for the same one, pointing at that attachment's address (the caller points the
/// kernel at the new holders: [`Db::ports`] lists them).
pub(super) fn release_ports(tx: &Transaction<'_>, id: i64) -> Result<(), StoreError> {
    tx.prepare_cached("DELETE FROM port_shares WHERE attachment_id = ?1")?
        .execute(params![id])?;
    let released: Vec<(i64, String, u16, String)> = tx
        .prepare_cached("SELECT family, host_ip, host_port, protocol FROM port_mappings WHERE attachment_id = ?1")?
        .query_map(params![id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))?
        .collect::<Result<_, _>>()?;
    tx.prepare_cached("DELETE FROM port_mappings WHERE attachment_id = ?1")?
        .execute(params![id])?;
    for (family, host_ip, port, proto) in released {
        let share: Option<i64> = tx
            .prepare_cached(
                "SELECT s.id FROM port_shares s JOIN attachments a ON s.attachment_id = a.id
                 WHERE s.family = ?1 AND s.host_ip = ?2 AND s.host_port = ?3 AND s.protocol = ?4
                   AND a.state != 'deleting'
                 ORDER BY s.id LIMIT 1",
            )?
            .query_row(params![family, host_ip, port, proto], |r| r.get(0))
            .optional()?;
        let Some(share) = share else { continue };
        tx.prepare_cached(
            "INSERT INTO port_mappings (attachment_id, family, host_ip, host_port, protocol, container_ip, container_port)
             SELECT attachment_id, family, host_ip, host_port, protocol, container_ip, container_port
             FROM port_shares WHERE id = ?1",
        )?
        .execute(params![share])?;
        tx.prepare_cached("DELETE FROM port_shares WHERE id = ?1")?
            .execute(params![share])?;
    }
    Ok(())
}
