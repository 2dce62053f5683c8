//! The engine over a topology directory as a lab's daemons read it: kubelet's report of
//! a pod's address (its Pod file written again) costs no full pass.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use weft_kernel::KernelError;
use weft_policy::nft::Observed;
use weft_policy::{Config, LocalPod, LocalPods, PolicyEngine, PolicyKernel, PolicyMetrics};
use weft_topology::DirSource;

#[derive(Clone, Default)]
struct Recorder(Arc<Mutex<Vec<String>>>);

impl PolicyKernel for Recorder {
    fn observe(&mut self) -> Result<Observed, KernelError> {
        Ok(Observed::default())
    }
    fn apply(&mut self, script: &str) -> Result<(), KernelError> {
        self.0.lock().unwrap().push(script.to_string());
        Ok(())
    }
    fn counters(&mut self) -> Result<BTreeMap<String, u64>, KernelError> {
        Ok(BTreeMap::new())
    }
    fn copy_dns_answers(&mut self, _: bool) -> Result<(), KernelError> {
        Ok(())
    }
}

fn pod(name: &str, ip: Option<&str>) -> String {
    let status = ip.map_or(String::new(), |ip| {
        format!("\nstatus: {{podIPs: [{{ip: {ip}}}], phase: Running}}")
    });
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: x, labels: {{app: web}}}}\nspec: {{nodeName: n1, containers: [{{name: c}}]}}{status}\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reported_address_in_a_directory_costs_no_full_pass() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, text: &str| std::fs::write(dir.path().join(name), text).unwrap();
    write("ns.yaml", "apiVersion: v1\nkind: Namespace\nmetadata: {name: x}\n");
    write(
        "np.yaml",
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: deny, namespace: x}\nspec: {podSelector: {}}\n",
    );
    write("pods.yaml", &pod("a", None));
    let source = DirSource::start(dir.path().to_path_buf(), "n1".into()).unwrap();
    let local: Arc<Mutex<Vec<LocalPod>>> = Arc::default();
    let l = local.clone();
    let pods: LocalPods = Arc::new(move || {
        let v = weft_policy::local_listing(l.lock().unwrap().iter().cloned());
        Box::pin(async move { Ok(v) })
    });
    let kernel = Recorder::default();
    let metrics = weft_telemetry::Metrics::new("t", "t");
    let e = Arc::new(PolicyEngine::new(
        Config {
            node_name: "n1".into(),
            resync: Duration::from_secs(3600),
            sync_wait: Duration::from_secs(5),
            learnt: weft_fqdn::Limits::default(),
        },
        source.clone(),
        pods,
        kernel.clone(),
        metrics.families::<PolicyMetrics>(),
    ));
    e.pass(true).await.unwrap();
    let a = LocalPod {
        namespace: "x".into(),
        name: "a".into(),
        ips: vec!["10.0.0.1".parse().unwrap()],
        host_ifname: "weft-a".into(),
    };
    e.pod_attached(a.clone()).await.unwrap();
    local.lock().unwrap().push(a);
    write("pods.yaml", &pod("a", Some("10.0.0.1")));
    source.reload().unwrap();
    let out = e.pass(false).await.unwrap();
    assert!(out.incremental, "{out:?}");
}
