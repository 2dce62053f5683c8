//! Start-up recovery: before serving, finish what a crash interrupted. An attachment
//! left `creating` is rolled back (its ADD never answered success); one left
//! `deleting` has its teardown completed (its DEL already answered success).

use tracing::{info, warn};
use weft_store::State;

use crate::seams::{Ipam, PodNetworking};

/// What recovery did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Recovered {
    /// Interrupted ADDs rolled back.
    pub rolled_back: usize,
    /// Interrupted teardowns completed.
    pub torn_down: usize,
}

/// Rolls back interrupted ADDs and completes interrupted teardowns.
pub async fn recover<I: Ipam, K: PodNetworking>(ipam: &I, net: &K) -> Result<Recovered, String> {
    let mut out = Recovered::default();
    for (state, what) in [
        (State::Creating, "rolling back an interrupted ADD"),
        (State::Deleting, "finishing an interrupted DEL"),
    ] {
        let list = ipam.list(None, Some(state)).await.map_err(|e| e.to_string())?;
        for att in list {
            info!(attachment = %att.key, host_ifname = %att.host_ifname, "{what}");
            if let Err(e) = net.remove(att.host_ifname.clone()).await {
                warn!(attachment = %att.key, error = %e, "could not remove the veth pair; keeping the row for the next attempt");
                continue;
            }
            ipam.remove(att.id).await.map_err(|e| e.to_string())?;
            match state {
                State::Creating => out.rolled_back += 1,
                _ => out.torn_down += 1,
            }
        }
    }
    Ok(out)
}
