//! The order of a trace without root: every node armed before the probe leaves, the
//! nodes' accounts gathered (the source's first), the ends checked, one trace at a time.

use std::sync::Mutex;

use weft_kernel::trace::Step;

use super::*;

/// What happened, in order, across the fakes.
type Log = Arc<Mutex<Vec<String>>>;

fn log(l: &Log, what: impl Into<String>) {
    l.lock().unwrap().push(what.into());
}

struct FakePolicy;

impl TracePolicy for FakePolicy {
    fn resolve(&self, what: &str) -> Result<(String, Vec<IpAddr>), String> {
        match what {
            "x/a" => Ok(("x/a".into(), vec!["10.0.1.2".parse().unwrap()])),
            "y/b" => Ok(("y/b".into(), vec!["10.0.2.2".parse().unwrap()])),
            "y/elsewhere" => Ok(("y/elsewhere".into(), vec!["10.0.3.2".parse().unwrap()])),
            other => other
                .parse::<IpAddr>()
                .map(|ip| (ip.to_string(), vec![ip]))
                .map_err(|_| format!("no pod {other} is known")),
        }
    }
    fn explain(&self, r: PolicyExplainRequest) -> Result<PolicyExplainReply, String> {
        Ok(PolicyExplainReply {
            src: r.src,
            dst: r.dst,
            allowed: r.port == 80,
            passes: r.port == 80,
            ..Default::default()
        })
    }
    fn meaning(&self, _table: &str, chain: &str, _rule: &str) -> Option<String> {
        (chain == "g-y").then(|| "pods of y isolated (ingress) by y/deny".to_string())
    }
}

struct FakeWatch {
    log: Log,
    hop: Option<Hop>,
}

impl Watching for FakeWatch {
    fn wait_seen(&self, _: Duration) -> bool {
        self.hop.is_some()
    }
    fn finish(self: Box<Self>) -> Option<Hop> {
        log(&self.log, "local finished");
        self.hop
    }
}

struct FakeKernel {
    log: Log,
    hop: Option<Hop>,
}

impl TraceKernel for FakeKernel {
    fn watch(&self, src: IpAddr, dst: IpAddr, probe: Probe) -> Result<Box<dyn Watching>, String> {
        log(&self.log, format!("local armed {src}>{dst} {probe}"));
        Ok(Box::new(FakeWatch {
            log: self.log.clone(),
            hop: self.hop.clone(),
        }))
    }
    fn send(&self, netns: &str, dst: IpAddr, _: Probe) -> Result<Option<bool>, String> {
        log(&self.log, format!("sent from {netns} to {dst}"));
        Ok(Some(false))
    }
}

fn dropping_hop() -> Hop {
    Hop {
        iif: "eth0".into(),
        oif: "veth-b".into(),
        route: "10.0.2.2 dev veth-b".into(),
        steps: vec![
            Step {
                table: "inet weft-policy".into(),
                chain: "ingress".into(),
                rule: "jump g-y".into(),
                verdict: "jump g-y".into(),
            },
            Step {
                table: "inet weft-policy".into(),
                chain: "g-y".into(),
                rule: "counter drop".into(),
                verdict: "drop".into(),
            },
        ],
        dropped_at: Some(1),
    }
}

/// n2 is armed and crossed, n3 armed and not crossed, n4 unreachable.
struct FakePeers {
    log: Log,
}

impl PeerTrace for FakePeers {
    fn watch(
        &self,
        _src: IpAddr,
        _dst: IpAddr,
        _probe: Probe,
        watch: Duration,
    ) -> BoxFuture<'static, Vec<(String, Result<PeerItems, String>)>> {
        assert_eq!(watch, WATCH);
        let l = self.log.clone();
        Box::pin(async move {
            let armed = |node: &'static str, hop: Option<TraceHop>| -> PeerItems {
                let l = l.clone();
                let first = futures::stream::once(async move {
                    log(&l, format!("{node} armed"));
                    Ok(PeerTraceItem {
                        item: Some(Item::Armed(true)),
                    })
                });
                let last = futures::stream::iter(hop.map(|h| {
                    Ok(PeerTraceItem {
                        item: Some(Item::Hop(h)),
                    })
                }));
                Box::pin(first.chain(last))
            };
            vec![
                (
                    "n3".to_string(),
                    Ok(armed(
                        "n3",
                        Some(TraceHop {
                            node: "n3".into(),
                            iif: "weft-vxlan".into(),
                            ..Default::default()
                        }),
                    )),
                ),
                ("n4".to_string(), Err("Unavailable: connection refused".to_string())),
                ("n2".to_string(), Ok(armed("n2", None))),
            ]
        })
    }
}

fn node(hop: Option<Hop>) -> (NodeTrace, Log) {
    let l: Log = Arc::default();
    let pods: LocalPodLookup = Arc::new(|ns, name| {
        Box::pin(async move {
            Ok((ns == "x" && name == "a").then(|| ("/run/netns/pod-a".to_string(), vec!["10.0.1.2".parse().unwrap()])))
        })
    });
    let t = NodeTrace::new(
        "n1",
        Arc::new(FakePolicy),
        pods,
        Arc::new(FakeKernel { log: l.clone(), hop }),
    );
    t.set_peers(Arc::new(FakePeers { log: l.clone() }));
    (t, l)
}

fn request(src: &str, dst: &str, probe: &str) -> TraceRequest {
    TraceRequest {
        src: src.into(),
        dst: dst.into(),
        probe: probe.into(),
    }
}

#[tokio::test]
async fn every_node_is_armed_before_the_probe_leaves_and_the_source_comes_first() {
    let (t, l) = node(Some(dropping_hop()));
    let r = t.trace(request("x/a", "y/b", "81/tcp")).await.expect("a trace");
    let events = l.lock().unwrap().clone();
    assert_eq!(
        events,
        [
            "local armed 10.0.1.2>10.0.2.2 81/tcp",
            "n3 armed",
            "n2 armed",
            "sent from /run/netns/pod-a to 10.0.2.2",
            "local finished"
        ]
    );
    let nodes: Vec<&str> = r.hops.iter().map(|h| h.node.as_str()).collect();
    assert_eq!(nodes, ["n1", "n3"], "n2 was not crossed: no hop");
    assert_eq!(r.hops[0].dropped_at, 2, "the second step, plus one");
    assert_eq!(r.hops[0].steps[1].meaning, "pods of y isolated (ingress) by y/deny");
    assert_eq!(r.hops[0].steps[0].meaning, "", "a chain the policy does not know");
    assert_eq!(r.unwatched, ["n4: Unavailable: connection refused"]);
    assert_eq!(r.answer, TraceAnswer::NotAnswered as i32);
    assert_eq!((r.src_ip.as_str(), r.dst_ip.as_str()), ("10.0.1.2", "10.0.2.2"));
    let expected = r.expected.expect("explained");
    assert!(!expected.allowed, "81 is not allowed by the fake");
}

#[tokio::test]
async fn an_icmp_probe_is_not_explained_and_an_address_is_a_destination() {
    let (t, _) = node(None);
    let r = t.trace(request("x/a", "10.0.9.9", "icmp")).await.expect("a trace");
    assert!(r.expected.is_none());
    assert_eq!(r.dst, "10.0.9.9");
    assert_eq!(r.hops.len(), 1, "only n3 saw it: {:?}", r.hops);
}

#[tokio::test]
async fn bad_ends_and_probes_are_refused_before_anything_is_armed() {
    let (t, l) = node(None);
    let code = |r: Result<TraceReply, Status>| r.expect_err("refused").code();
    assert_eq!(
        code(t.trace(request("x/a", "y/b", "80/sctp")).await),
        tonic::Code::InvalidArgument
    );
    assert_eq!(
        code(t.trace(request("10.0.1.2", "y/b", "80/tcp")).await),
        tonic::Code::InvalidArgument,
        "the source is a pod"
    );
    let elsewhere = t
        .trace(request("y/elsewhere", "y/b", "80/tcp"))
        .await
        .expect_err("not here");
    assert_eq!(elsewhere.code(), tonic::Code::FailedPrecondition);
    assert!(elsewhere.message().contains("does not run on node n1"), "{elsewhere:?}");
    assert_eq!(
        code(t.trace(request("x/a", "z/none", "80/tcp")).await),
        tonic::Code::FailedPrecondition
    );
    assert!(l.lock().unwrap().is_empty(), "nothing armed: {:?}", l.lock().unwrap());
}

#[tokio::test]
async fn one_trace_at_a_time_on_a_node() {
    let (t, _) = node(Some(dropping_hop()));
    let src = "10.0.5.5".parse().unwrap();
    let dst = "10.0.1.2".parse().unwrap();
    let mut watching = t.watch(src, dst, Probe::Icmp, Duration::from_secs(30)).expect("armed");
    let first = watching.next().await.expect("an item").expect("armed");
    assert_eq!(first.item, Some(Item::Armed(true)));
    let busy = t.trace(request("x/a", "y/b", "80/tcp")).await.expect_err("busy");
    assert_eq!(busy.code(), tonic::Code::Unavailable, "{busy:?}");
    // The caller going away ends the watch early, and frees the node.
    drop(watching);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        match t.watch(src, dst, Probe::Icmp, Duration::from_millis(10)) {
            Ok(mut w) => {
                assert!(matches!(w.next().await, Some(Ok(_))));
                let hop = w.next().await.expect("the hop").expect("no error");
                let Some(Item::Hop(h)) = hop.item else {
                    panic!("a hop: {hop:?}")
                };
                assert_eq!((h.node.as_str(), h.dropped_at), ("n1", 2));
                break;
            }
            Err(s) if tokio::time::Instant::now() < deadline => {
                assert_eq!(s.code(), tonic::Code::Unavailable);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(s) => panic!("still busy: {s:?}"),
        }
    }
    let mixed = t.watch(src, "fd00::1".parse().unwrap(), Probe::Icmp, Duration::ZERO);
    assert_eq!(mixed.err().map(|s| s.code()), Some(tonic::Code::InvalidArgument));
}
