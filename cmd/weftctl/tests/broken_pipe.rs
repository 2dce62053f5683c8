//! `weftctl ... | head`: when the reader of its output goes away, weftctl ends quietly
//! instead of panicking with a backtrace.

use std::process::{Command, Stdio};

#[test]
fn a_reader_gone_ends_weftctl_quietly() {
    let (reader, writer) = std::io::pipe().expect("a pipe");
    // The reader is gone before the first line is written: every write fails with
    // EPIPE (Rust programs ignore SIGPIPE).
    drop(reader);
    let out = Command::new(env!("CARGO_BIN_EXE_weftctl"))
        .arg("crds")
        .stdout(writer)
        .stderr(Stdio::piped())
        .output()
        .expect("weftctl runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "weftctl failed: {:?}\n{stderr}", out.status);
    assert!(stderr.is_empty(), "weftctl complained: {stderr}");
}
