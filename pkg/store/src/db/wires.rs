//! The `wires` table: the node's wire ends, each with the VNI it agreed with its peer.

use rusqlite::types::Value;
use rusqlite::{OptionalExtension, Row, params, params_from_iter};
use weft_link::WireEnd;

use super::{Db, now_ms};
use crate::StoreError;

impl Db {
    /// Records a wire end, or updates the one with the same id. Fails with
    /// [`StoreError::VniTaken`] when its VNI is held by another end of the node.
    pub fn put_wire(&mut self, w: &WireEnd) -> Result<(), StoreError> {
        let tx = self.immediate()?;
        if let Some(vni) = w.vni {
            let holder: Option<i64> = tx
                .prepare_cached("SELECT id FROM wires WHERE vni = ?1 AND id != ?2")?
                .query_row(params![vni, w.id as i64], |r| r.get(0))
                .optional()?;
            if let Some(h) = holder {
                return Err(StoreError::VniTaken { vni, holder: h as u64 });
            }
        }
        let values = to_row(w).into_iter().chain([Value::Integer(now_ms())]);
        // Cached: every end a pass builds is put, and parsing the upsert cost more than
        // running it.
        tx.prepare_cached(&format!(
            "INSERT INTO wires ({WIRE_COLUMNS}, updated_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)
             ON CONFLICT (id) DO UPDATE SET local_intf = ?5, peer_pod = ?6, peer_intf = ?7, peer_id = ?8,
                 kind = ?9, peer_node = ?10, vni = ?11, netns = ?12, state = ?13, updated_at = ?14"
        ))?
        .execute(params_from_iter(values))?;
        tx.commit()?;
        Ok(())
    }

    /// The wire end with this id.
    pub fn wire(&mut self, id: u64) -> Result<Option<WireEnd>, StoreError> {
        let mut stmt = self
            .conn
            .prepare_cached(&format!("SELECT {WIRE_COLUMNS} FROM wires WHERE id = ?1"))?;
        let mut rows = stmt.query(params![id as i64])?;
        rows.next()?.map(from_row).transpose()
    }

    /// Every wire end of the node.
    pub fn wires(&mut self) -> Result<Vec<WireEnd>, StoreError> {
        let mut stmt = self.conn.prepare_cached(&format!(
            "SELECT {WIRE_COLUMNS} FROM wires ORDER BY namespace, link_uid, local_pod"
        ))?;
        let mut rows = stmt.query([])?;
        let mut ends = Vec::new();
        while let Some(r) = rows.next()? {
            ends.push(from_row(r)?);
        }
        Ok(ends)
    }

    /// Which wire end holds `vni`, if any.
    pub fn vni_holder(&mut self, vni: u32) -> Result<Option<u64>, StoreError> {
        Ok(self
            .conn
            .prepare_cached("SELECT id FROM wires WHERE vni = ?1")?
            .query_row(params![vni], |r| r.get::<_, i64>(0))
            .optional()?
            .map(|v| v as u64))
    }

    /// Forgets a wire end.
    pub fn remove_wire(&mut self, id: u64) -> Result<(), StoreError> {
        let tx = self.immediate()?;
        tx.prepare_cached("DELETE FROM wires WHERE id = ?1")?
            .execute(params![id as i64])?;
        tx.commit()?;
        Ok(())
    }
}

/// The columns [`to_row`] fills and [`from_row`] reads, in their order.
const WIRE_COLUMNS: &str =
    "id, namespace, link_uid, local_pod, local_intf, peer_pod, peer_intf, peer_id, kind, peer_node, vni, netns, state";

/// A wire end as the values of [`WIRE_COLUMNS`]: kind and state by name, ids as SQLite's
/// signed integers (the bits kept).
fn to_row(w: &WireEnd) -> [Value; 13] {
    let text = |s: &str| Value::Text(s.to_string());
    [
        Value::Integer(w.id as i64),
        text(&w.namespace),
        Value::Integer(w.link_uid),
        text(&w.local_pod),
        text(&w.local_intf),
        text(&w.peer_pod),
        text(&w.peer_intf),
        Value::Integer(w.peer_id as i64),
        text(w.kind.as_str()),
        text(&w.peer_node),
        w.vni.map_or(Value::Null, |v| Value::Integer(i64::from(v))),
        text(&w.netns),
        text(w.state.as_str()),
    ]
}

/// A row of [`WIRE_COLUMNS`] as a wire end. A kind or state this binary does not know
/// (a store written by a newer weftd) is [`StoreError::UnknownWireName`].
fn from_row(r: &Row<'_>) -> Result<WireEnd, StoreError> {
    let id = r.get::<_, i64>(0)? as u64;
    let name = |e| StoreError::UnknownWireName { id, source: e };
    Ok(WireEnd {
        id,
        namespace: r.get(1)?,
        link_uid: r.get(2)?,
        local_pod: r.get(3)?,
        local_intf: r.get(4)?,
        peer_pod: r.get(5)?,
        peer_intf: r.get(6)?,
        peer_id: r.get::<_, i64>(7)? as u64,
        kind: r.get::<_, String>(8)?.parse().map_err(name)?,
        peer_node: r.get(9)?,
        vni: r.get::<_, Option<i64>>(10)?.map(|v| v as u32),
        netns: r.get(11)?,
        state: r.get::<_, String>(12)?.parse().map_err(name)?,
    })
}
