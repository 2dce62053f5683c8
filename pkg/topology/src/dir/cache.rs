//! Parsed files kept until they change: a file is read again only when its identity,
//! size or timestamps differ, and never trusted from the cache while its timestamps are
//! too recent to tell two versions apart.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use super::manifest::FileObjects;
use crate::TopologyStatus;

/// A file changed less than this long before it was read may change again with the same
/// size and timestamps (timestamps come from a coarse clock), so it is never trusted from
/// the cache.
const RACY: Duration = Duration::from_secs(1);

#[derive(Default)]
pub(super) struct Cache {
    /// Each file's objects, shared (a reload of unchanged files copies nothing).
    pub(super) objects: HashMap<PathBuf, Cached<std::sync::Arc<FileObjects>>>,
    pub(super) statuses: HashMap<PathBuf, Cached<Result<TopologyStatus, String>>>,
    /// Each Topology served with its status: the file's object, the status, and what
    /// was served, reused while both are the same (so a reload costs a comparison of
    /// statuses, not a copy and a deep comparison of every Topology).
    pub(super) served: HashMap<(String, String), ServedTopology>,
    /// What the files held at the last load, merged (`None` before the first).
    pub(super) merged: Option<super::merge::Merged>,
}

impl Cache {
    /// Topology `base` as served with `status` (`None`: as its file has it): the `Arc`
    /// served before when both are unchanged, so holders can compare pointers.
    pub(super) fn with_status(
        &mut self,
        key: &(String, String),
        base: std::sync::Arc<crate::Topology>,
        status: Option<TopologyStatus>,
    ) -> std::sync::Arc<crate::Topology> {
        let old = self.served.remove(key);
        let Some(status) = status else { return base };
        let with_status = match old.filter(|o| std::sync::Arc::ptr_eq(&o.base, &base) && o.status == status) {
            Some(o) => o.with_status,
            None => std::sync::Arc::new(crate::Topology {
                status: Some(status.clone()),
                ..(*base).clone()
            }),
        };
        self.served.insert(
            key.clone(),
            ServedTopology {
                base,
                status,
                with_status: with_status.clone(),
            },
        );
        with_status
    }
}

/// A Topology as served: the file's object and the status it was given.
pub(super) struct ServedTopology {
    pub(super) base: std::sync::Arc<crate::Topology>,
    pub(super) status: TopologyStatus,
    pub(super) with_status: std::sync::Arc<crate::Topology>,
}

pub(super) struct Cached<T> {
    stamp: Stamp,
    trusted: bool,
    value: T,
    /// What the file held when parsed, kept while it is not trusted: read again and
    /// found the same, its value is the one parsed before, without parsing again (a
    /// lab's one topology file of thousands of pods is read by every daemon within a
    /// second of its write, and parsing it takes a good part of that second).
    bytes: Option<Vec<u8>>,
}

/// What identifies a file's version without reading it.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    len: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl Stamp {
    fn of(m: &std::fs::Metadata) -> Self {
        Stamp {
            dev: m.dev(),
            ino: m.ino(),
            len: m.len(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
        }
    }

    /// Whether the file was last changed long enough ago that an equal stamp later means
    /// equal content.
    fn settled(&self, now: SystemTime) -> bool {
        let latest = self.mtime.max(self.ctime);
        let changed = if latest.0 >= 0 {
            SystemTime::UNIX_EPOCH + Duration::new(latest.0 as u64, latest.1.clamp(0, 999_999_999) as u32)
        } else {
            SystemTime::UNIX_EPOCH
        };
        now.duration_since(changed).is_ok_and(|age| age >= RACY)
    }
}

/// Returns the cached value for `path` if the file has not changed, else parses it.
pub(super) fn cached<T: Clone + PartialEq>(
    cache: &mut HashMap<PathBuf, Cached<T>>,
    path: &Path,
    meta: &std::fs::Metadata,
    now: SystemTime,
    parse: impl FnOnce(&[u8]) -> T,
) -> Result<T, String> {
    let stamp = Stamp::of(meta);
    if let Some(c) = cache.get(path)
        && c.trusted
        && c.stamp == stamp
    {
        return Ok(c.value.clone());
    }
    let bytes = std::fs::read(path).map_err(|e| e.to_string())?;
    // Read again but unchanged (a file not trusted yet, its timestamps too recent): the
    // value read before, so what it shares (objects behind `Arc`s) stays the same and
    // whoever holds it sees nothing changed.
    let value = match cache.get(path) {
        Some(c) if c.bytes.as_deref() == Some(bytes.as_slice()) => c.value.clone(),
        Some(c) => {
            let value = parse(&bytes);
            if c.value == value { c.value.clone() } else { value }
        }
        None => parse(&bytes),
    };
    let trusted = stamp.settled(now);
    cache.insert(
        path.to_path_buf(),
        Cached {
            stamp,
            trusted,
            value: value.clone(),
            bytes: (!trusted).then_some(bytes),
        },
    );
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    #[test]
    fn a_recent_file_read_again_unchanged_is_not_parsed_again() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.yaml");
        let parses = Cell::new(0);
        let parse = |b: &[u8]| {
            parses.set(parses.get() + 1);
            String::from_utf8_lossy(b).into_owned()
        };
        let mut cache = HashMap::new();
        let read_at = |cache: &mut HashMap<PathBuf, Cached<String>>, now: SystemTime| {
            let m = std::fs::metadata(&path).unwrap();
            cached(cache, &path, &m, now, parse).unwrap()
        };
        let read = |cache: &mut HashMap<PathBuf, Cached<String>>| read_at(cache, SystemTime::now());
        std::fs::write(&path, "a: 1").unwrap();
        assert_eq!(read(&mut cache), "a: 1");
        // Too recent to trust: read again, found the same, not parsed.
        assert_eq!(read(&mut cache), "a: 1");
        assert_eq!(parses.get(), 1);
        // Changed within the same second, same length: parsed.
        std::fs::write(&path, "a: 2").unwrap();
        assert_eq!(read(&mut cache), "a: 2");
        assert_eq!(parses.get(), 2);
        // Read when old enough to trust: not parsed, and from then on served from the
        // cache alone.
        let later = SystemTime::now() + RACY * 2;
        assert_eq!(read_at(&mut cache, later), "a: 2");
        assert!(cache[&path].trusted && cache[&path].bytes.is_none());
        assert_eq!(read_at(&mut cache, later), "a: 2");
        assert_eq!(parses.get(), 2);
    }
}
