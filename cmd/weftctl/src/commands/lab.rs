//! `weftctl lab`: a multi-node lab on this machine out of network namespaces (see
//! `weft_lab::cluster`).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Subcommand;
use weft_lab::Lab;

/// `weftctl lab` actions; each names the lab file first.
#[derive(Debug, Subcommand)]
pub enum LabAction {
    /// Builds what is missing (namespaces, daemons, pods); restarts crashed daemons.
    Up {
        /// The lab file.
        file: PathBuf,
    },
    /// Pings across every link, from both ends, and over the pod network (every pod to
    /// the pods of other nodes on `eth0`, to the other nodes, and to the outside);
    /// fails when one does not answer in time.
    Check {
        /// The lab file.
        file: PathBuf,
        /// Seconds each link may take to answer.
        #[arg(long, default_value_t = 10)]
        within: u64,
    },
    /// SIGKILLs a node's weftd (pods and kernel wires stay; `up` restarts it).
    Crash {
        /// The lab file.
        file: PathBuf,
        /// The node.
        node: String,
    },
    /// Runs a command inside a node's or a pod's network namespace.
    Exec {
        /// The lab file.
        file: PathBuf,
        /// The node, or the pod (`NS/NAME`, or `NAME` where only one pod has it).
        name: String,
        /// The command (after `--`).
        #[arg(trailing_var_arg = true, required = true, allow_hyphen_values = true)]
        argv: Vec<String>,
    },
    /// Writes a lab file: a ring of pods, each linked to its next neighbours until
    /// there are `--links` links, the pods spread over `--nodes` nodes (try weft at
    /// KNE's 1,500 links: `--pods 500 --links 1500 --nodes 3`).
    Gen {
        /// How many pods.
        #[arg(long)]
        pods: usize,
        /// How many links.
        #[arg(long)]
        links: usize,
        /// How many nodes.
        #[arg(long, default_value_t = 3)]
        nodes: usize,
        /// How links between nodes are carried: grpc, vxlan, mixed (alternately), or
        /// veth (each node's pods a ring of their own, no link between nodes).
        #[arg(long, default_value = "grpc")]
        kind: weft_lab::generate::GenKind,
        /// The lab's name.
        #[arg(long, default_value = "gen")]
        name: String,
        /// Where to write it (default: standard output).
        #[arg(short, long)]
        output: Option<PathBuf>,
    },
    /// Draws the lab: nodes, their pods, and every link with its ends, kind, state,
    /// impairment and (when the lab is up) the rate it carries. DOT on standard output,
    /// or to `-o FILE` as .dot, or .svg/.png rendered by Graphviz's `dot`.
    Graph {
        /// The lab file.
        file: PathBuf,
        /// Where to write it (.svg, .png or .dot; default: DOT on standard output).
        #[arg(short, long)]
        output: Option<PathBuf>,
        /// How long between the two counter samples a rate is made of (0s: no rates).
        #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
        sample: Duration,
    },
    /// Streams what happens in the running lab as JSON lines: link state changes,
    /// impairment and run-time changes, the lab scenario's steps, and (every interval)
    /// each end's counters and rates. Without `--follow`: the links as they stand.
    Events {
        /// The lab file.
        file: PathBuf,
        /// Go on until Ctrl-C.
        #[arg(long, short)]
        follow: bool,
        /// The time between samples.
        #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
        interval: Duration,
        /// Leave the counter samples out (changes only).
        #[arg(long)]
        no_counters: bool,
    },
    /// Serves a live view of the lab to a browser: its graph, every link coloured by
    /// state and labelled with its rate, updated twice a second; a click on a link
    /// shows its settings, both ends' counters and its recent rate. Until Ctrl-C.
    Serve {
        /// The lab file.
        file: PathBuf,
        /// Where to listen (port 0: any free port; the address is printed).
        #[arg(long, default_value = "127.0.0.1:8087")]
        listen: std::net::SocketAddr,
        /// The time between samples.
        #[arg(long, default_value = "500ms", value_parser = humantime::parse_duration)]
        interval: Duration,
    },
    /// Removes everything the lab made.
    Down {
        /// The lab file.
        file: PathBuf,
    },
    /// Creates or replaces NetworkPolicy objects in the running lab, as `kubectl apply
    /// -f` does (each node's weftd enforces them within a pass).
    Apply {
        /// The lab file.
        file: PathBuf,
        /// Files of NetworkPolicy objects (YAML or JSON, several documents each).
        #[arg(required = true)]
        objects: Vec<PathBuf>,
    },
    /// Deletes the NetworkPolicy objects the files name (by namespace and name), as
    /// `kubectl delete -f` does; fails after deleting the others if one is not there.
    Delete {
        /// The lab file.
        file: PathBuf,
        /// Files of NetworkPolicy objects.
        #[arg(required = true)]
        objects: Vec<PathBuf>,
    },
    /// Changes the labels of a pod or a namespace, as `kubectl label` does: `KEY=VALUE`
    /// sets a label, `KEY-` removes it.
    Label {
        /// The lab file.
        file: PathBuf,
        /// What to label: `pod` or `namespace`.
        kind: LabelKind,
        /// The pod (`NS/NAME`, or `NAME` where only one pod has it) or the namespace.
        name: String,
        /// The changes: `KEY=VALUE` or `KEY-`.
        #[arg(required = true, allow_hyphen_values = true)]
        changes: Vec<String>,
    },
    /// Which pods reach which: listens on each port in every pod, probes every ordered
    /// pair of pods from inside the source, and prints a table per port and family
    /// (rows: sources, columns: destinations; `.` reachable, `X` blocked, `?` failed).
    Matrix {
        /// The lab file.
        file: PathBuf,
        /// A port to probe: `80/tcp`, `53/udp`, `9/sctp` (`80` is TCP); a table each.
        #[arg(long = "port", required = true)]
        ports: Vec<weft_lab::matrix::Port>,
        /// Only this family (`4` or `6`); default: every family the lab has.
        #[arg(long)]
        family: Option<weft_lab::matrix::Family>,
        /// How long a probe waits before its pair counts as blocked.
        #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
        timeout: Duration,
        /// Tables to compare with, in the printed format: exits non-zero when a cell
        /// differs, printing each that does.
        #[arg(long)]
        expect: Option<PathBuf>,
    },
    /// Which pods reach which names of the lab's DNS: from inside every pod, resolves
    /// each name through the lab's DNS and connects at once to every address it gave
    /// on the port (the outside listens there meanwhile); a row per name, a column per
    /// pod (`.` every address reached, `X` none, `~` some, `?` no answer).
    Names {
        /// The lab file.
        file: PathBuf,
        /// The TCP port.
        #[arg(long, default_value_t = 80)]
        port: u16,
        /// How long a connection waits before it counts as blocked.
        #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
        timeout: Duration,
    },
}

/// What `lab label` labels.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum LabelKind {
    /// A pod.
    #[value(alias = "pods", alias = "po")]
    Pod,
    /// A namespace.
    #[value(alias = "namespaces", alias = "ns")]
    Namespace,
}

fn load(file: &std::path::Path) -> anyhow::Result<Lab> {
    Lab::load(file).with_context(|| format!("loading {}", file.display()))
}

/// Runs a lab action.
pub fn run(action: LabAction, json: bool) -> anyhow::Result<()> {
    match action {
        LabAction::Up { file } => {
            let lab = load(&file)?;
            let started = lab.up()?;
            outln!(
                "lab {} up: {} nodes, {} pods; weftd started on: {}",
                lab.spec.name,
                lab.spec.nodes.len(),
                lab.spec.pods.len(),
                if started.is_empty() {
                    "none (all running)".to_string()
                } else {
                    started.join(", ")
                }
            );
        }
        LabAction::Check { file, within } => {
            let lab = load(&file)?;
            let mut checks = lab.check(Duration::from_secs(within));
            super::link::mark_down_by_intent(&lab, &mut checks);
            checks.extend(lab.check_network(Duration::from_secs(within)));
            if json {
                outln!("{}", serde_json::to_string_pretty(&checks)?);
            } else {
                outln!("{:<16} {:<34} {:<7} {:<5} {:>9}", "FROM", "TO", "KIND", "OK", "RTT(ms)");
                for c in &checks {
                    let rtt = c.rtt_ms.map_or_else(|| "-".to_string(), |r| format!("{r:.3}"));
                    let ok = match (c.ok, c.down_by_intent) {
                        (true, _) => "ok",
                        (false, true) => "down",
                        (false, false) => "FAIL",
                    };
                    outln!("{:<16} {:<34} {:<7} {:<5} {:>9}", c.from, c.to, c.kind, ok, rtt);
                }
            }
            if !json {
                // Why each failure failed, after the table: what to look at next.
                for c in checks.iter().filter(|c| !c.ok && !c.down_by_intent) {
                    if let Some(r) = &c.reason {
                        outln!("FAIL {} -> {}: {r}", c.from, c.to);
                    }
                }
            }
            let failed = checks.iter().filter(|c| !c.ok && !c.down_by_intent).count();
            anyhow::ensure!(failed == 0, "{failed} of {} checks did not answer", checks.len());
        }
        LabAction::Crash { file, node } => load(&file)?.crash(&node)?,
        LabAction::Exec { file, name, argv } => {
            let status = load(&file)?.exec(&name, &argv)?;
            if !status.success() {
                std::process::exit(status.code().unwrap_or(1));
            }
        }
        LabAction::Gen {
            pods,
            links,
            nodes,
            kind,
            name,
            output,
        } => {
            let spec = weft_lab::generate::GenSpec {
                name,
                pods,
                links,
                nodes,
                kind,
            };
            let text = weft_lab::generate::generate(&spec).map_err(anyhow::Error::msg)?;
            match output {
                Some(path) => std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?,
                None => out!("{text}"),
            }
        }
        LabAction::Graph { file, output, sample } => super::lab_graph::run(&load(&file)?, output.as_deref(), sample)?,
        LabAction::Events {
            file,
            follow,
            interval,
            no_counters,
        } => super::lab_live::events(&load(&file)?, follow, interval, !no_counters)?,
        LabAction::Serve { file, listen, interval } => super::lab_live::serve(load(&file)?, listen, interval)?,
        LabAction::Down { file } => load(&file)?.down()?,
        LabAction::Apply { file, objects } => {
            let done = load(&file)?.apply_policies(&objects)?;
            print_changes(&done, json)?;
        }
        LabAction::Delete { file, objects } => {
            let done = load(&file)?.delete_policies(&objects)?;
            print_changes(&done, json)?;
            anyhow::ensure!(
                done.missing.is_empty(),
                "not found: {}",
                done.missing
                    .iter()
                    .map(|k| format!("networkpolicy {k}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        LabAction::Label {
            file,
            kind,
            name,
            changes,
        } => {
            let target = match kind {
                LabelKind::Pod => weft_lab::objects::LabelTarget::Pod,
                LabelKind::Namespace => weft_lab::objects::LabelTarget::Namespace,
            };
            outln!("{}", load(&file)?.label(target, &name, &changes)?);
        }
        LabAction::Matrix {
            file,
            ports,
            family,
            timeout,
            expect,
        } => matrix(&load(&file)?, ports, family, timeout, expect.as_deref(), json)?,
        LabAction::Names { file, port, timeout } => {
            let t = load(&file)?.name_probes(port, timeout)?;
            if json {
                outln!("{}", serde_json::to_string(&t)?);
            } else {
                out!("{t}");
            }
        }
    }
    Ok(())
}

fn print_changes(done: &weft_lab::objects::ObjectChanges, json: bool) -> anyhow::Result<()> {
    if json {
        let v = serde_json::json!({"changes": done.lines, "missing": done.missing});
        outln!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        for l in &done.lines {
            outln!("{l}");
        }
    }
    Ok(())
}

/// `lab matrix`: the tables on standard output (the format `--expect` reads), failed
/// probes on standard error, then the cells that differ from the expectation.
fn matrix(
    lab: &Lab,
    ports: Vec<weft_lab::matrix::Port>,
    family: Option<weft_lab::matrix::Family>,
    timeout: Duration,
    expect: Option<&std::path::Path>,
    json: bool,
) -> anyhow::Result<()> {
    // Read first: a typo in the expectation should not cost a run.
    let expected = match expect {
        Some(path) => {
            let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
            Some(weft_lab::matrix::parse_tables(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?)
        }
        None => None,
    };
    let opts = weft_lab::matrix::MatrixOptions {
        ports,
        families: family.into_iter().collect(),
        timeout,
    };
    let m = lab.matrix(&opts)?;
    let differences = expected.as_ref().map(|e| m.differences(e)).unwrap_or_default();
    let errors = m.errors();
    if json {
        let mut v = m.to_json();
        if expected.is_some() {
            v["differences"] = serde_json::json!(differences);
        }
        outln!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        out!("{}", m.to_text());
        for e in &errors {
            eprintln!("failed: {e}");
        }
        if !differences.is_empty() {
            outln!();
            for d in &differences {
                outln!("differs: {d}");
            }
        }
    }
    let pods = m.tables.first().map_or(0, |t| t.pods.len());
    eprintln!(
        "lab matrix: {pods} pods, {} pairs in each of {} tables, {:.2} s",
        pods * pods,
        m.tables.len(),
        m.elapsed.as_secs_f64()
    );
    anyhow::ensure!(
        errors.is_empty(),
        "{} of {} probes failed (not blocked: see why above)",
        errors.len(),
        pods * pods * m.tables.len()
    );
    if let Some(path) = expect {
        anyhow::ensure!(
            differences.is_empty(),
            "the matrix differs from {} ({} differences)",
            path.display(),
            differences.len()
        );
    }
    Ok(())
}
