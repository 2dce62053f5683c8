//! Telling a damaged database file from a sound one before opening it, and moving a
//! damaged one aside (kept for people to look at) so weftd starts on a fresh one.

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use rusqlite::{Connection, OpenFlags};

use crate::StoreError;

/// A database file found damaged and moved aside.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MovedAside {
    /// Where the file is now (`<path>.corrupt-<unix seconds>`).
    pub to: PathBuf,
    /// What was wrong with it.
    pub reason: String,
}

/// Why the file at `path` is not a sound SQLite database, or `None` when it is (or
/// does not exist). Only SQLite's own verdict counts: the file cannot be read as a
/// database, or `PRAGMA quick_check` finds damage.
pub fn damage(path: &Path) -> Option<String> {
    if !path.exists() {
        return None;
    }
    let conn = match Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY) {
        Ok(c) => c,
        Err(e) => return Some(e.to_string()),
    };
    let mut stmt = match conn.prepare("PRAGMA quick_check") {
        Ok(s) => s,
        Err(e) => return Some(e.to_string()),
    };
    let rows: Result<Vec<String>, _> = stmt.query_map([], |r| r.get::<_, String>(0)).and_then(|r| r.collect());
    match rows {
        Ok(rows) if rows == ["ok"] => None,
        Ok(rows) => Some(format!("quick_check: {}", rows.join("; "))),
        Err(e) => Some(e.to_string()),
    }
}

/// Moves the database at `path` aside when it is damaged, with its `-wal` and `-shm`
/// files (a write-ahead log must never be replayed onto another database). Returns
/// what it moved, or `None` when the file is sound or absent.
pub fn move_aside_if_damaged(path: &Path) -> Result<Option<MovedAside>, StoreError> {
    let Some(reason) = damage(path) else {
        return Ok(None);
    };
    let secs = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let to = PathBuf::from(format!("{}.corrupt-{secs}", path.display()));
    let failed = |source| StoreError::MoveAside {
        path: path.to_path_buf(),
        source,
    };
    // The logs first: a log left beside a fresh database would be replayed onto it.
    for suffix in ["-wal", "-shm"] {
        let side = PathBuf::from(format!("{}{suffix}", path.display()));
        if side.exists() {
            std::fs::rename(&side, format!("{}{suffix}", to.display())).map_err(failed)?;
        }
    }
    std::fs::rename(path, &to).map_err(failed)?;
    Ok(Some(MovedAside { to, reason }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_garbage_file_is_moved_aside_and_a_sound_one_is_left() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("weft.db");
        assert_eq!(move_aside_if_damaged(&path).unwrap(), None, "absent: nothing to do");

        crate::Db::open(&path).unwrap();
        assert_eq!(damage(&path), None);
        assert_eq!(move_aside_if_damaged(&path).unwrap(), None);
        assert!(path.exists());

        std::fs::write(&path, vec![0x5a; 8192]).unwrap();
        std::fs::write(dir.path().join("weft.db-wal"), b"old log").unwrap();
        let moved = move_aside_if_damaged(&path).unwrap().expect("garbage is moved aside");
        assert!(!path.exists());
        assert!(!dir.path().join("weft.db-wal").exists(), "its log goes with it");
        assert_eq!(std::fs::read(&moved.to).unwrap(), vec![0x5a; 8192], "kept as it was");
        assert!(
            moved.to.to_str().unwrap().contains("weft.db.corrupt-"),
            "{}",
            moved.to.display()
        );
        assert!(moved.reason.contains("not a database"), "{}", moved.reason);
        // A fresh database opens in its place.
        assert_eq!(crate::Db::open(&path).unwrap().schema_found(), 0);
    }

    #[test]
    fn a_database_with_damaged_pages_is_found_damaged() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("weft.db");
        {
            let c = Connection::open(&path).unwrap();
            c.execute_batch(
                "CREATE TABLE t (x TEXT); CREATE INDEX t_x ON t(x);
                 WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 2000)
                 INSERT INTO t SELECT printf('row %d', i) FROM n;",
            )
            .unwrap();
        }
        // Scribble over every page but the first (the header stays valid).
        let mut bytes = std::fs::read(&path).unwrap();
        let page = 4096;
        for b in bytes.iter_mut().skip(page) {
            *b = 0xa5;
        }
        std::fs::write(&path, bytes).unwrap();
        assert!(damage(&path).is_some());
    }
}
