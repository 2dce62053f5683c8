//! Order statistics over samples.

use serde::Serialize;

/// Nearest-rank percentiles of a sample set.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Percentiles {
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Largest sample.
    pub max: f64,
    /// How many samples.
    pub n: usize,
}

fn rank(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

impl Percentiles {
    /// Percentiles of `samples`.
    pub fn of(samples: &[f64]) -> Self {
        let mut s = samples.to_vec();
        s.sort_by(f64::total_cmp);
        Self {
            p50: rank(&s, 0.5),
            p90: rank(&s, 0.9),
            p99: rank(&s, 0.99),
            max: s.last().copied().unwrap_or(0.0),
            n: s.len(),
        }
    }

    /// `p50 / p99 / max` with `digits` decimals, as the reports' tables show them.
    pub fn p50_p99_max(&self, digits: usize) -> String {
        format!("{:.digits$} / {:.digits$} / {:.digits$}", self.p50, self.p99, self.max)
    }
}

/// The median of `samples` (0 when empty).
pub fn median(samples: &[f64]) -> f64 {
    Percentiles::of(samples).p50
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        let p = Percentiles::of(&v);
        assert_eq!((p.p50, p.p90, p.p99, p.max, p.n), (50.0, 90.0, 99.0, 100.0, 100));
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[]), 0.0);
        assert_eq!(p.p50_p99_max(1), "50.0 / 99.0 / 100.0");
    }
}
