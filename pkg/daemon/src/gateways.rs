//! The pods' gateways the node holds once for all its pods (IPv4, see
//! `weft_kernel::ptp`): let go when the last address of their range is released, so a
//! node without pods holds nothing of weft's, as a failed ADD leaves nothing.
//!
//! An ADD holds its range's gateway before it routes to its pod, and deleting a
//! gateway takes the routes that answer from it along; so setups and repairs take
//! [`GatewayLock`] shared, and a release takes it alone, reading what is in use from the
//! store under it. An ADD's addresses are in the store before its setup starts, so a
//! release either sees them or ends before that setup holds the gateway again.

use tokio::sync::RwLock;
use tracing::{info, warn};

use crate::seams::{Ipam, PodNetworking};

/// Setups and repairs hold it shared; a release of unused gateways alone.
pub type GatewayLock = RwLock<()>;

/// Lets go of the gateways no range with addresses held needs any more. A failure is
/// logged, not returned: an unused gateway held on is harmless, and the next release
/// (the next DEL, or the reconcile pass) tries again.
pub async fn release_unused<I: Ipam, K: PodNetworking>(ipam: &I, net: &K, lock: &GatewayLock) {
    let _alone = lock.write().await;
    let in_use = match ipam.gateways_in_use().await {
        Ok(g) => g,
        Err(e) => {
            warn!(error = %e, "cannot read which gateways are in use: keeping every gateway the node holds");
            return;
        }
    };
    match net.release_gateways(in_use).await {
        Ok(released) if !released.is_empty() => {
            info!(
                ?released,
                "released the gateways of ranges no pod of the node holds an address of"
            )
        }
        Ok(_) => {}
        Err(e) => warn!(error = %e, "could not release unused gateways; the next DEL or reconcile pass tries again"),
    }
}
