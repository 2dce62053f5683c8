//! Checking a lab: every link carries traffic from both ends, every pod reaches every node and pod on `eth0`.

use std::collections::BTreeMap;
use std::fs;
use std::process::Command;
use std::time::Duration;

use serde::Serialize;
use weft_topology::WireState;

use super::{Lab, OUTSIDE_ADDRESS, netns_addresses};
use crate::spec::PodSpec;

/// How long a check waits at most for the nodes' wire-state mirrors to be current (see
/// `Lab::mirrors`): a little more than the longest interval a node of a lab this tool
/// builds on one machine waits between two writes.
const MIRROR_WAIT: Duration = Duration::from_secs(5);

/// What a mirror's age must exceed its node's interval by before it is read as current:
/// the time the pass that makes a held-back write may take to end.
const MIRROR_SLACK: Duration = Duration::from_millis(300);

/// The outcome of checking one link from one side.
#[derive(Debug, Clone, Serialize)]
pub struct LinkCheck {
    /// `pod:intf`.
    pub from: String,
    /// `peer:intf`.
    pub to: String,
    /// How the link is carried (as the node's wire state says), `?` when unknown.
    pub kind: String,
    /// Whether the peer answered.
    pub ok: bool,
    /// The round-trip time of the echo that was answered, milliseconds.
    pub rtt_ms: Option<f64>,
    /// How long until the peer answered (or until giving up), milliseconds.
    pub waited_ms: u64,
    /// Why it failed, when it did: what the echoes met (no route, no reply to so many)
    /// and the state of the link's interface, so a failure says where to look.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// An operator took the link down (`weftctl link down`): not answering is
    /// expected, not a failure. Filled in by whoever can ask the nodes (`weftctl lab
    /// check`); the lab itself leaves it false.
    #[serde(default)]
    pub down_by_intent: bool,
}

impl Lab {
    /// The addresses of a pod's `eth0` (global scope, IPv4 first); the pod is `NS/NAME`
    /// or a unique `NAME`.
    pub fn pod_addresses(&self, pod: &str) -> Vec<std::net::IpAddr> {
        netns_addresses(&self.pod_ns(pod))
    }

    /// Pings over the pod network rather than the wires, each until it answers or
    /// `within` has passed: from every pod, every pod on another node over `eth0` (every
    /// address family they share; kind `eth0`), every other node's address (`node`), and
    /// the outside namespace (`outside`, which answers only through masquerade).
    pub fn check_network(&self, within: Duration) -> Vec<LinkCheck> {
        // (source's network namespace, source, target, address, kind)
        let mut probes: Vec<(String, String, String, String, &'static str)> = Vec::new();
        // (pod, how it is named, its network namespace, its addresses)
        let pods: Vec<(&PodSpec, String, String, Vec<std::net::IpAddr>)> = self
            .spec
            .pods
            .iter()
            .map(|p| {
                let ns = self.netns_of(p);
                let addrs = netns_addresses(&ns);
                (p, self.pod_ref(p), ns, addrs)
            })
            .collect();
        for (p, me, ns, mine) in &pods {
            for (_, them, _, theirs) in pods.iter().filter(|(q, ..)| q.node != p.node) {
                for a in theirs {
                    if mine.iter().any(|b| b.is_ipv6() == a.is_ipv6()) {
                        let to = format!("{them}:eth0 {a}");
                        probes.push((ns.clone(), me.clone(), to, a.to_string(), "eth0"));
                    }
                }
            }
            for n in self.spec.nodes.iter().filter(|n| n.name != p.node) {
                if let Some(a) = self.address_of(&n.name) {
                    probes.push((ns.clone(), me.clone(), format!("node {} {a}", n.name), a, "node"));
                }
            }
            probes.push((
                ns.clone(),
                me.clone(),
                format!("outside {OUTSIDE_ADDRESS}"),
                OUTSIDE_ADDRESS.to_string(),
                "outside",
            ));
        }
        // In-process echoes, a bounded number of namespaces at a time (see `ping`): a
        // process per probe does not scale to the pods-squared probes of a big lab.
        let targets: Vec<(String, String)> = probes
            .iter()
            .map(|(ns, _, _, addr, _)| (ns.clone(), addr.clone()))
            .collect();
        let found = crate::ping::ping_all(&targets, within);
        probes
            .iter()
            .zip(found)
            .map(|((_, pod, to, _, kind), o)| LinkCheck {
                kind: (*kind).to_string(),
                from: format!("{pod}:eth0"),
                to: to.clone(),
                ok: o.rtt_ms.is_some(),
                rtt_ms: o.rtt_ms,
                waited_ms: o.waited_ms,
                reason: o.reason,
                down_by_intent: false,
            })
            .collect()
    }

    /// The wire kinds the nodes report, by `pod:intf`: each end as the node its pod runs
    /// on reports it (another node's mirror may still list a pod that left it).
    fn kinds(&self) -> BTreeMap<String, String> {
        let node_of: BTreeMap<&str, &str> = (self.spec.pods.iter())
            .map(|p| (p.name.as_str(), p.node.as_str()))
            .collect();
        let mut out = BTreeMap::new();
        for ws in self.mirrors() {
            let node = ws.metadata.name.clone().unwrap_or_default();
            for w in ws.status.map(|s| s.wires).unwrap_or_default() {
                if node_of.get(w.local_pod.as_str()).is_some_and(|n| *n != node) {
                    continue;
                }
                out.insert(format!("{}:{}", w.local_pod, w.local_intf), w.kind.as_str().to_string());
            }
        }
        out
    }

    /// The nodes' wire-state mirrors, read once none can have a write held back: a node
    /// writes its mirror at most once per [`weft_topology::wire_state_interval`] and
    /// makes a held-back write when that is up, so a mirror written longer ago than
    /// that (and [`MIRROR_SLACK`] for a pass to end) holds every change made before it
    /// was read. Waits at most [`MIRROR_WAIT`], then reads them as they are.
    fn mirrors(&self) -> Vec<WireState> {
        let deadline = std::time::Instant::now() + MIRROR_WAIT;
        loop {
            let mut settled = true;
            let mut out = Vec::new();
            let Ok(dir) = fs::read_dir(self.topology_dir().join(".wires")) else {
                return out;
            };
            for e in dir.flatten() {
                let age = (e.metadata().and_then(|m| m.modified()))
                    .ok()
                    .and_then(|t| t.elapsed().ok())
                    .unwrap_or_default();
                let Ok(text) = fs::read_to_string(e.path()) else {
                    continue;
                };
                let Ok(ws) = serde_json::from_str::<WireState>(&text) else {
                    continue;
                };
                let ends = ws.status.as_ref().map_or(0, |s| s.wires.len());
                if age < weft_topology::wire_state_interval(ends) + MIRROR_SLACK {
                    settled = false;
                }
                out.push(ws);
            }
            if settled || std::time::Instant::now() >= deadline {
                return out;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// A pod interface's state as `ip` reports it (`missing`, `DOWN`, `UP
    /// NO-CARRIER`, its addresses), to say why a link did not answer.
    fn interface_state(&self, netns: &str, intf: &str) -> Option<String> {
        let out = Command::new("ip")
            .args(["-j", "-n", netns, "addr", "show", "dev", intf])
            .output()
            .ok()?;
        if !out.status.success() {
            return Some("missing".into());
        }
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
        let l = v.get(0)?;
        let flags: Vec<&str> = l["flags"].as_array()?.iter().filter_map(|f| f.as_str()).collect();
        let addrs: Vec<String> = l["addr_info"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|a| Some(format!("{}/{}", a["local"].as_str()?, a["prefixlen"].as_u64()?)))
            .collect();
        Some(format!(
            "state {} flags {} addresses [{}]",
            l["operstate"].as_str().unwrap_or("?"),
            flags.join(","),
            addrs.join(" ")
        ))
    }

    /// Pings the peer address of every link with one from its pod, each until it
    /// answers or `within` has passed since its pod's first echo.
    pub fn check(&self, within: Duration) -> Vec<LinkCheck> {
        // (pod, its network namespace, link, peer address)
        let links: Vec<(String, String, &weft_topology::Link, &str)> = self
            .topologies
            .iter()
            .flat_map(|t| {
                let pod = t.metadata.name.clone().unwrap_or_default();
                let netns = match self.pod_of_topology(t) {
                    Some(p) => self.netns_of(p),
                    None => format!("{}-p-{pod}", self.spec.name),
                };
                t.spec.links.iter().filter_map(move |l| {
                    let peer_ip = l.peer_ip.split('/').next().filter(|s| !s.is_empty())?;
                    Some((pod.clone(), netns.clone(), l, peer_ip))
                })
            })
            .collect();
        // In-process echoes, every link of a pod at once and a bounded number of pods
        // at a time, resent until answered within `within` (see `ping`): a `ping`
        // process per link end starved a 1,500-link lab of CPU until live links timed
        // out.
        let targets: Vec<(String, String)> = links
            .iter()
            .map(|(_, netns, _, peer_ip)| (netns.clone(), peer_ip.to_string()))
            .collect();
        let found = crate::ping::ping_all(&targets, within);
        let mut out: Vec<LinkCheck> = links
            .iter()
            .zip(found)
            .map(|((pod, netns, l, _), o)| {
                let reason = o.reason.map(|r| match self.interface_state(netns, &l.local_intf) {
                    Some(state) => format!("{r}; {}: {state}", l.local_intf),
                    None => r,
                });
                LinkCheck {
                    kind: String::new(),
                    from: format!("{pod}:{}", l.local_intf),
                    to: format!("{}:{}", l.peer_pod, l.peer_intf),
                    ok: o.rtt_ms.is_some(),
                    rtt_ms: o.rtt_ms,
                    waited_ms: o.waited_ms,
                    reason,
                    down_by_intent: false,
                }
            })
            .collect();
        // Read after the traffic, once no node can have a write of its mirror held
        // back (see `mirrors`): what answered has been mirrored by then.
        let kinds = self.kinds();
        for c in &mut out {
            c.kind = kinds
                .get(&c.from)
                .or_else(|| kinds.get(&c.to))
                .cloned()
                .unwrap_or_else(|| "?".into());
        }
        out
    }
}
