//! The daemon's UNIX socket: created mode 0600 (replacing a stale one left by a
//! crash, refusing to steal a live one), and served only to root peers (SO_PEERCRED).

use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use tokio::net::{UnixListener, UnixStream};
use tokio_stream::{Stream, StreamExt, wrappers::UnixListenerStream};
use tracing::warn;

/// Binds the socket at `path`. A socket file nobody answers on is a leftover of a
/// crash and is replaced; one that answers belongs to a running daemon, and binding
/// fails rather than cutting it off.
pub fn bind_unix(path: &Path) -> io::Result<UnixListener> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    match std::os::unix::net::UnixStream::connect(path) {
        Ok(_) => {
            return Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                format!("another weftd is serving {}; stop it first", path.display()),
            ));
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(_) => std::fs::remove_file(path).or_else(|e| {
            if e.kind() == io::ErrorKind::NotFound {
                Ok(())
            } else {
                Err(e)
            }
        })?,
    }
    // Created with mode 0600 from the start: no window in which others may connect.
    let old = nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o177));
    let bound = UnixListener::bind(path);
    nix::sys::stat::umask(old);
    let listener = bound?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}

/// Whether a connection's peer is root.
pub fn peer_is_root(s: &UnixStream) -> bool {
    matches!(s.peer_cred(), Ok(c) if c.uid() == 0)
}

/// Accepted connections from root peers; others are closed and logged.
pub fn root_only(listener: UnixListener) -> impl Stream<Item = io::Result<UnixStream>> {
    UnixListenerStream::new(listener).filter_map(|conn| match conn {
        Ok(s) if peer_is_root(&s) => Some(Ok(s)),
        Ok(s) => {
            let who = s
                .peer_cred()
                .map(|c| format!("uid {} pid {:?}", c.uid(), c.pid()))
                .unwrap_or_default();
            warn!(peer = %who, "refused a connection from a non-root peer");
            None
        }
        Err(e) => {
            warn!(error = %e, "accepting a connection failed");
            None
        }
    })
}
