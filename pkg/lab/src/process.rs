//! Whether a lab's daemon still runs: a pid alone is not enough, so its start time is
//! recorded beside it (`/proc/<pid>/stat`).

use std::fs;

/// A process's state letter and start time (in clock ticks since boot), from
/// `/proc/<pid>/stat`; the start time tells a process from a later one with its pid.
pub(crate) fn proc_stat(pid: u32) -> Option<(char, u64)> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: fields follow the last ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    Some((fields.first()?.chars().next()?, fields.get(19)?.parse().ok()?))
}

/// Whether the process recorded as `pid` (started at `started`) still runs. Its command
/// line is no help: between fork and exec the child still shows its parent's.
pub(crate) fn alive(pid: u32, started: u64) -> bool {
    proc_stat(pid).is_some_and(|(state, start)| start == started && state != 'Z' && state != 'X')
}
