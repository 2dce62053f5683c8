//! Recording attachments rebuilt from the kernel after the database was lost: each is
//! written `ready`, with the addresses, routes and MAC the kernel shows and the ADD
//! result they make.

use rusqlite::params;

use super::addresses::ensure_range;
use super::attachments::{mac_text, routes_text};
use super::{Db, key_blob, now_ms};
use crate::addr;
use crate::{StoreError, attachment::*};

/// An attachment as the kernel shows it: what [`Db::record_rebuilt`] writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RebuiltAttachment {
    /// Its key, from the host end's alias.
    pub key: AttachmentKey,
    /// The pod's network namespace, as found on the node (empty when not found).
    pub netns: String,
    /// The host end's name.
    pub host_ifname: String,
    /// The host end's MTU.
    pub mtu: u32,
    /// Its addresses, each with the range it is recorded under (see
    /// [`crate::narrowest_range`]) and the gateway on the host end.
    pub addresses: Vec<Allocation>,
    /// The routes through the gateways found in the pod.
    pub routes: Vec<InstalledRoute>,
    /// The pod end's MAC, when the pod end was found.
    pub pod_mac: Option<[u8; 6]>,
    /// The ADD result to answer a repeated ADD with (JSON), as the ADD would have
    /// made it.
    pub result: Option<String>,
}

impl Db {
    /// Records a rebuilt attachment as ready, holding its addresses. Returns `false`
    /// (and writes nothing) when its key or host end is already recorded or one of its
    /// addresses is held: the store's word wins over the kernel's.
    pub fn record_rebuilt(&mut self, r: &RebuiltAttachment) -> Result<bool, StoreError> {
        let tx = self.immediate()?;
        let taken: i64 = tx
            .prepare_cached(
                "SELECT COUNT(*) FROM attachments
             WHERE (network = ?1 AND container_id = ?2 AND ifname = ?3) OR host_ifname = ?4",
            )?
            .query_row(
                params![r.key.network, r.key.container_id, r.key.ifname, r.host_ifname],
                |row| row.get(0),
            )?;
        if taken > 0 {
            return Ok(false);
        }
        let now = now_ms();
        tx.prepare_cached(
            "INSERT INTO attachments (network, container_id, ifname, netns, host_ifname, mtu, state,
                 result, created_at, updated_at, routes, pod_mac)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, 'ready', ?10, ?7, ?7, ?8, ?9)",
        )?
        .execute(params![
            r.key.network,
            r.key.container_id,
            r.key.ifname,
            r.netns,
            r.host_ifname,
            r.mtu,
            now,
            routes_text(&r.routes),
            r.pod_mac.as_ref().map(mac_text),
            r.result,
        ])?;
        let id = tx.last_insert_rowid();
        for a in &r.addresses {
            let range_id = ensure_range(&tx, &a.range)?;
            let n = tx
                .prepare_cached(
                    "INSERT OR IGNORE INTO allocations (address, range_id, attachment_id) VALUES (?1, ?2, ?3)",
                )?
                .execute(params![key_blob(addr::to_key(a.address)), range_id, id])?;
            if n == 0 {
                // Held already: drop the whole attachment (the transaction rolls back).
                return Ok(false);
            }
        }
        tx.commit()?;
        Ok(true)
    }
}
