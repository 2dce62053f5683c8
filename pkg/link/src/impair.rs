//! Link emulation: the impairments a link's ends apply to what they send (delay,
//! jitter, loss, rate, corruption, duplication, reordering) and the state a link is
//! put in by intent (down or up), with the settings of one end as an operator sees
//! them.
//!
//! Values are written as `tc netem` users write them ("20ms", "1.5%", "100mbit") in
//! Topology files, on the command line, in the store and in both protocols; they are
//! parsed once here into exact integers (microseconds, parts per million, bits per
//! second), so two ends compare settings without rounding.

use std::collections::BTreeMap;
use std::fmt;

/// The longest delay or jitter accepted (netem holds packets in memory for it).
pub const MAX_DELAY_US: u64 = 60_000_000;

/// A value of one parameter that cannot be used, with the parameter named.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{param} {value:?}: {why}")]
pub struct ImpairmentError {
    /// The parameter (`delay`, `loss`, …).
    pub param: String,
    /// What was given.
    pub value: String,
    /// Why it is refused.
    pub why: String,
}

fn refuse(param: &str, value: &str, why: impl Into<String>) -> ImpairmentError {
    ImpairmentError {
        param: param.into(),
        value: value.into(),
        why: why.into(),
    }
}

/// What one end does to the frames it sends; `None` leaves a parameter off. Percentages
/// are parts per million (1% = 10 000), so they compare and store exactly.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Impairment {
    /// Added latency, microseconds.
    pub delay_us: Option<u64>,
    /// Random variation of the latency (uniform, ±), microseconds; needs a delay.
    pub jitter_us: Option<u64>,
    /// Frames dropped, ppm.
    pub loss_ppm: Option<u32>,
    /// Sending rate, bits per second.
    pub rate_bps: Option<u64>,
    /// Frames with a bit flipped, ppm.
    pub corrupt_ppm: Option<u32>,
    /// Frames sent twice, ppm.
    pub duplicate_ppm: Option<u32>,
    /// Frames sent at once, ahead of delayed ones, ppm; needs a delay.
    pub reorder_ppm: Option<u32>,
}

/// The parameters, in the order they are shown.
pub const PARAMS: [&str; 7] = ["delay", "jitter", "loss", "rate", "corrupt", "duplicate", "reorder"];

impl Impairment {
    /// Whether no parameter is set (the end sends untouched).
    pub fn is_empty(&self) -> bool {
        *self == Impairment::default()
    }

    /// Builds the impairment from (parameter, value) pairs, as files and flags give
    /// them; an empty value leaves the parameter off. Every value is checked, and so is
    /// the whole (jitter and reorder need a delay).
    pub fn from_params<'a>(
        params: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<Impairment, ImpairmentError> {
        let mut imp = Impairment::default();
        for (param, value) in params {
            imp.set(param, value)?;
        }
        imp.check()?;
        Ok(imp)
    }

    /// Sets one parameter from its text ("" clears it).
    pub fn set(&mut self, param: &str, value: &str) -> Result<(), ImpairmentError> {
        let v = value.trim();
        let empty = v.is_empty();
        match param {
            "delay" => self.delay_us = (!empty).then(|| parse_duration(param, v)).transpose()?,
            "jitter" => self.jitter_us = (!empty).then(|| parse_duration(param, v)).transpose()?,
            "loss" => self.loss_ppm = (!empty).then(|| parse_percent(param, v)).transpose()?,
            "rate" => self.rate_bps = (!empty).then(|| parse_rate(param, v)).transpose()?,
            "corrupt" => self.corrupt_ppm = (!empty).then(|| parse_percent(param, v)).transpose()?,
            "duplicate" => self.duplicate_ppm = (!empty).then(|| parse_percent(param, v)).transpose()?,
            "reorder" => self.reorder_ppm = (!empty).then(|| parse_percent(param, v)).transpose()?,
            other => {
                return Err(refuse(
                    other,
                    value,
                    format!("unknown parameter (known: {})", PARAMS.join(", ")),
                ));
            }
        }
        Ok(())
    }

    /// Checks what single values cannot: netem varies and reorders only delayed frames.
    pub fn check(&self) -> Result<(), ImpairmentError> {
        let no_delay = self.delay_us.unwrap_or(0) == 0;
        if no_delay && self.jitter_us.is_some_and(|j| j > 0) {
            return Err(refuse("jitter", &self.text("jitter"), "needs a delay"));
        }
        if no_delay && self.reorder_ppm.is_some_and(|r| r > 0) {
            return Err(refuse("reorder", &self.text("reorder"), "needs a delay"));
        }
        Ok(())
    }

    /// Every set parameter with its canonical text, in [`PARAMS`] order.
    pub fn params(&self) -> Vec<(&'static str, String)> {
        PARAMS
            .iter()
            .map(|p| (*p, self.text(p)))
            .filter(|(_, v)| !v.is_empty())
            .collect()
    }

    /// The parameters as a map (the protocols' form).
    pub fn to_map(&self) -> BTreeMap<String, String> {
        self.params().into_iter().map(|(k, v)| (k.to_string(), v)).collect()
    }

    /// From the protocols' map (checked as [`from_params`](Self::from_params)).
    pub fn from_map<'a>(
        map: impl IntoIterator<Item = (&'a String, &'a String)>,
    ) -> Result<Impairment, ImpairmentError> {
        Impairment::from_params(map.into_iter().map(|(k, v)| (k.as_str(), v.as_str())))
    }

    /// One parameter's canonical text ("" when off).
    pub fn text(&self, param: &str) -> String {
        let pct = |v: Option<u32>| v.map(format_percent).unwrap_or_default();
        match param {
            "delay" => self.delay_us.map(format_duration).unwrap_or_default(),
            "jitter" => self.jitter_us.map(format_duration).unwrap_or_default(),
            "loss" => pct(self.loss_ppm),
            "rate" => self.rate_bps.map(format_rate).unwrap_or_default(),
            "corrupt" => pct(self.corrupt_ppm),
            "duplicate" => pct(self.duplicate_ppm),
            "reorder" => pct(self.reorder_ppm),
            _ => String::new(),
        }
    }

    /// One parameter as a metric value in base units: seconds for delay and jitter,
    /// a ratio (0–1) for the percentages, bits per second for the rate; `None` when off.
    pub fn gauge(&self, param: &str) -> Option<f64> {
        let ratio = |v: Option<u32>| v.map(|p| f64::from(p) / 1e6);
        match param {
            "delay" => self.delay_us.map(|u| u as f64 / 1e6),
            "jitter" => self.jitter_us.map(|u| u as f64 / 1e6),
            "loss" => ratio(self.loss_ppm),
            "rate" => self.rate_bps.map(|r| r as f64),
            "corrupt" => ratio(self.corrupt_ppm),
            "duplicate" => ratio(self.duplicate_ppm),
            "reorder" => ratio(self.reorder_ppm),
            _ => None,
        }
    }

    /// Each parameter from `self`, or from `other` where `self` leaves it off (a link's
    /// values may be written on either end's entry).
    pub fn or(&self, other: &Impairment) -> Impairment {
        Impairment {
            delay_us: self.delay_us.or(other.delay_us),
            jitter_us: self.jitter_us.or(other.jitter_us),
            loss_ppm: self.loss_ppm.or(other.loss_ppm),
            rate_bps: self.rate_bps.or(other.rate_bps),
            corrupt_ppm: self.corrupt_ppm.or(other.corrupt_ppm),
            duplicate_ppm: self.duplicate_ppm.or(other.duplicate_ppm),
            reorder_ppm: self.reorder_ppm.or(other.reorder_ppm),
        }
    }
}

impl fmt::Display for Impairment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_empty() {
            return f.write_str("-");
        }
        let parts: Vec<String> = self.params().into_iter().map(|(k, v)| format!("{k} {v}")).collect();
        f.write_str(&parts.join(" "))
    }
}

/// Splits "20ms" into (20.0, "ms").
fn number_unit<'a>(param: &str, v: &'a str) -> Result<(f64, &'a str), ImpairmentError> {
    let at = v.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(v.len());
    let (num, unit) = v.split_at(at);
    let n: f64 = num
        .parse()
        .map_err(|_| refuse(param, v, "expected a number with a unit"))?;
    if !n.is_finite() || n < 0.0 {
        return Err(refuse(param, v, "must not be negative"));
    }
    Ok((n, unit.trim()))
}

/// "20ms", "1.5s", "500us", "250µs" to microseconds.
fn parse_duration(param: &str, v: &str) -> Result<u64, ImpairmentError> {
    let (n, unit) = number_unit(param, v)?;
    let scale = match unit.to_ascii_lowercase().as_str() {
        "us" | "µs" | "usec" => 1.0,
        "ms" | "msec" => 1e3,
        "s" | "sec" => 1e6,
        "" => return Err(refuse(param, v, "needs a unit: us, ms or s")),
        _ => return Err(refuse(param, v, "unknown unit (us, ms or s)")),
    };
    let us = (n * scale).round();
    if us > MAX_DELAY_US as f64 {
        return Err(refuse(param, v, "longer than 60s"));
    }
    Ok(us as u64)
}

/// "1%", "0.5%" to parts per million.
fn parse_percent(param: &str, v: &str) -> Result<u32, ImpairmentError> {
    let (n, unit) = number_unit(param, v)?;
    if unit != "%" {
        return Err(refuse(param, v, "expected a percentage such as 1%"));
    }
    if n > 100.0 {
        return Err(refuse(param, v, "more than 100%"));
    }
    Ok((n * 1e4).round() as u32)
}

/// "100mbit", "1gbit", "500kbit", "64bit", "10mbps" (bytes) to bits per second.
fn parse_rate(param: &str, v: &str) -> Result<u64, ImpairmentError> {
    let (n, unit) = number_unit(param, v)?;
    let scale = match unit.to_ascii_lowercase().as_str() {
        "bit" => 1.0,
        "kbit" => 1e3,
        "mbit" => 1e6,
        "gbit" => 1e9,
        "bps" => 8.0,
        "kbps" => 8e3,
        "mbps" => 8e6,
        "gbps" => 8e9,
        "" => return Err(refuse(param, v, "needs a unit such as kbit, mbit or gbit")),
        _ => {
            return Err(refuse(
                param,
                v,
                "unknown unit (bit, kbit, mbit, gbit, or bps… for bytes)",
            ));
        }
    };
    let bps = (n * scale).round();
    if bps < 8.0 {
        return Err(refuse(param, v, "below 8bit"));
    }
    if bps > 1e13 {
        return Err(refuse(param, v, "above 10000gbit"));
    }
    Ok(bps as u64)
}

fn format_duration(us: u64) -> String {
    if us.is_multiple_of(1_000_000) && us > 0 {
        format!("{}s", us / 1_000_000)
    } else if us.is_multiple_of(1000) {
        format!("{}ms", us / 1000)
    } else {
        format!("{us}us")
    }
}

fn format_percent(ppm: u32) -> String {
    let whole = ppm / 10_000;
    let frac = ppm % 10_000;
    if frac == 0 {
        format!("{whole}%")
    } else {
        let s = format!("{whole}.{frac:04}");
        format!("{}%", s.trim_end_matches('0'))
    }
}

fn format_rate(bps: u64) -> String {
    for (unit, scale) in [("gbit", 1_000_000_000), ("mbit", 1_000_000), ("kbit", 1000)] {
        if bps >= scale && bps.is_multiple_of(scale) {
            return format!("{}{unit}", bps / scale);
        }
    }
    format!("{bps}bit")
}

/// Whether a link is down by intent at an end, and who asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DownBy {
    /// An operator named this end (`weftctl link down POD INTF`).
    Named,
    /// An operator named the other end; this end follows.
    Peer,
}

impl DownBy {
    /// The name kept in the store.
    pub fn as_str(self) -> &'static str {
        match self {
            DownBy::Named => "named",
            DownBy::Peer => "peer",
        }
    }

    /// From the store's name.
    pub fn parse(s: &str) -> Option<DownBy> {
        match s {
            "named" => Some(DownBy::Named),
            "peer" => Some(DownBy::Peer),
            _ => None,
        }
    }
}

/// What an operator set on one wire end at run time (what the topology says is the
/// default for everything left unset).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EndSettings {
    /// Replaces the topology's impairment for this end's direction.
    pub impairment: Option<Impairment>,
    /// The link is down by intent.
    pub down: Option<DownBy>,
}

impl EndSettings {
    /// Whether nothing is set (the record can go).
    pub fn is_empty(&self) -> bool {
        self.impairment.is_none() && self.down.is_none()
    }
}

/// A change an operator asks for on one link, named by one of its ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinkChange {
    /// Replace the impairment of both directions.
    Set(Impairment),
    /// Back to the topology's impairment in both directions.
    Reset,
    /// Carrier off on both ends.
    Down,
    /// Carrier back on both ends.
    Up,
}

/// One wire end with its emulation settings, as `weftctl link show` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkView {
    /// The wire end.
    pub end: crate::WireEnd,
    /// What the topology says for this end's direction.
    pub topology: Impairment,
    /// What is applied (the run-time override, else the topology's).
    pub active: Impairment,
    /// Whether a run-time setting overrides the topology's.
    pub overridden: bool,
    /// Down by intent (and who asked).
    pub down: Option<DownBy>,
    /// Why the settings are not in force at this end (the kernel refused them), if so.
    pub problem: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_parse_to_exact_units_and_print_back() {
        let imp = Impairment::from_params([
            ("delay", "20ms"),
            ("jitter", "2ms"),
            ("loss", "1%"),
            ("rate", "100mbit"),
            ("corrupt", "0.1%"),
            ("duplicate", "0.25%"),
            ("reorder", "5%"),
        ])
        .unwrap();
        assert_eq!(imp.delay_us, Some(20_000));
        assert_eq!(imp.jitter_us, Some(2_000));
        assert_eq!(imp.loss_ppm, Some(10_000));
        assert_eq!(imp.rate_bps, Some(100_000_000));
        assert_eq!(imp.corrupt_ppm, Some(1_000));
        assert_eq!(imp.duplicate_ppm, Some(2_500));
        assert_eq!(
            imp.to_string(),
            "delay 20ms jitter 2ms loss 1% rate 100mbit corrupt 0.1% duplicate 0.25% reorder 5%"
        );
        let again = Impairment::from_map(&imp.to_map()).unwrap();
        assert_eq!(again, imp);
        assert_eq!(imp.gauge("delay"), Some(0.02));
        assert_eq!(imp.gauge("loss"), Some(0.01));
        assert_eq!(imp.gauge("rate"), Some(1e8));
        for (v, us) in [("1s", 1_000_000), ("1.5s", 1_500_000), ("250us", 250), ("0ms", 0)] {
            assert_eq!(
                Impairment::from_params([("delay", v)]).unwrap().delay_us,
                Some(us),
                "{v}"
            );
        }
        assert_eq!(
            Impairment::from_params([("rate", "10mbps")]).unwrap().rate_bps,
            Some(80_000_000)
        );
        assert!(Impairment::from_params([("delay", "")]).unwrap().is_empty());
        assert_eq!(Impairment::default().to_string(), "-");
    }

    #[test]
    fn bad_values_are_refused_with_the_parameter_named() {
        let cases = [
            (("delay", "20"), "delay \"20\": needs a unit: us, ms or s"),
            (
                ("delay", "20 minutes"),
                "delay \"20 minutes\": unknown unit (us, ms or s)",
            ),
            (("delay", "-5ms"), "delay \"-5ms\": expected a number with a unit"),
            (("delay", "61s"), "delay \"61s\": longer than 60s"),
            (("loss", "1"), "loss \"1\": expected a percentage such as 1%"),
            (("loss", "101%"), "loss \"101%\": more than 100%"),
            (("rate", "fast"), "rate \"fast\": expected a number with a unit"),
            (("rate", "1bit"), "rate \"1bit\": below 8bit"),
            (("rate", "100"), "rate \"100\": needs a unit such as kbit, mbit or gbit"),
            (
                ("latency", "1ms"),
                "latency \"1ms\": unknown parameter (known: delay, jitter, loss, rate, corrupt, duplicate, reorder)",
            ),
        ];
        for (p, want) in cases {
            assert_eq!(Impairment::from_params([p]).unwrap_err().to_string(), want);
        }
        assert_eq!(
            Impairment::from_params([("jitter", "2ms")]).unwrap_err().to_string(),
            "jitter \"2ms\": needs a delay"
        );
        assert_eq!(
            Impairment::from_params([("reorder", "5%")]).unwrap_err().to_string(),
            "reorder \"5%\": needs a delay"
        );
    }

    #[test]
    fn either_entry_of_a_link_may_carry_a_parameter() {
        let a = Impairment::from_params([("delay", "10ms")]).unwrap();
        let b = Impairment::from_params([("delay", "30ms"), ("loss", "2%")]).unwrap();
        let m = a.or(&b);
        assert_eq!((m.delay_us, m.loss_ppm), (Some(10_000), Some(20_000)));
        assert_eq!(DownBy::parse(DownBy::Peer.as_str()), Some(DownBy::Peer));
        assert!(EndSettings::default().is_empty());
    }
}
