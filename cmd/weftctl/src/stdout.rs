//! Standard output that tolerates a reader going away: `weftctl ... | head` must end
//! quietly, not with a panic and a backtrace.

use std::io::{ErrorKind, Write};

/// Writes `args` to standard output; exits the process with success when the reader
/// has gone (nothing more can be shown to anyone), panics on any other failure as
/// `print!` does.
pub fn write(args: std::fmt::Arguments<'_>) {
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_fmt(args).and_then(|()| out.flush()) {
        quiet_on_broken_pipe(&e);
        panic!("failed printing to stdout: {e}");
    }
}

/// Ends the process with success when `e` says the reader of standard output has
/// gone; returns otherwise.
pub fn quiet_on_broken_pipe(e: &std::io::Error) {
    if e.kind() == ErrorKind::BrokenPipe {
        std::process::exit(0);
    }
}
