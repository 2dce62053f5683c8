//! The state operations, on one SQLite connection. Every write is one `BEGIN
//! IMMEDIATE` transaction, so a crash leaves either all of it or none of it.

use std::net::IpAddr;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use ipnet::IpNet;
use rusqlite::{Connection, OptionalExtension, Transaction, TransactionBehavior, params};

use crate::addr;
use crate::schema;
use crate::{PreviousRun, StoreError, attachment::*};

/// An open state database.
pub struct Db {
    conn: Connection,
    schema_found: u32,
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

fn key_blob(k: u128) -> [u8; 16] {
    k.to_be_bytes()
}

fn blob_key(b: &[u8]) -> u128 {
    let mut a = [0u8; 16];
    a.copy_from_slice(&b[..16]);
    u128::from_be_bytes(a)
}

impl Db {
    /// Opens (creating if needed) the database at `path` and migrates it.
    ///
    /// WAL with `synchronous=NORMAL`: a committed transaction survives the daemon being
    /// killed at any instruction; only a power loss may drop the last commits, and a
    /// power loss takes every pod down with it.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        let mut conn = Connection::open(path)?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        conn.pragma_update(None, "foreign_keys", "ON")?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        let schema_found = schema::migrate(&mut conn)?;
        Ok(Self { conn, schema_found })
    }

    /// The schema version the database had before this open migrated it (0 = new).
    pub fn schema_found(&self) -> u32 {
        self.schema_found
    }

    fn immediate(&mut self) -> Result<Transaction<'_>, StoreError> {
        Ok(self.conn.transaction_with_behavior(TransactionBehavior::Immediate)?)
    }

    /// Runs raw SQL (tests: leaving a transaction open, as a job that panics half-way
    /// through hand-written SQL would).
    #[cfg(test)]
    pub(crate) fn execute_raw(&mut self, sql: &str) -> Result<(), StoreError> {
        Ok(self.conn.execute_batch(sql)?)
    }

    /// Rolls back a transaction left open (by a job that panicked half-way), so the
    /// connection serves the next job.
    pub(crate) fn roll_back_open_transaction(&mut self) {
        if !self.conn.is_autocommit() {
            let _ = self.conn.execute_batch("ROLLBACK");
        }
    }

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
        tx.execute(
            "INSERT INTO attachments (network, container_id, ifname, netns, pod_namespace, pod_name,
                 pod_uid, host_ifname, mtu, state, created_at, updated_at, routes, pod_mac)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, 'creating', ?10, ?10, '', ?11)",
            params![
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
            ],
        )?;
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
        let ports = hold_ports(&tx, id, &spec.ports, &addresses)?;
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

    /// Records a wire end, or updates the one with the same id. Fails with
    /// [`StoreError::VniTaken`] when its VNI is held by another end of the node.
    pub fn put_wire(&mut self, w: &WireRecord) -> Result<(), StoreError> {
        let tx = self.immediate()?;
        if let Some(vni) = w.vni {
            let holder: Option<i64> = tx
                .query_row(
                    "SELECT id FROM wires WHERE vni = ?1 AND id != ?2",
                    params![vni, w.id as i64],
                    |r| r.get(0),
                )
                .optional()?;
            if let Some(h) = holder {
                return Err(StoreError::VniTaken { vni, holder: h as u64 });
            }
        }
        tx.execute(
            "INSERT INTO wires (id, namespace, link_uid, local_pod, local_intf, peer_pod, peer_intf, peer_id, kind,
                                peer_node, vni, netns, state, updated_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)
             ON CONFLICT (id) DO UPDATE SET local_intf = ?5, peer_pod = ?6, peer_intf = ?7, peer_id = ?8, kind = ?9,
                 peer_node = ?10, vni = ?11, netns = ?12, state = ?13, updated_at = ?14",
            params![
                w.id as i64,
                w.namespace,
                w.link_uid,
                w.local_pod,
                w.local_intf,
                w.peer_pod,
                w.peer_intf,
                w.peer_id as i64,
                w.kind,
                w.peer_node,
                w.vni.map(i64::from),
                w.netns,
                w.state,
                now_ms()
            ],
        )?;
        tx.commit()?;
        Ok(())
    }

    /// The wire end with this id.
    pub fn wire(&mut self, id: u64) -> Result<Option<WireRecord>, StoreError> {
        Ok(self
            .conn
            .query_row(
                &format!("SELECT {WIRE_COLUMNS} FROM wires WHERE id = ?1"),
                params![id as i64],
                wire_row,
            )
            .optional()?)
    }

    /// Every wire end of the node.
    pub fn wires(&mut self) -> Result<Vec<WireRecord>, StoreError> {
        let mut stmt = self.conn.prepare(&format!(
            "SELECT {WIRE_COLUMNS} FROM wires ORDER BY namespace, link_uid, local_pod"
        ))?;
        let rows = stmt.query_map([], wire_row)?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Which wire end holds `vni`, if any.
    pub fn vni_holder(&mut self, vni: u32) -> Result<Option<u64>, StoreError> {
        Ok(self
            .conn
            .query_row("SELECT id FROM wires WHERE vni = ?1", params![vni], |r| {
                r.get::<_, i64>(0)
            })
            .optional()?
            .map(|v| v as u64))
    }

    /// Forgets a wire end.
    pub fn remove_wire(&mut self, id: u64) -> Result<(), StoreError> {
        let tx = self.immediate()?;
        tx.execute("DELETE FROM wires WHERE id = ?1", params![id as i64])?;
        tx.commit()?;
        Ok(())
    }

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

    /// Marks an attachment ready and stores its ADD result and the routes it installed.
    pub fn finish_add(&mut self, id: i64, result_json: &str, routes: &[InstalledRoute]) -> Result<(), StoreError> {
        let tx = self.immediate()?;
        let n = tx.execute(
            "UPDATE attachments SET state = 'ready', result = ?2, routes = ?3, updated_at = ?4 WHERE id = ?1",
            params![id, result_json, routes_text(routes), now_ms()],
        )?;
        tx.commit()?;
        if n == 0 { Err(StoreError::Missing(id)) } else { Ok(()) }
    }

    /// Removes an attachment and releases its addresses (abort of an ADD, or the end of
    /// a teardown). Removing one that is already gone is not an error.
    pub fn remove(&mut self, id: i64) -> Result<(), StoreError> {
        let tx = self.immediate()?;
        tx.execute("DELETE FROM attachments WHERE id = ?1", params![id])?;
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
        // answers, unlike the veth, whose removal finishes afterwards.
        tx.execute("DELETE FROM port_mappings WHERE attachment_id = ?1", params![att.id])?;
        if att.state != State::Deleting {
            tx.execute(
                "UPDATE attachments SET state = 'deleting', updated_at = ?2 WHERE id = ?1",
                params![att.id, now_ms()],
            )?;
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
            .query_row(
                "SELECT network, container_id, ifname FROM attachments
                 WHERE pod_namespace = ?1 AND pod_name = ?2 AND state = 'ready' ORDER BY id LIMIT 1",
                params![namespace, name],
                key_of_row,
            )
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
            let mut stmt = tx.prepare(keys_sql)?;
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

    /// Usage of every range the store knows.
    pub fn range_usage(&mut self) -> Result<Vec<RangeUsage>, StoreError> {
        let mut stmt = self.conn.prepare(
            "SELECT r.cidr, (SELECT COUNT(*) FROM allocations a WHERE a.range_id = r.id) FROM ranges r ORDER BY r.id",
        )?;
        let rows = stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))?;
        let mut out = Vec::new();
        for row in rows {
            let (cidr, allocated) = row?;
            let Ok(range) = cidr.parse::<IpNet>() else {
                continue;
            };
            out.push(RangeUsage {
                range,
                gateway: addr::gateway(&range),
                capacity: addr::capacity(&range),
                allocated: allocated as u64,
            });
        }
        Ok(out)
    }

    /// Usage of the given ranges (ranges the store has not seen yet count as empty).
    pub fn usage_of(&mut self, ranges: &[IpNet]) -> Result<Vec<RangeUsage>, StoreError> {
        let mut out = Vec::with_capacity(ranges.len());
        for range in ranges {
            let allocated: i64 = self
                .conn
                .query_row(
                    "SELECT COUNT(*) FROM allocations a JOIN ranges r ON a.range_id = r.id WHERE r.cidr = ?1",
                    params![range.to_string()],
                    |r| r.get(0),
                )
                .optional()?
                .unwrap_or(0);
            out.push(RangeUsage {
                range: *range,
                gateway: addr::gateway(range),
                capacity: addr::capacity(range),
                allocated: allocated as u64,
            });
        }
        Ok(out)
    }

    /// Records the start of a daemon run and tells how the previous one ended. Only the
    /// last 100 runs are kept.
    pub fn begin_run(&mut self, version: &str) -> Result<(i64, PreviousRun), StoreError> {
        let tx = self.immediate()?;
        let last: Option<(String, i64, Option<i64>)> = tx
            .query_row(
                "SELECT version, started_at, stopped_at FROM daemon_runs ORDER BY id DESC LIMIT 1",
                [],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .optional()?;
        let previous = match last {
            None => PreviousRun::None,
            Some((version, started_at_ms, Some(stopped_at_ms))) => PreviousRun::Stopped {
                version,
                started_at_ms,
                stopped_at_ms,
            },
            Some((version, started_at_ms, None)) => PreviousRun::Crashed { version, started_at_ms },
        };
        tx.execute(
            "INSERT INTO daemon_runs (version, started_at) VALUES (?1, ?2)",
            params![version, now_ms()],
        )?;
        let id = tx.last_insert_rowid();
        tx.execute("DELETE FROM daemon_runs WHERE id <= ?1 - 100", params![id])?;
        tx.commit()?;
        Ok((id, previous))
    }

    /// Records that run `id` stopped cleanly.
    pub fn end_run(&mut self, id: i64) -> Result<(), StoreError> {
        self.conn.execute(
            "UPDATE daemon_runs SET stopped_at = ?1 WHERE id = ?2",
            params![now_ms(), id],
        )?;
        Ok(())
    }

    /// Counts attachments by state: (creating, ready, deleting).
    pub fn counts(&mut self) -> Result<(u64, u64, u64), StoreError> {
        let mut stmt = self
            .conn
            .prepare("SELECT state, COUNT(*) FROM attachments GROUP BY state")?;
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

    /// Every allocated address (for consistency checks).
    pub fn allocated_addresses(&mut self) -> Result<Vec<IpAddr>, StoreError> {
        let mut stmt = self.conn.prepare(
            "SELECT a.address, r.cidr FROM allocations a JOIN ranges r ON a.range_id = r.id ORDER BY a.address",
        )?;
        let rows = stmt.query_map([], |r| Ok((r.get::<_, Vec<u8>>(0)?, r.get::<_, String>(1)?)))?;
        let mut out = Vec::new();
        for row in rows {
            let (b, cidr) = row?;
            if let Ok(range) = cidr.parse::<IpNet>() {
                out.push(addr::from_key(&range, blob_key(&b)));
            }
        }
        Ok(out)
    }
}

const WIRE_COLUMNS: &str =
    "id, namespace, link_uid, local_pod, local_intf, peer_pod, peer_intf, peer_id, kind, peer_node, vni, netns, state";

fn wire_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<WireRecord> {
    Ok(WireRecord {
        id: r.get::<_, i64>(0)? as u64,
        namespace: r.get(1)?,
        link_uid: r.get(2)?,
        local_pod: r.get(3)?,
        local_intf: r.get(4)?,
        peer_pod: r.get(5)?,
        peer_intf: r.get(6)?,
        peer_id: r.get::<_, i64>(7)? as u64,
        kind: r.get(8)?,
        peer_node: r.get(9)?,
        vni: r.get::<_, Option<i64>>(10)?.map(|v| v as u32),
        netns: r.get(11)?,
        state: r.get(12)?,
    })
}

fn port_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<PortMapping> {
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
fn hold_ports(
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
            tx.execute(
                "INSERT INTO port_mappings (attachment_id, family, host_ip, host_port, protocol, container_ip, container_port)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
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

fn join<T: std::fmt::Display>(items: impl Iterator<Item = T>) -> String {
    items.map(|i| i.to_string()).collect::<Vec<_>>().join(", ")
}

/// Allocates exactly `want`, which the runtime asked for, from the one of `ranges`
/// (all of its family) that holds it. Refused when no range holds it, when it is no
/// pod address of its range (network, gateway, IPv4 broadcast), or when another
/// attachment holds it; the cursor of the range is left alone, so sequential
/// allocation goes on where it was.
fn allocate_exact(
    tx: &Transaction<'_>,
    ranges: &[&IpNet],
    want: IpAddr,
    attachment: i64,
) -> Result<Allocation, StoreError> {
    let Some(range) = ranges.iter().copied().find(|r| r.contains(&want)) else {
        return Err(StoreError::AddressInvalid(format!(
            "requested address {want} is outside every {} range of the network: {}",
            Family::of(ranges[0]),
            join(ranges.iter())
        )));
    };
    let k = addr::to_key(want);
    let (lo, hi) = addr::pool(range);
    if !(lo..=hi).contains(&k) {
        let what = if want == range.network() {
            "the network address"
        } else if want == addr::gateway(range) {
            "the gateway (it sits on every host end)"
        } else {
            "the broadcast address"
        };
        return Err(StoreError::AddressInvalid(format!(
            "requested address {want} is {what} of range {range}, not a pod address"
        )));
    }
    let range_id = ensure_range(tx, range)?;
    let holder = tx
        .query_row(
            "SELECT a.network, a.container_id, a.ifname, a.pod_namespace, a.pod_name, a.state
             FROM allocations al JOIN attachments a ON al.attachment_id = a.id WHERE al.address = ?1",
            params![key_blob(k)],
            |r| {
                Ok((
                    AttachmentKey {
                        network: r.get(0)?,
                        container_id: r.get(1)?,
                        ifname: r.get(2)?,
                    },
                    r.get::<_, String>(3)?,
                    r.get::<_, String>(4)?,
                    r.get::<_, String>(5)?,
                ))
            },
        )
        .optional()?;
    if let Some((key, ns, name, state)) = holder {
        let deleting = State::parse(&state) == State::Deleting;
        let who = if name.is_empty() {
            format!("container {}", key.container_id)
        } else {
            format!("pod {ns}/{name}")
        };
        return Err(StoreError::AddressTaken {
            address: want,
            holder: format!(
                "{who} (network {}, interface {}{})",
                key.network,
                key.ifname,
                if deleting { ", being deleted" } else { "" }
            ),
            key,
            deleting,
        });
    }
    tx.execute(
        "INSERT INTO allocations (address, range_id, attachment_id) VALUES (?1, ?2, ?3)",
        params![key_blob(k), range_id, attachment],
    )?;
    Ok(Allocation {
        address: want,
        range: *range,
        gateway: addr::gateway(range),
    })
}

/// The stored form of an attachment's routes: `dst via gw` entries joined by `,`.
fn routes_text(routes: &[InstalledRoute]) -> String {
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

fn mac_text(mac: &[u8; 6]) -> String {
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

fn ensure_range(tx: &Transaction<'_>, range: &IpNet) -> Result<i64, StoreError> {
    let cidr = range.to_string();
    if let Some(id) = tx
        .query_row("SELECT id FROM ranges WHERE cidr = ?1", params![cidr], |r| r.get(0))
        .optional()?
    {
        return Ok(id);
    }
    tx.execute("INSERT INTO ranges (cidr) VALUES (?1)", params![cidr])?;
    Ok(tx.last_insert_rowid())
}

/// Allocates the first free address after the range's cursor, wrapping around once.
fn allocate_in(
    tx: &Transaction<'_>,
    range_id: i64,
    range: &IpNet,
    attachment: i64,
) -> Result<Option<IpAddr>, StoreError> {
    let (lo, hi) = addr::pool(range);
    let cursor: Option<Vec<u8>> = tx.query_row("SELECT cursor FROM ranges WHERE id = ?1", params![range_id], |r| {
        r.get(0)
    })?;
    let start = cursor
        .map(|c| blob_key(&c).saturating_add(1))
        .filter(|s| (lo..=hi).contains(s))
        .unwrap_or(lo);
    let found = match first_gap(tx, start, hi)? {
        Some(a) => Some(a),
        None if start > lo => first_gap(tx, lo, start - 1)?,
        None => None,
    };
    let Some(k) = found else { return Ok(None) };
    tx.execute(
        "INSERT INTO allocations (address, range_id, attachment_id) VALUES (?1, ?2, ?3)",
        params![key_blob(k), range_id, attachment],
    )?;
    tx.execute(
        "UPDATE ranges SET cursor = ?2 WHERE id = ?1",
        params![range_id, key_blob(k)],
    )?;
    Ok(Some(addr::from_key(range, k)))
}

/// The lowest address in `[from, to]` no allocation holds. Walks the allocated
/// addresses in order from `from`, so the cost is the length of the allocated run
/// starting there: usually none, because the cursor points just past the last one.
fn first_gap(tx: &Transaction<'_>, from: u128, to: u128) -> Result<Option<u128>, StoreError> {
    let mut stmt =
        tx.prepare_cached("SELECT address FROM allocations WHERE address >= ?1 AND address <= ?2 ORDER BY address")?;
    let mut rows = stmt.query(params![key_blob(from), key_blob(to)])?;
    let mut candidate = from;
    while let Some(row) = rows.next()? {
        let taken = blob_key(&row.get::<_, Vec<u8>>(0)?);
        if taken > candidate {
            break;
        }
        if candidate == to {
            return Ok(None);
        }
        candidate = taken + 1;
    }
    Ok(Some(candidate))
}

fn load(tx: &Transaction<'_>, key: &AttachmentKey) -> Result<Option<Attachment>, StoreError> {
    let row = tx
        .query_row(
            "SELECT id, netns, pod_namespace, pod_name, pod_uid, host_ifname, mtu, state, result, routes, pod_mac
             FROM attachments WHERE network = ?1 AND container_id = ?2 AND ifname = ?3",
            params![key.network, key.container_id, key.ifname],
            |r| {
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
            },
        )
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
