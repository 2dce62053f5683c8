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

/// Makes `/proc/sys/<key>` hold `value`, writing only when it holds something else. A
/// read is cheap where a write may not be: IPv6's per-interface settings take the RTNL
/// lock on write and, when another thread holds it, have the syscall restart until it
/// is free, so on a busy node a write that changes nothing costs a wait on every
/// netlink call in flight.
pub fn ensure(key: &str, value: &str) -> Result<(), KernelError> {
    if read(key).is_ok_and(|v| v == value.trim()) {
        return Ok(());
    }
    write(key, value)
}

/// Reads `/proc/sys/<key>`, trimmed.
pub fn read(key: &str) -> Result<String, KernelError> {
    let path = format!("/proc/sys/{key}");
    std::fs::read_to_string(&path)
        .map(|s| s.trim().to_string())
        .map_err(|e| KernelError::os(format!("reading {path}"), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `ensure` writes only what differs: a setting nobody may write (`kernel/ostype`,
    /// read-only even for root) is fine when it holds the value already and fails when
    /// it does not, which shows a write was tried then and only then.
    #[test]
    fn ensure_writes_only_a_value_that_differs() {
        let now = read("kernel/ostype").expect("kernel/ostype is readable");
        ensure("kernel/ostype", &now).expect("the value it holds: nothing written");
        ensure("kernel/ostype", &format!("{now}\n")).expect("compared as a trimmed line");
        let e = ensure("kernel/ostype", "not-an-os").expect_err("another value is written, and refused");
        assert!(e.to_string().contains("kernel/ostype"), "{e}");
    }
}
