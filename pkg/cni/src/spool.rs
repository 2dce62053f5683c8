//! The DEL spool: where the plugin leaves a DEL that weftd could not be reached for,
//! so pod teardown never waits on a down daemon; weftd replays it before it serves.
//!
//! One file per attachment (network, container id, interface), in a root-only
//! directory beside the daemon's socket. A file appears whole or not at all: it is
//! written under a temporary name in the same directory, synced, then renamed. Names
//! that do not end in [`SUFFIX`] (temporary files, files set aside) are not entries.
//! Blocking I/O only: the plugin stays free of an async runtime for this.

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// Name of the spool directory, beside the daemon socket.
pub const DIR_NAME: &str = "del-spool";
/// How a spool entry's file name ends.
pub const SUFFIX: &str = ".del";
/// How a file set aside as unreadable ends (kept for a human, never replayed).
pub const BAD_SUFFIX: &str = ".bad";

/// A DEL the plugin could not hand to weftd: everything the daemon needs to replay it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpooledDel {
    /// The network config's `name`.
    pub network: String,
    /// `CNI_CONTAINERID`.
    pub container_id: String,
    /// `CNI_IFNAME`.
    pub ifname: String,
    /// `CNI_NETNS` (the namespace is usually gone by the time it is replayed).
    pub netns: String,
    /// `CNI_ARGS` as key/value pairs.
    pub args: BTreeMap<String, String>,
    /// The network config, exactly as the plugin read it.
    pub config: String,
    /// When the plugin spooled it, in milliseconds since the Unix epoch.
    pub spooled_at_ms: u64,
}

/// A spool operation that failed.
#[derive(Debug, thiserror::Error)]
pub enum SpoolError {
    /// The file system refused.
    #[error("DEL spool: {what} {}: {source}", path.display())]
    Io {
        /// What was being done.
        what: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// An entry is not a spooled DEL (hand-edited or from another version).
    #[error("DEL spool: {} is not a spooled DEL: {source}", path.display())]
    Decode {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: serde_json::Error,
    },
    /// The spool path exists but is not a directory (a symlink is refused too).
    #[error("DEL spool: {} is not a directory", .0.display())]
    NotADirectory(PathBuf),
}

fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> SpoolError {
    let path = path.to_path_buf();
    move |source| SpoolError::Io { what, path, source }
}

/// The spool directory for the daemon listening on `socket`.
pub fn dir_for_socket(socket: &Path) -> PathBuf {
    socket.parent().unwrap_or(Path::new("/")).join(DIR_NAME)
}

/// The file name of the entry for one attachment: a stable hash of its key, so a
/// repeated DEL replaces the earlier one and an ADD finds it without a scan.
pub fn file_name(network: &str, container_id: &str, ifname: &str) -> String {
    // FNV-1a, 64 bit: stable across builds and versions (unlike std's hasher); the
    // key itself is in the file and checked on read, so a collision is harmless.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in [network, container_id, ifname] {
        for b in part.bytes().chain(std::iter::once(0)) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    format!("{h:016x}{SUFFIX}")
}

impl SpooledDel {
    /// The name of this DEL's entry in the spool.
    pub fn file_name(&self) -> String {
        file_name(&self.network, &self.container_id, &self.ifname)
    }

    /// Whether this DEL is for the attachment (network, container id, interface).
    pub fn is_for(&self, network: &str, container_id: &str, ifname: &str) -> bool {
        self.network == network && self.container_id == container_id && self.ifname == ifname
    }
}

/// Milliseconds since the Unix epoch now, for [`SpooledDel::spooled_at_ms`].
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Creates `dir` (mode 0700, parents too) if missing, and refuses anything but a
/// directory there.
fn ensure_dir(dir: &Path) -> Result<(), SpoolError> {
    match std::fs::symlink_metadata(dir) {
        Ok(m) if m.is_dir() => {
            if m.permissions().mode() & 0o077 != 0 {
                std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
                    .map_err(io("restricting", dir))?;
            }
            Ok(())
        }
        Ok(_) => Err(SpoolError::NotADirectory(dir.to_path_buf())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(io("creating", dir)),
        Err(e) => Err(io("inspecting", dir)(e)),
    }
}

/// Records `del` in the spool at `dir` atomically (mode 0600), replacing an earlier
/// entry for the same attachment. Returns the entry's path.
pub fn write(dir: &Path, del: &SpooledDel) -> Result<PathBuf, SpoolError> {
    ensure_dir(dir)?;
    let name = del.file_name();
    let path = dir.join(&name);
    let tmp = dir.join(format!(".{name}.{}.{}.tmp", std::process::id(), now_ms()));
    let bytes = serde_json::to_vec(del).map_err(|source| SpoolError::Decode {
        path: path.clone(),
        source,
    })?;
    let written = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            // `create_new` (O_EXCL) also refuses a symlink planted at the name.
            .mode(0o600)
            .open(&tmp)
            .map_err(io("creating", &tmp))?;
        f.write_all(&bytes).map_err(io("writing", &tmp))?;
        f.sync_all().map_err(io("syncing", &tmp))?;
        std::fs::rename(&tmp, &path).map_err(io("renaming", &tmp))
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    // The rename is durable only once the directory is.
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(path)
}

/// The entries in the spool at `dir`, oldest name order (a missing directory is an
/// empty spool). Temporary and set-aside files are left out.
pub fn list(dir: &Path) -> Result<Vec<PathBuf>, SpoolError> {
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io("reading", dir)(e)),
    };
    let mut out = Vec::new();
    for entry in rd {
        let entry = entry.map_err(io("reading", dir))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if name.starts_with('.') || !name.ends_with(SUFFIX) {
            continue;
        }
        if entry.file_type().is_ok_and(|t| t.is_file()) {
            out.push(entry.path());
        }
    }
    out.sort();
    Ok(out)
}

/// Removes temporary files older than `age` (left by a plugin killed between
/// writing and renaming; a younger one may still be renamed). Returns how many went.
pub fn remove_stale_temporaries(dir: &Path, age: std::time::Duration) -> Result<usize, SpoolError> {
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(io("reading", dir)(e)),
    };
    let mut removed = 0;
    for entry in rd {
        let entry = entry.map_err(io("reading", dir))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if !(name.starts_with('.') && name.ends_with(".tmp")) {
            continue;
        }
        let stale = entry
            .metadata()
            .and_then(|m| m.modified())
            .is_ok_and(|t| t.elapsed().is_ok_and(|e| e >= age));
        if stale && std::fs::remove_file(entry.path()).is_ok() {
            removed += 1;
        }
    }
    Ok(removed)
}

/// How many DELs wait in the spool at `dir`.
pub fn count(dir: &Path) -> Result<usize, SpoolError> {
    list(dir).map(|l| l.len())
}

/// Reads one entry; `None` when it is gone (replayed by someone else meanwhile).
pub fn read(path: &Path) -> Result<Option<SpooledDel>, SpoolError> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io("reading", path)(e)),
    };
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|source| SpoolError::Decode {
            path: path.to_path_buf(),
            source,
        })
}

/// The spooled DEL for one attachment, if there is one.
pub fn find(
    dir: &Path,
    network: &str,
    container_id: &str,
    ifname: &str,
) -> Result<Option<(PathBuf, SpooledDel)>, SpoolError> {
    let path = dir.join(file_name(network, container_id, ifname));
    Ok(read(&path)?
        .filter(|d| d.is_for(network, container_id, ifname))
        .map(|d| (path, d)))
}

/// Removes an entry once its DEL is done (already gone is fine).
pub fn remove(path: &Path) -> Result<(), SpoolError> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io("removing", path)(e)),
        _ => Ok(()),
    }
}

/// Renames an unreadable entry so it is kept for a human but never replayed again.
pub fn set_aside(path: &Path) -> Result<PathBuf, SpoolError> {
    let aside = path.with_extension(BAD_SUFFIX.trim_start_matches('.'));
    std::fs::rename(path, &aside).map_err(io("setting aside", path))?;
    Ok(aside)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn del(container: &str) -> SpooledDel {
        SpooledDel {
            network: "weft".into(),
            container_id: container.into(),
            ifname: "eth0".into(),
            netns: "/var/run/netns/gone".into(),
            args: BTreeMap::from([("K8S_POD_NAME".into(), "p".into())]),
            config: r#"{"cniVersion":"1.1.0","name":"weft","type":"weft"}"#.into(),
            spooled_at_ms: 42,
        }
    }

    fn scratch() -> PathBuf {
        static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        std::env::temp_dir().join(format!("weft-spool-test-{}-{}-{n}", std::process::id(), now_ms()))
    }

    #[test]
    fn written_entries_read_back_root_only() {
        let root = scratch();
        let dir = root.join("run").join(DIR_NAME);
        let path = write(&dir, &del("c1")).unwrap();
        assert_eq!(std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777, 0o700);
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(read(&path).unwrap(), Some(del("c1")));
        let (found, d) = find(&dir, "weft", "c1", "eth0").unwrap().unwrap();
        assert_eq!((found, d), (path.clone(), del("c1")));
        assert!(find(&dir, "weft", "c1", "eth1").unwrap().is_none());
        assert!(find(&dir, "other", "c1", "eth0").unwrap().is_none());
        // A second DEL of the same attachment replaces the first.
        let mut again = del("c1");
        again.spooled_at_ms = 43;
        assert_eq!(write(&dir, &again).unwrap(), path);
        assert_eq!(list(&dir).unwrap(), vec![path.clone()]);
        assert_eq!(read(&path).unwrap().unwrap().spooled_at_ms, 43);
        remove(&path).unwrap();
        remove(&path).unwrap();
        assert_eq!(count(&dir).unwrap(), 0);
        assert_eq!(read(&path).unwrap(), None);
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn temporary_and_set_aside_files_are_not_entries() {
        let root = scratch();
        let dir = root.join(DIR_NAME);
        let a = write(&dir, &del("a")).unwrap();
        write(&dir, &del("b")).unwrap();
        // A plugin killed between create and rename leaves a temporary file behind.
        std::fs::write(
            dir.join(format!(".{}.1.2.tmp", file_name("weft", "c", "eth0"))),
            b"{half",
        )
        .unwrap();
        std::fs::write(dir.join("README"), b"x").unwrap();
        assert_eq!(count(&dir).unwrap(), 2);
        assert_eq!(
            remove_stale_temporaries(&dir, std::time::Duration::from_secs(60)).unwrap(),
            0,
            "too young"
        );
        assert_eq!(remove_stale_temporaries(&dir, std::time::Duration::ZERO).unwrap(), 1);
        assert!(dir.join("README").exists(), "only temporaries go");
        assert_eq!(count(&dir).unwrap(), 2);
        std::fs::write(&a, b"not json").unwrap();
        assert!(matches!(read(&a), Err(SpoolError::Decode { .. })));
        let aside = set_aside(&a).unwrap();
        assert!(aside.to_str().unwrap().ends_with(BAD_SUFFIX));
        assert_eq!(count(&dir).unwrap(), 1);
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn a_missing_spool_is_empty_and_a_file_in_its_place_is_refused() {
        let root = scratch();
        assert_eq!(count(&root.join(DIR_NAME)).unwrap(), 0);
        std::fs::create_dir_all(&root).unwrap();
        std::fs::write(root.join(DIR_NAME), b"").unwrap();
        assert!(matches!(
            write(&root.join(DIR_NAME), &del("a")),
            Err(SpoolError::NotADirectory(_))
        ));
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn names_are_stable_and_keyed() {
        assert_eq!(file_name("weft", "c1", "eth0"), file_name("weft", "c1", "eth0"));
        assert_ne!(file_name("weft", "c1", "eth0"), file_name("weft", "c1", "eth1"));
        // The separator keeps ("ab","c") and ("a","bc") apart.
        assert_ne!(file_name("ab", "c", "eth0"), file_name("a", "bc", "eth0"));
        assert_eq!(
            dir_for_socket(Path::new("/run/weft/weftd.sock")),
            Path::new("/run/weft/del-spool")
        );
    }
}
