//! Child processes that must not share the caller's session: a daemon under test
//! stays up when the terminal that started the tests goes, and a signal sent to the
//! test's process group does not reach it.

use std::os::unix::process::CommandExt;
use std::process::Command;

/// Makes `cmd`'s child start a session of its own (setsid(2)) before it runs.
pub fn own_session(cmd: &mut Command) {
    // SAFETY: the closure runs in the forked child before exec and only calls
    // setsid(2), which is async-signal-safe; it allocates nothing and takes no lock.
    unsafe {
        cmd.pre_exec(|| {
            nix::unistd::setsid().map_err(std::io::Error::from)?;
            Ok(())
        });
    }
}
