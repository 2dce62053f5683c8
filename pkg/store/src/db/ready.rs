//! The node's ready pods in brief ([`Db::ready_pods`]), kept up to date from what
//! changed rather than read whole at every change.
//!
//! Network policy asks for the node's pods at every pod another node announces, and
//! they change at every ADD: read whole each time, a bring-up's listings grow with the
//! square of the node's pods. So the connection keeps a log of the attachments written
//! since (temporary triggers: they see every statement of this connection, whatever
//! its author, and write nothing to the database file), and a listing reads only the
//! attachments the log names. `pods_version` (kept by the schema's triggers, for every
//! writer) says whether the log holds all that changed: each write bumps it once and
//! logs once, so a write by another connection, a change of a range, or a log cut back
//! while nobody asked (it keeps the last [`LOG_KEPT`] entries) has the listing read
//! whole again. The log is written only inside the transactions that write what it
//! logs, so a listing never counts as a write.

use std::collections::BTreeMap;
use std::sync::Arc;

use ipnet::IpNet;
use rusqlite::params;

use super::{Db, blob_key};
use crate::addr;
use crate::{PodRef, ReadyPod, ReadyPods, StoreError};

/// How many entries the log keeps at least: past that, older ones go with the write
/// that logs the next multiple of it.
pub(crate) const LOG_KEPT: i64 = 1024;

/// The listing as last read, and where in the log it stands.
#[derive(Debug)]
pub(crate) struct ReadyCache {
    ifname: String,
    /// The `pods_version` it is current at.
    version: i64,
    /// The last log entry taken in.
    seq: i64,
    /// The pods by attachment id (the listing's order), shared with the listings handed
    /// out (changed in place: see [`ReadyPods`]): a pod that did not change is the same
    /// `Arc` from one to the next.
    pods: ReadyPods,
}

/// The log and its triggers, made on a connection when it first lists its pods (a
/// connection that never does logs nothing). One entry per bump of `pods_version`:
/// the attachment or attachments it concerns (`a`, `b`), none for a range.
fn log_sql() -> String {
    // In memory: the log never touches a disk (a full one fails only the writes the
    // database file itself would).
    let mut sql = String::from(
        "PRAGMA temp_store = MEMORY;\nCREATE TEMP TABLE IF NOT EXISTS ready_log (seq INTEGER PRIMARY KEY, a INTEGER, b INTEGER, every INTEGER NOT NULL DEFAULT 0);\n",
    );
    let triggers = [
        ("attachments_insert", "INSERT ON main.attachments", "NEW.id, NULL, 0"),
        ("attachments_update", "UPDATE ON main.attachments", "NEW.id, OLD.id, 0"),
        ("attachments_delete", "DELETE ON main.attachments", "OLD.id, NULL, 0"),
        (
            "allocations_insert",
            "INSERT ON main.allocations",
            "NEW.attachment_id, NULL, 0",
        ),
        (
            "allocations_update",
            "UPDATE ON main.allocations",
            "NEW.attachment_id, OLD.attachment_id, 0",
        ),
        (
            "allocations_delete",
            "DELETE ON main.allocations",
            "OLD.attachment_id, NULL, 0",
        ),
        ("ranges_insert", "INSERT ON main.ranges", "NULL, NULL, 1"),
        ("ranges_update", "UPDATE OF cidr ON main.ranges", "NULL, NULL, 1"),
        ("ranges_delete", "DELETE ON main.ranges", "NULL, NULL, 1"),
    ];
    for (name, on, values) in triggers {
        sql.push_str(&format!(
            "CREATE TEMP TRIGGER IF NOT EXISTS {name}_logs AFTER {on} BEGIN INSERT INTO ready_log (a, b, every) VALUES ({values}); END;\n"
        ));
    }
    // Cut back by the writes that log, never by a listing.
    sql.push_str(&format!(
        "CREATE TEMP TRIGGER IF NOT EXISTS ready_log_bounded AFTER INSERT ON ready_log WHEN NEW.seq % {LOG_KEPT} = 0 \
         BEGIN DELETE FROM ready_log WHERE seq <= NEW.seq - {LOG_KEPT}; END;\n"
    ));
    sql
}

/// The listing's statement, with `$only` added to its condition.
macro_rules! listing {
    ($only:literal) => {
        concat!(
            "SELECT a.id, a.pod_namespace, a.pod_name, a.host_ifname, al.address, r.cidr
             FROM attachments a
             LEFT JOIN allocations al ON al.attachment_id = a.id
             LEFT JOIN ranges r ON al.range_id = r.id
             WHERE a.state = 'ready' AND a.ifname = ?1 AND a.pod_name != ''",
            $only,
            " ORDER BY a.id, al.address"
        )
    };
}

/// Every ready attachment of `?1` that names a pod.
const EVERY: &str = listing!("");
/// The same, for attachment `?2` only.
const ONE: &str = listing!(" AND a.id = ?2");

impl Db {
    /// Every ready attachment of interface `ifname` that names a pod, with only its pod,
    /// host interface and addresses, in attachment order: what a reader of the node's
    /// pods needs (network policy reads them at every change of the cluster's pods).
    /// Kept between calls and brought up to date from the attachments written since
    /// (see the module documentation): the same answer as a read of every row. The map
    /// is the cache's own ([`ReadyPods`]), so a listing costs a pointer, and a pod that
    /// did not change since the last listing is the very same `Arc` in this one.
    pub fn ready_pods(&mut self, ifname: &str) -> Result<ReadyPods, StoreError> {
        let version = self.pods_version()?;
        if let Some(c) = &self.ready_cache
            && c.ifname == ifname
            && c.version == version
        {
            return Ok(c.pods.clone());
        }
        if !self.ready_log {
            self.conn.execute_batch(&log_sql())?;
            self.ready_log = true;
        }
        let kept = self.ready_cache.take().filter(|c| c.ifname == ifname);
        let cache = match kept {
            Some(mut c) => {
                if self.catch_up(&mut c, version)? {
                    c
                } else {
                    self.read_whole(ifname, version)?
                }
            }
            None => self.read_whole(ifname, version)?,
        };
        let pods = cache.pods.clone();
        self.ready_cache = Some(cache);
        Ok(pods)
    }

    /// A counter that moves whenever a row of what [`Db::ready_pods`] reads is written
    /// (by triggers, so whatever writes them): equal, the answer is the same.
    pub fn pods_version(&self) -> Result<i64, StoreError> {
        Ok(self
            .conn
            .prepare_cached("SELECT v FROM pods_version WHERE id = 1")?
            .query_row([], |r| r.get(0))?)
    }

    /// Brings `c` to `version` from the log; `false` when the log does not hold every
    /// change since (the listing is then read whole).
    fn catch_up(&mut self, c: &mut ReadyCache, version: i64) -> Result<bool, StoreError> {
        let (n, every, last): (i64, i64, Option<i64>) = self
            .conn
            .prepare_cached("SELECT count(*), coalesce(sum(every), 0), max(seq) FROM ready_log WHERE seq > ?1")?
            .query_row(params![c.seq], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
        if n != version - c.version || every > 0 {
            return Ok(false);
        }
        let ids: Vec<i64> = {
            let mut stmt = self.conn.prepare_cached(
                "SELECT a FROM ready_log WHERE seq > ?1 AND a IS NOT NULL
                 UNION SELECT b FROM ready_log WHERE seq > ?1 AND b IS NOT NULL",
            )?;
            stmt.query_map(params![c.seq], |r| r.get(0))?
                .collect::<Result<_, _>>()?
        };
        for id in ids {
            c.pods.remove(&id);
            for (id, pod) in self.read(ONE, params![c.ifname, id])? {
                c.pods.insert(id, Arc::new(pod));
            }
        }
        c.version = version;
        c.seq = last.unwrap_or(c.seq);
        Ok(true)
    }

    /// The listing read whole, at `version`, standing at the log's last entry.
    fn read_whole(&mut self, ifname: &str, version: i64) -> Result<ReadyCache, StoreError> {
        let seq: Option<i64> = self
            .conn
            .prepare_cached("SELECT max(seq) FROM ready_log")?
            .query_row([], |r| r.get(0))?;
        Ok(ReadyCache {
            ifname: ifname.to_string(),
            version,
            seq: seq.unwrap_or(0),
            pods: (self.read(EVERY, params![ifname])?.into_iter())
                .map(|(id, pod)| (id, Arc::new(pod)))
                .collect(),
        })
    }

    /// The pods `sql` ([`EVERY`] or [`ONE`]) finds, by attachment id.
    fn read(&mut self, sql: &str, args: impl rusqlite::Params) -> Result<BTreeMap<i64, ReadyPod>, StoreError> {
        let mut stmt = self.conn.prepare_cached(sql)?;
        let mut rows = stmt.query(args)?;
        let mut out: BTreeMap<i64, ReadyPod> = BTreeMap::new();
        while let Some(r) = rows.next()? {
            let id: i64 = r.get(0)?;
            let pod = match out.entry(id) {
                std::collections::btree_map::Entry::Occupied(o) => o.into_mut(),
                std::collections::btree_map::Entry::Vacant(v) => v.insert(ReadyPod {
                    pod: PodRef {
                        namespace: r.get(1)?,
                        name: r.get(2)?,
                        uid: String::new(),
                    },
                    host_ifname: r.get(3)?,
                    addresses: Vec::new(),
                }),
            };
            let (Some(b), Some(cidr)) = (r.get::<_, Option<Vec<u8>>>(4)?, r.get::<_, Option<String>>(5)?) else {
                continue;
            };
            if let Ok(range) = cidr.parse::<IpNet>() {
                pod.addresses.push(addr::from_key(&range, blob_key(&b)));
            }
        }
        Ok(out)
    }
}
