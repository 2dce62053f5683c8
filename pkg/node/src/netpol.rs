//! Network policy in the node: the engine's deny log read from the kernel (NFLOG, on a
//! thread of its own) and written as log lines and spans, and the engine as the admin
//! service's policy seam.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::broadcast;
use weft_daemon::service::PolicyAdmin;
use weft_policy::{DenyEvent, NftKernel, PolicyEngine};
use weft_rpc::admin::{PolicyDeny, PolicyExplainReply, PolicyExplainRequest, PolicySide, PolicyState};
use weft_topology::PortProtocol;

/// The engine weftd runs.
pub type Engine = PolicyEngine<NftKernel>;

/// How much of a denied packet NFLOG copies: its IPv6 header and ports.
const LOG_COPY: u32 = 64;

/// Reads the packets the policy table logs until `stop`, on a thread in the calling
/// thread's network namespace (weftd's, the node's): each becomes a deny event (unless
/// its flow was just reported), a log line, and a span exported over OTLP when an
/// endpoint is set. A group another process holds is said once; policy still works,
/// only denied flows go unexplained.
pub fn read_denies(engine: Arc<Engine>, stop: Arc<AtomicBool>) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new().name("policy-nflog".into()).spawn(move || {
        let mut sock = match weft_kernel::nflog::NflogSocket::bind(weft_policy::plan::LOG_GROUP, LOG_COPY) {
            Ok(s) => s,
            Err(e) => {
                tracing::error!(error = %e, group = weft_policy::plan::LOG_GROUP, "cannot read denied flows (NFLOG): they are counted but not explained");
                return;
            }
        };
        while !stop.load(Ordering::Relaxed) {
            match sock.next(Duration::from_millis(250)) {
                Ok(packets) => {
                    for p in packets {
                        if let Some(ev) = engine.logged(&p.prefix, &p.payload) {
                            log_deny(&ev);
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "reading denied flows (NFLOG) failed");
                    std::thread::sleep(Duration::from_secs(1));
                }
            }
        }
    })
}

/// How many new connections the hold keeps waiting at most; past it they are dropped
/// (fail closed: the client's retransmission comes back to a learner that caught up).
const HOLD_QUEUE_LEN: u32 = 1024;

/// The learner's socket buffer: room for a burst of answers' copies (each up to a
/// 4 KiB EDNS answer) so that none is lost while it writes a set.
const LEARNER_BUFFER: usize = 8 << 20;

/// Learns the DNS answers the DNS table copies (NFLOG) and releases the connections
/// the hold keeps (NFQUEUE) until `stop`, on a thread in the calling thread's network
/// namespace (weftd's, the node's). Both arrive on one socket in the order the packets
/// passed, so a held connection is released only after every answer that reached its
/// pod before it was learnt (its addresses in the learnt sets of the names it answers);
/// it then goes through its chain again, marked, and the rules decide. Answers never
/// wait: DNS works the same with weftd down, only what is learnt meanwhile is missed.
/// A queue another process holds is said once; held connections are then dropped, and
/// connections to names not learnt are refused: `domainNames` rules fail closed.
pub fn read_dns_answers(engine: Arc<Engine>, stop: Arc<AtomicBool>) -> std::io::Result<std::thread::JoinHandle<()>> {
    use weft_kernel::nfqueue::{Event, NfQueue, Overflow, Verdict};
    std::thread::Builder::new().name("policy-dns".into()).spawn(move || {
        let (queue, group) = (weft_policy::plan::HOLD_QUEUE, weft_policy::plan::DNS_LOG_GROUP);
        let bound = NfQueue::bind(queue, 128, HOLD_QUEUE_LEN, Overflow::Drop).and_then(|mut q| {
            q.log_too(group, 65535)?;
            q.receive_buffer(LEARNER_BUFFER)?;
            Ok(q)
        });
        let mut q = match bound {
            Ok(q) => q,
            Err(e) => {
                tracing::error!(error = %e, queue, group, "cannot read DNS answers (NFLOG) and held connections (NFQUEUE): domainNames rules learn nothing, their names stay refused");
                return;
            }
        };
        let released = Verdict::Repeat {
            mark: weft_policy::plan::HELD_MARK,
        };
        // Set when the kernel dropped messages (ENOBUFS): once what is left has been
        // read, in order, the packets still held (their messages lost) are released.
        let mut lost = false;
        while !stop.load(Ordering::Relaxed) {
            match q.next(Duration::from_millis(250)) {
                Ok(events) if events.is_empty() => {
                    if std::mem::take(&mut lost)
                        && let Err(e) = q.verdict_all(released)
                    {
                        tracing::warn!(error = %e, "cannot release the held connections");
                    }
                }
                Ok(events) => {
                    for e in events {
                        match e {
                            Event::Logged(p) => {
                                if let Some(message) = weft_kernel::nfqueue::dns_message(&p.payload) {
                                    engine.dns_answer(message);
                                }
                            }
                            Event::Held(p) => {
                                engine.dns_held();
                                if let Err(e) = q.verdict(p.id, released) {
                                    tracing::warn!(error = %e, "cannot release a held connection");
                                }
                            }
                        }
                    }
                }
                // A read with a timeout ends so when the process is stopped and goes
                // on (SIGSTOP, SIGCONT): nothing was lost, read on.
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    // ENOBUFS: copies were lost (their names' addresses are not
                    // learnt), and held connections' messages maybe with them.
                    tracing::warn!(error = %e, "reading DNS answers and held connections failed: some were lost");
                    lost = true;
                    if e.raw_os_error() != Some(nix::errno::Errno::ENOBUFS as i32) {
                        // Not a burst: do not spin on a socket that keeps failing.
                        std::thread::sleep(Duration::from_millis(100));
                    }
                }
            }
        }
    })
}

/// One JSON log line (and an OTLP span) per denied flow.
fn log_deny(ev: &DenyEvent) {
    let action = if ev.audit { "audit" } else { "deny" };
    let protocol = weft_policy::denies::protocol_name(ev.flow.protocol);
    let span = tracing::info_span!(
        target: "weft::policy",
        "policy.deny",
        direction = ev.direction.as_str(),
        action,
        src = %ev.src,
        dst = %ev.dst,
        protocol = %protocol,
        port = ev.flow.port.unwrap_or(0),
    );
    let _in = span.enter();
    tracing::warn!(
        target: "weft::policy",
        direction = ev.direction.as_str(),
        action,
        src = %ev.src,
        dst = %ev.dst,
        src_ip = %ev.flow.src,
        dst_ip = %ev.flow.dst,
        protocol = %protocol,
        port = ev.flow.port.unwrap_or(0),
        policies = %ev.policies.join(","),
        "connection {} by network policy: no rule of the policies isolating the pod allows it",
        if ev.audit { "would be denied (audit mode)" } else { "denied" },
    );
}

fn deny_message(ev: &DenyEvent) -> PolicyDeny {
    PolicyDeny {
        at_unix_ms: ev.at_ms,
        direction: ev.direction.as_str().into(),
        audit: ev.audit,
        src: ev.src.clone(),
        dst: ev.dst.clone(),
        src_ip: ev.flow.src.to_string(),
        dst_ip: ev.flow.dst.to_string(),
        protocol: weft_policy::denies::protocol_name(ev.flow.protocol),
        port: u32::from(ev.flow.port.unwrap_or(0)),
        policies: ev.policies.clone(),
    }
}

/// The engine as the admin service's policy seam.
pub struct EnginePolicyAdmin {
    engine: Arc<Engine>,
    follow: broadcast::Sender<PolicyDeny>,
}

impl EnginePolicyAdmin {
    /// The seam over `engine`; relays its deny events to followers (a task of the
    /// current runtime, ended with the runtime).
    pub fn new(engine: Arc<Engine>) -> Self {
        let (tx, _) = broadcast::channel(256);
        let mut rx = engine.denies().subscribe();
        let out = tx.clone();
        tokio::spawn(async move {
            loop {
                match rx.recv().await {
                    Ok(ev) => {
                        let _ = out.send(deny_message(&ev));
                    }
                    Err(broadcast::error::RecvError::Lagged(_)) => continue,
                    Err(broadcast::error::RecvError::Closed) => return,
                }
            }
        });
        Self { engine, follow: tx }
    }
}

fn side(s: &weft_policy::SideVerdict) -> PolicySide {
    let c = s.cluster.as_ref();
    PolicySide {
        policed: s.policed,
        isolating: s.isolating.clone(),
        allowed_by: s.allowed_by.as_ref().map(|r| r.policy.clone()).unwrap_or_default(),
        rule: s.allowed_by.as_ref().map_or(0, |r| r.rule as u32),
        audit: s.audit,
        cluster_policy: c.map(|d| d.policy.clone()).unwrap_or_default(),
        cluster_tier: c.map(|d| format!("{:?}", d.tier)).unwrap_or_default(),
        cluster_rule: c.map_or(0, |d| d.rule as u32),
        cluster_rule_name: c.map(|d| d.rule_name.clone()).unwrap_or_default(),
        cluster_action: c.map(|d| format!("{:?}", d.action)).unwrap_or_default(),
        cluster_domains: c.map(|d| d.domains.clone()).unwrap_or_default(),
    }
}

/// `policy explain` by `engine`, in the admin API's words.
pub fn explain(engine: &Engine, r: PolicyExplainRequest) -> Result<PolicyExplainReply, String> {
    let protocol =
        PortProtocol::parse(Some(&r.protocol)).ok_or_else(|| format!("protocol {:?}: tcp, udp or sctp", r.protocol))?;
    let port = u16::try_from(r.port)
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| format!("port {}: 1-65535", r.port))?;
    let e = engine.explain(&r.src, &r.dst, protocol, port)?;
    Ok(PolicyExplainReply {
        src: e.src,
        dst: e.dst,
        src_ip: e.src_ip.to_string(),
        dst_ip: e.dst_ip.to_string(),
        allowed: e.verdict.allowed(),
        passes: e.verdict.passes(),
        egress: Some(side(&e.verdict.egress)),
        ingress: Some(side(&e.verdict.ingress)),
        problems: e.problems.iter().map(ToString::to_string).collect(),
    })
}

impl PolicyAdmin for EnginePolicyAdmin {
    fn state(&self) -> PolicyState {
        let s = self.engine.status();
        PolicyState {
            synced: s.synced,
            stale: s.stale,
            policies: s.policies as u32,
            invalid: s.invalid,
            isolated_ingress: s.isolated_ingress as u32,
            isolated_egress: s.isolated_egress as u32,
            cluster_policies: s.cluster_policies as u32,
        }
    }

    fn explain(&self, r: PolicyExplainRequest) -> Result<PolicyExplainReply, String> {
        explain(&self.engine, r)
    }

    fn denies(&self, limit: usize) -> Vec<PolicyDeny> {
        let n = if limit == 0 { usize::MAX } else { limit };
        self.engine.denies().recent(n).iter().map(deny_message).collect()
    }

    fn follow(&self) -> broadcast::Receiver<PolicyDeny> {
        self.follow.subscribe()
    }

    fn learnt(&self) -> Vec<weft_rpc::admin::LearntAddress> {
        self.engine
            .learnt()
            .into_iter()
            .map(|a| weft_rpc::admin::LearntAddress {
                name: a.name,
                address: a.ip.to_string(),
                expires_unix_ms: a.expires_ms,
            })
            .collect()
    }
}
