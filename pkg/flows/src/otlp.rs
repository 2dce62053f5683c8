//! Flow records as OpenTelemetry log records: what weftd exports over OTLP. One
//! definition of the attribute names, written against the API's [`LogRecord`] trait so
//! the SDK's batching exporter sends them and a test can read them back.
//!
//! Attributes follow the semantic conventions where one exists: `source.address`,
//! `source.port`, `destination.address`, `destination.port`, `network.transport`,
//! `network.type`, and `k8s.namespace.name`, `k8s.pod.name` and the workload's
//! `k8s.<kind>.name` for the pod the flow belongs to (its source, or its destination
//! when the source is no pod). What the conventions do not name is under `weft.`:
//! both ends by name, the flow's kind, verdict, policies, end and counters. The
//! reporting node is the resource's `k8s.node.name`.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use opentelemetry::logs::{AnyValue, LogRecord, Severity};

use crate::aggregate::Aggregate;
use crate::record::{FlowRecord, Peer, PeerKind, Verdict, protocol_name};

/// The event name of a flow's record.
pub const FLOW_EVENT: &str = "weft.flow";
/// The event name of an aggregate's record.
pub const AGGREGATE_EVENT: &str = "weft.flow.aggregate";

fn time(ms: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

fn int(n: u64) -> AnyValue {
    AnyValue::Int(i64::try_from(n).unwrap_or(i64::MAX))
}

fn text(s: impl Into<String>) -> AnyValue {
    AnyValue::String(s.into().into())
}

/// `network.transport` as the conventions spell it (`tcp`, `udp`); for the protocols
/// they do not list, the name flows give everywhere else (`icmp`, `icmpv6`, `sctp`) or
/// the number.
pub fn transport(protocol: u8) -> String {
    protocol_name(protocol)
}

/// The semantic conventions' attribute for a workload written `Kind/name`, if the
/// conventions name that kind.
fn workload_attribute(workload: &str) -> Option<(&'static str, &str)> {
    let (kind, name) = workload.split_once('/')?;
    let key = match kind {
        "Deployment" => "k8s.deployment.name",
        "StatefulSet" => "k8s.statefulset.name",
        "DaemonSet" => "k8s.daemonset.name",
        "ReplicaSet" => "k8s.replicaset.name",
        "Job" => "k8s.job.name",
        "CronJob" => "k8s.cronjob.name",
        _ => return None,
    };
    Some((key, name))
}

fn kind_name(k: PeerKind) -> &'static str {
    match k {
        PeerKind::Pod => "pod",
        PeerKind::Node => "node",
        PeerKind::Outside => "outside",
    }
}

fn add_peer<R: LogRecord>(rec: &mut R, side: &'static str, p: &Peer) {
    let key = |what: &str| format!("weft.{side}.{what}");
    rec.add_attribute(key("kind"), kind_name(p.kind));
    for (what, v) in [
        ("namespace", &p.namespace),
        ("pod", &p.pod),
        ("workload", &p.workload),
        ("node", &p.node),
    ] {
        if !v.is_empty() {
            rec.add_attribute(key(what), text(&**v));
        }
    }
}

fn severity(v: Verdict) -> Severity {
    match v {
        Verdict::Forwarded => Severity::Info,
        Verdict::Denied | Verdict::Audit => Severity::Warn,
    }
}

/// Fills `rec` with flow `r`, observed at `now_ms`.
pub fn flow<R: LogRecord>(rec: &mut R, r: &FlowRecord, now_ms: i64) {
    rec.set_event_name(FLOW_EVENT);
    rec.set_timestamp(time(r.end_ms.unwrap_or(r.updated_ms)));
    rec.set_observed_timestamp(time(now_ms));
    let sev = severity(r.verdict);
    rec.set_severity_number(sev);
    rec.set_severity_text(sev.name());
    rec.set_body(text(format!(
        "{} -> {}:{} {} {} {} bytes",
        r.src,
        r.dst,
        r.dst.port,
        protocol_name(r.protocol),
        r.verdict.as_str(),
        r.bytes()
    )));
    rec.add_attribute("source.address", text(r.src.ip.to_string()));
    if r.src.port != 0 {
        rec.add_attribute("source.port", i64::from(r.src.port));
    }
    rec.add_attribute("destination.address", text(r.dst.ip.to_string()));
    if r.dst.port != 0 {
        rec.add_attribute("destination.port", i64::from(r.dst.port));
    }
    rec.add_attribute("network.transport", text(transport(r.protocol)));
    rec.add_attribute("network.type", if r.src.ip.is_ipv4() { "ipv4" } else { "ipv6" });
    let own = if r.src.kind == PeerKind::Pod { &r.src } else { &r.dst };
    if own.kind == PeerKind::Pod {
        rec.add_attribute("k8s.namespace.name", text(&*own.namespace));
        rec.add_attribute("k8s.pod.name", text(&*own.pod));
        if let Some((key, name)) = workload_attribute(&own.workload) {
            rec.add_attribute(key, text(name));
        }
    }
    add_peer(rec, "source", &r.src);
    add_peer(rec, "destination", &r.dst);
    if let Some(d) = r.dialled {
        rec.add_attribute("weft.flow.dialled", text(d.to_string()));
    }
    if let Some((t, c)) = r.icmp {
        rec.add_attribute("weft.flow.icmp.type", i64::from(t));
        rec.add_attribute("weft.flow.icmp.code", i64::from(c));
    }
    rec.add_attribute("weft.flow.id", int(r.id));
    rec.add_attribute("weft.flow.kind", r.kind.as_str());
    rec.add_attribute("weft.flow.verdict", r.verdict.as_str());
    rec.add_attribute("weft.flow.end", r.end.as_str());
    rec.add_attribute("weft.flow.start", r.start_ms);
    if let Some(end) = r.end_ms {
        rec.add_attribute("weft.flow.duration_ms", end.saturating_sub(r.start_ms));
    }
    if !r.policies.is_empty() {
        let list: Vec<AnyValue> = r.policies.iter().map(|p| text(p.to_string())).collect();
        rec.add_attribute("weft.flow.policies", AnyValue::ListAny(Box::new(list)));
    }
    if let Some(s) = &r.staged {
        rec.add_attribute("weft.flow.staged.verdict", s.verdict.as_str());
        let list: Vec<AnyValue> = s.policies.iter().map(|p| text(p.to_string())).collect();
        rec.add_attribute("weft.flow.staged.policies", AnyValue::ListAny(Box::new(list)));
    }
    counters(rec, r.forward, r.reverse);
}

fn counters<R: LogRecord>(rec: &mut R, forward: crate::Counters, reverse: crate::Counters) {
    rec.add_attribute("weft.flow.forward.bytes", int(forward.bytes));
    rec.add_attribute("weft.flow.forward.packets", int(forward.packets));
    rec.add_attribute("weft.flow.reverse.bytes", int(reverse.bytes));
    rec.add_attribute("weft.flow.reverse.packets", int(reverse.packets));
}

/// Fills `rec` with aggregate `a` (one 15 s bucket of one key), observed at `now_ms`.
pub fn aggregate<R: LogRecord>(rec: &mut R, a: &Aggregate, now_ms: i64) {
    rec.set_event_name(AGGREGATE_EVENT);
    rec.set_timestamp(time(a.end_ms));
    rec.set_observed_timestamp(time(now_ms));
    let sev = severity(a.key.verdict);
    rec.set_severity_number(sev);
    rec.set_severity_text(sev.name());
    rec.set_body(text(format!(
        "{} -> {}:{} {} {}: {} flows",
        a.key.src,
        a.key.dst,
        a.key.port,
        protocol_name(a.key.protocol),
        a.key.verdict.as_str(),
        a.value.flows
    )));
    if a.key.port != 0 {
        rec.add_attribute("destination.port", i64::from(a.key.port));
    }
    rec.add_attribute("network.transport", text(transport(a.key.protocol)));
    rec.add_attribute("weft.source.group", text(&*a.key.src));
    rec.add_attribute("weft.destination.group", text(&*a.key.dst));
    rec.add_attribute("weft.flow.kind", a.key.kind.as_str());
    rec.add_attribute("weft.flow.verdict", a.key.verdict.as_str());
    if !a.key.policy.is_empty() {
        rec.add_attribute("weft.flow.policy", text(&*a.key.policy));
    }
    rec.add_attribute("weft.aggregate.start", a.start_ms);
    rec.add_attribute("weft.aggregate.end", a.end_ms);
    rec.add_attribute("weft.aggregate.flows", int(a.value.flows));
    counters(rec, a.value.forward, a.value.reverse);
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use opentelemetry::Key;

    use super::*;
    use crate::record::{Counters, EndReason, FlowKind, PolicyHit, PolicySide};

    /// A record that keeps what it is given.
    #[derive(Default)]
    struct Kept {
        event: &'static str,
        severity: Option<Severity>,
        body: Option<AnyValue>,
        attrs: BTreeMap<String, AnyValue>,
    }

    impl LogRecord for Kept {
        fn set_event_name(&mut self, name: &'static str) {
            self.event = name;
        }
        fn set_target<T>(&mut self, _target: T)
        where
            T: Into<std::borrow::Cow<'static, str>>,
        {
        }
        fn set_timestamp(&mut self, _: SystemTime) {}
        fn set_observed_timestamp(&mut self, _: SystemTime) {}
        fn set_severity_text(&mut self, _: &'static str) {}
        fn set_severity_number(&mut self, s: Severity) {
            self.severity = Some(s);
        }
        fn set_body(&mut self, body: AnyValue) {
            self.body = Some(body);
        }
        fn add_attributes<I, K, V>(&mut self, attributes: I)
        where
            I: IntoIterator<Item = (K, V)>,
            K: Into<Key>,
            V: Into<AnyValue>,
        {
            for (k, v) in attributes {
                self.add_attribute(k, v);
            }
        }
        fn add_attribute<K, V>(&mut self, key: K, value: V)
        where
            K: Into<Key>,
            V: Into<AnyValue>,
        {
            let key: Key = key.into();
            assert!(
                self.attrs.insert(key.to_string(), value.into()).is_none(),
                "{key} set twice"
            );
        }
    }

    fn s(rec: &Kept, k: &str) -> Option<String> {
        match rec.attrs.get(k)? {
            AnyValue::String(v) => Some(v.to_string()),
            AnyValue::Int(i) => Some(i.to_string()),
            other => Some(format!("{other:?}")),
        }
    }

    fn pod(ns: &str, name: &str, workload: &str, ip: &str, port: u16) -> Peer {
        Peer {
            ip: ip.parse().unwrap(),
            port,
            kind: PeerKind::Pod,
            namespace: ns.into(),
            pod: name.into(),
            workload: workload.into(),
            node: "n1".into(),
        }
    }

    fn record() -> FlowRecord {
        FlowRecord {
            id: 7,
            node: "n1".into(),
            start_ms: 1_000,
            end_ms: Some(3_500),
            updated_ms: 3_500,
            src: pod("y", "a", "Deployment/web", "10.0.0.2", 40_000),
            dst: pod("x", "b", "", "10.0.1.3", 80),
            dialled: Some("10.96.0.10".parse().unwrap()),
            protocol: 6,
            icmp: None,
            kind: FlowKind::InterNode,
            verdict: Verdict::Forwarded,
            policies: Arc::from(vec![PolicyHit {
                domain: "".into(),
                side: PolicySide::Ingress,
                kind: "networkpolicy".into(),
                name: "x/allow".into(),
                rule: Some(0),
                rule_name: "".into(),
                effect: crate::record::Effect::Allow,
            }]),
            staged: None,
            forward: Counters {
                packets: 10,
                bytes: 1_000,
            },
            reverse: Counters { packets: 8, bytes: 500 },
            end: EndReason::Fin,
        }
    }

    #[test]
    fn a_flow_carries_the_conventions_attributes_and_its_own() {
        let mut rec = Kept::default();
        flow(&mut rec, &record(), 4_000);
        assert_eq!(rec.event, FLOW_EVENT);
        assert_eq!(rec.severity, Some(Severity::Info));
        for (k, v) in [
            ("source.address", "10.0.0.2"),
            ("source.port", "40000"),
            ("destination.address", "10.0.1.3"),
            ("destination.port", "80"),
            ("network.transport", "tcp"),
            ("network.type", "ipv4"),
            ("k8s.namespace.name", "y"),
            ("k8s.pod.name", "a"),
            ("k8s.deployment.name", "web"),
            ("weft.source.workload", "Deployment/web"),
            ("weft.destination.namespace", "x"),
            ("weft.destination.pod", "b"),
            ("weft.flow.dialled", "10.96.0.10"),
            ("weft.flow.kind", "inter-node"),
            ("weft.flow.verdict", "forwarded"),
            ("weft.flow.end", "fin"),
            ("weft.flow.duration_ms", "2500"),
            ("weft.flow.forward.bytes", "1000"),
            ("weft.flow.reverse.packets", "8"),
        ] {
            assert_eq!(s(&rec, k).as_deref(), Some(v), "{k}");
        }
        assert!(!rec.attrs.contains_key("weft.destination.workload"));
        match rec.attrs.get("weft.flow.policies") {
            Some(AnyValue::ListAny(l)) => {
                assert_eq!(l.len(), 1);
                assert!(format!("{:?}", l[0]).contains("ingress allowed by networkpolicy x/allow rule 0"));
            }
            other => panic!("policies: {other:?}"),
        }
    }

    #[test]
    fn a_flow_from_outside_names_its_destination_pod_and_a_denied_one_warns() {
        let mut r = record();
        r.src = Peer::outside("2001:db8::1".parse().unwrap(), 5000);
        r.dst = pod("x", "b", "StatefulSet/db", "fd00::3", 0);
        r.protocol = 58;
        r.icmp = Some((128, 0));
        r.verdict = Verdict::Denied;
        let mut rec = Kept::default();
        flow(&mut rec, &r, 4_000);
        assert_eq!(rec.severity, Some(Severity::Warn));
        assert_eq!(s(&rec, "k8s.pod.name").as_deref(), Some("b"));
        assert_eq!(s(&rec, "k8s.statefulset.name").as_deref(), Some("db"));
        assert_eq!(s(&rec, "network.type").as_deref(), Some("ipv6"));
        assert_eq!(s(&rec, "network.transport").as_deref(), Some("icmpv6"));
        assert_eq!(s(&rec, "weft.source.kind").as_deref(), Some("outside"));
        assert_eq!(s(&rec, "weft.flow.icmp.type").as_deref(), Some("128"));
        assert!(!rec.attrs.contains_key("destination.port"), "no port: no attribute");
    }
}
