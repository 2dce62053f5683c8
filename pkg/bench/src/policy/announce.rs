//! New pods announced at scale: in the scale simulation, a pod of another node comes
//! as a node announces it at its ADD (the wire port's `weft.wire.v1.Policy/Announce`,
//! as another weftd calls it), before the API server has its address. The bench plays
//! that node: a Node object for it in the cluster (an address of the measured node's
//! namespace, so the call comes from it, and a pod range), the pods' objects without
//! addresses (as the API has them before kubelet reports), then one call per pod from
//! that address, timed from the call to its answer (which comes once the node's kernel
//! holds the address) and to the first transaction holding it (`nft monitor`).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use weft_rpc::wire::policy_client::PolicyClient;
use weft_rpc::wire::{AnnounceOutcome, AnnounceRequest, AnnouncedPod, Hello};

use super::cluster::Cluster;
use super::nftmon::{Monitor, Transaction};
use super::objects::Synthetic;
use crate::simnode::SimNode;

/// The announcing node's name.
const ANNOUNCER: &str = "announcer";
/// Its address: one of the measured node's namespace (loopback), which the bench
/// calls from, as a peer node's weftd calls from its own.
const ANNOUNCER_ADDRESS: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);
/// The measured weftd's wire port (its default).
const WIRE_PORT: u16 = 9385;
/// How long the measured node may take to know the announcer's Node object.
const NODE_LIMIT: Duration = Duration::from_secs(30);
/// How long one announcement's address may take to reach the kernel.
const LIMIT: Duration = Duration::from_secs(30);

/// One announcement as the measured node took it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Announced {
    /// From the call to its answer (ms).
    pub(crate) answer_ms: f64,
    /// From the call to the first transaction holding the address (ms).
    pub(crate) kernel_ms: f64,
}

/// The `i`th announced pod's address (in the announcer's pod range).
fn address(i: usize) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 230, 0, 0)) + 1 + i as u32)
}

fn node_object() -> Value {
    weft_lab::kinds::node(&weft_topology::ClusterNode {
        name: ANNOUNCER.into(),
        addresses: vec![IpAddr::V4(ANNOUNCER_ADDRESS)],
        pod_cidrs: vec!["10.230.0.0/16".parse().expect("a range")],
        ..Default::default()
    })
}

/// The `i`th announced pod's object as the API has it before kubelet reports: a peer of
/// the policies selecting the node's first pod, on the announcer, without addresses.
fn pod_object(s: &Synthetic, i: usize) -> Value {
    let mut p = s.arriving_peer(i);
    p["metadata"]["name"] = format!("announced-{i}").into();
    p["spec"]["nodeName"] = ANNOUNCER.into();
    p["status"] = json!({"phase": "Pending"});
    p
}

/// Announces `n` pods to `node` as the announcer, one call each, and times each.
pub(crate) fn announce(
    node: &SimNode,
    objects: &Cluster,
    s: &Synthetic,
    monitor: &Monitor,
    n: usize,
    tag: &str,
) -> Result<Vec<Announced>, String> {
    objects.put("announcer-node.yaml", &[node_object()])?;
    let pods: Vec<Value> = (0..n).map(|i| pod_object(s, i)).collect();
    objects.put("announced-pods.yaml", &pods)?;
    let namespace = Synthetic::ns_name(0);
    let timed = node
        .ns
        .within(|| {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| format!("{tag}: a runtime: {e}"))?;
            rt.block_on(async {
                let channel = tonic::transport::Endpoint::from_shared(format!(
                    "http://{}",
                    SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), WIRE_PORT)
                ))
                .map_err(|e| e.to_string())?
                .connect_with_connector(tower::service_fn(|uri: http::Uri| async move {
                    // From the announcer's address, as its weftd would call.
                    let socket = tokio::net::TcpSocket::new_v4()?;
                    socket.bind(SocketAddr::new(IpAddr::V4(ANNOUNCER_ADDRESS), 0))?;
                    let port = uri.port_u16().unwrap_or(WIRE_PORT);
                    let stream = socket
                        .connect(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port))
                        .await?;
                    // As tonic's own connector does: a small request is not held back
                    // for a delayed acknowledgement (40 ms).
                    stream.set_nodelay(true)?;
                    Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
                }))
                .await
                .map_err(|e| format!("{tag}: connecting to the wire port: {e}"))?;
                let mut client = PolicyClient::new(channel);
                let request = |i: usize| AnnounceRequest {
                    from: Some(Hello {
                        node: ANNOUNCER.into(),
                        address: ANNOUNCER_ADDRESS.to_string(),
                    }),
                    pods: vec![AnnouncedPod {
                        namespace: namespace.clone(),
                        name: format!("announced-{i}"),
                        ips: vec![address(i).to_string()],
                    }],
                };
                // Until the node knows the announcer's Node and the pods' objects: a
                // probe (no pod) is admitted once the Node is known, and the first pod
                // is applied (not kept) once its object is.
                let deadline = Instant::now() + NODE_LIMIT;
                loop {
                    let admitted = client
                        .announce(AnnounceRequest {
                            from: request(0).from,
                            pods: Vec::new(),
                        })
                        .await
                        .is_ok();
                    if admitted {
                        break;
                    }
                    if Instant::now() > deadline {
                        return Err(format!(
                            "{tag}: the node never admitted the announcer within {NODE_LIMIT:?}"
                        ));
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
                let mut out = Vec::with_capacity(n);
                for i in 0..n {
                    let ip = address(i).to_string();
                    let (a, b) = (format!("{ip} "), format!("{ip},"));
                    let holds = |t: &Transaction| t.has(&["add element", &a]) || t.has(&["add element", &b]);
                    let mark = monitor.mark();
                    let t0 = Instant::now();
                    let reply = client
                        .announce(request(i))
                        .await
                        .map_err(|e| format!("{tag}: announcing pod {i}: {}", e.message()))?
                        .into_inner();
                    let answer_ms = t0.elapsed().as_secs_f64() * 1000.0;
                    let outcome = reply.results.first().map(|r| (r.outcome(), r.reason.clone()));
                    if outcome.as_ref().map(|o| o.0) != Some(AnnounceOutcome::Applied) {
                        return Err(format!("{tag}: pod {i} announced, not applied: {outcome:?}"));
                    }
                    let (txs, ok) = monitor.wait(mark, LIMIT, |txs| txs.iter().any(holds));
                    if !ok {
                        return Err(format!("{tag}: announced pod {i} ({ip}) never reached the kernel"));
                    }
                    let t = txs.iter().find(|t| holds(t)).expect("found above");
                    out.push(Announced {
                        answer_ms,
                        kernel_ms: t.first.duration_since(t0).as_secs_f64() * 1000.0,
                    });
                    monitor.settle(Duration::from_millis(20), Duration::from_secs(5));
                }
                Ok(out)
            })
        })
        .map_err(|e| format!("{tag}: entering the node's namespace: {e}"))??;
    // kubelet reports their addresses: the API now has what the announcements gave (a
    // restarted weftd, which knows no announcement, builds the same table from it).
    let reported: Vec<Value> = (0..n)
        .map(|i| {
            let mut p = pod_object(s, i);
            p["status"] = json!({"phase": "Running", "podIP": address(i).to_string(),
                                  "podIPs": [{"ip": address(i).to_string()}]});
            p
        })
        .collect();
    objects.put("announced-pods.yaml", &reported)?;
    monitor.settle(Duration::from_millis(300), Duration::from_secs(10));
    Ok(timed)
}
