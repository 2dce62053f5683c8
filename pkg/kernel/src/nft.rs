//! Running `nft` (package nftables) for what it does best: a whole table, or a batch of
//! set changes, in one atomic transaction, and the table read back as JSON. The per-pod
//! hot path (host port map elements) writes nfnetlink itself; this is for the rest.

use std::io::Write;
use std::process::{Command, Stdio};

/// Runs `nft ARGS` with `stdin` as its input (for `-f -`) and returns what it printed;
/// the error is nft's own message (or why it could not be run).
pub fn run(args: &[&str], stdin: Option<&str>) -> Result<String, String> {
    let mut child = Command::new("nft")
        .args(args)
        .stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("running nft (package nftables): {e}"))?;
    if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(input.as_bytes()).map_err(|e| e.to_string())?;
    }
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
    }
}
