//! The kernel settings weftd changes: IP forwarding (always) and `route_localnet`
//! (only with `--hostports-localhost`). Before its first change of each, weftd records
//! the value it found in the store, so a later start that no longer needs a setting
//! puts it back, even after a crash, and `weftd uninstall` can put every one back.
//!
//! What to do about one setting is decided by [`decide`], a pure function of whether
//! weftd needs it, its value now and the value remembered; [`Sysctls`] is the narrow
//! seam to the kernel and the store it is applied through.

use tracing::{info, warn};
use weft_kernel::KernelError;
use weft_store::{Store, StoreError};

/// `net.ipv4.conf.all.route_localnet`.
pub const ROUTE_LOCALNET: &str = weft_portmap::ROUTE_LOCALNET;

/// IPv4 forwarding.
pub const IPV4_FORWARDING: &str = "net/ipv4/ip_forward";

/// IPv6 forwarding (absent on a kernel without IPv6).
pub const IPV6_FORWARDING: &str = "net/ipv6/conf/all/forwarding";

/// What to do about one setting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Leave it: it is as needed, and nothing weft changed is waiting to go back.
    Leave,
    /// Record `original`, then turn it on (the record first: a crash between the two
    /// must not lose what the node had).
    RememberAndEnable {
        /// The value found.
        original: String,
    },
    /// Turn it on; what the node had is recorded already.
    Enable,
    /// Put `original` back, then forget it.
    Restore {
        /// The value weft found before its first change.
        original: String,
    },
    /// Forget the record: the setting holds its original value already.
    Forget,
}

/// Decides what to do about a setting weftd needs on (`needed`) or not, holding
/// `current`, with `remembered` the value recorded before weft's first change (if it
/// made one). A setting found on that weft never changed is left as it is.
pub fn decide(needed: bool, current: &str, remembered: Option<&str>) -> Step {
    match (needed, remembered) {
        (true, _) if current == "1" => Step::Leave,
        (true, None) => Step::RememberAndEnable {
            original: current.to_string(),
        },
        (true, Some(_)) => Step::Enable,
        (false, Some(original)) if original != current => Step::Restore {
            original: original.to_string(),
        },
        (false, Some(_)) => Step::Forget,
        (false, None) => Step::Leave,
    }
}

/// Why a setting could not be settled.
#[derive(Debug, thiserror::Error)]
pub enum SysctlError {
    /// The kernel refused a read or a write.
    #[error(transparent)]
    Kernel(#[from] KernelError),
    /// The store could not record or forget a value.
    #[error("recording the original value of a sysctl: {0}")]
    Store(#[from] StoreError),
}

/// The kernel and the store, as far as settling sysctls needs them.
pub trait Sysctls {
    /// The setting's value now.
    fn read(&mut self, name: &str) -> Result<String, KernelError>;
    /// Sets it.
    fn write(&mut self, name: &str, value: &str) -> Result<(), KernelError>;
    /// The value recorded before weft's first change.
    fn remembered(&mut self, name: &str) -> Result<Option<String>, StoreError>;
    /// Records the value found before weft's first change.
    fn remember(&mut self, name: &str, original: &str) -> Result<(), StoreError>;
    /// Forgets the record.
    fn forget(&mut self, name: &str) -> Result<(), StoreError>;
}

/// [`Sysctls`] on this namespace's kernel and the node's store (blocking: call it on
/// the blocking pool or before the runtime serves).
pub struct HostSysctls(pub Store);

impl Sysctls for HostSysctls {
    fn read(&mut self, name: &str) -> Result<String, KernelError> {
        weft_kernel::sysctl::read(name)
    }
    fn write(&mut self, name: &str, value: &str) -> Result<(), KernelError> {
        weft_kernel::sysctl::write(name, value)
    }
    fn remembered(&mut self, name: &str) -> Result<Option<String>, StoreError> {
        let name = name.to_string();
        self.0.run_blocking(move |db| db.remembered_sysctl(&name))
    }
    fn remember(&mut self, name: &str, original: &str) -> Result<(), StoreError> {
        let (name, original) = (name.to_string(), original.to_string());
        self.0.run_blocking(move |db| db.remember_sysctl(&name, &original))
    }
    fn forget(&mut self, name: &str) -> Result<(), StoreError> {
        let name = name.to_string();
        self.0.run_blocking(move |db| db.forget_sysctl(&name))
    }
}

/// Settles setting `name`: on when `needed` (recording the value found first), else
/// back to what weft found. Returns the step taken.
pub fn settle(k: &mut impl Sysctls, name: &str, needed: bool) -> Result<Step, SysctlError> {
    let current = k.read(name)?;
    let step = decide(needed, &current, k.remembered(name)?.as_deref());
    match &step {
        Step::Leave => {}
        Step::RememberAndEnable { original } => {
            k.remember(name, original)?;
            k.write(name, "1")?;
            info!(sysctl = name, was = %original, "turned on (the value found is kept to put back)");
        }
        Step::Enable => {
            k.write(name, "1")?;
            info!(sysctl = name, "turned on again");
        }
        Step::Restore { original } => {
            k.write(name, original)?;
            k.forget(name)?;
            info!(sysctl = name, value = %original, "no longer needed: put back as weft found it");
        }
        Step::Forget => k.forget(name)?,
    }
    Ok(step)
}

/// Puts back every setting weft changed (`weftd uninstall`). Returns the names put
/// back; one that cannot be is reported and the rest go on.
pub fn restore_all(k: &mut impl Sysctls, names: &[String]) -> Vec<String> {
    let mut done = Vec::new();
    for name in names {
        match settle(k, name, false) {
            Ok(Step::Restore { .. }) => done.push(name.clone()),
            Ok(_) => {}
            Err(e) => warn!(sysctl = %name, error = %e, "could not put the setting back"),
        }
    }
    done
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    #[test]
    fn decisions() {
        assert_eq!(
            decide(true, "0", None),
            Step::RememberAndEnable { original: "0".into() }
        );
        assert_eq!(decide(true, "1", None), Step::Leave, "found on: not weft's to put back");
        assert_eq!(decide(true, "1", Some("0")), Step::Leave);
        assert_eq!(decide(true, "0", Some("0")), Step::Enable, "a crash after the record");
        assert_eq!(decide(false, "1", Some("0")), Step::Restore { original: "0".into() });
        assert_eq!(decide(false, "0", Some("0")), Step::Forget);
        assert_eq!(decide(false, "1", None), Step::Leave, "someone else's setting");
    }

    /// A kernel and a store in maps; `crash_after_remember` fails the write that
    /// follows a record, as a crash between the two would leave things.
    #[derive(Default)]
    struct Fake {
        kernel: HashMap<String, String>,
        store: HashMap<String, String>,
        crash_after_remember: bool,
    }

    impl Sysctls for Fake {
        fn read(&mut self, name: &str) -> Result<String, KernelError> {
            Ok(self.kernel.get(name).cloned().unwrap_or_else(|| "0".into()))
        }
        fn write(&mut self, name: &str, value: &str) -> Result<(), KernelError> {
            if std::mem::take(&mut self.crash_after_remember) {
                return Err(KernelError::os("crash", std::io::Error::other("killed")));
            }
            self.kernel.insert(name.into(), value.into());
            Ok(())
        }
        fn remembered(&mut self, name: &str) -> Result<Option<String>, StoreError> {
            Ok(self.store.get(name).cloned())
        }
        fn remember(&mut self, name: &str, original: &str) -> Result<(), StoreError> {
            self.store.entry(name.into()).or_insert_with(|| original.into());
            Ok(())
        }
        fn forget(&mut self, name: &str) -> Result<(), StoreError> {
            self.store.remove(name);
            Ok(())
        }
    }

    /// Start with the flag, crash (at any point), start without: the node has its
    /// original value back and weft remembers nothing.
    #[test]
    fn a_restart_without_the_flag_puts_route_localnet_back_even_after_a_crash() {
        for crash_between in [false, true] {
            let mut k = Fake {
                crash_after_remember: crash_between,
                ..Fake::default()
            };
            let first = settle(&mut k, ROUTE_LOCALNET, true);
            assert_eq!(first.is_err(), crash_between);
            if !crash_between {
                assert_eq!(k.kernel[ROUTE_LOCALNET], "1");
            }
            assert_eq!(k.store[ROUTE_LOCALNET], "0", "recorded before the change");
            settle(&mut k, ROUTE_LOCALNET, false).unwrap();
            assert_eq!(k.kernel.get(ROUTE_LOCALNET).map(String::as_str).unwrap_or("0"), "0");
            assert!(k.store.is_empty());
        }
        // Someone else's route_localnet stays on, and weft never claims it.
        let mut k = Fake::default();
        k.kernel.insert(ROUTE_LOCALNET.into(), "1".into());
        settle(&mut k, ROUTE_LOCALNET, true).unwrap();
        settle(&mut k, ROUTE_LOCALNET, false).unwrap();
        assert_eq!(k.kernel[ROUTE_LOCALNET], "1");
        assert!(k.store.is_empty());
    }

    #[test]
    fn uninstall_puts_back_what_weft_changed() {
        let mut k = Fake::default();
        k.kernel.insert(IPV6_FORWARDING.into(), "1".into());
        for name in [IPV4_FORWARDING, IPV6_FORWARDING, ROUTE_LOCALNET] {
            settle(&mut k, name, true).unwrap();
        }
        let names: Vec<String> = k.store.keys().cloned().collect();
        let mut back = restore_all(&mut k, &names);
        back.sort();
        assert_eq!(back, vec![ROUTE_LOCALNET.to_string(), IPV4_FORWARDING.to_string()]);
        assert_eq!(k.kernel[IPV4_FORWARDING], "0");
        assert_eq!(k.kernel[IPV6_FORWARDING], "1", "found on, left on");
    }
}
