//! Flow records to a file: one JSON line per ended flow (the record of `weftctl flows -o
//! json`), filtered as the operator asks, rotated by size so the node's disk is never
//! filled: `PATH` is written, `PATH.1` the previous file ... `PATH.KEEP` the oldest kept.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use crate::filter::Filter;
use crate::record::{EndReason, FlowRecord};

/// Where and how much.
#[derive(Debug, Clone)]
pub struct FileExportConfig {
    /// The file written.
    pub path: PathBuf,
    /// Its size at most before it is rotated.
    pub max_bytes: u64,
    /// Rotated files kept besides it.
    pub keep: usize,
    /// Which flows (empty: all).
    pub filter: Filter,
}

/// An open export file.
pub struct FileExport {
    cfg: FileExportConfig,
    file: File,
    written: u64,
    /// Records written since the start.
    pub records: u64,
    /// Rotations since the start.
    pub rotations: u64,
}

fn open(path: &Path) -> io::Result<File> {
    OpenOptions::new().create(true).append(true).open(path)
}

fn rotated(path: &Path, n: usize) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(format!(".{n}"));
    PathBuf::from(s)
}

impl FileExport {
    /// Opens (or creates) the file, appending to what a previous run wrote.
    pub fn open(cfg: FileExportConfig) -> io::Result<Self> {
        if let Some(dir) = cfg.path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        let file = open(&cfg.path)?;
        let written = file.metadata()?.len();
        Ok(FileExport {
            cfg,
            file,
            written,
            records: 0,
            rotations: 0,
        })
    }

    /// Writes `r` when it has ended and the filter wants it; returns whether it did.
    pub fn write(&mut self, r: &FlowRecord) -> io::Result<bool> {
        if r.end == EndReason::Open || !self.cfg.filter.matches(r) {
            return Ok(false);
        }
        let mut line = serde_json::to_vec(r).map_err(io::Error::other)?;
        line.push(b'\n');
        if self.written > 0 && self.written + line.len() as u64 > self.cfg.max_bytes {
            self.rotate()?;
        }
        self.file.write_all(&line)?;
        self.written += line.len() as u64;
        self.records += 1;
        Ok(true)
    }

    /// `PATH.KEEP` goes, each `PATH.N` becomes `PATH.N+1`, `PATH` becomes `PATH.1`, and a
    /// new `PATH` is opened (with `keep` 0 the file is only truncated).
    fn rotate(&mut self) -> io::Result<()> {
        let path = &self.cfg.path;
        if self.cfg.keep == 0 {
            self.file = OpenOptions::new().write(true).truncate(true).open(path)?;
        } else {
            let _ = std::fs::remove_file(rotated(path, self.cfg.keep));
            for n in (1..self.cfg.keep).rev() {
                let from = rotated(path, n);
                if from.exists() {
                    std::fs::rename(&from, rotated(path, n + 1))?;
                }
            }
            std::fs::rename(path, rotated(path, 1))?;
            self.file = open(path)?;
        }
        self.written = 0;
        self.rotations += 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{Counters, FlowKind, Peer, PeerKind, Verdict};

    fn record(id: u64, verdict: Verdict, end: EndReason) -> FlowRecord {
        let pod = |name: &str, ip: &str| Peer {
            ip: ip.parse().unwrap(),
            port: 80,
            kind: PeerKind::Pod,
            namespace: "x".into(),
            pod: name.into(),
            workload: "".into(),
            node: "n1".into(),
        };
        FlowRecord {
            id,
            node: "n1".into(),
            start_ms: 1,
            end_ms: Some(2),
            updated_ms: 2,
            src: pod("a", "10.244.1.2"),
            dst: pod("b", "10.244.1.3"),
            dialled: None,
            protocol: 6,
            icmp: None,
            kind: FlowKind::IntraNode,
            verdict,
            policies: Vec::new().into(),
            staged: None,
            forward: Counters::default(),
            reverse: Counters::default(),
            end,
        }
    }

    #[test]
    fn ended_flows_the_filter_wants_as_json_lines_rotated_by_size() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("flows").join("flows.jsonl");
        let line_len = serde_json::to_vec(&record(10, Verdict::Denied, EndReason::Denied))
            .unwrap()
            .len()
            + 1;
        let mut filter = Filter::default();
        filter.add("verdict=denied").unwrap();
        let mut e = FileExport::open(FileExportConfig {
            path: path.clone(),
            max_bytes: (line_len * 3) as u64,
            keep: 2,
            filter,
        })
        .unwrap();
        assert!(
            !e.write(&record(1, Verdict::Forwarded, EndReason::Fin)).unwrap(),
            "not asked for"
        );
        assert!(
            !e.write(&record(2, Verdict::Denied, EndReason::Open)).unwrap(),
            "not ended"
        );
        for id in 10..20 {
            assert!(e.write(&record(id, Verdict::Denied, EndReason::Denied)).unwrap());
        }
        // 10 lines, 3 a file: 10-12, 13-15 rotated away ... the newest file holds 19.
        let ids = |p: &Path| -> Vec<u64> {
            std::fs::read_to_string(p)
                .unwrap()
                .lines()
                .map(|l| serde_json::from_str::<FlowRecord>(l).unwrap().id)
                .collect()
        };
        assert_eq!(ids(&path), vec![19]);
        assert_eq!(ids(&rotated(&path, 1)), vec![16, 17, 18]);
        assert_eq!(ids(&rotated(&path, 2)), vec![13, 14, 15]);
        assert!(!rotated(&path, 3).exists(), "only two kept");
        assert_eq!((e.records, e.rotations), (10, 3));
        // A restart appends to what is there.
        drop(e);
        let mut e = FileExport::open(FileExportConfig {
            path: path.clone(),
            max_bytes: (line_len * 3) as u64,
            keep: 2,
            filter: Filter::default(),
        })
        .unwrap();
        e.write(&record(20, Verdict::Forwarded, EndReason::Fin)).unwrap();
        assert_eq!(ids(&path), vec![19, 20]);
    }
}
