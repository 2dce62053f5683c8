//! `weft_pod_network_*`: each pod's traffic, from the kernel counters of its host-side
//! veth end, sampled before each scrape (one link dump for every pod) and encoded by a
//! collector, so a pod's series leave the exposition with its attachment.

use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use weft_kernel::{Link, LinkStats};
use weft_store::Attachment;

/// Which pod interface a series counts.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct PodInterfaceLabels {
    /// The pod's Kubernetes namespace; empty where the runtime gives none (podman).
    pub namespace: String,
    /// The pod's name, or its container id where the runtime gives no name.
    pub pod: String,
    /// The pod's interface (`CNI_IFNAME`, e.g. `eth0`).
    pub interface: String,
}

/// A pod interface's counters in the pod's direction: what the pod transmits is what
/// its host end receives, and the other way round.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PodCounters {
    /// Bytes the pod received.
    pub receive_bytes: u64,
    /// Bytes the pod transmitted.
    pub transmit_bytes: u64,
    /// Packets the pod received.
    pub receive_packets: u64,
    /// Packets the pod transmitted.
    pub transmit_packets: u64,
    /// Packets for the pod its host end dropped (could not deliver).
    pub receive_drops: u64,
    /// Packets from the pod its host end dropped on receipt.
    pub transmit_drops: u64,
}

impl PodCounters {
    /// The pod's view of its host end's counters `host`.
    pub fn from_host_end(host: &LinkStats) -> Self {
        Self {
            receive_bytes: host.tx_bytes,
            transmit_bytes: host.rx_bytes,
            receive_packets: host.tx_packets,
            transmit_packets: host.rx_packets,
            receive_drops: host.tx_dropped,
            transmit_drops: host.rx_dropped,
        }
    }

    fn add(&mut self, o: &Self) {
        self.receive_bytes = self.receive_bytes.wrapping_add(o.receive_bytes);
        self.transmit_bytes = self.transmit_bytes.wrapping_add(o.transmit_bytes);
        self.receive_packets = self.receive_packets.wrapping_add(o.receive_packets);
        self.transmit_packets = self.transmit_packets.wrapping_add(o.transmit_packets);
        self.receive_drops = self.receive_drops.wrapping_add(o.receive_drops);
        self.transmit_drops = self.transmit_drops.wrapping_add(o.transmit_drops);
    }
}

/// The series of each pod interface: `attachments` (the node's ready ones) matched to
/// `links` (the node's links with their counters) by host-side veth name. An attachment
/// whose host end is missing (torn down under the scrape) has no series.
pub fn sample(attachments: &[Attachment], links: &[(Link, LinkStats)]) -> BTreeMap<PodInterfaceLabels, PodCounters> {
    let by_name: BTreeMap<&str, &LinkStats> = links.iter().map(|(l, s)| (l.name.as_str(), s)).collect();
    let mut out: BTreeMap<PodInterfaceLabels, PodCounters> = BTreeMap::new();
    for a in attachments {
        let Some(stats) = by_name.get(a.host_ifname.as_str()) else {
            continue;
        };
        let pod = if a.pod.name.is_empty() {
            a.key.container_id.clone()
        } else {
            a.pod.name.clone()
        };
        let labels = PodInterfaceLabels {
            namespace: a.pod.namespace.clone(),
            pod,
            interface: a.key.ifname.clone(),
        };
        // Two attachments with one label set (a pod's old sandbox not yet deleted when
        // its new one is added) are summed: a label set exposed twice makes Prometheus
        // drop samples.
        out.entry(labels).or_default().add(&PodCounters::from_host_end(stats));
    }
    out
}

/// A family the collector writes: name (without `_total`), help, and its counter.
type CounterFamily = (&'static str, &'static str, fn(&PodCounters) -> u64);

/// The families the collector writes.
const FAMILIES: [CounterFamily; 6] = [
    (
        "weft_pod_network_receive_bytes",
        "Bytes a pod received on an interface, counted by its host-side veth end",
        |c| c.receive_bytes,
    ),
    (
        "weft_pod_network_transmit_bytes",
        "Bytes a pod transmitted on an interface, counted by its host-side veth end",
        |c| c.transmit_bytes,
    ),
    (
        "weft_pod_network_receive_packets",
        "Packets a pod received on an interface, counted by its host-side veth end",
        |c| c.receive_packets,
    ),
    (
        "weft_pod_network_transmit_packets",
        "Packets a pod transmitted on an interface, counted by its host-side veth end",
        |c| c.transmit_packets,
    ),
    (
        "weft_pod_network_receive_drops",
        "Packets for a pod its host-side veth end dropped instead of delivering",
        |c| c.receive_drops,
    ),
    (
        "weft_pod_network_transmit_drops",
        "Packets from a pod its host-side veth end dropped on receipt",
        |c| c.transmit_drops,
    ),
];

/// The names of the families [`PodTraffic`] encodes, to register it under.
pub fn family_names() -> [&'static str; 6] {
    FAMILIES.map(|(name, _, _)| name)
}

/// The last sample of every pod interface's counters, encoded at each scrape as
/// `weft_pod_network_*`.
#[derive(Debug, Default)]
pub struct PodTraffic {
    last: Mutex<BTreeMap<PodInterfaceLabels, PodCounters>>,
}

impl PodTraffic {
    /// Replaces the sample; a pod missing from `pods` has no series from now on.
    pub fn replace(&self, pods: BTreeMap<PodInterfaceLabels, PodCounters>) {
        *self.last.lock().unwrap_or_else(PoisonError::into_inner) = pods;
    }
}

impl Collector for PodTraffic {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let pods = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        if pods.is_empty() {
            return Ok(());
        }
        for (name, help, value) in FAMILIES {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            for (labels, counters) in pods.iter() {
                ConstCounter::new(value(counters)).encode(family.encode_family(labels)?)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use weft_store::{AttachmentKey, PodRef, State};

    use super::*;

    fn attachment(namespace: &str, name: &str, container: &str, ifname: &str, host: &str) -> Attachment {
        Attachment {
            id: 1,
            key: AttachmentKey {
                network: "weft".into(),
                container_id: container.into(),
                ifname: ifname.into(),
            },
            netns: "/run/netns/x".into(),
            pod: PodRef {
                namespace: namespace.into(),
                name: name.into(),
                uid: String::new(),
            },
            host_ifname: host.into(),
            mtu: 1500,
            state: State::Ready,
            result: None,
            addresses: vec![],
            ports: vec![],
            routes: vec![],
            pod_mac: None,
        }
    }

    fn link(name: &str, rx: u64, tx: u64) -> (Link, LinkStats) {
        (
            Link {
                index: 1,
                name: name.into(),
                up: true,
                mac: vec![],
                mtu: 1500,
            },
            LinkStats {
                rx_bytes: rx,
                tx_bytes: tx,
                rx_packets: rx / 100,
                tx_packets: tx / 100,
                rx_dropped: 1,
                tx_dropped: 2,
            },
        )
    }

    #[test]
    fn counters_take_the_pods_direction_and_pods_without_a_host_end_are_left_out() {
        let pods = sample(
            &[
                attachment("default", "web", "c1", "eth0", "veth1"),
                attachment("", "", "c2abc", "eth0", "veth2"),
                attachment("default", "gone", "c3", "eth0", "veth3"),
            ],
            &[link("veth1", 1000, 5000), link("veth2", 7, 9), link("lo", 1, 1)],
        );
        let web = PodInterfaceLabels {
            namespace: "default".into(),
            pod: "web".into(),
            interface: "eth0".into(),
        };
        assert_eq!(
            pods[&web],
            PodCounters {
                receive_bytes: 5000,
                transmit_bytes: 1000,
                receive_packets: 50,
                transmit_packets: 10,
                receive_drops: 2,
                transmit_drops: 1,
            }
        );
        let podman = PodInterfaceLabels {
            namespace: String::new(),
            pod: "c2abc".into(),
            interface: "eth0".into(),
        };
        assert_eq!(pods[&podman].transmit_bytes, 7);
        assert_eq!(pods.len(), 2, "{pods:?}");
    }

    #[test]
    fn a_replaced_sample_drops_the_series_of_pods_gone() {
        let m = weft_telemetry::Metrics::new("v", "c");
        let traffic = std::sync::Arc::new(PodTraffic::default());
        m.register_collector(&family_names(), traffic.clone());
        traffic.replace(sample(
            &[
                attachment("ns", "a", "c1", "eth0", "veth1"),
                attachment("ns", "b", "c2", "eth0", "veth2"),
            ],
            &[link("veth1", 10, 20), link("veth2", 30, 40)],
        ));
        let (_, classic) = m.render("text/plain");
        assert!(
            classic.contains("# TYPE weft_pod_network_transmit_bytes_total counter\n"),
            "{classic}"
        );
        assert!(
            classic
                .contains("weft_pod_network_transmit_bytes_total{namespace=\"ns\",pod=\"a\",interface=\"eth0\"} 10\n"),
            "{classic}"
        );
        assert!(
            classic
                .contains("weft_pod_network_receive_bytes_total{namespace=\"ns\",pod=\"b\",interface=\"eth0\"} 40\n"),
            "{classic}"
        );
        traffic.replace(sample(
            &[attachment("ns", "a", "c1", "eth0", "veth1")],
            &[link("veth1", 11, 21)],
        ));
        let (_, classic) = m.render("text/plain");
        assert!(!classic.contains("pod=\"b\""), "{classic}");
        assert!(classic.contains("pod=\"a\""), "{classic}");
        traffic.replace(BTreeMap::new());
        let (_, om) = m.render("application/openmetrics-text");
        assert!(!om.contains("weft_pod_network"), "{om}");
    }
}
