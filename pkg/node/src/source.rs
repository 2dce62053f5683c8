//! Where the cluster's objects (Topologies, Nodes) come from: a directory, the
//! Kubernetes API, or nowhere (a standalone node).

use std::sync::Arc;

use weft_topology::TopologySource;

use crate::NodeConfig;
use crate::error::NodeError;

/// The kind of source, which decides what readiness waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceKind {
    /// A directory of files (labs, standalone nodes).
    Dir,
    /// The Kubernetes API: pod ranges must come from this node's Node.
    Kube,
}

/// The source of Topology and Node objects the configuration asks for, if any: the
/// directory when one is given, else the API when asked or inside a cluster.
pub async fn topology_source(config: &NodeConfig) -> Result<Option<(Arc<dyn TopologySource>, SourceKind)>, NodeError> {
    if let Some(dir) = &config.topology_dir {
        let src = weft_topology::DirSource::start(dir.clone(), config.node_name.clone()).map_err(|error| {
            NodeError::TopologyDir {
                path: dir.clone(),
                error,
            }
        })?;
        return Ok(Some((src, SourceKind::Dir)));
    }
    let in_cluster = std::env::var_os("KUBERNETES_SERVICE_HOST").is_some();
    if config.kubernetes.unwrap_or(in_cluster) {
        let client = kube::Client::try_default().await.map_err(NodeError::Kubernetes)?;
        return Ok(Some((
            weft_topology::KubeSource::start(client, config.node_name.clone()),
            SourceKind::Kube,
        )));
    }
    Ok(None)
}
