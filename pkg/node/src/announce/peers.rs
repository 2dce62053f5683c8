//! The client side: every other node of the cluster told in parallel, over one
//! persistent channel per peer, within a bound; a peer that did not answer is left out
//! of ADDs until it answers again in the background, so that a dead node slows one ADD,
//! not every one.
//!
//! When a left-out peer is asked again depends on what its failure cost: one that made
//! an ADD wait out the bound (a timeout: a dead or overloaded node) only after
//! [`SKIP_FOR`], so that it costs at most one ADD in that time; one that failed at once
//! (connection refused: a weftd starting or restarting, as every node's is when a lab or
//! a cluster starts) soon, from [`FIRST_RETRY`] on and twice as long each time up to
//! [`SKIP_FOR`], so that it takes announcements again within a moment of serving.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::time::Instant;
use tonic::transport::Channel;
use tracing::Instrument;
use weft_policy::{Announced, Announcer};
use weft_rpc::wire::policy_client::PolicyClient;
use weft_rpc::wire::{AnnounceOutcome, AnnounceRequest, AnnouncedPod, Hello, PeerFlowsRequest, PeerTraceRequest};
use weft_topology::TopologySource;
use weft_wiretls::{WireConnector, WireSecurity};

use super::{AnnounceLabels, AnnounceMetrics};

/// How long a peer that made an ADD wait out the bound is left out of announcements
/// before it is asked again (in the background: ADDs wait for it again once it
/// answered); also the longest wait between two tries of a peer that does not answer.
pub const SKIP_FOR: Duration = Duration::from_secs(30);
/// When a peer that failed at once (or a background try) is first tried again.
pub const FIRST_RETRY: Duration = Duration::from_millis(100);
/// How long one call may take in all, in the background once the ADD stopped waiting:
/// an announcement that lands late still beats the API server's watch.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// What the announcer knows of a peer's answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Health {
    /// It answers: asked at every ADD.
    Up,
    /// It did not answer: left out of ADDs; tried again in the background from
    /// `until` on (`probing` while that call is out), the next time `retry` after it
    /// if it fails again.
    Down {
        until: Instant,
        retry: Duration,
        probing: bool,
    },
}

/// One other node: where it is and the channel to it (kept across calls: it reconnects
/// by itself, so an ADD pays no handshake unless the connection was lost).
struct Peer {
    address: IpAddr,
    client: PolicyClient<Channel>,
    health: Health,
}

/// How one peer's call ended.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Outcome {
    /// It took every pod.
    Taken,
    /// It answered with a refusal (of a pod or of the call).
    Refused(String),
    /// No answer: the call failed (connection refused or lost, TLS refused).
    Failed(String),
    /// No answer within the bound: the ADD waited it out.
    Late,
}

impl Outcome {
    fn label(&self) -> &'static str {
        match self {
            Outcome::Taken => "taken",
            Outcome::Refused(_) => "refused",
            Outcome::Failed(_) | Outcome::Late => "failed",
        }
    }
}

struct Inner {
    node_name: String,
    /// This node's address as given (`--node-address`, or a wire address that is no
    /// wildcard); else the source's.
    node_address: Option<IpAddr>,
    port: u16,
    connector: WireConnector,
    source: Arc<dyn TopologySource>,
    bound: Duration,
    skip_for: Duration,
    first_retry: Duration,
    metrics: Arc<AnnounceMetrics>,
    peers: Mutex<BTreeMap<String, Peer>>,
    /// Wakes [`WireAnnouncer::run`] when a peer's next try is set.
    retry_set: tokio::sync::Notify,
}

/// The policy engine's [`Announcer`] over the wire port: every other Node of the
/// cluster (by [`TopologySource::nodes`]) is called at its first address and this node's
/// wire port, with the port's security, all at once; [`Announcer::announce`] returns
/// when each answered or `bound` passed. A peer that did not answer is left out until
/// it answers in the background (see the module documentation; one log line when it
/// goes down, one when it is back).
#[derive(Clone)]
pub struct WireAnnouncer {
    inner: Arc<Inner>,
}

impl WireAnnouncer {
    /// An announcer for node `node_name` (at `node_address` if given, else where
    /// `source` says) calling its peers' wire port `port` with `security`, each ADD
    /// waiting at most `bound`.
    pub fn new(
        node_name: String,
        node_address: Option<IpAddr>,
        port: u16,
        security: WireSecurity,
        source: Arc<dyn TopologySource>,
        bound: Duration,
        metrics: Arc<AnnounceMetrics>,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                node_name,
                node_address,
                port,
                connector: WireConnector::new(security),
                source,
                bound,
                skip_for: SKIP_FOR,
                first_retry: FIRST_RETRY,
                metrics,
                peers: Mutex::default(),
                retry_set: tokio::sync::Notify::new(),
            }),
        }
    }

    /// The same with [`SKIP_FOR`] and [`FIRST_RETRY`] replaced (tests).
    pub fn with_retries(mut self, skip_for: Duration, first_retry: Duration) -> Self {
        let inner = Arc::get_mut(&mut self.inner).expect("retries are set before the announcer is cloned");
        inner.skip_for = skip_for;
        inner.first_retry = first_retry;
        self
    }

    /// Keeps the peers in step with the Node objects, and tries the peers left out
    /// again when their time comes, until `stop`. A new peer is probed (a call without
    /// pods) at once, so that its connection is open, and a dead node known, before the
    /// first ADD that would wait for it.
    pub async fn run(self, stop: impl Future<Output = ()>) {
        let mut changes = Some(self.inner.source.changes());
        tokio::pin!(stop);
        loop {
            for (name, client) in self.inner.refresh() {
                self.inner.clone().probe(name, client, self.inner.request(Vec::new()));
            }
            let (_, next) = self.inner.retry_due(None);
            // Asleep until a try is due, the Node objects change or a failure sets a
            // new try: nothing wakes while every peer answers.
            let due = async {
                match next {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            let changed = async {
                match changes.as_mut() {
                    Some(c) => c.changed().await.is_ok(),
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = &mut stop => return,
                alive = changed => if !alive { changes = None },
                _ = due => {}
                _ = self.inner.retry_set.notified() => {}
            }
        }
    }

    /// The peers as known now: name and whether it is asked at the next ADD (tests).
    pub fn peer_states(&self) -> BTreeMap<String, bool> {
        let peers = self.inner.peers.lock().expect("peers lock");
        peers.iter().map(|(n, p)| (n.clone(), p.health == Health::Up)).collect()
    }
}

impl crate::flows::PeerFlows for WireAnnouncer {
    fn flows(
        &self,
        request: weft_rpc::admin::FlowsRequest,
    ) -> BoxFuture<'static, Vec<(String, Result<weft_daemon::service::FlowsStream, String>)>> {
        let inner = self.inner.clone();
        Box::pin(async move {
            let from = inner.address().map(|a| Hello {
                node: inner.node_name.clone(),
                address: a.to_string(),
            });
            // Every peer the Node objects name, whether or not it took the last
            // announcement: a listing says which did not answer.
            let peers: Vec<(String, PolicyClient<Channel>)> = {
                let peers = inner.peers.lock().expect("peers lock");
                peers.iter().map(|(n, p)| (n.clone(), p.client.clone())).collect()
            };
            let calls = peers.into_iter().map(|(name, mut client)| {
                let req = PeerFlowsRequest {
                    from: from.clone(),
                    request: Some(request.clone()),
                };
                async move {
                    let answer = match client.flows(req).await {
                        Ok(r) => Ok(Box::pin(r.into_inner()) as weft_daemon::service::FlowsStream),
                        Err(s) => Err(format!("{:?}: {}", s.code(), s.message())),
                    };
                    (name, answer)
                }
            });
            futures::future::join_all(calls).await
        })
    }
}

impl crate::trace::PeerTrace for WireAnnouncer {
    fn watch(
        &self,
        src: IpAddr,
        dst: IpAddr,
        probe: weft_kernel::trace::Probe,
        watch: std::time::Duration,
    ) -> BoxFuture<'static, Vec<(String, Result<crate::trace::PeerItems, String>)>> {
        let inner = self.inner.clone();
        Box::pin(async move {
            let from = inner.address().map(|a| Hello {
                node: inner.node_name.clone(),
                address: a.to_string(),
            });
            let peers: Vec<(String, PolicyClient<Channel>)> = {
                let peers = inner.peers.lock().expect("peers lock");
                peers.iter().map(|(n, p)| (n.clone(), p.client.clone())).collect()
            };
            let calls = peers.into_iter().map(|(name, mut client)| {
                let req = PeerTraceRequest {
                    from: from.clone(),
                    src_ip: src.to_string(),
                    dst_ip: dst.to_string(),
                    probe: probe.to_string(),
                    watch_ms: watch.as_millis() as u32,
                };
                async move {
                    let answer = match client.trace(req).await {
                        Ok(r) => Ok(Box::pin(r.into_inner()) as crate::trace::PeerItems),
                        Err(s) => Err(format!("{:?}: {}", s.code(), s.message())),
                    };
                    (name, answer)
                }
            });
            futures::future::join_all(calls).await
        })
    }
}

impl Inner {
    /// This node's address, for the `Hello` of its calls.
    fn address(&self) -> Option<IpAddr> {
        self.node_address.or_else(|| self.source.node_address())
    }

    /// Brings the peers in line with the Node objects (every other node with an
    /// address: its first, the primary one); returns the ones new (or moved) since the
    /// last time.
    fn refresh(&self) -> Vec<(String, PolicyClient<Channel>)> {
        let me = self.address();
        let nodes = self.source.nodes();
        let mut peers = self.peers.lock().expect("peers lock");
        peers.retain(|name, _| nodes.iter().any(|n| &n.name == name));
        let mut new = Vec::new();
        for n in nodes {
            let Some(&address) = n.addresses.first() else {
                peers.remove(&n.name);
                continue;
            };
            if n.name == self.node_name || Some(address) == me {
                continue;
            }
            if peers.get(&n.name).is_some_and(|p| p.address == address) {
                continue;
            }
            let client = PolicyClient::new(self.channel(address));
            peers.insert(
                n.name.clone(),
                Peer {
                    address,
                    client: client.clone(),
                    health: Health::Up,
                },
            );
            new.push((n.name, client));
        }
        new
    }

    /// A channel to a peer's wire port, opened at its first call and reopened after a
    /// failure by itself.
    fn channel(&self, address: IpAddr) -> Channel {
        self.connector
            .channel(SocketAddr::new(address, self.port), CALL_TIMEOUT)
    }

    fn request(&self, pods: Vec<AnnouncedPod>) -> AnnounceRequest {
        AnnounceRequest {
            // Without a known address of its own, the node claims none: the peer goes by
            // the connection alone, as it does anyway.
            from: self.address().map(|a| Hello {
                node: self.node_name.clone(),
                address: a.to_string(),
            }),
            pods,
        }
    }

    /// Sends `req` to a peer in the background (no ADD waits for it): what it answers
    /// says whether the peer is up.
    fn probe(self: Arc<Self>, name: String, client: PolicyClient<Channel>, req: AnnounceRequest) {
        tokio::spawn(async move {
            match call(client, req).await {
                Outcome::Failed(why) => self.failed(&name, &why, false),
                Outcome::Late => self.failed(&name, "no answer", false),
                Outcome::Taken | Outcome::Refused(_) => self.answered(&name),
            }
        });
    }

    /// Tries again, in the background, every peer left out whose time has come, with
    /// `req` (an ADD's announcement) or a probe; returns how many peers are left out,
    /// and when the next try not yet due is.
    fn retry_due(self: &Arc<Self>, req: Option<&AnnounceRequest>) -> (u64, Option<Instant>) {
        let now = Instant::now();
        let mut due = Vec::new();
        let mut out = 0;
        let mut next: Option<Instant> = None;
        {
            let mut peers = self.peers.lock().expect("peers lock");
            for (name, p) in peers.iter_mut() {
                if let Health::Down { until, probing, .. } = &mut p.health {
                    out += 1;
                    if *probing {
                        continue;
                    }
                    if now >= *until {
                        *probing = true;
                        due.push((name.clone(), p.client.clone()));
                    } else {
                        next = Some(next.map_or(*until, |n| n.min(*until)));
                    }
                }
            }
        }
        for (name, client) in due {
            let req = req.cloned().unwrap_or_else(|| self.request(Vec::new()));
            self.clone().probe(name, client, req);
        }
        (out, next)
    }

    /// Leaves `name` out after a failure (with a log line if it was up): for
    /// [`SKIP_FOR`] if an ADD waited it out (`waited_out`), else for a while that
    /// doubles with each failure in a row.
    fn failed(&self, name: &str, why: &str, waited_out: bool) {
        let mut peers = self.peers.lock().expect("peers lock");
        let Some(p) = peers.get_mut(name) else { return };
        let retry = match (p.health, waited_out) {
            (_, true) => self.skip_for,
            (Health::Up, false) => self.first_retry,
            (Health::Down { retry, .. }, false) => (retry * 2).clamp(self.first_retry, self.skip_for),
        };
        if p.health == Health::Up {
            tracing::warn!(peer = %name, address = %p.address, error = %why, retry_in = ?retry, "a peer node does not take policy announcements: new pods are not announced to it until it answers again");
        }
        p.health = Health::Down {
            until: Instant::now() + retry,
            retry,
            probing: false,
        };
        drop(peers);
        self.retry_set.notify_one();
    }

    /// Marks `name` up after an answer, with a log line if it was down.
    fn answered(&self, name: &str) {
        let mut peers = self.peers.lock().expect("peers lock");
        let Some(p) = peers.get_mut(name) else { return };
        if p.health != Health::Up {
            tracing::info!(peer = %name, address = %p.address, "a peer node takes policy announcements again");
        }
        p.health = Health::Up;
    }

    async fn announce(self: Arc<Self>, pod: Announced) {
        let started = Instant::now();
        if pod.ips.is_empty() {
            return;
        }
        // A node new since the last look is called below like the others.
        self.refresh();
        let req = self.request(vec![AnnouncedPod {
            namespace: pod.namespace,
            name: pod.name,
            ips: pod.ips.iter().map(ToString::to_string).collect(),
        }]);
        let waited: Vec<_> = {
            let peers = self.peers.lock().expect("peers lock");
            peers
                .iter()
                .filter(|(_, p)| p.health == Health::Up)
                // A task of its own: the call goes on after the bound.
                .map(|(name, p)| (name.clone(), tokio::spawn(call(p.client.clone(), req.clone()))))
                .collect()
        };
        // Peers left out whose time has come get this announcement in the background;
        // the next ADD waits for them if they answered.
        let (skipped, _) = self.retry_due(Some(&req));
        let count = |result: &'static str, n: u64| {
            self.metrics.peers.get_or_create(&AnnounceLabels { result }).inc_by(n);
        };
        count("skipped", skipped);
        let deadline = started + self.bound;
        let outcomes = futures::future::join_all(waited.into_iter().map(|(name, call)| async move {
            let outcome = match tokio::time::timeout_at(deadline, call).await {
                Ok(Ok(o)) => o,
                Ok(Err(e)) => Outcome::Failed(format!("the call's task failed: {e}")),
                Err(_) => Outcome::Late,
            };
            (name, outcome)
        }))
        .await;
        for (name, outcome) in &outcomes {
            count(outcome.label(), 1);
            match outcome {
                Outcome::Failed(why) => self.failed(name, why, false),
                Outcome::Late => self.failed(name, "no answer within the bound", true),
                Outcome::Refused(why) => {
                    tracing::debug!(peer = %name, reason = %why, "a peer node refused a policy announcement");
                    self.answered(name);
                }
                Outcome::Taken => self.answered(name),
            }
        }
        self.metrics.seconds.observe(started.elapsed().as_secs_f64());
    }
}

/// One call and how it ended.
async fn call(mut client: PolicyClient<Channel>, req: AnnounceRequest) -> Outcome {
    match client.announce(req).await {
        Ok(reply) => {
            let refused: Vec<String> = reply
                .into_inner()
                .results
                .into_iter()
                .filter(|r| r.outcome() == AnnounceOutcome::Refused || r.outcome() == AnnounceOutcome::Unspecified)
                .map(|r| r.reason)
                .collect();
            if refused.is_empty() {
                Outcome::Taken
            } else {
                Outcome::Refused(refused.join("; "))
            }
        }
        // No answer from the peer's service: the transport's (connection refused or
        // lost, no TLS) and timeouts.
        Err(s)
            if matches!(
                s.code(),
                tonic::Code::Unavailable
                    | tonic::Code::DeadlineExceeded
                    | tonic::Code::Cancelled
                    | tonic::Code::Unknown
            ) =>
        {
            Outcome::Failed(s.message().to_string())
        }
        // An answer: the peer refused the call (this node unknown to it, a node without
        // network policy: `Unimplemented`).
        Err(s) => Outcome::Refused(format!("{:?}: {}", s.code(), s.message())),
    }
}

impl Announcer for WireAnnouncer {
    fn announce(&self, pod: Announced) -> BoxFuture<'static, ()> {
        let span = tracing::info_span!(
            "policy.announce",
            k8s.namespace.name = %pod.namespace,
            k8s.pod.name = %pod.name,
        );
        Box::pin(self.inner.clone().announce(pod).instrument(span))
    }
}
