//! Existing meshnet and KNE topology files load unchanged: the user-written form
//! (objects beside Pods, no namespace) and `kubectl get -o yaml` output (a List with
//! server metadata, meshnet's status and KNE's extra status field).

use std::path::PathBuf;

use weft_topology::{Topology, parse_topologies, validate};

fn load(name: &str) -> Vec<Topology> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    let bytes = std::fs::read(&path).unwrap();
    let (topologies, problems) = parse_topologies(&path, &bytes);
    assert!(problems.is_empty(), "{name}: {problems:?}");
    topologies
}

#[test]
fn a_meshnet_file_loads_as_written() {
    let t = load("meshnet-3node.yml");
    let names: Vec<_> = t.iter().map(|t| t.metadata.name.clone().unwrap()).collect();
    assert_eq!(names, ["pod1", "pod2", "pod3"], "the Pod in the file is not a Topology");
    // No namespace in the file: the pod's namespace is the default one.
    assert!(t.iter().all(|t| t.metadata.namespace.as_deref() == Some("default")));
    let l = &t[0].spec.links[1];
    assert_eq!(
        (l.uid, l.peer_pod.as_str(), l.local_intf.as_str(), l.peer_intf.as_str()),
        (3, "pod3", "eth2", "eth2")
    );
    assert_eq!(
        (l.local_ip.as_str(), l.peer_ip.as_str()),
        ("13.13.13.1/24", "13.13.13.3/24")
    );
    // weft's own additions are absent and default to "not given".
    assert!(
        t.iter()
            .flat_map(|t| &t.spec.links)
            .all(|l| l.kind.is_none() && l.local_mac.is_none() && l.impair == Default::default())
    );
    for t in &t {
        validate(t).unwrap();
    }
}

#[test]
fn kubectl_output_of_a_kne_lab_loads_with_its_status() {
    let t = load("kne-get-topologies.yaml");
    assert_eq!(t.len(), 2);
    assert_eq!(t[0].metadata.namespace.as_deref(), Some("kne-lab"));
    // KNE numbers links from 0 and leaves addresses out of some.
    assert_eq!(t[0].spec.links[0].uid, 0);
    assert!(t[0].spec.links[0].local_ip.is_empty());
    let st = t[0].status.as_ref().unwrap();
    assert_eq!(st.src_ip, "192.168.18.2");
    assert_eq!(st.net_ns, "/var/run/netns/cni-1234-5678");
    assert_eq!(st.container_id, "3b1d5c0e9f");
    assert_eq!((st.skipped[0].pod_name.as_str(), st.skipped[0].link_id), ("r2", 0));
    assert!(st.alive());
    assert!(
        !t[1].status.as_ref().unwrap().alive(),
        "an empty status: not running anywhere"
    );
}
