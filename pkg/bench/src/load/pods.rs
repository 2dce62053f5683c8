//! The load benchmark's pod namespaces: made and removed from a few threads, and what links
//! each holds.

use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

use weft_harness::{HarnessError, NamedNetns};

use crate::lab;

/// Creates `n` pod namespaces from a few threads (each `ip netns add` is a couple of
/// processes and a mount; a thousand of them one by one take a while).
pub(crate) fn create_pods(tag: &str, n: usize) -> Result<Vec<NamedNetns>, String> {
    let next = AtomicUsize::new(0);
    let mut made: Vec<(usize, Result<NamedNetns, HarnessError>)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|_| {
                s.spawn(|| {
                    let mut mine = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= n {
                            return mine;
                        }
                        mine.push((i, NamedNetns::create(&format!("{tag}-p{i}"))));
                    }
                })
            })
            .collect();
        handles.into_iter().flat_map(|h| h.join().unwrap_or_default()).collect()
    });
    made.sort_by_key(|(i, _)| *i);
    // On an error the namespaces made so far are dropped, which deletes them.
    made.into_iter().map(|(_, r)| r.map_err(lab)).collect()
}

/// Deletes the pod namespaces from a few threads.
pub(crate) fn remove_pods(pods: Vec<NamedNetns>) {
    let mut chunks: Vec<Vec<NamedNetns>> = (0..4).map(|_| Vec::new()).collect();
    for (i, p) in pods.into_iter().enumerate() {
        chunks[i % 4].push(p);
    }
    std::thread::scope(|s| {
        for c in chunks {
            s.spawn(move || drop(c));
        }
    });
}

/// Interfaces in namespace `ns` other than `lo`.
pub(super) fn links_besides_lo(ns: &str) -> Result<usize, String> {
    let out = Command::new("ip")
        .args(["-n", ns, "-o", "link", "show"])
        .output()
        .map_err(|e| format!("running ip: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "listing links in {ns}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.split(':').nth(1).is_some_and(|name| name.trim() != "lo"))
        .count())
}
