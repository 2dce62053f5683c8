//! `weft_conntrack_*`: the connection tracking table of the node's network namespace,
//! read from /proc at each scrape. Pod traffic that crosses the node (host ports,
//! masquerade, pod to pod) is tracked there, and a full table drops new connections.
//! With the conntrack module not loaded the files are absent and so are the metrics.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

/// Where the table's size is read from.
const COUNT: &str = "sys/net/netfilter/nf_conntrack_count";

/// Where its limit is read from, the first that reads: the namespace's own (read-only,
/// or absent on some kernels, outside the initial namespace), then the initial
/// namespace's.
const LIMIT: [&str; 2] = ["sys/net/netfilter/nf_conntrack_max", "sys/net/nf_conntrack_max"];

/// The counters: name, help, and the column of `/proc/net/stat/nf_conntrack`.
const COUNTERS: [(&str, &str, &str); 3] = [
    (
        "weft_conntrack_insert_failed",
        "Connections conntrack could not insert into its table (a clash with another entry)",
        "insert_failed",
    ),
    (
        "weft_conntrack_early_drop",
        "Connections conntrack evicted early to make room in a full table",
        "early_drop",
    ),
    (
        "weft_conntrack_drops",
        "Packets conntrack dropped, mostly for a full table with nothing to evict early",
        "drop",
    ),
];

/// The names of the families [`ConntrackCollector`] encodes, to register it under.
pub fn family_names() -> [&'static str; 5] {
    let [a, b, c] = COUNTERS.map(|(name, _, _)| name);
    ["weft_conntrack_entries", "weft_conntrack_limit", a, b, c]
}

/// Sums the per-CPU rows of `/proc/net/stat/nf_conntrack` by the column names of its
/// header line (hexadecimal values; columns move between kernel versions). `entries`
/// is left out: every row repeats the namespace's count rather than a CPU's share.
/// `None` when the text does not have that shape: no numbers rather than wrong ones.
pub fn parse_stat(text: &str) -> Option<BTreeMap<String, u64>> {
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next()?.split_whitespace().collect();
    if header.is_empty() {
        return None;
    }
    let mut sums: BTreeMap<String, u64> = header
        .iter()
        .filter(|c| **c != "entries")
        .map(|c| (c.to_string(), 0))
        .collect();
    for line in lines.filter(|l| !l.trim().is_empty()) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() != header.len() {
            return None;
        }
        for (column, field) in header.iter().zip(fields) {
            let v = u64::from_str_radix(field, 16).ok()?;
            if let Some(sum) = sums.get_mut(*column) {
                *sum = sum.wrapping_add(v);
            }
        }
    }
    Some(sums)
}

fn read_number(path: &Path) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// Encodes `weft_conntrack_*` from the files under a proc root (`/proc`) at each scrape.
#[derive(Debug)]
pub struct ConntrackCollector {
    proc: PathBuf,
}

impl Default for ConntrackCollector {
    fn default() -> Self {
        Self::new("/proc")
    }
}

impl ConntrackCollector {
    /// Reads under `proc` (`/proc`, or a copy of its files in a test).
    pub fn new(proc: impl Into<PathBuf>) -> Self {
        Self { proc: proc.into() }
    }
}

impl Collector for ConntrackCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        if let Some(entries) = read_number(&self.proc.join(COUNT)) {
            ConstGauge::new(entries).encode(encoder.encode_descriptor(
                "weft_conntrack_entries",
                "Connections in the conntrack table of the node's network namespace",
                None,
                MetricType::Gauge,
            )?)?;
        }
        // nf_conntrack_max 0 means no limit: no limit gauge rather than a fill ratio
        // against zero.
        let limit = LIMIT.iter().find_map(|p| read_number(&self.proc.join(p)));
        if let Some(limit) = limit.filter(|l| *l > 0) {
            ConstGauge::new(limit).encode(encoder.encode_descriptor(
                "weft_conntrack_limit",
                "Size limit of the conntrack table (nf_conntrack_max)",
                None,
                MetricType::Gauge,
            )?)?;
        }
        let stat = std::fs::read_to_string(self.proc.join("net/stat/nf_conntrack"))
            .ok()
            .and_then(|t| parse_stat(&t));
        if let Some(stat) = stat {
            for (name, help, column) in COUNTERS {
                if let Some(v) = stat.get(column) {
                    let c = ConstCounter::new(*v);
                    c.encode(encoder.encode_descriptor(name, help, None, MetricType::Counter)?)?;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Captured from Linux 6.18 (two CPUs) in a namespace with one tracked connection;
    /// the counters this module exports were then set by hand on one CPU or both, since
    /// a test machine's table never fills.
    const STAT_6_18: &str = "\
entries  clashres found new invalid ignore delete chainlength insert insert_failed drop early_drop icmp_error  expect_new expect_create expect_delete search_restart
00000001  00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 0000000a 00000003 000000ff 00000000  00000000 00000000 00000000 00000000
00000001  00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000001 00000000 00000001 00000000  00000000 00000000 00000000 00000002
";

    /// The layout of Linux 4.x and 5.x (`searched`, `delete_list` where 6.x has other
    /// columns): the same counters, elsewhere.
    const STAT_5_4: &str = "\
entries  searched found new invalid ignore delete delete_list insert insert_failed drop early_drop icmp_error  expect_new expect_create expect_delete search_restart
0000002a  00000000 00000000 00000000 00000005 00000000 00000000 00000000 00000000 00000002 00000000 00000000 00000000  00000000 00000000 00000000 00000010
0000002a  00000000 00000000 00000000 00000001 00000000 00000000 00000000 00000000 00000003 00000007 00000001 00000000  00000000 00000000 00000000 00000000
0000002a  00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000  00000000 00000000 00000000 00000000
";

    #[test]
    fn the_stat_file_is_summed_over_cpus_by_its_header() {
        let s = parse_stat(STAT_6_18).unwrap();
        assert_eq!(s["insert_failed"], 11);
        assert_eq!(s["drop"], 3);
        assert_eq!(s["early_drop"], 256);
        assert_eq!(s["search_restart"], 2);
        assert!(!s.contains_key("entries"), "entries is not per CPU");
        let s = parse_stat(STAT_5_4).unwrap();
        assert_eq!((s["insert_failed"], s["drop"], s["early_drop"]), (5, 7, 1));
        assert_eq!(s["invalid"], 6);
    }

    #[test]
    fn a_stat_file_of_another_shape_gives_nothing() {
        assert_eq!(parse_stat(""), None);
        assert_eq!(parse_stat("entries drop\n00000001\n"), None, "a short row");
        assert_eq!(parse_stat("entries drop\n00000001 0000zz00\n"), None, "not hex");
        assert_eq!(
            parse_stat("entries drop\n").unwrap(),
            BTreeMap::from([("drop".to_string(), 0)])
        );
    }

    fn render(proc: &Path) -> String {
        let m = weft_telemetry::Metrics::new("v", "c");
        m.register_collector(&family_names(), ConntrackCollector::new(proc));
        m.render("text/plain").1
    }

    #[test]
    fn the_limit_falls_back_and_absent_files_give_no_metrics() {
        let dir = tempfile::tempdir().unwrap();
        let page = render(dir.path());
        assert!(!page.contains("weft_conntrack"), "{page}");

        let p = dir.path();
        std::fs::create_dir_all(p.join("sys/net/netfilter")).unwrap();
        std::fs::create_dir_all(p.join("net/stat")).unwrap();
        std::fs::write(p.join("sys/net/netfilter/nf_conntrack_count"), "17\n").unwrap();
        std::fs::write(p.join("sys/net/nf_conntrack_max"), "262144\n").unwrap();
        std::fs::write(p.join("net/stat/nf_conntrack"), STAT_6_18).unwrap();
        let page = render(p);
        for line in [
            "# TYPE weft_conntrack_entries gauge\nweft_conntrack_entries 17\n",
            "weft_conntrack_limit 262144\n",
            "# TYPE weft_conntrack_insert_failed_total counter\nweft_conntrack_insert_failed_total 11\n",
            "weft_conntrack_early_drop_total 256\n",
            "weft_conntrack_drops_total 3\n",
        ] {
            assert!(page.contains(line), "{line} in:\n{page}");
        }
        // The per-namespace file wins over the initial namespace's; 0 is no limit.
        std::fs::write(p.join("sys/net/netfilter/nf_conntrack_max"), "1000\n").unwrap();
        assert!(render(p).contains("weft_conntrack_limit 1000\n"));
        std::fs::write(p.join("sys/net/netfilter/nf_conntrack_max"), "0\n").unwrap();
        std::fs::remove_file(p.join("sys/net/nf_conntrack_max")).unwrap();
        assert!(!render(p).contains("weft_conntrack_limit"));
    }
}
