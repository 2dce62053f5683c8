//! The kernel's neighbour tables are one per machine, not one per network namespace:
//! every ARP and NDP entry of every namespace counts against the init namespace's
//! `gc_thresh3` (1,024 by default). A lab of 1,500 links resolves over 3,000 link-end
//! neighbours plus the pod network's, on one kernel where a cluster would spread them
//! over its nodes: past the limit the kernel drops new entries ("neighbor table
//! overflow!") and links answer only now and then. So `lab up` raises the thresholds
//! to what its labs need (never lowers them), and the last lab's `down` puts back
//! what was there before. Each lab's need is a file under [`DIR`], so labs
//! running side by side do not undo each other's.

use std::fs;
use std::path::{Path, PathBuf};

use crate::LabError;

/// Where each running lab records how many neighbour entries it needs, and the
/// thresholds found before the first lab raised them.
pub const DIR: &str = "/run/weft-lab-neigh";

const FAMILIES: [&str; 2] = ["ipv4", "ipv6"];
const KNOBS: [&str; 3] = ["gc_thresh1", "gc_thresh2", "gc_thresh3"];

fn knob(family: &str, name: &str) -> PathBuf {
    Path::new("/proc/sys/net").join(family).join("neigh/default").join(name)
}

fn read(path: &Path) -> Option<u64> {
    fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// The neighbour entries a lab of `links` links and `pods` pods may hold at once: an
/// entry per link end, and per pod a few on `eth0` (its gateway; its node's entry for
/// it; the checks' traffic), with room for the IPv6 ones the link-local addresses make.
pub fn need(links: usize, pods: usize, nodes: usize) -> u64 {
    (2 * links + 4 * pods + 16 * nodes + 256) as u64
}

fn io(what: &str, e: std::io::Error) -> LabError {
    LabError::io(what.to_string(), e)
}

/// The file recording lab `key`'s need.
fn entry(key: &str) -> PathBuf {
    // The key is a state directory: a path, flattened into one file name.
    Path::new(DIR).join(key.trim_start_matches('/').replace('/', "_"))
}

/// Records that lab `key` needs `n` entries and raises the thresholds to cover every
/// running lab's needs together.
pub fn reserve(key: &str, n: u64) -> Result<(), LabError> {
    fs::create_dir_all(DIR).map_err(|e| io("creating the neighbour-table records", e))?;
    let original = Path::new(DIR).join(".original");
    if !original.exists() {
        let mut text = String::new();
        for f in FAMILIES {
            for k in KNOBS {
                if let Some(v) = read(&knob(f, k)) {
                    text.push_str(&format!("{f} {k} {v}\n"));
                }
            }
        }
        fs::write(&original, text).map_err(|e| io("recording the neighbour thresholds", e))?;
    }
    fs::write(entry(key), n.to_string()).map_err(|e| io("recording the lab's neighbour need", e))?;
    apply()
}

/// Forgets lab `key`'s need; once no lab is left, puts the original thresholds back.
pub fn release(key: &str) -> Result<(), LabError> {
    let _ = fs::remove_file(entry(key));
    let left = fs::read_dir(DIR)
        .map(|d| {
            d.flatten()
                .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
                .count()
        })
        .unwrap_or(0);
    if left > 0 {
        return Ok(());
    }
    let original = Path::new(DIR).join(".original");
    if let Ok(text) = fs::read_to_string(&original) {
        for line in text.lines() {
            let parts: Vec<&str> = line.split_whitespace().collect();
            if let [f, k, v] = parts[..] {
                let _ = fs::write(knob(f, k), v);
            }
        }
    }
    let _ = fs::remove_dir_all(DIR);
    Ok(())
}

/// Sets each threshold to at least what the running labs need together (on top of
/// the original value, which the rest of the machine was using).
fn apply() -> Result<(), LabError> {
    let total: u64 = fs::read_dir(DIR)
        .map_err(|e| io("reading the neighbour-table records", e))?
        .flatten()
        .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
        .filter_map(|e| read(&e.path()))
        .sum();
    let original = fs::read_to_string(Path::new(DIR).join(".original")).unwrap_or_default();
    for f in FAMILIES {
        for (k, factor) in KNOBS.into_iter().zip([0u64, 1, 2]) {
            let base = original
                .lines()
                .find_map(|l| l.strip_prefix(&format!("{f} {k} ")))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0u64);
            // gc_thresh1 (below which nothing is collected) stays; gc_thresh2 (soft)
            // gets the need, gc_thresh3 (hard) twice that: headroom for stale
            // entries the collector has not reached yet.
            let want = base + total * factor;
            let path = knob(f, k);
            if factor > 0 && read(&path).is_some_and(|cur| cur < want) {
                fs::write(&path, want.to_string()).map_err(|e| io("raising the neighbour-table thresholds", e))?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_1500_link_lab_needs_more_than_the_default_table() {
        assert!(super::need(1500, 500, 3) > 1024);
        assert_eq!(super::entry("/run/weft-lab/x").file_name().unwrap(), "run_weft-lab_x");
    }
}
