//! Checks a `Topology` before it is served, so the daemon never has to cope with links
//! it could not build (and so one bad object does not hide the good ones).

use std::collections::BTreeMap;

use crate::{Link, Topology};

/// Checks one pod's topology: link uids unique within the pod, peer pods named and not
/// the pod itself, valid and distinct Linux interface names, valid CIDRs and unicast
/// MACs where given. Every problem found is returned, each message naming the pod and
/// the link.
pub fn validate(t: &Topology) -> Result<(), Vec<String>> {
    let ns = t.metadata.namespace.as_deref().unwrap_or("default");
    let pod = t.metadata.name.as_deref().unwrap_or("");
    let mut errors = Vec::new();
    if pod.is_empty() {
        errors.push(format!("topology in namespace {ns}: metadata.name (the pod) is empty"));
    }
    if let Some(Err(e)) = t.spec.wait_for_links.as_deref().map(weft_link::parse_link_wait) {
        errors.push(format!("topology {ns}/{pod}: wait_for_links: {e}"));
    }
    let mut uids: BTreeMap<i64, usize> = BTreeMap::new();
    let mut intfs: BTreeMap<&str, usize> = BTreeMap::new();
    for (i, link) in t.spec.links.iter().enumerate() {
        let at = |what: String| format!("topology {ns}/{pod}: link #{i} (uid {}): {what}", link.uid);
        if let Some(first) = uids.insert(link.uid, i) {
            errors.push(at(format!("uid {} already used by link #{first}", link.uid)));
            uids.insert(link.uid, first);
        }
        check_link(link, pod, &mut |e| errors.push(at(e)));
        if let Some(first) = intfs.insert(&link.local_intf, i) {
            errors.push(at(format!(
                "local_intf {:?} already used by link #{first}",
                link.local_intf
            )));
            intfs.insert(&link.local_intf, first);
        }
    }
    if errors.is_empty() { Ok(()) } else { Err(errors) }
}

fn check_link(link: &Link, pod: &str, err: &mut dyn FnMut(String)) {
    if link.peer_pod.is_empty() {
        err("peer_pod is empty".into());
    } else if link.peer_pod == pod {
        err(format!("peer_pod {:?} is the pod itself", link.peer_pod));
    }
    for (field, name) in [("local_intf", &link.local_intf), ("peer_intf", &link.peer_intf)] {
        if let Err(why) = check_ifname(name) {
            err(format!("{field} {name:?} is not a valid interface name: {why}"));
        }
    }
    for (field, cidr) in [("local_ip", &link.local_ip), ("peer_ip", &link.peer_ip)] {
        if !cidr.is_empty() && cidr.parse::<ipnet::IpNet>().is_err() {
            err(format!(
                "{field} {cidr:?} is not a CIDR (address/prefix, e.g. 10.0.0.1/30)"
            ));
        }
    }
    for (field, mac) in [("local_mac", &link.local_mac), ("peer_mac", &link.peer_mac)] {
        if let Some(mac) = mac
            && let Err(why) = check_mac(mac)
        {
            err(format!("{field} {mac:?} {why}"));
        }
    }
    if let Err(e) = link.impair.parse() {
        err(format!("impairment {e}"));
    }
}

/// The kernel's rule (`dev_valid_name`): what `ip link` would refuse, refused up front.
fn check_ifname(name: &str) -> Result<(), &'static str> {
    if name.is_empty() {
        return Err("empty");
    }
    if name.len() > 15 {
        return Err("longer than 15 bytes");
    }
    if name == "." || name == ".." {
        return Err("'.' and '..' are reserved");
    }
    if name
        .chars()
        .any(|c| c == '/' || c == ':' || c == '\0' || c.is_whitespace())
    {
        return Err("contains '/', ':' or whitespace");
    }
    Ok(())
}

/// Six colon-separated two-digit hex octets, neither multicast nor all zeros (the
/// kernel refuses both as an interface address).
fn check_mac(mac: &str) -> Result<(), &'static str> {
    let octets: Vec<&str> = mac.split(':').collect();
    if octets.len() != 6
        || octets
            .iter()
            .any(|o| o.len() != 2 || !o.bytes().all(|b| b.is_ascii_hexdigit()))
    {
        return Err("is not a MAC address (aa:bb:cc:dd:ee:ff)");
    }
    let bytes: Vec<u8> = octets.iter().map(|o| u8::from_str_radix(o, 16).unwrap_or(0)).collect();
    if bytes[0] & 1 == 1 {
        return Err("is a multicast MAC address, not unicast");
    }
    if bytes.iter().all(|&b| b == 0) {
        return Err("is the all-zero MAC address");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{LinkKind, TopologySpec};

    fn link(uid: i64, peer: &str, local: &str, remote: &str) -> Link {
        Link {
            uid,
            peer_pod: peer.into(),
            local_intf: local.into(),
            peer_intf: remote.into(),
            local_ip: String::new(),
            peer_ip: String::new(),
            local_mac: None,
            peer_mac: None,
            kind: None,
            impair: Default::default(),
        }
    }

    fn topo(links: Vec<Link>) -> Topology {
        let mut t = Topology::new(
            "r1",
            TopologySpec {
                links,
                ..Default::default()
            },
        );
        t.metadata.namespace = Some("lab".into());
        t
    }

    fn errors(t: &Topology) -> Vec<String> {
        validate(t).expect_err("should be invalid")
    }

    #[test]
    fn a_full_valid_topology_passes() {
        let mut l1 = link(1, "r2", "eth1", "eth1");
        l1.local_ip = "12.12.12.1/24".into();
        l1.peer_ip = "12.12.12.2/24".into();
        l1.local_mac = Some("02:00:00:00:01:01".into());
        l1.peer_mac = Some("0A:bc:DE:f0:12:34".into());
        l1.kind = Some(LinkKind::Vxlan);
        let mut l2 = link(2, "r3", "eth2", "e1-1");
        l2.local_ip = "2001:db8::1/64".into();
        assert_eq!(validate(&topo(vec![l1, l2, link(3, "r2", "eth3", "eth3")])), Ok(()));
        assert_eq!(validate(&topo(vec![])), Ok(()));
    }

    #[test]
    fn impairments_are_checked_and_named() {
        let mut l = link(1, "r2", "eth1", "eth1");
        l.impair.delay = Some("20ms".into());
        l.impair.loss = Some("10%".into());
        l.impair.rate = Some("50mbit".into());
        assert_eq!(validate(&topo(vec![l.clone()])), Ok(()));
        l.impair.loss = Some("ten".into());
        let e = errors(&topo(vec![l.clone()]));
        assert_eq!(
            e,
            vec![
                "topology lab/r1: link #0 (uid 1): impairment loss \"ten\": expected a number with a unit".to_string()
            ]
        );
        l.impair.loss = None;
        l.impair.delay = None;
        l.impair.jitter = Some("2ms".into());
        assert!(errors(&topo(vec![l]))[0].ends_with("impairment jitter \"2ms\": needs a delay"));
    }

    #[test]
    fn names_the_pod_and_the_link() {
        let e = errors(&topo(vec![link(7, "", "eth1", "eth1")]));
        assert_eq!(
            e,
            vec!["topology lab/r1: link #0 (uid 7): peer_pod is empty".to_string()]
        );
    }

    #[test]
    fn a_wait_for_links_must_be_a_bounded_duration() {
        let mut t = topo(vec![]);
        t.spec.wait_for_links = Some("3s".into());
        assert_eq!(validate(&t), Ok(()));
        assert_eq!(t.spec.link_wait(), Some(std::time::Duration::from_secs(3)));
        t.spec.wait_for_links = Some("soon".into());
        let e = errors(&t);
        assert!(
            e[0].contains("wait_for_links") && e[0].contains("not a duration"),
            "{e:?}"
        );
    }

    #[test]
    fn duplicate_uids_are_refused() {
        let e = errors(&topo(vec![
            link(1, "r2", "eth1", "eth1"),
            link(1, "r3", "eth2", "eth1"),
            link(1, "r4", "eth3", "eth1"),
        ]));
        assert_eq!(e.len(), 2, "{e:?}");
        assert!(e[0].contains("link #1 (uid 1): uid 1 already used by link #0"), "{e:?}");
        assert!(e[1].contains("link #2 (uid 1): uid 1 already used by link #0"), "{e:?}");
    }

    #[test]
    fn peer_pod_must_be_another_pod() {
        let e = errors(&topo(vec![link(1, "r1", "eth1", "eth2")]));
        assert!(e[0].contains("peer_pod \"r1\" is the pod itself"), "{e:?}");
    }

    #[test]
    fn interface_names_follow_the_kernel_rules() {
        for bad in ["", "a23456789012345x", ".", "..", "eth/1", "eth:1", "eth 1", "eth\t1"] {
            let e = errors(&topo(vec![link(1, "r2", bad, "eth1")]));
            assert!(
                e[0].contains("local_intf") && e[0].contains("not a valid interface name"),
                "{bad:?}: {e:?}"
            );
            let e = errors(&topo(vec![link(1, "r2", "eth1", bad)]));
            assert!(e[0].contains("peer_intf"), "{bad:?}: {e:?}");
        }
        for good in ["e", "a23456789012345", "e1-1", "Ethernet1_1", "...", "eth1.100"] {
            assert_eq!(validate(&topo(vec![link(1, "r2", good, good)])), Ok(()), "{good:?}");
        }
    }

    #[test]
    fn a_local_interface_is_used_once() {
        let e = errors(&topo(vec![
            link(1, "r2", "eth1", "eth1"),
            link(2, "r3", "eth1", "eth1"),
        ]));
        assert_eq!(
            e,
            vec!["topology lab/r1: link #1 (uid 2): local_intf \"eth1\" already used by link #0".to_string()]
        );
        // The same peer_intf on different peers is fine.
        assert_eq!(
            validate(&topo(vec![
                link(1, "r2", "eth1", "eth1"),
                link(2, "r3", "eth2", "eth1")
            ])),
            Ok(())
        );
    }

    #[test]
    fn addresses_must_be_cidrs() {
        for bad in ["10.0.0.1", "10.0.0.1/33", "fe80::1/129", "x/24", "10.0.0.1/"] {
            let mut l = link(1, "r2", "eth1", "eth1");
            l.peer_ip = bad.into();
            let e = errors(&topo(vec![l]));
            assert!(
                e[0].contains("peer_ip") && e[0].contains("is not a CIDR"),
                "{bad:?}: {e:?}"
            );
        }
    }

    #[test]
    fn macs_must_be_unicast_and_well_formed() {
        for (bad, why) in [
            ("01:00:5e:00:00:01", "multicast"),
            ("ff:ff:ff:ff:ff:ff", "multicast"),
            ("00:00:00:00:00:00", "all-zero"),
            ("02:00:00:00:01", "not a MAC"),
            ("02-00-00-00-01-01", "not a MAC"),
            ("2:0:0:0:1:1", "not a MAC"),
            ("02:00:00:00:01:0g", "not a MAC"),
            ("", "not a MAC"),
        ] {
            let mut l = link(1, "r2", "eth1", "eth1");
            l.local_mac = Some(bad.into());
            let e = errors(&topo(vec![l]));
            assert!(e[0].contains("local_mac") && e[0].contains(why), "{bad:?}: {e:?}");
        }
    }

    #[test]
    fn every_problem_is_reported() {
        let mut l = link(1, "", "", "eth:1");
        l.local_ip = "nope".into();
        l.peer_mac = Some("03:00:00:00:00:01".into());
        let mut t = topo(vec![l]);
        t.metadata.name = None;
        let e = errors(&t);
        assert_eq!(e.len(), 6, "{e:?}");
        assert!(e[0].contains("metadata.name"), "{e:?}");
    }
}
