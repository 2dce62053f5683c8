//! `weftctl link`: link emulation at run time. Impairments (`set`, `reset`), state by
//! intent (`down`, `up`, `flap`), timed scenarios of both (`scenario run`) and what is
//! in force (`show`), asked of the daemon of the pod's node: the one at `--socket`, or,
//! given `--lab FILE`, the lab's node the pod runs on. Each change applies to both ends
//! of the link and survives restarts.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use weft_link::Impairment;
use weft_rpc::admin::admin_client::AdminClient;
use weft_rpc::admin::{
    ChangeSource, LinkInfo, LinkRef, LinkResetRequest, LinkSetRequest, LinkShowRequest, LinkStateRequest,
};

/// Where the pod's daemon is, and which namespace the pod is in.
#[derive(Debug, Clone, Args)]
pub struct Target {
    /// Find the pod's node in this lab (`weftctl lab`) instead of using `--socket`.
    #[arg(long)]
    pub(crate) lab: Option<PathBuf>,
    /// The pod's Topology namespace (needed only when several have such a pod).
    #[arg(long, short = 'n')]
    pub(crate) namespace: Option<String>,
}

/// One link, by its end in a pod.
#[derive(Debug, Clone, Args)]
pub struct LinkArgs {
    /// The pod.
    pod: String,
    /// Its interface (the link's end in it).
    intf: String,
    #[command(flatten)]
    target: Target,
}

/// The impairment flags, in `tc netem`'s words.
#[derive(Debug, Clone, Args)]
pub struct ImpairArgs {
    /// Added latency (e.g. 20ms; us, ms, s).
    #[arg(long)]
    delay: Option<String>,
    /// Variation of the delay, optionally with the correlation of successive delays
    /// (e.g. 2ms, "2ms 25%"; needs --delay).
    #[arg(long)]
    jitter: Option<String>,
    /// The delay's distribution: uniform (default), normal, pareto, paretonormal
    /// (needs --jitter).
    #[arg(long)]
    distribution: Option<String>,
    /// Frames lost: "1%", "1% 25%" (correlated), "gemodel P [R [1-H [1-K]]]"
    /// (Gilbert-Elliott), "state P13 [P31 [P32 [P23 [P14]]]]" (4-state Markov).
    #[arg(long)]
    loss: Option<String>,
    /// Sending rate (e.g. 100mbit; bit, kbit, mbit, gbit, or bps, kbps… for bytes).
    #[arg(long)]
    rate: Option<String>,
    /// Frames corrupted (e.g. 0.1%, "0.1% 25%" correlated).
    #[arg(long)]
    corrupt: Option<String>,
    /// Frames duplicated (e.g. 0.1%, "0.1% 25%" correlated).
    #[arg(long)]
    duplicate: Option<String>,
    /// Frames sent ahead of delayed ones (e.g. 5%, "5% 50%"; needs --delay).
    #[arg(long)]
    reorder: Option<String>,
    /// Frames released in bursts: "MIN [MAX] [packets N] [bytes B]" (e.g. "800us 1ms
    /// packets 32").
    #[arg(long)]
    slot: Option<String>,
    /// "on": an ECN-capable frame is marked Congestion Experienced instead of lost
    /// (needs --loss).
    #[arg(long)]
    ecn: Option<String>,
}

impl ImpairArgs {
    /// The flags given, checked here so a typo is named before anything changes.
    fn impairment(&self) -> anyhow::Result<Impairment> {
        // The same fields a Topology link carries, read the same way.
        let given = weft_topology::LinkImpairments {
            delay: self.delay.clone(),
            jitter: self.jitter.clone(),
            distribution: self.distribution.clone(),
            loss: self.loss.clone(),
            rate: self.rate.clone(),
            corrupt: self.corrupt.clone(),
            duplicate: self.duplicate.clone(),
            reorder: self.reorder.clone(),
            slot: self.slot.clone(),
            ecn: self.ecn.clone(),
        };
        Ok(given.parse()?)
    }
}

/// `weftctl link` actions.
#[derive(Debug, Subcommand)]
pub enum LinkAction {
    /// Impairs both directions of a link (replacing the topology's values until
    /// `reset`; no flag at all sets no impairment).
    Set {
        #[command(flatten)]
        link: LinkArgs,
        #[command(flatten)]
        impair: Box<ImpairArgs>,
    },
    /// Back to the topology's impairment in both directions.
    Reset {
        #[command(flatten)]
        link: LinkArgs,
    },
    /// Takes a link down by intent: both ends lose their carrier (until `up`, across
    /// restarts; `lab check` reports it as down by intent).
    Down {
        #[command(flatten)]
        link: LinkArgs,
    },
    /// Brings a link taken down back up.
    Up {
        #[command(flatten)]
        link: LinkArgs,
    },
    /// Takes a link down and up again, `--count` times, a state every `--every`.
    Flap {
        #[command(flatten)]
        link: LinkArgs,
        /// Time in each state (e.g. 2s, 500ms).
        #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
        every: Duration,
        /// How many down-up cycles.
        #[arg(long, default_value_t = 5)]
        count: u32,
    },
    /// Timed scenarios: a file's timeline of link changes (set, ramp, down, up, reset,
    /// repeated), each at its time.
    Scenario {
        #[command(subcommand)]
        action: ScenarioAction,
    },
    /// Counters of every link end (of a pod, of the node, or of the lab): bytes and
    /// frames each way, the kernel's drops and the emulation's apart, and their rates
    /// over `--interval`; with `--follow`, a sample every interval until Ctrl-C.
    Stats {
        /// The pod (all pods when left out).
        pod: Option<String>,
        #[command(flatten)]
        target: Target,
        /// Sample again every interval until stopped.
        #[arg(long, short)]
        follow: bool,
        /// The time between samples (rates are over it).
        #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
        interval: Duration,
        /// table or json (one object per end per sample).
        #[arg(short, long, value_enum, default_value_t = super::flows::Output::Table)]
        output: super::flows::Output,
    },
    /// The links of a pod (or of every pod of the node, or of the lab) with their
    /// impairment and state.
    Show {
        /// The pod (all pods when left out).
        pod: Option<String>,
        #[command(flatten)]
        target: Target,
    },
}

/// `weftctl link scenario` actions.
#[derive(Debug, Subcommand)]
pub enum ScenarioAction {
    /// Runs FILE: every change at its time from now, each logged with when it was due
    /// and when it was made. Ctrl-C stops it; a change that fails stops it with the
    /// step named. Either way the links stay as the changes made so far set them.
    Run {
        /// The scenario file (YAML; see docs/emulation.md).
        file: PathBuf,
        #[command(flatten)]
        target: Target,
    },
    /// Checks FILE and prints its timeline without changing anything.
    Check {
        /// The scenario file.
        file: PathBuf,
    },
}

/// The sockets to ask: the lab node's of `pod`, every lab node's, or `socket`.
pub(crate) fn sockets(socket: &Path, target: &Target, pod: Option<&str>) -> anyhow::Result<Vec<PathBuf>> {
    let Some(file) = &target.lab else {
        return Ok(vec![socket.to_path_buf()]);
    };
    let lab = weft_lab::Lab::load(file).with_context(|| format!("loading lab {}", file.display()))?;
    match pod {
        Some(pod) => {
            let node = lab
                .node_of(pod)
                .with_context(|| format!("pod {pod} is not in lab {}", file.display()))?;
            Ok(vec![lab.socket(node)])
        }
        None => Ok(lab.spec.nodes.iter().map(|n| lab.socket(&n.name)).collect()),
    }
}

async fn client(socket: &Path) -> anyhow::Result<AdminClient<tonic::transport::Channel>> {
    Ok(AdminClient::new(super::connect(socket).await?))
}

fn link_ref(l: &LinkArgs) -> Option<LinkRef> {
    Some(LinkRef {
        namespace: l.target.namespace.clone().unwrap_or_default(),
        pod: l.pod.clone(),
        intf: l.intf.clone(),
    })
}

/// A status as an error that says what the daemon said.
fn failed(what: &str, l: &LinkArgs, s: tonic::Status) -> anyhow::Error {
    anyhow::anyhow!("{what} {}:{}: {}", l.pod, l.intf, s.message())
}

/// Runs `action` against the daemon(s) it names.
pub async fn run(action: LinkAction, socket: &Path, json: bool) -> anyhow::Result<()> {
    match action {
        LinkAction::Set { link, impair } => {
            let imp = impair.impairment()?;
            let req = LinkSetRequest {
                link: link_ref(&link),
                impairment: imp.to_map().into_iter().collect(),
                source: None,
            };
            let info = one(socket, &link).await?.link_set(req).await;
            print_one(
                info.map_err(|s| failed("cannot set", &link, s))?.into_inner(),
                json,
                true,
            )
        }
        LinkAction::Reset { link } => {
            let req = LinkResetRequest {
                link: link_ref(&link),
                source: None,
            };
            let info = one(socket, &link).await?.link_reset(req).await;
            print_one(
                info.map_err(|s| failed("cannot reset", &link, s))?.into_inner(),
                json,
                true,
            )
        }
        LinkAction::Down { link } => print_one(state(socket, &link, false, None).await?, json, false),
        LinkAction::Up { link } => print_one(state(socket, &link, true, None).await?, json, false),
        LinkAction::Flap { link, every, count } => {
            if count == 0 {
                bail!("--count must be at least 1");
            }
            let start = Instant::now();
            for i in 1..=count {
                for up in [false, true] {
                    state(socket, &link, up, None).await?;
                    outln!(
                        "{:>8.3}s  {}:{} {} ({i}/{count})",
                        start.elapsed().as_secs_f64(),
                        link.pod,
                        link.intf,
                        if up { "up" } else { "down" }
                    );
                    if !(up && i == count) {
                        tokio::time::sleep(every).await;
                    }
                }
            }
            Ok(())
        }
        LinkAction::Scenario { action } => scenario(action, socket, json).await,
        LinkAction::Stats {
            pod,
            target,
            follow,
            interval,
            output,
        } => stats(socket, pod.as_deref(), &target, follow, interval, output).await,
        LinkAction::Show { pod, target } => {
            let mut links = Vec::new();
            for s in sockets(socket, &target, pod.as_deref())? {
                let req = LinkShowRequest {
                    namespace: target.namespace.clone().unwrap_or_default(),
                    pod: pod.clone().unwrap_or_default(),
                };
                let reply = client(&s)
                    .await?
                    .link_show(req)
                    .await
                    .map_err(|e| anyhow::anyhow!("cannot list the links at {}: {}", s.display(), e.message()))?;
                links.extend(reply.into_inner().links);
            }
            print_all(&links, json)
        }
    }
}

/// Reads a scenario file into its timeline (checked whole).
fn timeline(file: &Path) -> anyhow::Result<(String, Vec<weft_link::scenario::Change>)> {
    let text = std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    let sc = weft_link::scenario::Scenario::from_yaml(&text).with_context(|| file.display().to_string())?;
    let t = sc.timeline().with_context(|| file.display().to_string())?;
    Ok((sc.name, t))
}

/// One end named `[namespace/]pod:intf`, with where its daemon is.
fn named_link(name: &str, target: &Target) -> LinkArgs {
    let (ns, rest) = match name.split_once('/') {
        Some((ns, rest)) => (Some(ns.to_string()), rest),
        None => (target.namespace.clone(), name),
    };
    let (pod, intf) = rest.split_once(':').unwrap_or((rest, ""));
    LinkArgs {
        pod: pod.into(),
        intf: intf.into(),
        target: Target {
            namespace: ns,
            ..target.clone()
        },
    }
}

/// Makes one change of a scenario on one link, as step `source`.
async fn change(
    socket: &Path,
    link: &LinkArgs,
    action: &weft_link::scenario::Action,
    source: ChangeSource,
) -> anyhow::Result<()> {
    use weft_link::scenario::Action;
    let source = Some(source);
    match action {
        Action::Set(imp) => {
            let req = LinkSetRequest {
                link: link_ref(link),
                impairment: imp.to_map().into_iter().collect(),
                source,
            };
            let info = one(socket, link)
                .await?
                .link_set(req)
                .await
                .map_err(|s| failed("cannot set", link, s))?
                .into_inner();
            anyhow::ensure!(info.problem.is_empty(), "not in force: {}", info.problem);
        }
        Action::Reset => {
            let req = LinkResetRequest {
                link: link_ref(link),
                source,
            };
            one(socket, link)
                .await?
                .link_reset(req)
                .await
                .map_err(|s| failed("cannot reset", link, s))?;
        }
        Action::Down => {
            state(socket, link, false, source).await?;
        }
        Action::Up => {
            state(socket, link, true, source).await?;
        }
    }
    Ok(())
}

/// `link stats`: samples `interval` apart, each printed with the rates since the one
/// before.
async fn stats(
    socket: &Path,
    pod: Option<&str>,
    target: &Target,
    follow: bool,
    interval: Duration,
    output: super::flows::Output,
) -> anyhow::Result<()> {
    anyhow::ensure!(interval >= Duration::from_millis(100), "--interval: at least 100ms");
    let daemons: Vec<super::live::Daemon> = match &target.lab {
        Some(file) => {
            let lab = weft_lab::Lab::load(file).with_context(|| format!("loading lab {}", file.display()))?;
            super::live::lab_daemons(&lab)
        }
        None => vec![(String::new(), socket.to_path_buf())],
    };
    let keep = |s: &mut weft_link::live::Sample| {
        s.ends.retain(|_, e| {
            pod.is_none_or(|p| p == e.pod) && target.namespace.as_deref().is_none_or(|n| n == e.namespace)
        })
    };
    let mut prev = super::live::sample(&daemons).await;
    keep(&mut prev);
    if prev.ends.is_empty() {
        bail!(
            "no link ends to count{}",
            pod.map(|p| format!(" of pod {p}")).unwrap_or_default()
        );
    }
    let stop = tokio::signal::ctrl_c();
    tokio::pin!(stop);
    let mut tick = tokio::time::interval(interval);
    tick.tick().await;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = &mut stop => return Ok(()),
        }
        let mut cur = super::live::sample(&daemons).await;
        keep(&mut cur);
        let rates = weft_link::live::rates(&prev, &cur);
        print_stats(&cur, &rates, output)?;
        if !follow {
            return Ok(());
        }
        prev = cur;
    }
}

/// One sample of `link stats`.
fn print_stats(
    s: &weft_link::live::Sample,
    rates: &BTreeMap<String, weft_link::live::Rates>,
    output: super::flows::Output,
) -> anyhow::Result<()> {
    if output == super::flows::Output::Json {
        for (name, e) in &s.ends {
            outln!(
                "{}",
                serde_json::json!({
                    "at_ms": s.at_ms, "end": name, "node": e.node, "peer": format!("{}:{}", e.peer_pod, e.peer_intf),
                    "kind": e.kind, "state": e.state, "down_by_intent": e.down, "impairment": e.impairment,
                    "counters": e.counters, "emulation": e.emulation, "rates": rates.get(name),
                })
            );
        }
        return Ok(());
    }
    outln!(
        "{:<24} {:<8} {:>10} {:>12} {:>10} {:>12} {:>8} {:>9} {:>12} {:>12}   at {}",
        "END",
        "STATE",
        "TX FRAMES",
        "TX BYTES",
        "RX FRAMES",
        "RX BYTES",
        "DROPS",
        "EMU DROPS",
        "TX RATE",
        "RX RATE",
        super::clock(s.at_ms)
    );
    let n = |v: Option<u64>| v.map_or_else(|| "-".to_string(), |v| v.to_string());
    for (name, e) in &s.ends {
        let c = e.counters;
        let r = rates.get(name);
        let rate =
            |f: fn(&weft_link::live::Rates) -> f64| r.map_or_else(|| "-".into(), |r| weft_lab::graph::rate_text(f(r)));
        outln!(
            "{:<24} {:<8} {:>10} {:>12} {:>10} {:>12} {:>8} {:>9} {:>12} {:>12}",
            name,
            if e.down { "down*" } else { e.state.as_str() },
            n(c.map(|c| c.tx_frames)),
            n(c.map(|c| c.tx_bytes)),
            n(c.map(|c| c.rx_frames)),
            n(c.map(|c| c.rx_bytes)),
            n(c.map(|c| c.dropped)),
            n(e.emulation.map(|m| m.drops())),
            rate(|r| r.tx_bps),
            rate(|r| r.rx_bps),
        );
    }
    Ok(())
}

/// How long a scenario waits for the links it names to be built before its clock
/// starts.
const LINKS_WAIT: Duration = Duration::from_secs(30);

/// Whether `link`'s pod has its links built on its node: the node knows the pod's
/// links and none is pending. (An interface the pod does not have is then not waited
/// for: its step fails when it is due, naming it.)
async fn built(socket: &Path, link: &LinkArgs) -> bool {
    let Ok(mut c) = one(socket, link).await else {
        return false;
    };
    let Ok(reply) = c.wires(weft_rpc::admin::WiresRequest {}).await else {
        return false;
    };
    let ns = link.target.namespace.as_deref();
    let ends: Vec<_> = reply
        .into_inner()
        .wires
        .into_iter()
        .filter(|w| w.pod == link.pod && ns.is_none_or(|n| n == w.namespace))
        .collect();
    !ends.is_empty() && ends.iter().all(|w| w.state != "pending")
}

/// `link scenario run|check`.
async fn scenario(action: ScenarioAction, socket: &Path, json: bool) -> anyhow::Result<()> {
    let (file, target) = match action {
        ScenarioAction::Check { file } => {
            let (name, t) = timeline(&file)?;
            outln!("scenario {name:?}: {} changes", t.len());
            for c in &t {
                outln!(
                    "{:>10.3}s  step {:<3} {:<40} {}",
                    c.at.as_secs_f64(),
                    c.step,
                    c.action.to_string(),
                    c.links.join(" ")
                );
            }
            return Ok(());
        }
        ScenarioAction::Run { file, target } => (file, target),
    };
    let (name, t) = timeline(&file)?;
    // Its clock starts once every link it names is built (a lab's scenario starts as
    // soon as the pods are attached, before their wires are up).
    let mut named: Vec<&String> = t.iter().flat_map(|c| c.links.iter()).collect();
    named.sort();
    named.dedup();
    let deadline = tokio::time::Instant::now() + LINKS_WAIT;
    for l in named {
        let link = named_link(l, &target);
        while !built(socket, &link).await {
            if tokio::time::Instant::now() >= deadline {
                bail!(
                    "scenario {name:?}: the links of {l}'s pod were not built within {} s: nothing changed",
                    LINKS_WAIT.as_secs()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let start = tokio::time::Instant::now();
    let mut latest = Duration::ZERO;
    let stop = tokio::signal::ctrl_c();
    tokio::pin!(stop);
    for (k, c) in t.iter().enumerate() {
        tokio::select! {
            _ = tokio::time::sleep_until(start + c.at) => {}
            _ = &mut stop => {
                bail!(
                    "scenario {name:?} stopped before step {} (due at {:.3}s), {k} of {} changes made: the links stay as they set them",
                    c.step, c.at.as_secs_f64(), t.len()
                );
            }
        }
        let made = start.elapsed();
        for l in &c.links {
            let source = ChangeSource {
                scenario: name.clone(),
                step: c.step as u32,
            };
            if let Err(e) = change(socket, &named_link(l, &target), &c.action, source).await {
                bail!(
                    "scenario {name:?}: step {} (due at {:.3}s, {}) failed on {l}: {e:#}; the links stay as the changes before it set them",
                    c.step,
                    c.at.as_secs_f64(),
                    c.action
                );
            }
        }
        let late = made.saturating_sub(c.at);
        latest = latest.max(late);
        if json {
            outln!(
                "{}",
                serde_json::json!({
                    "scenario": name, "step": c.step, "action": c.action.to_string(), "links": c.links,
                    "due_s": c.at.as_secs_f64(), "made_s": made.as_secs_f64(), "late_ms": late.as_secs_f64() * 1e3,
                })
            );
        } else {
            outln!(
                "{:>10.3}s  (+{:.1} ms)  step {:<3} {:<40} {}",
                made.as_secs_f64(),
                late.as_secs_f64() * 1e3,
                c.step,
                c.action.to_string(),
                c.links.join(" ")
            );
        }
    }
    if !json {
        outln!(
            "scenario {name:?} done: {} changes, the latest {:.1} ms after it was due",
            t.len(),
            latest.as_secs_f64() * 1e3
        );
    }
    Ok(())
}

/// The client of the daemon of `link`'s pod.
async fn one(socket: &Path, link: &LinkArgs) -> anyhow::Result<AdminClient<tonic::transport::Channel>> {
    let s = sockets(socket, &link.target, Some(&link.pod))?;
    client(&s[0]).await
}

/// Takes `link` down or brings it up, as `source` asks (`None`: by hand).
async fn state(socket: &Path, link: &LinkArgs, up: bool, source: Option<ChangeSource>) -> anyhow::Result<LinkInfo> {
    let req = LinkStateRequest {
        link: link_ref(link),
        up,
        source,
    };
    let what = if up { "cannot bring up" } else { "cannot take down" };
    Ok(one(socket, link)
        .await?
        .link_state(req)
        .await
        .map_err(|s| failed(what, link, s))?
        .into_inner())
}

/// An impairment map as `delay 20ms loss 1%` (`-` for none), in the parameters' order.
fn impairment_text(map: &std::collections::HashMap<String, String>) -> String {
    let m: BTreeMap<&String, &String> = map.iter().collect();
    Impairment::from_map(m)
        .map(|i| i.to_string())
        .unwrap_or_else(|e| format!("? ({e})"))
}

/// Where a link stands by intent: `up`, `down` (named here) or `down (peer)`.
fn link_state(l: &LinkInfo) -> &'static str {
    match (l.down, l.down_by_peer) {
        (false, _) => "up",
        (true, false) => "down",
        (true, true) => "down(peer)",
    }
}

fn row_json(l: &LinkInfo) -> serde_json::Value {
    serde_json::json!({
        "namespace": l.namespace,
        "link_uid": l.link_uid,
        "pod": l.pod,
        "intf": l.intf,
        "peer_pod": l.peer_pod,
        "peer_intf": l.peer_intf,
        "peer_node": l.peer_node,
        "kind": l.kind,
        "state": l.state,
        "down_by_intent": l.down,
        "down_by_peer": l.down_by_peer,
        "active": l.active.iter().collect::<BTreeMap<_, _>>(),
        "topology": l.topology.iter().collect::<BTreeMap<_, _>>(),
        "overridden": l.overridden,
        "problem": l.problem,
        "last_change": (!l.last_change.is_empty()).then(|| serde_json::json!({
            "what": l.last_change, "at_ms": l.last_change_ms,
        })),
    })
}

/// Prints one end; `strict`: a setting not in force fails the command (the impairment
/// was what was asked), else it is only shown.
fn print_one(l: LinkInfo, json: bool, strict: bool) -> anyhow::Result<()> {
    if json {
        outln!("{}", serde_json::to_string_pretty(&row_json(&l))?);
        anyhow::ensure!(
            !strict || l.problem.is_empty(),
            "{}:{}: not in force: {}",
            l.pod,
            l.intf,
            l.problem
        );
        return Ok(());
    }
    let source = if l.overridden {
        format!("run time, overrides the topology's: {}", impairment_text(&l.topology))
    } else {
        "the topology's".to_string()
    };
    outln!(
        "{}:{} <-> {}:{} ({}): link {}, impairment {} ({source})",
        l.pod,
        l.intf,
        l.peer_pod,
        l.peer_intf,
        l.kind,
        link_state(&l),
        impairment_text(&l.active)
    );
    if !l.problem.is_empty() && !strict {
        outln!("  impairment not in force at this end: {}", l.problem);
    } else if !l.problem.is_empty() {
        bail!(
            "{}:{}: kept, but not in force at this end: {}",
            l.pod,
            l.intf,
            l.problem
        );
    }
    Ok(())
}

fn print_all(links: &[LinkInfo], json: bool) -> anyhow::Result<()> {
    if json {
        let rows: Vec<_> = links.iter().map(row_json).collect();
        outln!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    outln!(
        "{:<24} {:<20} {:<6} {:<8} {:<10} {:<40} SOURCE",
        "END",
        "PEER",
        "KIND",
        "WIRE",
        "LINK",
        "IMPAIRMENT"
    );
    for l in links {
        let mut source = if l.overridden {
            format!("run time (topology: {})", impairment_text(&l.topology))
        } else {
            "topology".into()
        };
        if !l.problem.is_empty() {
            source = format!("{source}; NOT IN FORCE: {}", l.problem);
        }
        if !l.last_change.is_empty() {
            source = format!(
                "{source}; last change: {} at {}",
                l.last_change,
                super::clock(l.last_change_ms)
            );
        }
        outln!(
            "{:<24} {:<20} {:<6} {:<8} {:<10} {:<40} {source}",
            format!("{}/{}:{}", l.namespace, l.pod, l.intf),
            format!("{}:{}", l.peer_pod, l.peer_intf),
            l.kind,
            l.state,
            link_state(l),
            impairment_text(&l.active),
        );
    }
    Ok(())
}

/// Marks the checks of link ends an operator took down (asked of every node of `lab`;
/// a node that does not answer marks nothing, so its links count as they are).
pub fn mark_down_by_intent(lab: &weft_lab::Lab, checks: &mut [weft_lab::LinkCheck]) {
    let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_all().build() else {
        return;
    };
    let down: std::collections::BTreeSet<String> = rt.block_on(async {
        let mut down = std::collections::BTreeSet::new();
        for n in &lab.spec.nodes {
            let Ok(mut c) = client(&lab.socket(&n.name)).await else {
                continue;
            };
            if let Ok(reply) = c.link_show(LinkShowRequest::default()).await {
                down.extend(
                    reply
                        .into_inner()
                        .links
                        .into_iter()
                        .filter(|l| l.down)
                        .map(|l| format!("{}:{}", l.pod, l.intf)),
                );
            }
        }
        down
    });
    for c in checks {
        c.down_by_intent = down.contains(&c.from) || down.contains(&c.to);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_are_checked_before_anything_is_asked() {
        let args = ImpairArgs {
            delay: Some("20ms".into()),
            jitter: Some("2ms".into()),
            loss: None,
            rate: Some("100mbit".into()),
            corrupt: None,
            duplicate: None,
            reorder: None,
            distribution: Some("normal".into()),
            slot: None,
            ecn: None,
        };
        assert_eq!(
            args.impairment().unwrap().to_string(),
            "delay 20ms jitter 2ms distribution normal rate 100mbit"
        );
        let bad = ImpairArgs {
            loss: Some("lots".into()),
            ..args
        };
        assert!(bad.impairment().unwrap_err().to_string().starts_with("loss \"lots\""));
    }

    #[test]
    fn a_row_says_what_is_active_and_where_it_comes_from() {
        let l = LinkInfo {
            pod: "r1".into(),
            intf: "e1".into(),
            active: [("delay".to_string(), "20ms".to_string())].into(),
            topology: Default::default(),
            overridden: true,
            down: true,
            down_by_peer: true,
            ..Default::default()
        };
        assert_eq!(impairment_text(&l.active), "delay 20ms");
        assert_eq!(impairment_text(&l.topology), "-");
        assert_eq!(link_state(&l), "down(peer)");
        assert_eq!(row_json(&l)["active"]["delay"], "20ms");
        assert_eq!(row_json(&l)["last_change"], serde_json::Value::Null);
    }
}
