//! One module per subcommand.

pub mod bench;
pub mod calls;
pub mod capture;
pub mod certs;
pub mod crds;
pub mod install;
pub mod lab;
pub mod lab_graph;
pub mod link;
pub mod ports;
pub mod status;
pub mod wires;

use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use tonic::transport::Channel;
use weft_rpc::{DialOptions, dial_unix};

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
