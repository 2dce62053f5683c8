//! Who made each link's last run-time change (a person with `weftctl link`, or a
//! scenario's step) and when: kept for `weftctl link show` and counted per scenario
//! in the metrics (`weft_scenario_steps_total`, `weft_scenario_step`).
//!
//! Kept in memory on the node the change was asked of: after a restart a link shows
//! no last change, while the change itself (in the store) stays in force.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use weft_telemetry::{Families, Metrics};

/// What asked for a change: a scenario's step, or no one in particular (by hand).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChangeSource {
    /// The scenario's name; empty: a change by hand.
    pub scenario: String,
    /// The step's number in the scenario (from 1).
    pub step: u32,
}

impl ChangeSource {
    /// How `link show` names it.
    fn describe(&self, what: &str) -> String {
        if self.scenario.is_empty() {
            format!("by hand: {what}")
        } else {
            format!("scenario {:?} step {}: {what}", self.scenario, self.step)
        }
    }
}

/// The last change of one link, as `link show` prints it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LastChange {
    /// Who and what (`scenario "flaky" step 3: down`, `by hand: set delay 20ms`).
    pub what: String,
    /// When, in milliseconds since the Unix epoch.
    pub at_ms: i64,
}

/// The scenario labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ScenarioLabels {
    scenario: String,
}

/// The scenario families.
struct ScenarioMetrics {
    steps: Family<ScenarioLabels, Counter>,
    step: Family<ScenarioLabels, Gauge>,
}

impl Families for ScenarioMetrics {
    fn register(metrics: &Metrics) -> Self {
        let m = ScenarioMetrics {
            steps: Family::default(),
            step: Family::default(),
        };
        metrics.register(
            "weft_scenario_steps",
            "Link changes a scenario's steps made through this node, by scenario",
            m.steps.clone(),
        );
        metrics.register(
            "weft_scenario_step",
            "The number of the last step a scenario made through this node",
            m.step.clone(),
        );
        m
    }
}

/// The last change of every link changed through this node (shared by clones).
#[derive(Clone, Default)]
pub struct LinkChanges {
    last: Arc<Mutex<HashMap<(String, i64), LastChange>>>,
    metrics: Option<Arc<ScenarioMetrics>>,
}

impl LinkChanges {
    /// Counts scenario steps in `metrics`.
    pub fn with_metrics(mut self, metrics: &Metrics) -> Self {
        self.metrics = Some(metrics.families::<ScenarioMetrics>());
        self
    }

    /// Notes that `source` made change `what` on link `uid` of `namespace`, now.
    pub fn record(&self, namespace: &str, uid: i64, source: &ChangeSource, what: &str) {
        let at_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        let change = LastChange {
            what: source.describe(what),
            at_ms,
        };
        self.last
            .lock()
            .expect("link changes lock")
            .insert((namespace.to_string(), uid), change);
        if let Some(m) = &self.metrics
            && !source.scenario.is_empty()
        {
            let l = ScenarioLabels {
                scenario: source.scenario.clone(),
            };
            m.steps.get_or_create(&l).inc();
            m.step.get_or_create(&l).set(i64::from(source.step));
        }
    }

    /// The last change of link `uid` of `namespace` made through this node, if any.
    pub fn last(&self, namespace: &str, uid: i64) -> Option<LastChange> {
        self.last
            .lock()
            .expect("link changes lock")
            .get(&(namespace.to_string(), uid))
            .cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_change_is_kept_per_link_and_a_scenario_step_counted() {
        let metrics = Metrics::new("test", "none");
        let c = LinkChanges::default().with_metrics(&metrics);
        let flaky = ChangeSource {
            scenario: "flaky".into(),
            step: 3,
        };
        c.record("lab", 7, &flaky, "down");
        c.record("lab", 8, &ChangeSource::default(), "set delay 20ms");
        assert_eq!(c.last("lab", 7).unwrap().what, "scenario \"flaky\" step 3: down");
        assert_eq!(c.last("lab", 8).unwrap().what, "by hand: set delay 20ms");
        assert!(c.last("other", 7).is_none());
        c.record("lab", 7, &ChangeSource { step: 4, ..flaky }, "up");
        assert_eq!(c.last("lab", 7).unwrap().what, "scenario \"flaky\" step 4: up");
        let (_, text) = metrics.render("text/plain");
        assert!(
            text.contains("weft_scenario_steps_total{scenario=\"flaky\"} 2"),
            "{text}"
        );
        assert!(text.contains("weft_scenario_step{scenario=\"flaky\"} 4"), "{text}");
    }
}
