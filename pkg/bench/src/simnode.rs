//! A simulated node: a network namespace of its own with a weftd reading the cluster a
//! benchmark plays (`policy::Cluster`: the in-process API server or a topology
//! directory). The one fixture of every benchmark that runs weftd against a cluster.

use std::path::{Path, PathBuf};

use weft_harness::{DaemonConfig, NamedNetns, NodeDaemon};

use crate::policy::Cluster;
use crate::{STOP_LIMIT, lab};

/// How long [`SimNode::start`] waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wait {
    /// Until weftd is spawned: a benchmark that times its start itself.
    Spawned,
    /// Until weftd serves.
    Serving,
}

/// A node namespace with a weftd reading a cluster.
pub(crate) struct SimNode {
    /// The node's namespace.
    pub(crate) ns: NamedNetns,
    /// Its weftd.
    pub(crate) daemon: NodeDaemon,
    /// weftd's socket, for the pods' network config.
    pub(crate) socket: PathBuf,
    /// Its state, logs and socket.
    dir: PathBuf,
}

impl SimNode {
    /// Starts `weftd` as node `name` at `address` (`--node-address`; gRPC wires in
    /// plaintext) inside `ns`, its state under `dir`, reading `cluster`.
    pub(crate) fn start(
        ns: NamedNetns,
        weftd: &Path,
        dir: &Path,
        (name, address): (&str, &str),
        cluster: &mut Cluster,
        wait: Wait,
    ) -> Result<SimNode, String> {
        let mut config = DaemonConfig::under(weftd, dir, name);
        config.args = ["--wire-insecure", "--node-address", address]
            .map(String::from)
            .to_vec();
        cluster.attach(&ns, &mut config)?;
        let socket = config.socket.clone();
        let daemon = match wait {
            Wait::Spawned => NodeDaemon::spawn(&ns, config),
            Wait::Serving => NodeDaemon::start(&ns, config),
        }
        .map_err(lab)?;
        Ok(SimNode {
            ns,
            daemon,
            socket,
            dir: dir.to_path_buf(),
        })
    }

    /// The network config of the node's pods.
    pub(crate) fn conf(&self) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({
            "cniVersion": "1.0.0", "name": "bench", "type": "weft",
            "socket": self.socket, "ranges": ["10.244.0.0/16"], "mtu": 1500,
        }))
        .expect("config serializes")
    }

    /// Stops weftd (it finishes its teardowns first), removes the namespace and the
    /// node's directory; with `WEFT_BENCH_KEEP_LOG` set, weftd's log is kept beside
    /// the directory as `<dir>.log`.
    pub(crate) fn finish(self) {
        let SimNode {
            ns, mut daemon, dir, ..
        } = self;
        daemon.stop(STOP_LIMIT);
        drop(ns);
        if std::env::var_os("WEFT_BENCH_KEEP_LOG").is_some() {
            let _ = std::fs::copy(dir.join("weftd.log"), dir.with_extension("log"));
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
