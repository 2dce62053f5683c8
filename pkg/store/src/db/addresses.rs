//! The `ranges` and `allocations` tables: which address of which range each attachment
//! holds, and where sequential allocation goes on in each range.

use std::net::IpAddr;

use ipnet::IpNet;
use rusqlite::{OptionalExtension, Transaction, params};

use super::{Db, blob_key, join, key_blob};
use crate::addr;
use crate::{StoreError, attachment::*};

impl Db {
    /// Usage of every range the store knows.
    pub fn range_usage(&mut self) -> Result<Vec<RangeUsage>, StoreError> {
        let mut stmt = self.conn.prepare_cached(
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

    /// Every range the store knows, in the order it first saw them: what a reader of the
    /// node's pod ranges needs, without [`Db::range_usage`]'s count of each range's
    /// allocations (a row per pod: the node network asks at each of its passes).
    pub fn ranges(&mut self) -> Result<Vec<IpNet>, StoreError> {
        let mut stmt = self.conn.prepare_cached("SELECT cidr FROM ranges ORDER BY id")?;
        let cidrs = stmt.query_map([], |r| r.get::<_, String>(0))?;
        let mut out = Vec::new();
        for cidr in cidrs {
            // As `range_usage`: a row that does not parse is not a range.
            if let Ok(range) = cidr?.parse::<IpNet>() {
                out.push(range);
            }
        }
        Ok(out)
    }

    /// The gateways of the ranges some attachment holds an address of, in any state:
    /// what the node must keep holding. One look per range at its first allocation (the
    /// index), not a count of its rows: a DEL asks, and a node may hold thousands.
    pub fn gateways_in_use(&mut self) -> Result<Vec<IpAddr>, StoreError> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT r.cidr FROM ranges r WHERE EXISTS (SELECT 1 FROM allocations a WHERE a.range_id = r.id)",
        )?;
        let cidrs = stmt.query_map([], |r| r.get::<_, String>(0))?;
        let mut out = Vec::new();
        for cidr in cidrs {
            // As `range_usage`: a row that does not parse is not a range.
            if let Ok(range) = cidr?.parse::<IpNet>() {
                let gw = addr::gateway(&range);
                if !out.contains(&gw) {
                    out.push(gw);
                }
            }
        }
        Ok(out)
    }

    /// Usage of the given ranges (ranges the store has not seen yet count as empty).
    pub fn usage_of(&mut self, ranges: &[IpNet]) -> Result<Vec<RangeUsage>, StoreError> {
        let mut out = Vec::with_capacity(ranges.len());
        for range in ranges {
            let allocated: i64 = self
                .conn
                .prepare_cached(
                    "SELECT COUNT(*) FROM allocations a JOIN ranges r ON a.range_id = r.id WHERE r.cidr = ?1",
                )?
                .query_row(params![range.to_string()], |r| r.get(0))
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

    /// Every allocated address (for consistency checks).
    pub fn allocated_addresses(&mut self) -> Result<Vec<IpAddr>, StoreError> {
        let mut stmt = self.conn.prepare_cached(
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

/// Allocates exactly `want`, which the runtime asked for, from the one of `ranges`
/// (all of its family) that holds it. Refused when no range holds it, when it is no
/// pod address of its range (network, gateway, IPv4 broadcast), or when another
/// attachment holds it; the cursor of the range is left alone, so sequential
/// allocation goes on where it was.
pub(super) fn allocate_exact(
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
        .prepare_cached(
            "SELECT a.network, a.container_id, a.ifname, a.pod_namespace, a.pod_name, a.state
             FROM allocations al JOIN attachments a ON al.attachment_id = a.id WHERE al.address = ?1",
        )?
        .query_row(params![key_blob(k)], |r| {
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
        })
        .optional()?;
    if let Some((key, ns, name, state)) = holder {
        let deleting = State::parse(&state) == State::Deleting;
        let who = PodRef {
            namespace: ns,
            name,
            uid: String::new(),
        }
        .describe(&key.container_id);
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
    tx.prepare_cached("INSERT INTO allocations (address, range_id, attachment_id) VALUES (?1, ?2, ?3)")?
        .execute(params![key_blob(k), range_id, attachment])?;
    Ok(Allocation {
        address: want,
        range: *range,
        gateway: addr::gateway(range),
    })
}

pub(super) fn ensure_range(tx: &Transaction<'_>, range: &IpNet) -> Result<i64, StoreError> {
    let cidr = range.to_string();
    if let Some(id) = tx
        .prepare_cached("SELECT id FROM ranges WHERE cidr = ?1")?
        .query_row(params![cidr], |r| r.get(0))
        .optional()?
    {
        return Ok(id);
    }
    tx.prepare_cached("INSERT INTO ranges (cidr) VALUES (?1)")?
        .execute(params![cidr])?;
    Ok(tx.last_insert_rowid())
}

/// Allocates the first free address after the range's cursor, wrapping around once.
pub(super) fn allocate_in(
    tx: &Transaction<'_>,
    range_id: i64,
    range: &IpNet,
    attachment: i64,
) -> Result<Option<IpAddr>, StoreError> {
    let (lo, hi) = addr::pool(range);
    let cursor: Option<Vec<u8>> = tx
        .prepare_cached("SELECT cursor FROM ranges WHERE id = ?1")?
        .query_row(params![range_id], |r| r.get(0))?;
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
    tx.prepare_cached("INSERT INTO allocations (address, range_id, attachment_id) VALUES (?1, ?2, ?3)")?
        .execute(params![key_blob(k), range_id, attachment])?;
    tx.prepare_cached("UPDATE ranges SET cursor = ?2 WHERE id = ?1")?
        .execute(params![range_id, key_blob(k)])?;
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
