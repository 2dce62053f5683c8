//! One module per subcommand.

pub mod calls;
pub mod capture;
pub mod certs;
pub mod crds;
pub mod flows;
pub mod install;
pub mod lab;
pub mod lab_graph;
pub mod lab_live;
pub mod link;
pub mod live;
pub mod policy;
pub mod ports;
pub mod status;
pub mod trace;
pub mod wires;

use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use tonic::transport::Channel;
use weft_rpc::{DialOptions, dial_unix};

/// How a pod is shown: `namespace/name`, the name alone when the runtime gave no
/// namespace (podman), else the container id.
pub fn pod_label(namespace: &str, name: &str, container_id: &str) -> String {
    match (namespace.is_empty(), name.is_empty()) {
        (_, true) if container_id.is_empty() => "-".to_string(),
        (_, true) => container_id.to_string(),
        (true, false) => name.to_string(),
        (false, false) => format!("{namespace}/{name}"),
    }
}

/// The daemons to ask: every node's of the lab in `lab`, or the one at `socket`.
pub fn daemons(socket: &Path, lab: Option<&Path>) -> anyhow::Result<Vec<std::path::PathBuf>> {
    match lab {
        None => Ok(vec![socket.to_path_buf()]),
        Some(file) => {
            let lab = weft_lab::Lab::load(file).map_err(|e| anyhow::anyhow!("loading lab {}: {e}", file.display()))?;
            Ok(lab.spec.nodes.iter().map(|n| lab.socket(&n.name)).collect())
        }
    }
}

/// Connects to weftd at `socket` without waiting for a restarting daemon.
pub async fn connect(socket: &Path) -> anyhow::Result<Channel> {
    let opts = DialOptions {
        connect_window: Duration::ZERO,
        call_timeout: Duration::from_secs(10),
        ..DialOptions::default()
    };
    dial_unix(socket, &opts)
        .await
        .with_context(|| format!("cannot reach weftd at {}", socket.display()))
}

/// Unix ms as `HH:MM:SS.mmm` UTC (enough to line events up; JSON has the number).
pub fn clock(ms: i64) -> String {
    let s = ms.div_euclid(1000);
    format!(
        "{:02}:{:02}:{:02}.{:03}",
        (s / 3600) % 24,
        (s / 60) % 60,
        s % 60,
        ms.rem_euclid(1000)
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn pods_without_a_namespace_show_their_name_alone() {
        assert_eq!(super::pod_label("default", "web", "c1"), "default/web");
        assert_eq!(super::pod_label("", "s1", "c1"), "s1");
        assert_eq!(super::pod_label("", "", "c1"), "c1");
        assert_eq!(super::pod_label("", "", ""), "-");
    }
}
