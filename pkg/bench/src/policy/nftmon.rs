//! `nft monitor` inside a namespace, read line by line as the kernel announces each
//! committed transaction, each line stamped when it was read: what changed in weft's
//! policy table and when, without polling the table. A transaction's lines come
//! together right after it commits and end with `# new generation N by process P
//! (comm)`; the first line's stamp is the commit (the generation line trails it on a
//! big transaction, by as long as the monitor takes to print every element).

use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::Serialize;
use weft_harness::NamedNetns;

/// The policy table's name in `nft monitor` lines.
pub(crate) const POLICY_TABLE: &str = "inet weft-policy";

/// A table the monitor's readiness probe makes and removes.
const PROBE_TABLE: &str = "weftbench-probe";

/// One line as read.
#[derive(Debug, Clone)]
struct Line {
    at: Instant,
    text: String,
}

/// One committed transaction.
#[derive(Debug, Clone)]
pub(crate) struct Transaction {
    /// When its first line was read (the commit).
    pub(crate) first: Instant,
    /// Its lines, the generation line left out.
    pub(crate) lines: Vec<String>,
    /// The process that made it (`nft`, `weftd`).
    pub(crate) by: String,
}

/// What a transaction did to the policy table.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct BatchCounts {
    /// Set and map elements added.
    pub elements_added: usize,
    /// Set and map elements deleted.
    pub elements_deleted: usize,
    /// Chains added or deleted.
    pub chains: usize,
    /// Sets (and maps) added or deleted.
    pub sets: usize,
    /// Rules added or deleted.
    pub rules: usize,
    /// Everything else (tables, counters, flushes).
    pub other: usize,
}

impl BatchCounts {
    /// Adds another transaction's counts.
    pub fn add(&mut self, o: &BatchCounts) {
        self.elements_added += o.elements_added;
        self.elements_deleted += o.elements_deleted;
        self.chains += o.chains;
        self.sets += o.sets;
        self.rules += o.rules;
        self.other += o.other;
    }

    /// Objects other than elements.
    pub fn objects(&self) -> usize {
        self.chains + self.sets + self.rules + self.other
    }
}

/// How many elements an `add element ... { a, b }` line names.
fn elements_in(line: &str) -> usize {
    match (line.find('{'), line.rfind('}')) {
        (Some(a), Some(b)) if b > a => {
            let inner = line[a + 1..b].trim();
            if inner.is_empty() { 0 } else { inner.split(", ").count() }
        }
        _ => 1,
    }
}

impl Transaction {
    /// Whether it touched the policy table.
    pub(crate) fn policy(&self) -> bool {
        self.lines.iter().any(|l| is_policy_line(l))
    }

    /// What it did to the policy table.
    pub(crate) fn counts(&self) -> BatchCounts {
        let mut c = BatchCounts::default();
        for l in self.lines.iter().filter(|l| is_policy_line(l)) {
            let mut words = l.split_whitespace();
            let (verb, what) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
            match (verb, what) {
                ("add", "element") => c.elements_added += elements_in(l),
                ("delete", "element") => c.elements_deleted += elements_in(l),
                (_, "chain") => c.chains += 1,
                (_, "set") | (_, "map") => c.sets += 1,
                (_, "rule") => c.rules += 1,
                _ => c.other += 1,
            }
        }
        c
    }

    /// Whether some policy line contains every one of `needles`.
    pub(crate) fn has(&self, needles: &[&str]) -> bool {
        self.lines
            .iter()
            .any(|l| is_policy_line(l) && needles.iter().all(|n| l.contains(n)))
    }
}

fn is_policy_line(l: &str) -> bool {
    l.contains(&format!(" {POLICY_TABLE} ")) || l.ends_with(&format!(" {POLICY_TABLE}"))
}

/// `nft monitor` running in a namespace; stopped on drop.
pub(crate) struct Monitor {
    child: Option<Child>,
    lines: Arc<Mutex<Vec<Line>>>,
    reader: Option<JoinHandle<()>>,
    ns: String,
}

impl Monitor {
    /// Starts it in `ns` and returns once it is seen to report (a probe table made and
    /// removed there shows up).
    pub(crate) fn start(ns: &str) -> Result<Self, String> {
        let mut child = NamedNetns::existing(ns)
            .command(["nft", "monitor"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("starting nft monitor in {ns}: {e}"))?;
        let out = child.stdout.take().ok_or("nft monitor has no stdout")?;
        let lines: Arc<Mutex<Vec<Line>>> = Arc::default();
        let sink = lines.clone();
        let reader = std::thread::spawn(move || {
            for l in BufReader::new(out).lines() {
                let Ok(text) = l else { return };
                let at = Instant::now();
                sink.lock().expect("monitor lock").push(Line { at, text });
            }
        });
        let m = Monitor {
            child: Some(child),
            lines,
            reader: Some(reader),
            ns: ns.to_string(),
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            nft(ns, &format!("add table inet {PROBE_TABLE}"))?;
            nft(ns, &format!("delete table inet {PROBE_TABLE}"))?;
            std::thread::sleep(Duration::from_millis(50));
            if m.lines
                .lock()
                .expect("monitor lock")
                .iter()
                .any(|l| l.text.contains(PROBE_TABLE))
            {
                return Ok(m);
            }
            if Instant::now() > deadline {
                return Err(format!("nft monitor in {ns} reported nothing"));
            }
        }
    }

    /// A mark: transactions after it are those committed from now on.
    pub(crate) fn mark(&self) -> usize {
        self.lines.lock().expect("monitor lock").len()
    }

    /// The complete transactions read since `mark`.
    pub(crate) fn since(&self, mark: usize) -> Vec<Transaction> {
        let lines = self.lines.lock().expect("monitor lock");
        let mut out = Vec::new();
        let mut cur: Vec<&Line> = Vec::new();
        for l in lines.iter().skip(mark) {
            if let Some(rest) = l.text.strip_prefix("# new generation") {
                let by = rest
                    .rsplit_once('(')
                    .map(|(_, c)| c.trim_end_matches(')').to_string())
                    .unwrap_or_default();
                out.push(Transaction {
                    first: cur.first().map_or(l.at, |c| c.at),
                    lines: cur.iter().map(|c| c.text.clone()).collect(),
                    by,
                });
                cur.clear();
            } else {
                cur.push(l);
            }
        }
        out
    }

    /// The transactions on the policy table since `mark`.
    pub(crate) fn policy_since(&self, mark: usize) -> Vec<Transaction> {
        self.since(mark).into_iter().filter(Transaction::policy).collect()
    }

    /// Waits up to `limit` until `done` says the policy transactions since `mark` are
    /// what was awaited; returns them, and whether `done` said so.
    pub(crate) fn wait(
        &self,
        mark: usize,
        limit: Duration,
        done: impl Fn(&[Transaction]) -> bool,
    ) -> (Vec<Transaction>, bool) {
        let deadline = Instant::now() + limit;
        loop {
            let t = self.policy_since(mark);
            if done(&t) {
                return (t, true);
            }
            if Instant::now() >= deadline {
                return (t, false);
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Waits until no line has come for `quiet` (or `limit` has passed).
    pub(crate) fn settle(&self, quiet: Duration, limit: Duration) {
        let deadline = Instant::now() + limit;
        loop {
            let last = self.lines.lock().expect("monitor lock").last().map(|l| l.at);
            if last.is_none_or(|t| t.elapsed() >= quiet) || Instant::now() >= deadline {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The namespace.
    pub(crate) fn ns(&self) -> &str {
        &self.ns
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
    }
}

/// Runs one nft command in `ns`.
pub(crate) fn nft(ns: &str, command: &str) -> Result<String, String> {
    let out = NamedNetns::existing(ns)
        .command(["nft"].into_iter().chain(command.split_whitespace()))
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("running nft in {ns}: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "nft {command} in {ns}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// What the policy table in `ns` holds: its elements (sets and maps), chains, sets and
/// rules; all zero without the table.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct TableSize {
    /// Elements of every set and map.
    pub elements: usize,
    /// Chains.
    pub chains: usize,
    /// Sets and maps.
    pub sets: usize,
    /// Rules.
    pub rules: usize,
}

/// Counts what the policy table in `ns` holds (`nft -j list table`).
pub(crate) fn table_size(ns: &str) -> Result<TableSize, String> {
    let out = NamedNetns::existing(ns)
        .command(["nft", "-j", "list", "table", "inet", "weft-policy"])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("running nft in {ns}: {e}"))?;
    if !out.status.success() {
        return Ok(TableSize::default());
    }
    let v: serde_json::Value =
        serde_json::from_slice(&out.stdout).map_err(|e| format!("nft -j list table in {ns}: {e}"))?;
    let mut s = TableSize::default();
    for o in v["nftables"].as_array().into_iter().flatten() {
        if o.get("chain").is_some() {
            s.chains += 1;
        } else if o.get("rule").is_some() {
            s.rules += 1;
        } else if let Some(set) = o.get("set").or_else(|| o.get("map")) {
            s.sets += 1;
            s.elements += set["elem"].as_array().map_or(0, Vec::len);
        }
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tx(lines: &[&str]) -> Transaction {
        let now = Instant::now();
        Transaction {
            first: now,
            lines: lines.iter().map(|l| l.to_string()).collect(),
            by: "weftd".into(),
        }
    }

    #[test]
    fn counts_what_a_transaction_did_to_the_policy_table() {
        let t = tx(&[
            "add element inet weft-policy pabc_i_pods4 { 10.0.0.1 }",
            "add element inet weft-policy ingress_pods { \"wabc\" : jump gdef_i }",
            "add element inet weft-policy pabc_i_pods4 { 10.0.0.2, 10.0.0.3 }",
            "delete element inet weft-policy pold_pods4 { 10.0.0.9 }",
            "add chain inet weft-policy pnew_i",
            "add rule inet weft-policy pnew_i ip saddr @pnew_pods4 counter name \"c\" accept",
            "add set inet weft-policy pnew_pods4 { type ipv4_addr; }",
            "delete chain inet weft-policy pold_i",
            "add element inet weft-nat pods { 10.0.0.7 }",
            "add table inet weft-policy",
        ]);
        assert!(t.policy());
        let c = t.counts();
        assert_eq!(
            c,
            BatchCounts {
                elements_added: 4,
                elements_deleted: 1,
                chains: 2,
                sets: 1,
                rules: 1,
                other: 1
            }
        );
        assert!(t.has(&["add element", "10.0.0.3"]));
        assert!(!t.has(&["10.0.0.7"]), "another table's line is not the policy table's");
        assert!(!tx(&["add table inet weftbench-probe"]).policy());
    }
}
