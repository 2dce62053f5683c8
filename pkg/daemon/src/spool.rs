//! Replaying the DEL spool: DELs the plugin recorded while weftd could not be reached
//! (`weft_cni::spool`), and those the handler recorded itself while its store could not
//! write, are done by the DEL the caller hands in (the handler's own), before the node
//! serves, on each reconcile pass, when the store writes again, and ahead of an ADD for
//! the same attachment, so a pod's DEL always comes before its next ADD. This module
//! knows the spool, not the handler: the handler calls it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tracing::{info, warn};
use weft_cni::spool::{self, SpoolError, SpooledDel};
use weft_cni::{CniError, Code};
use weft_store::AttachmentKey;

use crate::call::CniCall;

/// The DEL a replay does for each entry: the handler's own, answering like a DEL call.
pub type DoDel<'a> = dyn Fn(CniCall) -> futures::future::BoxFuture<'a, Result<(), CniError>> + Send + Sync + 'a;

/// A temporary spool file this old was left by a plugin killed while writing it.
const STALE_TEMPORARY: Duration = Duration::from_secs(60);

/// Called with the number of DELs replayed, wherever they were replayed (the node
/// counts them in `weft_del_spool_replayed_total`).
pub type OnReplayed = Arc<dyn Fn(u64) + Send + Sync>;

/// The spool directory the handler replays, and the lock that keeps a replay and an
/// ADD of the same attachment from crossing (an entry read by the reconcile pass must
/// not be replayed after the ADD that followed it).
pub struct DelSpool {
    dir: PathBuf,
    lock: tokio::sync::Mutex<()>,
    on_replayed: Option<OnReplayed>,
}

impl DelSpool {
    /// The spool at `dir` (see `weft_cni::spool::dir_for_socket`).
    pub fn new(dir: PathBuf) -> Self {
        Self {
            dir,
            lock: tokio::sync::Mutex::new(()),
            on_replayed: None,
        }
    }

    /// Calls `f` with the number of DELs each replay did.
    pub fn on_replayed(mut self, f: OnReplayed) -> Self {
        self.on_replayed = Some(f);
        self
    }

    /// The spool directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// How many DELs wait in the spool now (0 when it cannot be read; that is logged
    /// by the replay).
    pub fn pending(&self) -> usize {
        spool::count(&self.dir).unwrap_or(0)
    }

    fn replayed(&self, n: u64) {
        if n > 0
            && let Some(f) = &self.on_replayed
        {
            f(n);
        }
    }
}

/// What one replay of the whole spool did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Replayed {
    /// DELs done and taken out of the spool.
    pub replayed: u64,
    /// DELs that failed; they stay for the next pass.
    pub failed: u64,
    /// Entries renamed aside, never replayed: unreadable, or a DEL refused for its
    /// own input.
    pub set_aside: u64,
}

/// What replaying one entry came to.
enum Outcome {
    Replayed,
    /// Why, for an ADD that must wait for it.
    Failed(String),
    SetAside,
}

/// The call the plugin would have made.
fn call_of(del: SpooledDel) -> CniCall {
    CniCall {
        container_id: del.container_id,
        netns: del.netns,
        ifname: del.ifname,
        args: del.args.into_iter().collect::<HashMap<_, _>>(),
        config: del.config.into_bytes(),
    }
}

impl DelSpool {
    /// Replays every DEL in the spool with `del`, oldest file name first, removing each
    /// entry once its DEL succeeded.
    pub async fn replay_all(&self, del: &DoDel<'_>) -> Replayed {
        let mut done = Replayed::default();
        let spool = self;
        if let Err(e) = spool::remove_stale_temporaries(spool.dir(), STALE_TEMPORARY) {
            warn!(error = %e, "cannot clear stale temporary files from the DEL spool");
        }
        let paths = match spool::list(spool.dir()) {
            Ok(p) => p,
            Err(e) => {
                warn!(error = %e, "cannot read the DEL spool; retried on the next pass");
                return done;
            }
        };
        for path in paths {
            let _guard = spool.lock.lock().await;
            match spool::read(&path) {
                // Replayed ahead of an ADD meanwhile.
                Ok(None) => {}
                Ok(Some(entry)) => match replay_one(&path, entry, del).await {
                    Outcome::Replayed => done.replayed += 1,
                    Outcome::Failed(_) => done.failed += 1,
                    Outcome::SetAside => done.set_aside += 1,
                },
                Err(e @ SpoolError::Decode { .. }) => {
                    match spool::set_aside(&path) {
                        Ok(aside) => {
                            warn!(error = %e, aside = %aside.display(), "unreadable DEL spool entry set aside")
                        }
                        Err(e2) => warn!(error = %e, error2 = %e2, "unreadable DEL spool entry could not be set aside"),
                    }
                    done.set_aside += 1;
                }
                Err(e) => {
                    warn!(error = %e, "cannot read a DEL spool entry; retried on the next pass");
                    done.failed += 1;
                }
            }
        }
        spool.replayed(done.replayed);
        done
    }

    /// Whether a DEL of `key` waits in the spool (one stat).
    pub fn waits(&self, key: &AttachmentKey) -> bool {
        self.dir()
            .join(spool::file_name(&key.network, &key.container_id, &key.ifname))
            .exists()
    }

    /// Before an ADD: replays with `del` a DEL spooled for `key`, so it is not applied
    /// after the ADD. Fails the ADD (try again later) when that DEL cannot be done now.
    pub async fn replay_key(&self, key: &AttachmentKey, del: &DoDel<'_>) -> Result<(), CniError> {
        let spool = self;
        let path = spool
            .dir()
            .join(spool::file_name(&key.network, &key.container_id, &key.ifname));
        // The common case, no entry, costs one stat and no lock.
        if !path.exists() {
            return Ok(());
        }
        let _guard = spool.lock.lock().await;
        match spool::find(spool.dir(), &key.network, &key.container_id, &key.ifname) {
            Ok(None) => Ok(()),
            Ok(Some((path, entry))) => match replay_one(&path, entry, del).await {
                Outcome::Replayed => {
                    spool.replayed(1);
                    Ok(())
                }
                Outcome::SetAside => Ok(()),
                Outcome::Failed(why) => Err(CniError::new(
                    Code::TryAgainLater,
                    format!("a DEL of {key} waiting in the DEL spool could not be done yet: {why}"),
                )),
            },
            Err(e @ SpoolError::Decode { .. }) => {
                let _ = spool::set_aside(&path);
                warn!(error = %e, "unreadable DEL spool entry set aside");
                Ok(())
            }
            Err(e) => Err(CniError::new(Code::TryAgainLater, e.to_string())),
        }
    }
}

/// Does one spooled DEL and removes its entry; failures are logged. A DEL refused
/// for its own input (a code below 11: bad config, bad variables) can never succeed
/// and is set aside instead of blocking its pod's next ADD for good.
async fn replay_one(path: &Path, del: SpooledDel, do_del: &DoDel<'_>) -> Outcome {
    let (container, ifname, network) = (del.container_id.clone(), del.ifname.clone(), del.network.clone());
    let age_ms = spool::now_ms().saturating_sub(del.spooled_at_ms);
    if let Err(e) = do_del(call_of(del)).await {
        if e.code.is_about_input() {
            let aside = spool::set_aside(path);
            warn!(network, container, ifname, code = e.code.number(), error = %e.msg, aside = ?aside.as_ref().map(|p| p.display().to_string()), "spooled DEL refused for its input; set aside");
            return Outcome::SetAside;
        }
        warn!(network, container, ifname, error = %e.details, "spooled DEL failed; kept for the next pass");
        return Outcome::Failed(e.details);
    }
    if let Err(e) = spool::remove(path) {
        warn!(error = %e, "spooled DEL done but its entry stays; replaying it again is harmless");
    }
    info!(network, container, ifname, age_ms, "spooled DEL replayed");
    Outcome::Replayed
}
