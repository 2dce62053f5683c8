//! Scenarios: a timeline of link changes read from a file (at T set these impairments
//! on these links, take a link down, bring it up, repeat a step N times, ramp a
//! parameter from A to B over a duration), expanded here into the exact list of
//! changes and when each is due, checked whole before the first one runs. Running it
//! (asking the daemons, keeping time, logging each step) is `weftctl link scenario`.
//!
//! ```yaml
//! name: degrade-then-flap
//! steps:
//!   - {at: 0s, links: [r1:e1], set: {delay: 20ms, loss: "1%"}}
//!   - {at: 2s, links: [r1:e1], ramp: {param: delay, from: 20ms, to: 200ms, over: 5s, every: 500ms}}
//!   - {at: 8s, links: [r1:e1, r2:e3], down: true, repeat: 3, every: 2s}
//!   - {at: 9s, links: [r1:e1, r2:e3], up: true, repeat: 3, every: 2s}
//!   - {at: 15s, links: [r1:e1], reset: true}
//! ```

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;

use crate::Impairment;

/// A scenario file that cannot be run, with where.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ScenarioError(pub String);

/// A scenario as its file says.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// Its name, for the log.
    #[serde(default)]
    pub name: String,
    /// The steps, each at its time from the start.
    pub steps: Vec<StepSpec>,
}

/// One step of the file.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StepSpec {
    /// When, from the scenario's start (`2s`, `500ms`).
    pub at: String,
    /// The links, each by one end: `pod:intf` (or `namespace/pod:intf`).
    pub links: Vec<String>,
    /// Sets these impairments (replacing what the link had, as `link set` does).
    #[serde(default)]
    pub set: Option<BTreeMap<String, String>>,
    /// Back to the topology's impairment.
    #[serde(default)]
    pub reset: bool,
    /// Takes the links down.
    #[serde(default)]
    pub down: bool,
    /// Brings the links up.
    #[serde(default)]
    pub up: bool,
    /// Moves one parameter from a value to another in steps (with `set`'s other
    /// parameters held).
    #[serde(default)]
    pub ramp: Option<Ramp>,
    /// Runs the step this many times (default once)…
    #[serde(default)]
    pub repeat: Option<u32>,
    /// …this far apart.
    #[serde(default)]
    pub every: Option<String>,
}

/// A parameter moved linearly from `from` to `to` over `over`, a change every `every`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Ramp {
    /// The parameter (`delay`, `jitter`, `loss`, `rate`, `corrupt`, `duplicate`,
    /// `reorder`).
    pub param: String,
    /// Its first value.
    pub from: String,
    /// Its last value.
    pub to: String,
    /// How long the ramp lasts.
    pub over: String,
    /// How often it changes (default 1s).
    #[serde(default)]
    pub every: Option<String>,
}

/// What one change does to a link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Set this impairment (the link's whole run-time impairment).
    Set(Impairment),
    /// Back to the topology's.
    Reset,
    /// Carrier off.
    Down,
    /// Carrier on.
    Up,
}

impl std::fmt::Display for Action {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Action::Set(i) => write!(f, "set {i}"),
            Action::Reset => f.write_str("reset"),
            Action::Down => f.write_str("down"),
            Action::Up => f.write_str("up"),
        }
    }
}

/// One change of the timeline: due `at` after the start, from step `step` (counted
/// from 1 as the file lists them), on `links`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    /// When it is due.
    pub at: Duration,
    /// The file's step it comes from.
    pub step: usize,
    /// What it does.
    pub action: Action,
    /// The links, as the file names them.
    pub links: Vec<String>,
}

/// The most changes a scenario may expand to (a typo in `every` should not make
/// millions).
pub const MAX_CHANGES: usize = 100_000;

fn duration(step: usize, what: &str, v: &str) -> Result<Duration, ScenarioError> {
    humantime::parse_duration(v.trim()).map_err(|e| ScenarioError(format!("step {step}: {what} {v:?}: {e}")))
}

impl Scenario {
    /// Reads a scenario file's text.
    pub fn from_yaml(text: &str) -> Result<Scenario, ScenarioError> {
        serde_yaml_ng::from_str(text).map_err(|e| ScenarioError(format!("not a scenario: {e}")))
    }

    /// Every change in the order it is due (steps due at the same time in the file's
    /// order), each checked: a bad value anywhere fails the whole scenario before any
    /// change is made.
    pub fn timeline(&self) -> Result<Vec<Change>, ScenarioError> {
        let mut out = Vec::new();
        for (i, s) in self.steps.iter().enumerate() {
            let step = i + 1;
            let at = duration(step, "at", &s.at)?;
            if s.links.is_empty() {
                return Err(ScenarioError(format!("step {step}: no links")));
            }
            for l in &s.links {
                if !l.contains(':') {
                    return Err(ScenarioError(format!(
                        "step {step}: link {l:?}: name one end as pod:intf"
                    )));
                }
            }
            let actions = usize::from(s.set.is_some() || s.ramp.is_some())
                + usize::from(s.reset)
                + usize::from(s.down)
                + usize::from(s.up);
            if actions != 1 {
                return Err(ScenarioError(format!(
                    "step {step}: one of set (or ramp), reset, down, up"
                )));
            }
            let once = self.once(step, s)?;
            let repeat = s.repeat.unwrap_or(1);
            if repeat == 0 {
                return Err(ScenarioError(format!("step {step}: repeat 0 runs nothing")));
            }
            let every = match &s.every {
                Some(e) => duration(step, "every", e)?,
                None if repeat > 1 => {
                    return Err(ScenarioError(format!("step {step}: repeat needs every")));
                }
                None => Duration::ZERO,
            };
            for r in 0..repeat {
                for (offset, action) in &once {
                    out.push(Change {
                        at: at + every * r + *offset,
                        step,
                        action: action.clone(),
                        links: s.links.clone(),
                    });
                    if out.len() > MAX_CHANGES {
                        return Err(ScenarioError(format!(
                            "more than {MAX_CHANGES} changes: check repeat and every"
                        )));
                    }
                }
            }
        }
        // Stable: the file's order among changes due at once.
        out.sort_by_key(|c| c.at);
        Ok(out)
    }

    /// One run of a step: its changes with their offsets.
    fn once(&self, step: usize, s: &StepSpec) -> Result<Vec<(Duration, Action)>, ScenarioError> {
        let bad = |e: crate::ImpairmentError| ScenarioError(format!("step {step}: {e}"));
        if s.reset {
            return Ok(vec![(Duration::ZERO, Action::Reset)]);
        }
        if s.down {
            return Ok(vec![(Duration::ZERO, Action::Down)]);
        }
        if s.up {
            return Ok(vec![(Duration::ZERO, Action::Up)]);
        }
        let base: BTreeMap<String, String> = s.set.clone().unwrap_or_default();
        let Some(ramp) = &s.ramp else {
            let imp = Impairment::from_map(&base).map_err(bad)?;
            return Ok(vec![(Duration::ZERO, Action::Set(imp))]);
        };
        let over = duration(step, "ramp over", &ramp.over)?;
        let every = match &ramp.every {
            Some(e) => duration(step, "ramp every", e)?,
            None => Duration::from_secs(1),
        };
        if every.is_zero() {
            return Err(ScenarioError(format!("step {step}: ramp every must be more than 0")));
        }
        let from = ramp_value(&ramp.param, &ramp.from).map_err(bad)?;
        let to = ramp_value(&ramp.param, &ramp.to).map_err(bad)?;
        let n = (over.as_nanos() / every.as_nanos()).max(1) as u32;
        let mut out = Vec::new();
        for k in 0..=n {
            let v = from + (to - from) * f64::from(k) / f64::from(n);
            let mut params = base.clone();
            params.insert(ramp.param.clone(), ramp_text(&ramp.param, v));
            let imp = Impairment::from_map(&params).map_err(bad)?;
            out.push((every * k, Action::Set(imp)));
            if out.len() > MAX_CHANGES {
                return Err(ScenarioError(format!(
                    "step {step}: a ramp of more than {MAX_CHANGES} changes"
                )));
            }
        }
        Ok(out)
    }
}

/// A rampable parameter's value in its exact unit (µs, ppm, bit/s).
fn ramp_value(param: &str, v: &str) -> Result<f64, crate::ImpairmentError> {
    let mut imp = Impairment::default();
    imp.set(param, v)?;
    let n = match param {
        "delay" => imp.delay_us.map(|x| x as f64),
        "jitter" => imp.jitter_us.map(|x| x as f64),
        "loss" => imp.loss_ppm.map(f64::from),
        "rate" => imp.rate_bps.map(|x| x as f64),
        "corrupt" => imp.corrupt_ppm.map(f64::from),
        "duplicate" => imp.duplicate_ppm.map(f64::from),
        "reorder" => imp.reorder_ppm.map(f64::from),
        _ => None,
    };
    n.ok_or_else(|| crate::ImpairmentError {
        param: param.into(),
        value: v.into(),
        why: "a ramp moves delay, jitter, loss, rate, corrupt, duplicate or reorder, from one plain value to another"
            .into(),
    })
}

/// The text of a rampable parameter's value (exact units, rounded).
fn ramp_text(param: &str, v: f64) -> String {
    match param {
        "delay" | "jitter" => format!("{}us", v.round() as u64),
        "rate" => format!("{}bit", v.round() as u64),
        _ => format!("{}%", v.round() / 1e4),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timeline(yaml: &str) -> Result<Vec<Change>, ScenarioError> {
        Scenario::from_yaml(yaml)?.timeline()
    }

    #[test]
    fn steps_repeats_and_ramps_expand_in_time_order() {
        let t = timeline(
            "name: t\nsteps:\n\
             - {at: 0s, links: [r1:e1], set: {delay: 20ms, loss: 1%}}\n\
             - {at: 1s, links: [r1:e1], ramp: {param: delay, from: 20ms, to: 60ms, over: 2s, every: 500ms}, set: {loss: 1%}}\n\
             - {at: 1200ms, links: [r1:e1, r2:e3], down: true, repeat: 2, every: 1s}\n\
             - {at: 1700ms, links: [r1:e1, r2:e3], up: true, repeat: 2, every: 1s}\n",
        )
        .unwrap();
        let shown: Vec<String> = t
            .iter()
            .map(|c| format!("{} {} {}", c.at.as_millis(), c.step, c.action))
            .collect();
        assert_eq!(
            shown,
            [
                "0 1 set delay 20ms loss 1%",
                "1000 2 set delay 20ms loss 1%",
                "1200 3 down",
                "1500 2 set delay 30ms loss 1%",
                "1700 4 up",
                "2000 2 set delay 40ms loss 1%",
                "2200 3 down",
                "2500 2 set delay 50ms loss 1%",
                "2700 4 up",
                "3000 2 set delay 60ms loss 1%",
            ]
        );
        assert_eq!(t[2].links, ["r1:e1", "r2:e3"]);
        // Percentages and rates ramp too, downwards as well.
        let t =
            timeline("steps:\n- {at: 0s, links: [a:b], ramp: {param: loss, from: 10%, to: 0%, over: 4s, every: 1s}}\n")
                .unwrap();
        let losses: Vec<String> = t.iter().map(|c| c.action.to_string()).collect();
        assert_eq!(
            losses,
            [
                "set loss 10%",
                "set loss 7.5%",
                "set loss 5%",
                "set loss 2.5%",
                "set loss 0%"
            ]
        );
    }

    #[test]
    fn a_bad_scenario_is_refused_whole_with_its_step_named() {
        for (yaml, want) in [
            (
                "steps:\n- {at: soon, links: [a:b], down: true}\n",
                "step 1: at \"soon\"",
            ),
            (
                "steps:\n- {at: 1s, links: [ab], down: true}\n",
                "step 1: link \"ab\": name one end as pod:intf",
            ),
            (
                "steps:\n- {at: 1s, links: [a:b], down: true, up: true}\n",
                "step 1: one of set (or ramp), reset, down, up",
            ),
            (
                "steps:\n- {at: 1s, links: [a:b], down: true}\n- {at: 2s, links: [a:b], set: {loss: lots}}\n",
                "step 2: loss \"lots\"",
            ),
            (
                "steps:\n- {at: 1s, links: [a:b], down: true, repeat: 3}\n",
                "step 1: repeat needs every",
            ),
            ("steps:\n- {at: 1s, links: [], down: true}\n", "step 1: no links"),
            (
                "steps:\n- {at: 1s, links: [a:b], ramp: {param: slot, from: 1ms, to: 2ms, over: 1s}}\n",
                "step 1: slot",
            ),
            (
                "steps:\n- {at: 1s, links: [a:b], down: true, repeat: 1000000, every: 1ms}\n",
                "more than 100000 changes",
            ),
            ("steps:\n- {at: 1s, link: [a:b], down: true}\n", "not a scenario"),
        ] {
            let e = timeline(yaml).unwrap_err().to_string();
            assert!(e.contains(want), "{yaml}: {e}");
        }
    }
}
