//! Child processes: running a command for its output, and guarding one that must not
//! outlive its owner.

use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

use crate::HarnessError;

/// Runs `cmd` to completion; its stdout when it succeeds, else an error carrying its
/// stderr under the name `what`.
pub fn run(cmd: &mut Command, what: &str) -> Result<String, HarnessError> {
    let out = cmd.output().map_err(|e| HarnessError::io(what, e))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(HarnessError::Command {
            what: what.into(),
            detail: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        })
    }
}

/// Runs `ip args`; its stdout.
pub fn ip(args: &[&str]) -> Result<String, HarnessError> {
    run(Command::new("ip").args(args), &format!("ip {}", args.join(" ")))
}

/// Waits up to `limit` for `child` to exit and reaps it; `None` when it still runs.
pub fn wait_exit(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + limit;
    loop {
        if let Ok(Some(st)) = child.try_wait() {
            return Some(st);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A child process killed and reaped on drop, so an error or a panic in the middle of a
/// test or a measurement leaves nothing running.
#[derive(Debug)]
pub struct ChildGuard(Option<Child>);

impl ChildGuard {
    /// Guards `child`.
    pub fn new(child: Child) -> Self {
        Self(Some(child))
    }

    /// The child's pid (0 once it has been taken).
    pub fn pid(&self) -> u32 {
        self.0.as_ref().map_or(0, Child::id)
    }

    /// Waits for the child until `limit`: how it ended, or `None` (it is killed then).
    pub fn wait_within(&mut self, limit: Duration) -> Option<ExitStatus> {
        let child = self.0.as_mut()?;
        let status = wait_exit(child, limit);
        if status.is_none() {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.0 = None;
        status
    }

    /// Waits for the child until `limit`, then kills it; its stdout (when piped).
    pub fn output_within(mut self, limit: Duration) -> Result<Vec<u8>, HarnessError> {
        let Some(mut child) = self.0.take() else {
            return Err(HarnessError::Command {
                what: "waiting for a child".into(),
                detail: "it was already taken".into(),
            });
        };
        if wait_exit(&mut child, limit).is_none() {
            let _ = child.kill();
            let _ = child.wait();
            return Err(HarnessError::TimedOut {
                what: format!("process {}", child.id()),
                limit,
            });
        }
        let mut out = Vec::new();
        if let Some(mut s) = child.stdout.take() {
            let _ = std::io::Read::read_to_end(&mut s, &mut out);
        }
        Ok(out)
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
