//! `weftd uninstall`: what a stopped weftd leaves on a node taken away, and how the
//! node gets back to what weft found. weftd itself never removes its tables, routes or
//! settings when it stops (pods keep their networking across a restart, and a
//! DaemonSet's pod stops on every upgrade); this is the explicit last step.
//!
//! It refuses while a weftd holds the state directory, and while pods are attached
//! (they would lose their networking) unless forced. Then it removes weft's nftables
//! tables (host ports, masquerade, network policy), its routes (protocols 74 and 75: pod routes, routes to other nodes' pods,
//! the unreachable routes of the node's ranges), its VXLAN device and the device holding its pods' IPv4 gateways, puts every sysctl
//! weft changed back to the value it found (IP forwarding, `route_localnet`), and
//! removes its state directory, socket and DEL spool.

use std::path::{Path, PathBuf};
use std::time::Duration;

use weft_kernel::{NODE_ROUTE_PROTOCOL, Netlink, ROUTE_PROTOCOL};
use weft_store::{State, Store};

use crate::sysctls::{self, HostSysctls};

/// What `weftd uninstall` is asked to do.
#[derive(Debug, Clone)]
pub struct UninstallConfig {
    /// weftd's state directory.
    pub state_dir: PathBuf,
    /// weftd's socket (its directory holds the DEL spool).
    pub socket: PathBuf,
    /// Go on although pods are attached (their networking goes).
    pub force: bool,
    /// Leave the state directory (for a later install to adopt).
    pub keep_state: bool,
    /// Where weftd exported the node's pod ranges (the same flags as weftd's): those
    /// routes are withdrawn too.
    pub export: Option<weft_nodenet::RouteExport>,
}

/// What an uninstall removed and put back.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Uninstalled {
    /// nftables tables deleted.
    pub tables: Vec<String>,
    /// Routes deleted.
    pub routes: usize,
    /// Links deleted (the VXLAN device, the gateway device; pods' host ends when forced).
    pub links: Vec<String>,
    /// Sysctls put back to the value weft found.
    pub sysctls: Vec<String>,
    /// Whether the state directory was removed.
    pub state_removed: bool,
}

/// Why an uninstall did not run (or not fully).
#[derive(Debug, thiserror::Error)]
pub enum UninstallError {
    /// A weftd runs on this state directory.
    #[error("a weftd is running on state directory {0}: stop it first")]
    Running(PathBuf),
    /// Pods are attached.
    #[error("{count} pod attachment(s) would lose their networking ({sample}); delete the pods first, or pass --force")]
    PodsAttached {
        /// How many.
        count: usize,
        /// A few of them, for people.
        sample: String,
    },
    /// The state could not be read.
    #[error("reading the state in {path}: {source}")]
    Store {
        /// The database.
        path: PathBuf,
        /// Why.
        source: Box<weft_store::StoreError>,
    },
    /// A kernel step failed.
    #[error("{0}")]
    Kernel(String),
    /// A file could not be removed.
    #[error("removing {path}: {source}")]
    Remove {
        /// What.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// The nftables tables (family `inet`) weft owns.
pub const TABLES: [&str; 4] = [
    weft_portmap::TABLE,
    weft_nodenet::masq::TABLE,
    weft_policy::plan::TABLE,
    weft_policy::plan::DNS_TABLE,
];

/// Uninstalls weft from this node's namespace (the caller's). Blocking.
pub async fn uninstall(cfg: &UninstallConfig) -> Result<Uninstalled, UninstallError> {
    let mut done = Uninstalled::default();
    let _lock = if cfg.state_dir.exists() {
        Some(
            crate::lock::lock_state_dir(&cfg.state_dir, Duration::ZERO)
                .await
                .map_err(|_| UninstallError::Running(cfg.state_dir.clone()))?,
        )
    } else {
        None
    };
    let db = cfg.state_dir.join("weft.db");
    let store = if db.exists() {
        Some(Store::open(&db).map_err(|source| UninstallError::Store {
            path: db.clone(),
            source: Box::new(source),
        })?)
    } else {
        None
    };
    let mut host_ends = Vec::new();
    if let Some(store) = &store {
        let attached = store
            .run_blocking(|db| db.list(None, None))
            .map_err(|source| UninstallError::Store {
                path: db.clone(),
                source: Box::new(source),
            })?;
        let live: Vec<_> = attached.iter().filter(|a| a.state != State::Deleting).collect();
        if !live.is_empty() && !cfg.force {
            return Err(UninstallError::PodsAttached {
                count: live.len(),
                sample: live
                    .iter()
                    .take(3)
                    .map(|a| format!("{} {}", a.pod.describe(&a.key.container_id), a.key))
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        }
        host_ends = attached.iter().map(|a| a.host_ifname.clone()).collect();
    }

    for table in TABLES {
        match weft_kernel::nft::run(&["delete", "table", "inet", table], None) {
            Ok(_) => done.tables.push(format!("inet {table}")),
            Err(e) if e.contains("No such file") => {}
            Err(e) => return Err(UninstallError::Kernel(format!("deleting table inet {table}: {e}"))),
        }
    }
    let kernel = |what: &str, e: std::io::Error| UninstallError::Kernel(format!("{what}: {e}"));
    let mut nl = Netlink::new().map_err(|e| kernel("opening netlink", e))?;
    for name in host_ends
        .iter()
        .map(String::as_str)
        .chain([weft_nodenet::VXLAN_DEVICE, weft_kernel::GATEWAY_DEVICE])
    {
        if nl.delete_link(name).map_err(|e| kernel("deleting a link", e))? {
            done.links.push(name.to_string());
        }
    }
    for proto in [ROUTE_PROTOCOL, NODE_ROUTE_PROTOCOL] {
        for v6 in [false, true] {
            let routes = match nl.routes_of_protocol(v6, proto) {
                Ok(r) => r,
                Err(e) if v6 && e.raw_os_error() == Some(nix::errno::Errno::EAFNOSUPPORT as i32) => continue,
                Err(e) => return Err(kernel("listing weft's routes", e)),
            };
            for r in routes {
                if nl
                    .delete_proto_route(r.dst, r.gateway, r.oif, proto, r.unreachable)
                    .map_err(|e| kernel("deleting a route of weft's", e))?
                {
                    done.routes += 1;
                }
            }
        }
    }
    if let Some(e) = cfg.export {
        for v6 in [false, true] {
            let exported = match nl.blackholes_in_table(v6, e.table, e.protocol) {
                Ok(r) => r,
                Err(err) if v6 && err.raw_os_error() == Some(nix::errno::Errno::EAFNOSUPPORT as i32) => continue,
                Err(err) => return Err(kernel("listing the exported pod ranges", err)),
            };
            for dst in exported {
                if nl
                    .delete_blackhole_route(dst, e.table, e.protocol)
                    .map_err(|err| kernel("withdrawing an exported pod range", err))?
                {
                    done.routes += 1;
                }
            }
        }
    }
    if let Some(store) = &store {
        let names: Vec<String> = store
            .run_blocking(|db| db.remembered_sysctls())
            .map_err(|source| UninstallError::Store {
                path: db.clone(),
                source: Box::new(source),
            })?
            .into_iter()
            .map(|(name, _)| name)
            .collect();
        done.sysctls = sysctls::restore_all(&mut HostSysctls(store.clone()), &names);
    }
    drop(store);
    let spool = weft_cni::spool::dir_for_socket(&cfg.socket);
    remove(&spool, true)?;
    remove(&cfg.socket, false)?;
    if !cfg.keep_state && cfg.state_dir.exists() {
        remove(&cfg.state_dir, true)?;
        done.state_removed = true;
    }
    Ok(done)
}

fn remove(path: &Path, dir: bool) -> Result<(), UninstallError> {
    let r = if dir {
        std::fs::remove_dir_all(path)
    } else {
        std::fs::remove_file(path)
    };
    match r {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(UninstallError::Remove {
            path: path.to_path_buf(),
            source,
        }),
    }
}
