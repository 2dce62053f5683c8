//! sysctls under `/proc/sys`. Entries under `net/` belong to the network namespace of
//! the thread that opens them, so these functions act on the caller's namespace.

use std::io::Write;

use crate::KernelError;

/// Writes `value` to `/proc/sys/<key>` (key with `/` separators).
pub fn write(key: &str, value: &str) -> Result<(), KernelError> {
    let path = format!("/proc/sys/{key}");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .map_err(|e| KernelError::os(format!("opening {path}"), e))?;
    f.write_all(value.as_bytes())
        .map_err(|e| KernelError::os(format!("writing {path}"), e))
}

/// Reads `/proc/sys/<key>`, trimmed.
pub fn read(key: &str) -> Result<String, KernelError> {
    let path = format!("/proc/sys/{key}");
    std::fs::read_to_string(&path)
        .map(|s| s.trim().to_string())
        .map_err(|e| KernelError::os(format!("reading {path}"), e))
}
