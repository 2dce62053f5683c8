//! Link emulation: the impairments a link's ends apply to what they send (delay,
//! jitter and its distribution, loss and its models, rate, corruption, duplication,
//! reordering, each with a correlation; slots; ECN marking) and the state a link is
//! put in by intent (down or up), with the settings of one end as an operator sees
//! them.
//!
//! Values are written as `tc netem` users write them ("20ms", "1.5%", "100mbit",
//! "gemodel 1% 10% 70% 0.1%", "800us 1ms packets 32") in Topology files, on the command
//! line, in the store and in both protocols; they are parsed once here into exact
//! integers (microseconds, parts per million, bits per second), so two ends compare
//! settings without rounding. [`crate::model`] runs them.

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
    /// Variation of the latency, microseconds (± for the uniform distribution, the
    /// standard deviation for the others); needs a delay.
    pub jitter_us: Option<u64>,
    /// How successive delays are correlated, ppm (`jitter 2ms 25%`).
    pub jitter_corr_ppm: Option<u32>,
    /// The delay's distribution (`uniform` when off); needs a jitter.
    pub distribution: Option<crate::model::Distribution>,
    /// Frames dropped at random, ppm.
    pub loss_ppm: Option<u32>,
    /// How successive random losses are correlated, ppm (`loss 1% 25%`).
    pub loss_corr_ppm: Option<u32>,
    /// A loss model instead of random loss (`loss gemodel ...`, `loss state ...`).
    pub loss_model: Option<LossSpec>,
    /// Sending rate, bits per second.
    pub rate_bps: Option<u64>,
    /// Frames with a bit flipped, ppm.
    pub corrupt_ppm: Option<u32>,
    /// Correlation of corruption, ppm.
    pub corrupt_corr_ppm: Option<u32>,
    /// Frames sent twice, ppm.
    pub duplicate_ppm: Option<u32>,
    /// Correlation of duplication, ppm.
    pub duplicate_corr_ppm: Option<u32>,
    /// Frames sent at once, ahead of delayed ones, ppm; needs a delay.
    pub reorder_ppm: Option<u32>,
    /// Correlation of reordering, ppm.
    pub reorder_corr_ppm: Option<u32>,
    /// Frames released in bursts (`slot MIN [MAX] [packets N] [bytes B]`).
    pub slot: Option<crate::model::SlotConfig>,
    /// A lost frame that is ECN-capable is marked Congestion Experienced and sent
    /// instead of dropped; needs a loss.
    pub ecn: bool,
}

/// A loss model as written (ppm, the values not given left off so it prints back as
/// written); [`LossSpec::model`] fills netem's defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LossSpec {
    /// `gemodel p [r [1-h [1-k]]]`.
    GilbertElliott {
        /// Good to bad.
        p: u32,
        /// Bad to good.
        r: Option<u32>,
        /// Lost in the bad state.
        one_minus_h: Option<u32>,
        /// Lost in the good state.
        one_minus_k: Option<u32>,
    },
    /// `state p13 [p31 [p32 [p23 [p14]]]]`.
    State {
        /// Gap to burst loss.
        p13: u32,
        /// The rest, in netem's order (`p31`, `p32`, `p23`, `p14`).
        rest: [Option<u32>; 4],
    },
}

impl LossSpec {
    /// The model with netem's defaults for what is left off.
    pub fn model(&self) -> crate::model::LossModel {
        use crate::model::{LossModel, Prob};
        let p = Prob::from_ppm;
        match *self {
            LossSpec::GilbertElliott {
                p: gp,
                r,
                one_minus_h,
                one_minus_k,
            } => LossModel::gilbert_elliott(p(gp), r.map(p), one_minus_h.map(p), one_minus_k.map(p)),
            LossSpec::State { p13, rest } => {
                let [p31, p32, p23, p14] = rest.map(|v| v.map(p));
                LossModel::state(p(p13), p31, p32, p23, p14)
            }
        }
    }

    fn text(&self) -> String {
        let (name, values): (&str, Vec<u32>) = match *self {
            LossSpec::GilbertElliott {
                p,
                r,
                one_minus_h,
                one_minus_k,
            } => (
                "gemodel",
                std::iter::once(Some(p))
                    .chain([r, one_minus_h, one_minus_k])
                    .map_while(|v| v)
                    .collect(),
            ),
            LossSpec::State { p13, rest } => (
                "state",
                std::iter::once(Some(p13)).chain(rest).map_while(|v| v).collect(),
            ),
        };
        let mut out = name.to_string();
        for v in values {
            out.push(' ');
            out.push_str(&format_percent(v));
        }
        out
    }
}

/// The parameters, in the order they are shown.
pub const PARAMS: [&str; 10] = [
    "delay",
    "jitter",
    "distribution",
    "loss",
    "rate",
    "corrupt",
    "duplicate",
    "reorder",
    "slot",
    "ecn",
];

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
            "jitter" => (self.jitter_us, self.jitter_corr_ppm) = unzip(parse_with_corr(param, v, parse_duration)?),
            "distribution" => {
                self.distribution = (!empty)
                    .then(|| {
                        crate::model::Distribution::parse(v)
                            .ok_or_else(|| refuse(param, v, "one of uniform, normal, pareto, paretonormal"))
                    })
                    .transpose()?;
            }
            "loss" => {
                (self.loss_ppm, self.loss_corr_ppm, self.loss_model) = (None, None, None);
                let words: Vec<&str> = v.split_whitespace().collect();
                match words.first().copied() {
                    None => {}
                    Some("gemodel") => {
                        let v4 = percents(param, v, &words[1..], 4)?;
                        self.loss_model = Some(LossSpec::GilbertElliott {
                            p: v4[0].ok_or_else(|| refuse(param, v, "gemodel needs at least p"))?,
                            r: v4[1],
                            one_minus_h: v4[2],
                            one_minus_k: v4[3],
                        });
                    }
                    Some("state") => {
                        let v5 = percents(param, v, &words[1..], 5)?;
                        self.loss_model = Some(LossSpec::State {
                            p13: v5[0].ok_or_else(|| refuse(param, v, "state needs at least p13"))?,
                            rest: [v5[1], v5[2], v5[3], v5[4]],
                        });
                    }
                    Some("random") => {
                        (self.loss_ppm, self.loss_corr_ppm) =
                            unzip(parse_with_corr(param, &words[1..].join(" "), parse_percent)?);
                        if self.loss_ppm.is_none() {
                            return Err(refuse(param, v, "random needs a percentage"));
                        }
                    }
                    Some(_) => (self.loss_ppm, self.loss_corr_ppm) = unzip(parse_with_corr(param, v, parse_percent)?),
                }
            }
            "rate" => self.rate_bps = (!empty).then(|| parse_rate(param, v)).transpose()?,
            "corrupt" => (self.corrupt_ppm, self.corrupt_corr_ppm) = unzip(parse_with_corr(param, v, parse_percent)?),
            "duplicate" => {
                (self.duplicate_ppm, self.duplicate_corr_ppm) = unzip(parse_with_corr(param, v, parse_percent)?);
            }
            "reorder" => (self.reorder_ppm, self.reorder_corr_ppm) = unzip(parse_with_corr(param, v, parse_percent)?),
            "slot" => self.slot = (!empty).then(|| parse_slot(param, v)).transpose()?,
            "ecn" => {
                self.ecn = match v {
                    "" | "off" | "false" | "no" => false,
                    "on" | "true" | "yes" => true,
                    _ => return Err(refuse(param, v, "on or off")),
                }
            }
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

    /// Whether netem, as weft writes it, applies every set parameter with weft's
    /// meaning: everything but correlations, whose meaning in netem is not weft's (see
    /// docs/emulation.md); an impairment with a correlation runs in weft's detour on
    /// any kernel.
    pub fn netem_expressible(&self) -> bool {
        self.jitter_corr_ppm.is_none()
            && self.loss_corr_ppm.is_none()
            && self.corrupt_corr_ppm.is_none()
            && self.duplicate_corr_ppm.is_none()
            && self.reorder_corr_ppm.is_none()
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
        if self.distribution.is_some() && self.jitter_us.unwrap_or(0) == 0 {
            return Err(refuse(
                "distribution",
                &self.text("distribution"),
                "needs a jitter (the distribution's spread)",
            ));
        }
        if self.ecn && self.loss_ppm.unwrap_or(0) == 0 && self.loss_model.is_none() {
            return Err(refuse("ecn", "on", "needs a loss (ECN marks what would be lost)"));
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
        let pct = |v: Option<u32>, corr: Option<u32>| match (v, corr) {
            (Some(v), Some(c)) => format!("{} {}", format_percent(v), format_percent(c)),
            (Some(v), None) => format_percent(v),
            (None, _) => String::new(),
        };
        match param {
            "delay" => self.delay_us.map(format_duration).unwrap_or_default(),
            "jitter" => match (self.jitter_us, self.jitter_corr_ppm) {
                (Some(j), Some(c)) => format!("{} {}", format_duration(j), format_percent(c)),
                (Some(j), None) => format_duration(j),
                (None, _) => String::new(),
            },
            "distribution" => self.distribution.map(|d| d.as_str().to_string()).unwrap_or_default(),
            "loss" => match &self.loss_model {
                Some(m) => m.text(),
                None => pct(self.loss_ppm, self.loss_corr_ppm),
            },
            "rate" => self.rate_bps.map(format_rate).unwrap_or_default(),
            "corrupt" => pct(self.corrupt_ppm, self.corrupt_corr_ppm),
            "duplicate" => pct(self.duplicate_ppm, self.duplicate_corr_ppm),
            "reorder" => pct(self.reorder_ppm, self.reorder_corr_ppm),
            "slot" => self.slot.map(format_slot).unwrap_or_default(),
            "ecn" => {
                if self.ecn {
                    "on".into()
                } else {
                    String::new()
                }
            }
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
        // A parameter and its correlation (or model) come from the same entry.
        let (jitter_us, jitter_corr_ppm) = if self.jitter_us.is_some() {
            (self.jitter_us, self.jitter_corr_ppm)
        } else {
            (other.jitter_us, other.jitter_corr_ppm)
        };
        let (loss_ppm, loss_corr_ppm, loss_model) = if self.loss_ppm.is_some() || self.loss_model.is_some() {
            (self.loss_ppm, self.loss_corr_ppm, self.loss_model)
        } else {
            (other.loss_ppm, other.loss_corr_ppm, other.loss_model)
        };
        let pair = |a: (Option<u32>, Option<u32>), b: (Option<u32>, Option<u32>)| if a.0.is_some() { a } else { b };
        let (corrupt_ppm, corrupt_corr_ppm) = pair(
            (self.corrupt_ppm, self.corrupt_corr_ppm),
            (other.corrupt_ppm, other.corrupt_corr_ppm),
        );
        let (duplicate_ppm, duplicate_corr_ppm) = pair(
            (self.duplicate_ppm, self.duplicate_corr_ppm),
            (other.duplicate_ppm, other.duplicate_corr_ppm),
        );
        let (reorder_ppm, reorder_corr_ppm) = pair(
            (self.reorder_ppm, self.reorder_corr_ppm),
            (other.reorder_ppm, other.reorder_corr_ppm),
        );
        Impairment {
            delay_us: self.delay_us.or(other.delay_us),
            jitter_us,
            jitter_corr_ppm,
            distribution: self.distribution.or(other.distribution),
            loss_ppm,
            loss_corr_ppm,
            loss_model,
            rate_bps: self.rate_bps.or(other.rate_bps),
            corrupt_ppm,
            corrupt_corr_ppm,
            duplicate_ppm,
            duplicate_corr_ppm,
            reorder_ppm,
            reorder_corr_ppm,
            slot: self.slot.or(other.slot),
            ecn: self.ecn || other.ecn,
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

/// `VALUE [CORRELATION]`: a value and, optionally, its correlation (a percentage).
fn parse_with_corr<T>(
    param: &str,
    v: &str,
    value: fn(&str, &str) -> Result<T, ImpairmentError>,
) -> Result<Option<(T, Option<u32>)>, ImpairmentError> {
    let words: Vec<&str> = v.split_whitespace().collect();
    match words.as_slice() {
        [] => Ok(None),
        [x] => Ok(Some((value(param, x)?, None))),
        [x, c] => Ok(Some((value(param, x)?, Some(parse_percent(param, c)?)))),
        _ => Err(refuse(param, v, "a value and at most its correlation (a percentage)")),
    }
}

fn unzip<T>(v: Option<(T, Option<u32>)>) -> (Option<T>, Option<u32>) {
    match v {
        Some((a, b)) => (Some(a), b),
        None => (None, None),
    }
}

/// Up to `max` percentages, the rest left off.
fn percents(param: &str, v: &str, words: &[&str], max: usize) -> Result<Vec<Option<u32>>, ImpairmentError> {
    if words.len() > max {
        return Err(refuse(param, v, format!("at most {max} percentages")));
    }
    let mut out: Vec<Option<u32>> = words
        .iter()
        .map(|w| parse_percent(param, w).map(Some))
        .collect::<Result<_, _>>()?;
    out.resize(max, None);
    Ok(out)
}

/// `MIN [MAX] [packets N] [bytes B]`.
fn parse_slot(param: &str, v: &str) -> Result<crate::model::SlotConfig, ImpairmentError> {
    let words: Vec<&str> = v.split_whitespace().collect();
    let mut times = Vec::new();
    let (mut packets, mut bytes) = (None, None);
    let mut i = 0;
    while i < words.len() {
        match words[i] {
            "packets" | "bytes" => {
                let n: u64 = words
                    .get(i + 1)
                    .and_then(|n| n.parse().ok())
                    .filter(|n| *n > 0)
                    .ok_or_else(|| refuse(param, v, format!("{} needs a positive count", words[i])))?;
                if words[i] == "packets" {
                    packets = Some(u32::try_from(n).map_err(|_| refuse(param, v, "too many packets"))?);
                } else {
                    bytes = Some(n);
                }
                i += 2;
            }
            w if times.len() < 2 && packets.is_none() && bytes.is_none() => {
                times.push(parse_duration(param, w)?);
                i += 1;
            }
            _ => return Err(refuse(param, v, "MIN [MAX] [packets N] [bytes B]")),
        }
    }
    let min_us = *times
        .first()
        .ok_or_else(|| refuse(param, v, "needs the time between slots"))?;
    let max_us = times.get(1).copied().unwrap_or(min_us);
    if max_us < min_us {
        return Err(refuse(param, v, "MAX is shorter than MIN"));
    }
    Ok(crate::model::SlotConfig {
        min_us,
        max_us,
        packets,
        bytes,
    })
}

fn format_slot(s: crate::model::SlotConfig) -> String {
    let mut out = format_duration(s.min_us);
    if s.max_us != s.min_us {
        out.push(' ');
        out.push_str(&format_duration(s.max_us));
    }
    if let Some(p) = s.packets {
        out.push_str(&format!(" packets {p}"));
    }
    if let Some(b) = s.bytes {
        out.push_str(&format!(" bytes {b}"));
    }
    out
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
                "latency \"1ms\": unknown parameter (known: delay, jitter, distribution, loss, rate, corrupt, duplicate, reorder, slot, ecn)",
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
    fn netem_forms_parse_and_print_back() {
        let imp = Impairment::from_params([
            ("delay", "50ms"),
            ("jitter", "10ms 25%"),
            ("distribution", "paretonormal"),
            ("loss", "gemodel 1% 10% 70% 0.1%"),
            ("corrupt", "0.1% 50%"),
            ("duplicate", "1%"),
            ("reorder", "5% 50%"),
            ("slot", "800us 1ms packets 32 bytes 65536"),
            ("ecn", "on"),
        ])
        .unwrap();
        assert_eq!(imp.jitter_corr_ppm, Some(250_000));
        assert_eq!(
            imp.loss_model,
            Some(LossSpec::GilbertElliott {
                p: 10_000,
                r: Some(100_000),
                one_minus_h: Some(700_000),
                one_minus_k: Some(1_000)
            })
        );
        assert_eq!(
            imp.to_string(),
            "delay 50ms jitter 10ms 25% distribution paretonormal loss gemodel 1% 10% 70% 0.1% \
             corrupt 0.1% 50% duplicate 1% reorder 5% 50% slot 800us 1ms packets 32 bytes 65536 ecn on"
        );
        assert_eq!(Impairment::from_map(&imp.to_map()).unwrap(), imp);
        assert!(!imp.netem_expressible());
        for (v, text) in [
            ("1% 25%", "1% 25%"),
            ("random 2%", "2%"),
            ("random 2% 10%", "2% 10%"),
            ("state 1% 20%", "state 1% 20%"),
            ("gemodel 0.5%", "gemodel 0.5%"),
        ] {
            let i = Impairment::from_params([("loss", v)]).unwrap();
            assert_eq!(i.text("loss"), text, "{v}");
        }
        let state = Impairment::from_params([("loss", "state 1% 20%")]).unwrap();
        assert_eq!(
            state.loss_model.unwrap().model(),
            crate::model::LossModel::state(
                crate::model::Prob::from_ppm(10_000),
                Some(crate::model::Prob::from_ppm(200_000)),
                None,
                None,
                None
            )
        );
        assert!(
            Impairment::from_params([("delay", "5ms"), ("loss", "1%")])
                .unwrap()
                .netem_expressible()
        );
        // Models, distributions, slots and ECN go through netem; a correlation does not.
        assert!(
            Impairment::from_params([
                ("delay", "5ms"),
                ("jitter", "1ms"),
                ("distribution", "pareto"),
                ("loss", "gemodel 1% 10%"),
                ("slot", "1ms"),
                ("ecn", "on"),
            ])
            .unwrap()
            .netem_expressible()
        );
        assert!(
            !Impairment::from_params([("loss", "1% 25%")])
                .unwrap()
                .netem_expressible()
        );
        let slot = Impairment::from_params([("slot", "2ms")]).unwrap().slot.unwrap();
        assert_eq!(
            (slot.min_us, slot.max_us, slot.packets, slot.bytes),
            (2_000, 2_000, None, None)
        );
        for (p, v, want) in [
            ("loss", "gemodel", "gemodel needs at least p"),
            ("loss", "gemodel 1% 2% 3% 4% 5%", "at most 4 percentages"),
            ("loss", "random", "random needs a percentage"),
            (
                "jitter",
                "1ms 2% 3%",
                "a value and at most its correlation (a percentage)",
            ),
            (
                "distribution",
                "gaussian",
                "one of uniform, normal, pareto, paretonormal",
            ),
            ("slot", "packets 3", "needs the time between slots"),
            ("slot", "2ms 1ms", "MAX is shorter than MIN"),
            ("slot", "1ms packets", "packets needs a positive count"),
            ("ecn", "maybe", "on or off"),
        ] {
            let e = Impairment::from_params([("delay", "1ms"), (p, v)]).unwrap_err();
            assert!(e.to_string().ends_with(want), "{p} {v}: {e}");
        }
        assert!(
            Impairment::from_params([("delay", "1ms"), ("jitter", "0ms"), ("distribution", "normal")])
                .unwrap_err()
                .to_string()
                .contains("needs a jitter")
        );
        assert!(
            Impairment::from_params([("ecn", "on")])
                .unwrap_err()
                .to_string()
                .contains("needs a loss")
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
