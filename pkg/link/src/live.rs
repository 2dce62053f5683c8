//! Live link counters: samples of every link end (its state, impairment and counters,
//! as its node reports them), the rates between two samples, and the events that
//! tell one sample from the next (`weftctl link stats`, `lab events`, `lab serve`).
//! Pure: the callers ask the daemons and keep the previous sample.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::{EmulationCounts, WireCounters};

/// One link end in one sample.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EndSample {
    /// The node whose daemon reported it.
    pub node: String,
    /// The Topology namespace.
    pub namespace: String,
    /// The link's uid in it.
    pub link_uid: i64,
    /// The pod.
    pub pod: String,
    /// Its interface (the link's end in it).
    pub intf: String,
    /// The peer pod and interface.
    pub peer_pod: String,
    /// The peer's interface.
    pub peer_intf: String,
    /// veth, vxlan or grpc.
    pub kind: String,
    /// up, down (peer away) or pending.
    pub state: String,
    /// Held down by intent (`weftctl link down`, a scenario).
    pub down: bool,
    /// A run-time setting overrides the topology's impairment.
    pub overridden: bool,
    /// The impairment in force on what this end sends (`delay 20ms loss 1%`; empty:
    /// none).
    pub impairment: String,
    /// The last run-time change and who made it (empty: none known).
    pub last_change: String,
    /// The interface's kernel counters (none when it could not be read).
    pub counters: Option<WireCounters>,
    /// What weft's own emulation did (none when weft emulates nothing here).
    pub emulation: Option<EmulationCounts>,
}

impl EndSample {
    /// `namespace/pod:intf`, how the end is named in events and tables.
    pub fn name(&self) -> String {
        format!("{}/{}:{}", self.namespace, self.pod, self.intf)
    }

    /// Whether the link carries traffic: its wire is up and no one holds it down.
    pub fn is_up(&self) -> bool {
        self.state == "up" && !self.down
    }
}

/// Every end of a lab (or a node) at one instant, by [`EndSample::name`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sample {
    /// When, in milliseconds since the Unix epoch.
    pub at_ms: i64,
    /// The ends.
    pub ends: BTreeMap<String, EndSample>,
}

/// One end's rates between two samples, per second.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Rates {
    /// Bits the pod sent into the link.
    pub tx_bps: f64,
    /// Bits that reached the pod.
    pub rx_bps: f64,
    /// Frames the pod sent.
    pub tx_pps: f64,
    /// Frames that reached the pod.
    pub rx_pps: f64,
    /// Frames the kernel dropped on the interface.
    pub kernel_drops_ps: f64,
    /// Frames the emulation dropped (lost and overflowed).
    pub emulation_drops_ps: f64,
}

/// The rates of every end present in both samples with counters in both. A counter
/// that went back (the interface was made again) counts from zero, never negative.
pub fn rates(prev: &Sample, cur: &Sample) -> BTreeMap<String, Rates> {
    let secs = (cur.at_ms - prev.at_ms) as f64 / 1000.0;
    if secs <= 0.0 {
        return BTreeMap::new();
    }
    let grow = |now: u64, was: u64| if now >= was { now - was } else { now } as f64 / secs;
    cur.ends
        .iter()
        .filter_map(|(name, c)| {
            let p = prev.ends.get(name)?;
            let (now, was) = (c.counters?, p.counters?);
            let emu = |s: &EndSample| s.emulation.map_or(0, |e| e.drops());
            Some((
                name.clone(),
                Rates {
                    tx_bps: grow(now.tx_bytes, was.tx_bytes) * 8.0,
                    rx_bps: grow(now.rx_bytes, was.rx_bytes) * 8.0,
                    tx_pps: grow(now.tx_frames, was.tx_frames),
                    rx_pps: grow(now.rx_frames, was.rx_frames),
                    kernel_drops_ps: grow(now.dropped, was.dropped),
                    emulation_drops_ps: grow(emu(c), emu(p)),
                },
            ))
        })
        .collect()
}

/// What changed about an end from one sample to the next (`weftctl lab events`).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    /// An end appeared (first sample: every end).
    Added {
        /// The end.
        end: String,
        /// Its state.
        state: String,
        /// Held down by intent.
        down: bool,
        /// Its impairment.
        impairment: String,
    },
    /// An end went.
    Removed {
        /// The end.
        end: String,
    },
    /// The link went up or down (its wire's state, or held down by intent).
    State {
        /// The end.
        end: String,
        /// Before.
        from: String,
        /// Now (`up`, `down`, `down(intent)`, `pending`).
        to: String,
    },
    /// The impairment in force changed.
    Impairment {
        /// The end.
        end: String,
        /// Before.
        from: String,
        /// Now.
        to: String,
    },
    /// A run-time change was made (by hand or a scenario's step).
    Change {
        /// The end.
        end: String,
        /// Who and what (`scenario "flaky" step 3: down`).
        what: String,
    },
    /// The end's counters and rates at this sample.
    Counters {
        /// The end.
        end: String,
        /// Its counters.
        counters: Option<WireCounters>,
        /// Its emulation's counts.
        emulation: Option<EmulationCounts>,
        /// The rates since the previous sample.
        rates: Option<Rates>,
    },
}

/// An end's state as events name it.
fn state_word(e: &EndSample) -> String {
    if e.down { "down(intent)".into() } else { e.state.clone() }
}

/// The events from `prev` to `cur`: ends added and removed, state, impairment and
/// run-time changes, then (with `counters`) every end's counters and rates.
pub fn events(prev: &Sample, cur: &Sample, counters: bool) -> Vec<Event> {
    let mut out = Vec::new();
    for (name, e) in &cur.ends {
        let Some(p) = prev.ends.get(name) else {
            out.push(Event::Added {
                end: name.clone(),
                state: state_word(e),
                down: e.down,
                impairment: e.impairment.clone(),
            });
            continue;
        };
        let (from, to) = (state_word(p), state_word(e));
        if from != to {
            out.push(Event::State {
                end: name.clone(),
                from,
                to,
            });
        }
        if p.impairment != e.impairment {
            out.push(Event::Impairment {
                end: name.clone(),
                from: p.impairment.clone(),
                to: e.impairment.clone(),
            });
        }
        if p.last_change != e.last_change && !e.last_change.is_empty() {
            out.push(Event::Change {
                end: name.clone(),
                what: e.last_change.clone(),
            });
        }
    }
    for name in prev.ends.keys().filter(|n| !cur.ends.contains_key(*n)) {
        out.push(Event::Removed { end: name.clone() });
    }
    if counters {
        let r = rates(prev, cur);
        for (name, e) in &cur.ends {
            out.push(Event::Counters {
                end: name.clone(),
                counters: e.counters,
                emulation: e.emulation,
                rates: r.get(name).copied(),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn end(state: &str, tx_bytes: u64, lost: u64) -> EndSample {
        EndSample {
            node: "n1".into(),
            namespace: "lab".into(),
            link_uid: 1,
            pod: "r1".into(),
            intf: "e1".into(),
            peer_pod: "r2".into(),
            peer_intf: "e1".into(),
            kind: "veth".into(),
            state: state.into(),
            down: false,
            overridden: false,
            impairment: String::new(),
            last_change: String::new(),
            counters: Some(WireCounters {
                tx_bytes,
                tx_frames: tx_bytes / 100,
                ..Default::default()
            }),
            emulation: Some(EmulationCounts {
                lost,
                ..Default::default()
            }),
        }
    }

    fn sample(at_ms: i64, e: EndSample) -> Sample {
        Sample {
            at_ms,
            ends: [(e.name(), e)].into(),
        }
    }

    #[test]
    fn rates_are_per_second_and_never_negative() {
        let a = sample(1_000, end("up", 10_000, 2));
        let b = sample(3_000, end("up", 30_000, 12));
        let r = rates(&a, &b)["lab/r1:e1"];
        assert_eq!((r.tx_bps, r.tx_pps, r.emulation_drops_ps), (80_000.0, 100.0, 5.0));
        // The interface made again: its counters start over, counted from zero.
        let c = sample(4_000, end("up", 500, 0));
        assert_eq!(rates(&b, &c)["lab/r1:e1"].tx_bps, 4_000.0);
        assert!(rates(&b, &b).is_empty(), "no time passed: no rates");
    }

    #[test]
    fn events_say_what_changed() {
        let a = sample(1_000, end("up", 0, 0));
        let first = events(&Sample::default(), &a, false);
        assert!(matches!(&first[..], [Event::Added { end, state, .. }] if end == "lab/r1:e1" && state == "up"));
        let mut held = end("up", 0, 0);
        held.down = true;
        held.impairment = "delay 20ms".into();
        held.last_change = "scenario \"s\" step 1: down".into();
        let b = sample(2_000, held);
        let ev = events(&a, &b, true);
        assert_eq!(ev.len(), 4, "{ev:?}");
        assert_eq!(
            ev[0],
            Event::State {
                end: "lab/r1:e1".into(),
                from: "up".into(),
                to: "down(intent)".into()
            }
        );
        assert!(matches!(&ev[1], Event::Impairment { to, .. } if to == "delay 20ms"));
        assert!(matches!(&ev[2], Event::Change { what, .. } if what.contains("step 1")));
        assert!(matches!(&ev[3], Event::Counters { rates: Some(_), .. }));
        let json = serde_json::to_value(&ev[0]).unwrap();
        assert_eq!(json["event"], "state");
        let gone = events(&b, &Sample::default(), false);
        assert_eq!(
            gone,
            [Event::Removed {
                end: "lab/r1:e1".into()
            }]
        );
    }
}
