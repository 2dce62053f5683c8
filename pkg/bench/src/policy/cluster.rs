//! Where a policy benchmark's cluster lives, as weftd reads it: YAML files in its
//! `--topology-dir` (as a lab's daemons read them), or the in-process fake Kubernetes API
//! server (`weft-fakekube`), served over HTTPS inside the node's namespace and read
//! through weftd's watch caches, as a node in a cluster reads the real one.

use std::path::PathBuf;

use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use serde_json::Value;
use weft_fakekube::{FakeApiServer, HttpsEndpoint};
use weft_harness::{DaemonConfig, NamedNetns};

use super::objects::{write_chunked, write_docs};

/// The bearer token weftd presents to the fake API server.
const TOKEN: &str = "weft-bench-policy";

/// Which source a benchmark part reads its cluster from
/// (`WEFT_BENCH_POLICY_SOURCE=api|dir`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ClusterSource {
    /// The in-process fake API server, over HTTPS, through weftd's watch caches.
    Api,
    /// Files in weftd's `--topology-dir`.
    Dir,
}

impl ClusterSource {
    /// How a report names it.
    pub fn describe(self) -> &'static str {
        match self {
            ClusterSource::Api => "the in-process fake API server (over HTTPS, through weftd's watch caches)",
            ClusterSource::Dir => "files in weftd's --topology-dir",
        }
    }

    /// From `WEFT_BENCH_POLICY_SOURCE`, else `default`.
    pub fn from_env(default: ClusterSource) -> Result<ClusterSource, String> {
        match std::env::var("WEFT_BENCH_POLICY_SOURCE").as_deref() {
            Err(_) | Ok("") => Ok(default),
            Ok("api") => Ok(ClusterSource::Api),
            Ok("dir") => Ok(ClusterSource::Dir),
            Ok(other) => Err(format!("WEFT_BENCH_POLICY_SOURCE={other:?}: api or dir")),
        }
    }
}

/// A cluster's objects where one weftd reads them.
pub(crate) enum Cluster {
    /// A topology directory.
    Dir(PathBuf),
    /// The fake API server.
    Api(Box<ApiCluster>),
}

/// The fake API server, its runtime, and (once served) its endpoint and the kubeconfig
/// that names it.
pub(crate) struct ApiCluster {
    rt: tokio::runtime::Runtime,
    server: FakeApiServer,
    endpoint: Option<HttpsEndpoint>,
    kubeconfig: PathBuf,
    /// What was last put of each object: a set written again puts only what changed,
    /// as a kubelet updates one pod, not every pod of the node.
    last: std::sync::Mutex<std::collections::HashMap<String, Value>>,
}

impl Cluster {
    /// A cluster of `source` kind; its files (the directory, or the kubeconfig and CA)
    /// go under `dir`.
    pub(crate) fn new(source: ClusterSource, dir: &std::path::Path) -> Result<Cluster, String> {
        match source {
            ClusterSource::Dir => {
                let topology = dir.join("topology");
                std::fs::create_dir_all(&topology).map_err(|e| format!("creating {}: {e}", topology.display()))?;
                Ok(Cluster::Dir(topology))
            }
            ClusterSource::Api => {
                std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(1)
                    .enable_all()
                    .build()
                    .map_err(|e| format!("starting the fake API server's runtime: {e}"))?;
                Ok(Cluster::Api(Box::new(ApiCluster {
                    rt,
                    server: FakeApiServer::new(),
                    endpoint: None,
                    kubeconfig: dir.join("kubeconfig"),
                    last: Default::default(),
                })))
            }
        }
    }

    /// Writes `docs` as one set named `name` (a file in the directory; each object put
    /// to the API server, replacing the one of its name).
    pub(crate) fn put(&self, name: &str, docs: &[Value]) -> Result<(), String> {
        match self {
            Cluster::Dir(dir) => write_docs(dir, name, docs),
            Cluster::Api(api) => {
                let ApiCluster { server, last, .. } = &**api;
                let mut last = last.lock().expect("last lock");
                for d in docs {
                    let key = format!("{}/{}/{}", d["kind"], d["metadata"]["namespace"], d["metadata"]["name"]);
                    if last.get(&key) != Some(d) {
                        put_value(server, d)?;
                        last.insert(key, d.clone());
                    }
                }
                Ok(())
            }
        }
    }

    /// Writes many objects (files of at most `per_file` each in the directory).
    pub(crate) fn put_many(&self, prefix: &str, docs: &[Value], per_file: usize) -> Result<(), String> {
        match self {
            Cluster::Dir(dir) => write_chunked(dir, prefix, docs, per_file),
            Cluster::Api(api) => docs.iter().try_for_each(|d| put_value(&api.server, d)),
        }
    }

    /// Serves the API inside `ns` (its loopback, as a node reaches its API server) and
    /// tells `config` how weftd reaches the cluster.
    pub(crate) fn attach(&mut self, ns: &NamedNetns, config: &mut DaemonConfig) -> Result<(), String> {
        match self {
            Cluster::Dir(dir) => {
                config
                    .args
                    .extend(["--topology-dir".to_string(), dir.display().to_string()]);
                Ok(())
            }
            Cluster::Api(api) => {
                let ApiCluster {
                    rt,
                    server,
                    endpoint,
                    kubeconfig,
                    ..
                } = &mut **api;
                let listener = ns
                    .within(|| std::net::TcpListener::bind("127.0.0.1:0"))
                    .map_err(|e| e.to_string())?
                    .map_err(|e| format!("binding the API server's port in {}: {e}", ns.name()))?;
                let _inside = rt.enter();
                let served = server
                    .serve_https(listener, TOKEN)
                    .map_err(|e| format!("serving the fake API server: {e}"))?;
                let dir = kubeconfig.parent().expect("kubeconfig has a directory");
                let ca = dir.join("ca.crt");
                std::fs::write(&ca, &served.ca_pem).map_err(|e| format!("writing {}: {e}", ca.display()))?;
                let text = format!(
                    "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {{server: \"https://{}\", certificate-authority: \"{}\"}}\nusers:\n- name: u\n  user: {{token: {TOKEN}}}\ncontexts:\n- name: x\n  context: {{cluster: c, user: u}}\ncurrent-context: x\n",
                    served.addr,
                    ca.display()
                );
                std::fs::write(&*kubeconfig, text).map_err(|e| format!("writing {}: {e}", kubeconfig.display()))?;
                *endpoint = Some(served);
                config.env.extend([
                    ("WEFT_KUBERNETES".to_string(), "true".to_string()),
                    ("KUBECONFIG".to_string(), kubeconfig.display().to_string()),
                ]);
                Ok(())
            }
        }
    }
}

/// Puts one object of the kinds the benchmarks write (Namespace, Pod, NetworkPolicy,
/// Node) to `server`.
fn put_value(server: &FakeApiServer, v: &Value) -> Result<(), String> {
    fn typed<K: serde::de::DeserializeOwned>(v: &Value) -> Result<K, String> {
        serde_json::from_value(v.clone()).map_err(|e| format!("{e}: {v}"))
    }
    match v["kind"].as_str() {
        Some("Namespace") => drop(server.put(&typed::<Namespace>(v)?)),
        Some("Pod") => drop(server.put(&typed::<Pod>(v)?)),
        Some("NetworkPolicy") => drop(server.put(&typed::<NetworkPolicy>(v)?)),
        Some("Node") => drop(server.put(&typed::<Node>(v)?)),
        other => return Err(format!("no API object of kind {other:?} in the benchmark: {v}")),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objects_of_every_written_kind_reach_the_api_server() {
        let server = FakeApiServer::new();
        let docs = [
            super::super::objects::namespace("x", serde_json::json!({"team": "t"})),
            super::super::objects::pod("x", "a", "n1", serde_json::json!({"app": "a"}), None),
            super::super::objects::policy("x", "p", serde_json::json!({"podSelector": {}})),
        ];
        for d in &docs {
            put_value(&server, d).unwrap();
        }
        assert!(server.get::<Pod>(Some("x"), "a").is_some());
        assert!(server.get::<NetworkPolicy>(Some("x"), "p").is_some());
        assert!(server.get::<Namespace>(None, "x").is_some());
        let bad = serde_json::json!({"kind": "Service"});
        assert!(put_value(&server, &bad).unwrap_err().contains("Service"));
    }
}
