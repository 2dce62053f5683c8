//! The `attachments` table: a pod's interface on a network, its state through ADD and
//! DEL, and what it installed (routes, MAC); its addresses and host ports are taken in
//! the same transaction.

use std::net::IpAddr;

use ipnet::IpNet;
use rusqlite::{OptionalExtension, Transaction, params};

use super::addresses::{allocate_exact, allocate_in, ensure_range};
use super::ports::{hold_ports, port_row, release_ports};
use super::{Db, blob_key, join, now_ms};
use crate::addr;
use crate::{StoreError, attachment::*};

impl Db {
    /// Records the intent to attach a pod and allocates its addresses, one per address
    /// family present in `spec.ranges`: the requested one of that family, or else the
    /// next free one of the first range of that family with room. Returns the existing
    /// attachment instead when the key already has one. A requested address outside
    /// the ranges or held by another attachment fails the whole transaction.
    pub fn begin_add(&mut self, spec: &NewAttachment) -> Result<BeginAdd, StoreError> {
        let tx = self.immediate()?;
        if let Some(existing) = load(&tx, &spec.key)? {
            return Ok(BeginAdd::Existing(existing));
        }
        if let Some(stray) = spec
            .requested
            .iter()
            .find(|a| !spec.ranges.iter().any(|r| r.addr().is_ipv4() == a.is_ipv4()))
        {
            return Err(StoreError::AddressInvalid(format!(
                "requested address {stray} is outside every range of the network: the network has no {} range (ranges: {})",
                if stray.is_ipv4() { Family::V4 } else { Family::V6 },
                join(spec.ranges.iter())
            )));
        }
        let now = now_ms();
        tx.prepare_cached(
            "INSERT INTO attachments (network, container_id, ifname, netns, pod_namespace, pod_name,
                 pod_uid, host_ifname, mtu, state, created_at, updated_at, routes, pod_mac)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, 'creating', ?10, ?10, '', ?11)",
        )?
        .execute(params![
            spec.key.network,
            spec.key.container_id,
            spec.key.ifname,
            spec.netns,
            spec.pod.namespace,
            spec.pod.name,
            spec.pod.uid,
            spec.host_ifname,
            spec.mtu,
            now,
            spec.pod_mac.as_ref().map(mac_text),
        ])?;
        let id = tx.last_insert_rowid();
        let mut addresses = Vec::new();
        for family in [Family::V4, Family::V6] {
            let ranges: Vec<&IpNet> = spec.ranges.iter().filter(|r| Family::of(r) == family).collect();
            if ranges.is_empty() {
                continue;
            }
            if let Some(want) = spec.requested.iter().find(|a| a.is_ipv6() == (family == Family::V6)) {
                addresses.push(allocate_exact(&tx, &ranges, *want, id)?);
                continue;
            }
            let mut got = None;
            for range in &ranges {
                let range_id = ensure_range(&tx, range)?;
                if let Some(a) = allocate_in(&tx, range_id, range, id)? {
                    got = Some(Allocation {
                        address: a,
                        range: **range,
                        gateway: addr::gateway(range),
                    });
                    break;
                }
            }
            match got {
                Some(a) => addresses.push(a),
                None => {
                    return Err(StoreError::Exhausted {
                        family,
                        ranges: ranges.iter().map(|r| r.to_string()).collect(),
                    });
                }
            }
        }
        let ports = hold_ports(&tx, id, &spec.key.container_id, &spec.ports, &addresses)?;
        let att = Attachment {
            id,
            key: spec.key.clone(),
            netns: spec.netns.clone(),
            pod: spec.pod.clone(),
            host_ifname: spec.host_ifname.clone(),
            mtu: spec.mtu,
            state: State::Creating,
            result: None,
            addresses,
            ports,
            routes: Vec::new(),
            pod_mac: spec.pod_mac,
        };
        tx.commit()?;
        Ok(BeginAdd::Created(att))
    }

    /// Marks an attachment ready and stores its ADD result and the routes it installed.
    pub fn finish_add(&mut self, id: i64, result_json: &str, routes: &[InstalledRoute]) -> Result<(), StoreError> {
        let tx = self.immediate()?;
        let n = tx
            .prepare_cached(
                "UPDATE attachments SET state = 'ready', result = ?2, routes = ?3, updated_at = ?4 WHERE id = ?1",
            )?
            .execute(params![id, result_json, routes_text(routes), now_ms()])?;
        tx.commit()?;
        if n == 0 { Err(StoreError::Missing(id)) } else { Ok(()) }
    }

    /// Removes an attachment and releases its addresses (abort of an ADD, or the end of
    /// a teardown). Removing one that is already gone is not an error.
    pub fn remove(&mut self, id: i64) -> Result<(), StoreError> {
        let tx = self.immediate()?;
        // An ADD undone may hold mappings another network of its container shares.
        release_ports(&tx, id)?;
        tx.prepare_cached("DELETE FROM attachments WHERE id = ?1")?
            .execute(params![id])?;
        tx.commit()?;
        Ok(())
    }

    /// Marks the attachment for `key` as being torn down and returns it; `None` when
    /// there is none. Its addresses stay allocated until [`Db::remove`].
    pub fn begin_del(&mut self, key: &AttachmentKey) -> Result<Option<Attachment>, StoreError> {
        let tx = self.immediate()?;
        let Some(mut att) = load(&tx, key)? else {
            return Ok(None);
        };
        // Host ports are released at once: DEL removes them from the kernel before it
        // answers, unlike the veth, whose removal finishes afterwards. A mapping another
        // network of the same container shares passes to it.
        release_ports(&tx, att.id)?;
        if att.state != State::Deleting {
            tx.prepare_cached("UPDATE attachments SET state = 'deleting', updated_at = ?2 WHERE id = ?1")?
                .execute(params![att.id, now_ms()])?;
            att.state = State::Deleting;
        }
        tx.commit()?;
        Ok(Some(att))
    }

    /// The attachment for `key`, if any.
    pub fn get(&mut self, key: &AttachmentKey) -> Result<Option<Attachment>, StoreError> {
        let tx = self.conn.transaction()?;
        let a = load(&tx, key)?;
        tx.commit()?;
        Ok(a)
    }

    /// Every attachment of container `container_id` (every network of one pod), in
    /// any state, oldest first.
    pub fn container_attachments(&mut self, container_id: &str) -> Result<Vec<Attachment>, StoreError> {
        self.load_where(
            "SELECT network, container_id, ifname FROM attachments WHERE container_id = ?1 ORDER BY id",
            params![container_id],
        )
    }

    /// The ready attachment of Kubernetes pod `namespace/name`, if it runs on this node.
    pub fn attachment_of_pod(&mut self, namespace: &str, name: &str) -> Result<Option<Attachment>, StoreError> {
        let tx = self.conn.transaction()?;
        let key = tx
            .prepare_cached(
                "SELECT network, container_id, ifname FROM attachments
                 WHERE pod_namespace = ?1 AND pod_name = ?2 AND state = 'ready' ORDER BY id LIMIT 1",
            )?
            .query_row(params![namespace, name], key_of_row)
            .optional()?;
        let a = match key {
            Some(k) => load(&tx, &k)?,
            None => None,
        };
        tx.commit()?;
        Ok(a)
    }

    /// Every attachment, optionally only those of `network` and/or in `state`.
    pub fn list(&mut self, network: Option<&str>, state: Option<State>) -> Result<Vec<Attachment>, StoreError> {
        self.load_where(
            "SELECT network, container_id, ifname FROM attachments
             WHERE (?1 IS NULL OR network = ?1) AND (?2 IS NULL OR state = ?2) ORDER BY id",
            params![network, state.map(State::as_str)],
        )
    }

    /// Loads, in one transaction, every attachment whose key `keys_sql` selects.
    fn load_where(&mut self, keys_sql: &str, args: impl rusqlite::Params) -> Result<Vec<Attachment>, StoreError> {
        let tx = self.conn.transaction()?;
        let keys: Vec<AttachmentKey> = {
            let mut stmt = tx.prepare_cached(keys_sql)?;
            let rows = stmt.query_map(args, key_of_row)?;
            rows.collect::<Result<_, _>>()?
        };
        let mut out = Vec::with_capacity(keys.len());
        for k in keys {
            if let Some(a) = load(&tx, &k)? {
                out.push(a);
            }
        }
        tx.commit()?;
        Ok(out)
    }

    /// Counts attachments by state: (creating, ready, deleting).
    pub fn counts(&mut self) -> Result<(u64, u64, u64), StoreError> {
        let mut stmt = self
            .conn
            .prepare_cached("SELECT state, COUNT(*) FROM attachments GROUP BY state")?;
        let mut c = (0, 0, 0);
        let rows = stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))?;
        for row in rows {
            let (s, n) = row?;
            match s.as_str() {
                "creating" => c.0 = n as u64,
                "ready" => c.1 = n as u64,
                _ => c.2 = n as u64,
            }
        }
        Ok(c)
    }
}

fn load(tx: &Transaction<'_>, key: &AttachmentKey) -> Result<Option<Attachment>, StoreError> {
    let row = tx
        .prepare_cached(
            "SELECT id, netns, pod_namespace, pod_name, pod_uid, host_ifname, mtu, state, result, routes, pod_mac
             FROM attachments WHERE network = ?1 AND container_id = ?2 AND ifname = ?3",
        )?
        .query_row(params![key.network, key.container_id, key.ifname], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, String>(1)?,
                PodRef {
                    namespace: r.get(2)?,
                    name: r.get(3)?,
                    uid: r.get(4)?,
                },
                r.get::<_, String>(5)?,
                r.get::<_, u32>(6)?,
                r.get::<_, String>(7)?,
                r.get::<_, Option<String>>(8)?,
                r.get::<_, Option<String>>(9)?,
                r.get::<_, Option<String>>(10)?,
            ))
        })
        .optional()?;
    let Some((id, netns, pod, host_ifname, mtu, state, result, routes, pod_mac)) = row else {
        return Ok(None);
    };
    let mut stmt = tx.prepare_cached(
        "SELECT a.address, r.cidr FROM allocations a JOIN ranges r ON a.range_id = r.id
         WHERE a.attachment_id = ?1 ORDER BY a.address",
    )?;
    let mut addresses = stmt
        .query_map(params![id], |r| Ok((r.get::<_, Vec<u8>>(0)?, r.get::<_, String>(1)?)))?
        .filter_map(|row| {
            let (b, cidr) = row.ok()?;
            let range: IpNet = cidr.parse().ok()?;
            Some(Allocation {
                address: addr::from_key(&range, blob_key(&b)),
                range,
                gateway: addr::gateway(&range),
            })
        })
        .collect::<Vec<_>>();
    addresses.sort_by_key(|a| matches!(a.range, IpNet::V6(_)));
    let mut stmt = tx.prepare_cached(
        "SELECT host_ip, host_port, protocol, container_ip, container_port FROM port_mappings
         WHERE attachment_id = ?1 ORDER BY id",
    )?;
    let ports = stmt.query_map(params![id], port_row)?.collect::<Result<Vec<_>, _>>()?;
    let routes = parse_routes(routes.as_deref(), &addresses)?;
    let pod_mac = pod_mac.as_deref().map(parse_mac).transpose()?;
    Ok(Some(Attachment {
        id,
        key: key.clone(),
        netns,
        pod,
        host_ifname,
        mtu,
        state: State::parse(&state),
        result,
        addresses,
        ports,
        routes,
        pod_mac,
    }))
}

/// An attachment's key from a row whose first columns are `network, container_id, ifname`.
fn key_of_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<AttachmentKey> {
    Ok(AttachmentKey {
        network: r.get(0)?,
        container_id: r.get(1)?,
        ifname: r.get(2)?,
    })
}

/// The stored form of an attachment's routes: `dst via gw` entries joined by `,`.
pub(super) fn routes_text(routes: &[InstalledRoute]) -> String {
    routes.iter().map(|r| r.to_string()).collect::<Vec<_>>().join(",")
}

fn bad_column(what: &str, value: &str) -> rusqlite::Error {
    rusqlite::Error::FromSqlConversionFailure(
        0,
        rusqlite::types::Type::Text,
        format!("unreadable {what} {value:?} in the attachments table").into(),
    )
}

/// Reads [`routes_text`] back; `None` (a row from before schema 5) is what weft
/// installed then: the default route through each gateway.
fn parse_routes(text: Option<&str>, addresses: &[Allocation]) -> rusqlite::Result<Vec<InstalledRoute>> {
    let Some(text) = text else {
        return Ok(addresses
            .iter()
            .map(|a| InstalledRoute {
                dst: IpNet::new(
                    if a.address.is_ipv4() {
                        IpAddr::from([0u8; 4])
                    } else {
                        IpAddr::from([0u8; 16])
                    },
                    0,
                )
                .expect("a zero prefix is valid"),
                gateway: a.gateway,
            })
            .collect());
    };
    text.split(',')
        .filter(|e| !e.is_empty())
        .map(|e| {
            let (dst, gw) = e.split_once(" via ").ok_or_else(|| bad_column("route", e))?;
            Ok(InstalledRoute {
                dst: dst.parse().map_err(|_| bad_column("route", e))?,
                gateway: gw.parse().map_err(|_| bad_column("route", e))?,
            })
        })
        .collect()
}

pub(super) fn mac_text(mac: &[u8; 6]) -> String {
    mac.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":")
}

fn parse_mac(text: &str) -> rusqlite::Result<[u8; 6]> {
    let mut mac = [0u8; 6];
    let parts: Vec<&str> = text.split(':').collect();
    if parts.len() != 6 {
        return Err(bad_column("MAC", text));
    }
    for (b, p) in mac.iter_mut().zip(parts) {
        *b = u8::from_str_radix(p, 16).map_err(|_| bad_column("MAC", text))?;
    }
    Ok(mac)
}
