//! Property tests for topology files: any bytes load without panicking and only
//! valid topologies are served; generated valid topologies survive YAML and JSON and
//! validate; a reused `local_intf` is refused. `fuzz/` drives the same parser
//! (`topology`) with raw bytes.

use std::collections::BTreeSet;
use std::path::Path;

use proptest::prelude::*;
use weft_topology::{Link, LinkKind, Topology, TopologySpec, parse_topologies, validate};

/// Interface names the kernel takes, YAML's special characters and words included
/// (`null`, `~`, `#`, `*`, `&`, ...), so the YAML writer's quoting is exercised.
fn ifname() -> impl Strategy<Value = String> {
    prop_oneof![
        "[A-Za-z0-9_.-]{1,15}",
        "[!-~&&[^/:]]{1,15}",
        prop::sample::select(vec![
            "null", "~", "true", "no", "1e3", "0x1f", ".5", "-", "*a", "&a", "!!str", "'", "\"", "#"
        ])
        .prop_map(str::to_string),
    ]
    .prop_filter("not . or ..", |s| s != "." && s != "..")
}

fn pod() -> impl Strategy<Value = String> {
    "[a-z0-9]([a-z0-9-]{0,14}[a-z0-9])?"
}

fn cidr() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        (any::<std::net::Ipv4Addr>(), 0u8..=32).prop_map(|(a, p)| format!("{a}/{p}")),
        (any::<std::net::Ipv6Addr>(), 0u8..=128).prop_map(|(a, p)| format!("{a}/{p}")),
    ]
}

fn mac() -> impl Strategy<Value = Option<String>> {
    prop::option::of(any::<[u8; 6]>().prop_filter_map("unicast, not zero", |mut b| {
        b[0] &= 0xfe;
        (b != [0; 6]).then(|| b.iter().map(|o| format!("{o:02x}")).collect::<Vec<_>>().join(":"))
    }))
}

type LinkBody = (
    String,
    String,
    String,
    String,
    Option<String>,
    Option<String>,
    Option<LinkKind>,
);

fn link_body() -> impl Strategy<Value = LinkBody> {
    (
        pod(),
        ifname(),
        cidr(),
        cidr(),
        mac(),
        mac(),
        prop::option::of(prop::sample::select(vec![
            LinkKind::Veth,
            LinkKind::Vxlan,
            LinkKind::Grpc,
        ])),
    )
}

/// A valid topology: unique uids, unique local interfaces, peers other than the pod.
fn topology() -> impl Strategy<Value = Topology> {
    (
        pod(),
        prop::option::of(pod()),
        prop::collection::btree_set(any::<i64>(), 0..6),
        prop::collection::btree_set(ifname(), 6),
        prop::collection::vec(link_body(), 6),
    )
        .prop_map(|(name, namespace, uids, locals, bodies)| {
            let links = uids
                .into_iter()
                .zip(locals)
                .zip(bodies)
                .map(
                    |((uid, local_intf), (peer_pod, peer_intf, local_ip, peer_ip, local_mac, peer_mac, kind))| Link {
                        uid,
                        peer_pod: if peer_pod == name {
                            format!("{peer_pod}-peer")
                        } else {
                            peer_pod
                        },
                        local_intf,
                        peer_intf,
                        local_ip,
                        peer_ip,
                        local_mac,
                        peer_mac,
                        kind,
                        impair: Default::default(),
                    },
                )
                .collect();
            let mut t = Topology::new(
                &name,
                TopologySpec {
                    links,
                    ..Default::default()
                },
            );
            // The loader fills in the namespace; generate it filled so the round trip is exact.
            t.metadata.namespace = Some(namespace.unwrap_or_else(|| "default".into()));
            t
        })
}

fn yaml_stream(ts: &[Topology]) -> String {
    ts.iter()
        .map(|t| serde_yaml_ng::to_string(t).unwrap())
        .collect::<Vec<_>>()
        .join("---\n")
}

proptest! {
    #[test]
    fn any_bytes_load_without_panicking(bytes in prop::collection::vec(any::<u8>(), 0..512), json in any::<bool>()) {
        let path = if json { Path::new("t.json") } else { Path::new("t.yaml") };
        let (topologies, _) = parse_topologies(path, &bytes);
        for t in &topologies {
            prop_assert_eq!(validate(t), Ok(()));
        }
    }

    #[test]
    fn topology_like_yaml_loads_without_panicking(
        lines in prop::collection::vec(
            prop_oneof![
                Just("---".to_string()),
                Just("apiVersion: networkop.co.uk/v1beta1".to_string()),
                Just("kind: Topology".to_string()),
                Just("kind: List".to_string()),
                Just("items:".to_string()),
                Just("metadata: {name: r1, namespace: lab}".to_string()),
                Just("spec:".to_string()),
                Just("  links:".to_string()),
                Just("  - {uid: 1, peer_pod: r2, local_intf: e1, peer_intf: e1}".to_string()),
                "  - \\{uid: -?[0-9]{1,3}, peer_pod: [a-z0-9]{0,3}, local_intf: [a-z0-9:]{0,3}, peer_intf: e1\\}",
                "[ -~]{0,20}",
            ],
            0..16,
        )
    ) {
        let text = lines.join("\n");
        let (topologies, _) = parse_topologies(Path::new("t.yaml"), text.as_bytes());
        for t in &topologies {
            prop_assert_eq!(validate(t), Ok(()));
        }
    }

    #[test]
    fn generated_topologies_validate_and_round_trip(ts in prop::collection::vec(topology(), 1..4)) {
        for t in &ts {
            prop_assert_eq!(validate(t), Ok(()));
        }
        let (back, problems) = parse_topologies(Path::new("lab.yaml"), yaml_stream(&ts).as_bytes());
        prop_assert!(problems.is_empty(), "{:?}", problems);
        prop_assert_eq!(&back, &ts);
        let json = serde_json::to_vec(&ts).unwrap();
        let (back, problems) = parse_topologies(Path::new("lab.json"), &json);
        prop_assert!(problems.is_empty(), "{:?}", problems);
        prop_assert_eq!(&back, &ts);
    }

    #[test]
    fn a_reused_local_intf_is_refused(
        t in topology().prop_filter("has links", |t| !t.spec.links.is_empty()),
        pick in any::<prop::sample::Index>(),
        at in any::<prop::sample::Index>(),
    ) {
        let mut bad = t.clone();
        let i = pick.index(t.spec.links.len());
        let mut dup = t.spec.links[i].clone();
        let uids: BTreeSet<i64> = t.spec.links.iter().map(|l| l.uid).collect();
        dup.uid = (i64::MIN..).find(|u| !uids.contains(u)).unwrap();
        let j = at.index(bad.spec.links.len() + 1);
        bad.spec.links.insert(j, dup.clone());
        let errors = validate(&bad).unwrap_err();
        prop_assert_eq!(errors.len(), 1, "{:?}", errors);
        let (first, second) = if j <= i { (j, i + 1) } else { (i, j) };
        prop_assert!(
            errors[0].contains(&format!("link #{second} ")) && errors[0].contains(&format!(
                "local_intf {:?} already used by link #{first}",
                dup.local_intf
            )),
            "{:?}", errors
        );
        // The loader leaves it out and says why.
        let (loaded, problems) = parse_topologies(Path::new("t.yaml"), yaml_stream(&[bad]).as_bytes());
        prop_assert!(loaded.is_empty());
        prop_assert_eq!(problems.len(), 1);
        prop_assert!(problems[0].reason.contains("already used"), "{}", problems[0].reason);
    }
}
