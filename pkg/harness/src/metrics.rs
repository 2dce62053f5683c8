//! Reading a weftd's Prometheus metrics page from outside: the one way benchmarks and
//! tests scrape a daemon and read a series off the page.

use std::time::{Duration, Instant};

use crate::NamedNetns;

/// The metrics page of the weftd serving on 127.0.0.1:9384 inside namespace `ns`,
/// asked again for up to 10 s: a weftd whose socket already accepts may not serve HTTP
/// yet (its socket is bound before start-up recovery, its HTTP server after).
pub fn page_in(ns: &str) -> Result<String, String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let out = NamedNetns::existing(ns)
            .command(["curl", "-sSf", "--max-time", "5", "http://127.0.0.1:9384/metrics"])
            .output()
            .map_err(|e| format!("running curl in {ns}: {e}"))?;
        if out.status.success() {
            return Ok(String::from_utf8_lossy(&out.stdout).into_owned());
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "fetching the metrics in {ns} failed for 10 s: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The sum of the samples of metric `name` whose label set contains every one of
/// `labels` (`key="value"` strings).
pub fn metric_sum(page: &str, name: &str, labels: &[&str]) -> f64 {
    page.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let (metric, rest) = series.split_once('{').unwrap_or((series, ""));
            (metric == name && labels.iter().all(|want| rest.contains(want))).then(|| value.parse::<f64>().ok())?
        })
        .sum()
}

/// The value of one series (name and labels, as the page prints them) on a metrics
/// page; 0 when the page does not have it.
pub fn series_value(page: &str, series: &str) -> f64 {
    page.lines()
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: &str = "# HELP x_total x\nx_total{kind=\"a\",node=\"n1\"} 2\nx_total{kind=\"b\",node=\"n1\"} 3\ny 7\n";

    #[test]
    fn series_are_summed_by_labels_and_read_one_by_one() {
        assert_eq!(metric_sum(PAGE, "x_total", &[]), 5.0);
        assert_eq!(metric_sum(PAGE, "x_total", &["kind=\"b\""]), 3.0);
        assert_eq!(metric_sum(PAGE, "missing", &[]), 0.0);
        assert_eq!(series_value(PAGE, "y"), 7.0);
        assert_eq!(series_value(PAGE, "x_total{kind=\"a\",node=\"n1\"}"), 2.0);
        assert_eq!(series_value(PAGE, "x"), 0.0);
    }
}
