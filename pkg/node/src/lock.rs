//! The state directory's lock: one daemon per state directory, for the process's life,
//! since a second daemon on the same state would "recover" the first one's calls in
//! flight.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tracing::info;

/// The lock, held until dropped (the kernel releases it when the process exits).
#[derive(Debug)]
pub struct StateLock {
    _file: nix::fcntl::Flock<std::fs::File>,
}

/// Why the state directory could not be locked.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// The lock file could not be opened.
    #[error("opening {}", path.display())]
    Open {
        /// The lock file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Another daemon still holds it after the wait (or locking failed otherwise).
    #[error("another weftd is running on state directory {} ({errno}); waited {} s for it to exit", dir.display(), wait.as_secs())]
    Held {
        /// The state directory.
        dir: PathBuf,
        /// What `flock` answered last.
        errno: nix::errno::Errno,
        /// How long was waited.
        wait: Duration,
    },
}

/// Takes `dir`'s lock (`weftd.lock`). A daemon that is still exiting (seconds after a
/// SIGKILL, while the kernel tears its sockets down) holds it a little longer: wait for
/// it, up to `wait`, saying so once, rather than fail a restart that would succeed.
pub async fn lock_state_dir(dir: &Path, wait: Duration) -> Result<StateLock, LockError> {
    let path = dir.join("weftd.lock");
    let deadline = tokio::time::Instant::now() + wait;
    let mut said = false;
    loop {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|source| LockError::Open {
                path: path.clone(),
                source,
            })?;
        match nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock) {
            Ok(lock) => {
                if said {
                    info!(state = %dir.display(), "the previous weftd released the state directory");
                }
                return Ok(StateLock { _file: lock });
            }
            Err((_, nix::errno::Errno::EWOULDBLOCK)) if tokio::time::Instant::now() < deadline => {
                if !said {
                    info!(state = %dir.display(), wait_seconds = wait.as_secs(), "another weftd holds the state directory; waiting for it to exit");
                    said = true;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err((_, errno)) => {
                return Err(LockError::Held {
                    dir: dir.to_path_buf(),
                    errno,
                    wait,
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_second_lock_waits_for_the_first_and_then_gives_up() {
        let dir = tempfile::tempdir().unwrap();
        let first = lock_state_dir(dir.path(), Duration::ZERO).await.unwrap();
        let t = std::time::Instant::now();
        let err = lock_state_dir(dir.path(), Duration::from_millis(200))
            .await
            .unwrap_err();
        assert!(
            t.elapsed() >= Duration::from_millis(200),
            "gave up after {:?}",
            t.elapsed()
        );
        assert!(
            matches!(
                err,
                LockError::Held {
                    errno: nix::errno::Errno::EWOULDBLOCK,
                    ..
                }
            ),
            "{err}"
        );
        assert!(
            err.to_string()
                .starts_with("another weftd is running on state directory")
        );
        // Released while the second one waits: it gets the lock.
        let dir_path = dir.path().to_path_buf();
        let second = tokio::spawn(async move { lock_state_dir(&dir_path, Duration::from_secs(10)).await });
        tokio::time::sleep(Duration::from_millis(100)).await;
        drop(first);
        second.await.unwrap().unwrap();
    }
}
