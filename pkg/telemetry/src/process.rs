//! The standard process metrics (`process_*`), read from `/proc/self` at each scrape.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

/// Reports CPU time, memory, file descriptors and start time of this process.
#[derive(Debug)]
pub struct ProcessCollector;

struct Sample {
    cpu_seconds: f64,
    rss_bytes: f64,
    vsize_bytes: f64,
    open_fds: f64,
    max_fds: f64,
    start_time: f64,
}

fn read() -> Option<Sample> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the parenthesised command name; the name may contain spaces.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    use nix::unistd::{SysconfVar, sysconf};
    let (tick, page) = (
        sysconf(SysconfVar::CLK_TCK).ok()?? as f64,
        sysconf(SysconfVar::PAGE_SIZE).ok()?? as f64,
    );
    let utime: f64 = f.get(11)?.parse().ok()?;
    let stime: f64 = f.get(12)?.parse().ok()?;
    let starttime: f64 = f.get(19)?.parse().ok()?;
    let vsize: f64 = f.get(20)?.parse().ok()?;
    let rss: f64 = f.get(21)?.parse().ok()?;
    let btime: f64 = std::fs::read_to_string("/proc/stat")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("btime ").and_then(|v| v.trim().parse().ok()))?;
    let open_fds = std::fs::read_dir("/proc/self/fd").map(|d| d.count()).unwrap_or(0) as f64;
    let max_fds = std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Max open files"))
                .and_then(|l| l.split_whitespace().nth(3).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0.0);
    Some(Sample {
        cpu_seconds: (utime + stime) / tick,
        rss_bytes: rss * page,
        vsize_bytes: vsize,
        open_fds,
        max_fds,
        start_time: btime + starttime / tick,
    })
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(s) = read() else { return Ok(()) };
        let c = ConstCounter::new(s.cpu_seconds);
        c.encode(encoder.encode_descriptor(
            "process_cpu_seconds",
            "Total user and system CPU time spent in seconds.",
            None,
            c.metric_type(),
        )?)?;
        for (name, help, v) in [
            (
                "process_resident_memory_bytes",
                "Resident memory size in bytes.",
                s.rss_bytes,
            ),
            (
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes.",
                s.vsize_bytes,
            ),
            ("process_open_fds", "Number of open file descriptors.", s.open_fds),
            ("process_max_fds", "Maximum number of open file descriptors.", s.max_fds),
            (
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds.",
                s.start_time,
            ),
        ] {
            let g = ConstGauge::new(v);
            g.encode(encoder.encode_descriptor(name, help, None, g.metric_type())?)?;
        }
        Ok(())
    }
}
