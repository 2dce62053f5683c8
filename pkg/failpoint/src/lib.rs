//! Crash points for tests: `failpoint!("add.veth")` kills weftd on the spot when the
//! environment variable `WEFT_FAILPOINT` names that point, so a test can check what a
//! crash at exactly that step of ADD or DEL leaves behind and that a restart repairs it.
//! Pause points (`pause!`, armed by `WEFT_PAUSE`) hold a process instead, so a test can
//! force an interleaving of weftd and the plugin.
//!
//! - Only in builds with `debug_assertions` (what `cargo build` and `cargo test` make).
//!   In release builds [`hit`] is an empty inline function and every failpoint
//!   compiles to nothing; the variable is never read.
//! - `WEFT_FAILPOINT` is read once; it holds one name or a comma-separated list.
//! - An armed point calls [`std::process::abort`]: no destructor runs, no buffer is
//!   flushed, nothing is logged. That is as close as a process gets to being SIGKILLed
//!   at that instruction; core dumps are switched off first, so a crash test does not
//!   leave one per point.
//! - [`ALL`] lists every point. `failpoint!` refuses (at compile time) a name missing
//!   from it, so the crash test, which iterates over [`ALL`], covers a new point the
//!   moment it is added.
//!
//! Why not the `fail` crate: fail-rs has no abort action (its `panic` unwinds, runs
//! destructors and, inside a tokio task, does not even stop the process), and it is
//! switched on by a cargo feature, which cargo unifies across the build: enabling it
//! from a dev-dependency would compile the failpoints into release binaries too.

/// Every failpoint, in the order a call passes them. The crash test arms each in turn.
///
/// ADD: `add.lock` (the container's lock is held), `add.ipam` (the `creating` row and
/// its addresses are committed), `add.veth` (the veth pair exists), `add.addresses`
/// (addresses set, links up), `add.routes` (routes in place), `add.hostports` (host
/// port map elements added; only for pods with port mappings), `add.commit` (just
/// before the row is marked ready), `add.done` (the row is ready, the answer not sent).
///
/// DEL: `del.lock`, `del.intent` (the row is `deleting`, ports released in the store),
/// `del.hostports` (port map elements removed; only for pods with port mappings),
/// `del.disconnect` (host end down; DEL answers after this), `del.veth` (veth pair
/// removed, row still there), `del.release` (row and addresses gone).
pub const ALL: &[&str] = &[
    "add.lock",
    "add.ipam",
    "add.veth",
    "add.addresses",
    "add.routes",
    "add.hostports",
    "add.commit",
    "add.done",
    "del.lock",
    "del.intent",
    "del.hostports",
    "del.disconnect",
    "del.veth",
    "del.release",
];

/// The environment variable naming the armed failpoints.
pub const ENV: &str = "WEFT_FAILPOINT";

/// Whether `name` is in [`ALL`]; `const` so that [`failpoint!`] checks it at compile time.
pub const fn known(name: &str) -> bool {
    let mut i = 0;
    while i < ALL.len() {
        if eq(ALL[i].as_bytes(), name.as_bytes()) {
            return true;
        }
        i += 1;
    }
    false
}

const fn eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// Whether the value of [`ENV`] (one name or a comma-separated list) arms `name`.
pub fn armed_in(value: &str, name: &str) -> bool {
    value.split(',').any(|n| n.trim() == name)
}

/// Aborts the process if [`ENV`] arms `name`. Prefer [`failpoint!`], which also checks
/// the name against [`ALL`].
#[cfg(debug_assertions)]
#[inline]
pub fn hit(name: &str) {
    static ARMED: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    let armed = ARMED.get_or_init(|| std::env::var(ENV).ok().filter(|v| !v.is_empty()));
    if let Some(value) = armed
        && armed_in(value, name)
    {
        // A crash here is the expected outcome, not a bug to debug: no core file.
        let _ = nix::sys::prctl::set_dumpable(false);
        std::process::abort();
    }
}

/// Release builds: nothing, so failpoints cost nothing.
#[cfg(not(debug_assertions))]
#[inline(always)]
pub fn hit(_name: &str) {}

/// `failpoint!("add.veth")`: aborts weftd here when `WEFT_FAILPOINT` arms the point
/// (debug builds only). The name must be listed in [`ALL`]; a missing one does not compile.
///
/// ```
/// weft_failpoint::failpoint!("add.veth"); // not armed: nothing happens
/// ```
///
/// ```compile_fail
/// weft_failpoint::failpoint!("add.nowhere"); // not in ALL, so no test would arm it
/// ```
#[macro_export]
macro_rules! failpoint {
    ($name:literal) => {{
        const _: () = assert!(
            $crate::known($name),
            concat!("failpoint ", $name, " is not listed in weft_failpoint::ALL")
        );
        $crate::hit($name)
    }};
}

/// Points a test can hold a process at, rather than crash it there, to force an
/// interleaving of two processes: `start.spool_replayed` (weftd has replayed the DEL
/// spool at start and not served yet), `plugin.spool` (the plugin could not reach
/// weftd and is about to write its DEL to the spool). [`pause!`] refuses others.
pub const PAUSES: &[&str] = &["start.spool_replayed", "plugin.spool"];

/// The environment variable arming pause points: `NAME=FILE` (comma-separated for
/// several). An armed point creates `FILE.paused` and waits until `FILE` exists.
pub const PAUSE_ENV: &str = "WEFT_PAUSE";

/// Whether `name` is in [`PAUSES`]; `const` so that [`pause!`] checks it at compile time.
pub const fn known_pause(name: &str) -> bool {
    let mut i = 0;
    while i < PAUSES.len() {
        if eq(PAUSES[i].as_bytes(), name.as_bytes()) {
            return true;
        }
        i += 1;
    }
    false
}

/// The file that releases `name` when the value of [`PAUSE_ENV`] arms it.
pub fn release_file_in(value: &str, name: &str) -> Option<std::path::PathBuf> {
    value.split(',').find_map(|entry| {
        let (n, file) = entry.split_once('=')?;
        (n.trim() == name && !file.trim().is_empty()).then(|| std::path::PathBuf::from(file.trim()))
    })
}

/// Holds the calling thread at `name` when [`PAUSE_ENV`] arms it: says so by creating
/// `FILE.paused`, then waits until the test creates `FILE`. Prefer [`pause!`].
#[cfg(debug_assertions)]
pub fn hold(name: &str) {
    let Ok(value) = std::env::var(PAUSE_ENV) else { return };
    let Some(release) = release_file_in(&value, name) else {
        return;
    };
    let mut paused = release.clone().into_os_string();
    paused.push(".paused");
    let _ = std::fs::write(&paused, name);
    while !release.exists() {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// Release builds: nothing.
#[cfg(not(debug_assertions))]
#[inline(always)]
pub fn hold(_name: &str) {}

/// `pause!("plugin.spool")`: holds the process here while `WEFT_PAUSE` arms the point
/// (debug builds only). The name must be listed in [`PAUSES`].
///
/// ```compile_fail
/// weft_failpoint::pause!("start.nowhere");
/// ```
#[macro_export]
macro_rules! pause {
    ($name:literal) => {{
        const _: () = assert!(
            $crate::known_pause($name),
            concat!("pause point ", $name, " is not listed in weft_failpoint::PAUSES")
        );
        $crate::hold($name)
    }};
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_known() {
        for (i, a) in ALL.iter().enumerate() {
            assert!(known(a));
            assert!(!ALL[i + 1..].contains(a), "{a} listed twice");
        }
        assert!(!known("add"));
        assert!(!known("add.vet"));
        assert!(!known("add.veth2"));
    }

    #[test]
    fn a_pause_is_armed_by_its_name_with_a_release_file() {
        let v = "plugin.spool=/tmp/a, start.spool_replayed=/tmp/b";
        assert_eq!(release_file_in(v, "plugin.spool"), Some("/tmp/a".into()));
        assert_eq!(release_file_in(v, "start.spool_replayed"), Some("/tmp/b".into()));
        assert_eq!(release_file_in(v, "plugin"), None);
        assert_eq!(release_file_in("plugin.spool=", "plugin.spool"), None);
        assert!(PAUSES.iter().all(|p| known_pause(p)) && !known_pause("add.veth"));
    }

    #[test]
    fn a_list_arms_each_of_its_names() {
        assert!(armed_in("add.veth", "add.veth"));
        assert!(armed_in("add.ipam, add.veth", "add.veth"));
        assert!(armed_in("add.ipam,add.veth", "add.ipam"));
        assert!(!armed_in("add.vethx", "add.veth"));
        assert!(!armed_in("", "add.veth"));
    }

    /// Not run on its own: the child process of `an_armed_point_aborts_the_process`.
    #[test]
    #[ignore = "run as a child process by an_armed_point_aborts_the_process"]
    fn child_hits_add_veth() {
        failpoint!("add.ipam");
        failpoint!("add.veth");
        panic!("the failpoint did not abort");
    }

    #[test]
    fn an_armed_point_aborts_the_process() {
        use std::os::unix::process::ExitStatusExt;
        let st = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "tests::child_hits_add_veth",
                "--include-ignored",
                "--nocapture",
            ])
            .env(ENV, "del.veth,add.veth")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .unwrap();
        if cfg!(debug_assertions) {
            assert_eq!(st.signal(), Some(nix::sys::signal::Signal::SIGABRT as i32), "{st}");
        } else {
            // Compiled out: the child runs through and panics.
            assert_eq!(st.code(), Some(101), "{st}");
        }
    }
}
