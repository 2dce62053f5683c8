//! The multi-node lab end to end (`weftctl lab`): one test binary, one module per area.
//! Labs share names, namespaces and the machine's two cores, so the tests of this
//! binary take [`one_lab`] first and run one at a time, as they did when each area was a
//! binary of its own.

use std::sync::{Mutex, MutexGuard};

mod basics;
mod bgp;
mod capture;
mod crash;
mod edges;
mod graph;
mod impair;
mod scale;

static ONE_LAB: Mutex<()> = Mutex::new(());

/// Held for a test's whole run: no other lab test runs meanwhile. A test that failed
/// while holding it does not stop the others.
pub(crate) fn one_lab() -> MutexGuard<'static, ()> {
    ONE_LAB.lock().unwrap_or_else(|e| e.into_inner())
}
