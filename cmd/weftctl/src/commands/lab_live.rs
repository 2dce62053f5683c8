//! `weftctl lab events` and `weftctl lab serve`: a running lab watched live. Events are
//! JSON lines (link state, impairment and run-time changes, the lab scenario's steps,
//! counter samples); the served page draws the lab and colours and labels its links
//! from samples the server takes (plain HTML, SVG and JavaScript, served from the
//! binary: nothing fetched from elsewhere).

use std::collections::{BTreeMap, VecDeque};
use std::io::{Read as _, Seek as _};
use std::net::SocketAddr;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use anyhow::Context;
use serde_json::{Value, json};
use weft_lab::Lab;
use weft_lab::graph::Graph;
use weft_link::live::{self, Sample};

use super::live::{lab_daemons, sample};

/// Rate points kept per link for the page's history (a minute at the default
/// interval).
const HISTORY: usize = 120;

/// The page.
const PAGE: &str = include_str!("lab_serve.html");

/// An event as one JSON line: the event's fields with the sample's time.
fn line(at_ms: i64, event: &impl serde::Serialize) -> anyhow::Result<String> {
    let mut v = serde_json::to_value(event)?;
    if let Value::Object(m) = &mut v {
        m.insert("at_ms".into(), at_ms.into());
    }
    Ok(v.to_string())
}

/// The lab scenario's log from `offset` on: its new complete lines, and the offset
/// after them.
fn scenario_lines(lab: &Lab, offset: u64) -> (Vec<String>, u64) {
    let Ok(mut f) = std::fs::File::open(lab.scenario_log()) else {
        return (Vec::new(), 0);
    };
    let len = f.metadata().map_or(0, |m| m.len());
    // A new log (the scenario started again) is read from its start.
    let from = if len < offset { 0 } else { offset };
    let mut text = String::new();
    if f.seek(std::io::SeekFrom::Start(from)).is_err() || f.read_to_string(&mut text).is_err() {
        return (Vec::new(), from);
    }
    let complete = text.rfind('\n').map_or(0, |i| i + 1);
    let lines = text[..complete].lines().map(str::to_string).collect();
    (lines, from + complete as u64)
}

/// A scenario log line as an event: a step it made (its JSON), or how it ended.
fn scenario_event(at_ms: i64, l: &str) -> Value {
    match serde_json::from_str::<Value>(l) {
        Ok(Value::Object(mut m)) => {
            m.insert("event".into(), "scenario_step".into());
            m.insert("at_ms".into(), at_ms.into());
            Value::Object(m)
        }
        _ => json!({"event": "scenario_end", "at_ms": at_ms, "message": l}),
    }
}

/// `lab events`: every link end as it stands (and its counters), then, with `follow`,
/// what changes every `interval` until Ctrl-C.
pub fn events(lab: &Lab, follow: bool, interval: Duration, counters: bool) -> anyhow::Result<()> {
    anyhow::ensure!(interval >= Duration::from_millis(100), "--interval: at least 100ms");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(async {
        let daemons = lab_daemons(lab);
        let mut prev = Sample::default();
        // Only steps made from now on: the log's past is in the file.
        let (_, mut offset) = scenario_lines(lab, 0);
        let stop = tokio::signal::ctrl_c();
        tokio::pin!(stop);
        let mut tick = tokio::time::interval(interval);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = &mut stop => return Ok(()),
            }
            let cur = sample(&daemons).await;
            let (steps, next) = scenario_lines(lab, offset);
            offset = next;
            for s in steps {
                outln!("{}", scenario_event(cur.at_ms, &s));
            }
            // The first sample's counters have no rates yet: shown from the second on.
            let with_counters = counters && !prev.ends.is_empty();
            for e in live::events(&prev, &cur, with_counters) {
                outln!("{}", line(cur.at_ms, &e)?);
            }
            if !follow {
                return Ok(());
            }
            prev = cur;
        }
    })
}

/// What the page shows: the latest view as JSON, made by the sampling task.
struct Shared {
    latest: RwLock<String>,
}

/// The page's view of the lab: its graph with each link's state, impairment and
/// rate, both ends' counters, and each link's recent rates.
fn view(
    lab: &Lab,
    s: &Sample,
    rates: &BTreeMap<String, live::Rates>,
    history: &BTreeMap<String, VecDeque<f64>>,
) -> Value {
    let graph = Graph::new(&lab.spec, &lab.topologies, &super::lab_graph::end_reports(s, rates));
    let end = |ns: &str, (pod, intf): &(String, String)| {
        let name = format!("{ns}/{pod}:{intf}");
        s.ends.get(&name).map(|e| {
            json!({
                "name": name, "node": e.node, "state": e.state, "down_by_intent": e.down,
                "impairment": e.impairment, "last_change": e.last_change,
                "counters": e.counters, "emulation": e.emulation, "rates": rates.get(&name),
            })
        })
    };
    let links: Vec<Value> = graph
        .links
        .iter()
        .map(|l| {
            let id = format!("{}/{}", l.namespace, l.uid);
            json!({
                "id": id, "namespace": l.namespace, "uid": l.uid,
                "a": {"pod": l.a.0, "intf": l.a.1, "end": end(&l.namespace, &l.a)},
                "b": {"pod": l.b.0, "intf": l.b.1, "end": end(&l.namespace, &l.b)},
                "kind": l.kind, "state": l.state.as_str(), "impairment": l.impairment,
                "rate_bps": l.rate_bps, "history": history.get(&id),
            })
        })
        .collect();
    let nodes: Vec<Value> = graph
        .nodes
        .iter()
        .map(|(n, pods)| json!({"name": n, "pods": pods}))
        .collect();
    json!({"name": graph.name, "at_ms": s.at_ms, "nodes": nodes, "links": links})
}

/// Keeps `shared` at the lab's latest view, a sample every `interval`.
async fn keep_sampling(lab: Lab, shared: Arc<Shared>, interval: Duration) {
    let daemons = lab_daemons(&lab);
    let mut prev = Sample::default();
    let mut history: BTreeMap<String, VecDeque<f64>> = BTreeMap::new();
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let cur = sample(&daemons).await;
        let rates = live::rates(&prev, &cur);
        let v = view(&lab, &cur, &rates, &history);
        // Each link's rate: its busier end's, both ways (as the graph's label).
        if let Some(links) = v["links"].as_array() {
            for l in links {
                let (Some(id), Some(bps)) = (l["id"].as_str(), l["rate_bps"].as_f64()) else {
                    continue;
                };
                let h = history.entry(id.to_string()).or_default();
                h.push_back(bps);
                if h.len() > HISTORY {
                    h.pop_front();
                }
            }
        }
        *shared.latest.write().expect("latest lock") = v.to_string();
        prev = cur;
    }
}

/// `lab serve`: the live page at `listen` until Ctrl-C.
pub fn serve(lab: Lab, listen: SocketAddr, interval: Duration) -> anyhow::Result<()> {
    use axum::http::header;
    use axum::routing::get;

    anyhow::ensure!(interval >= Duration::from_millis(100), "--interval: at least 100ms");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .with_context(|| format!("listening on {listen}"))?;
        let addr = listener.local_addr()?;
        let name = lab.spec.name.clone();
        let shared = Arc::new(Shared {
            latest: RwLock::new(String::from("{}")),
        });
        tokio::spawn(keep_sampling(lab, shared.clone(), interval));
        let live = shared.clone();
        let app = axum::Router::new()
            .route(
                "/",
                get(|| async { ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], PAGE) }),
            )
            .route(
                "/api/live",
                get(move || {
                    let body = live.latest.read().expect("latest lock").clone();
                    async move {
                        (
                            [
                                (header::CONTENT_TYPE, "application/json"),
                                (header::CACHE_CONTROL, "no-store"),
                            ],
                            body,
                        )
                    }
                }),
            );
        outln!("lab {name}: serving its live view at http://{addr}/ (Ctrl-C stops)");
        axum::serve(listener, app)
            .with_graceful_shutdown(async {
                let _ = tokio::signal::ctrl_c().await;
            })
            .await
            .context("serving the lab's view")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scenario_log_lines_become_events() {
        let step = scenario_event(5, r#"{"scenario":"s","step":2,"action":"down"}"#);
        assert_eq!(
            (step["event"].as_str(), step["step"].as_u64()),
            (Some("scenario_step"), Some(2))
        );
        let end = scenario_event(6, "weftctl: scenario \"s\" stopped before step 3");
        assert_eq!(end["event"], "scenario_end");
        assert!(end["message"].as_str().unwrap().contains("stopped"));
        let e = live::Event::Removed {
            end: "lab/r1:e1".into(),
        };
        let l: Value = serde_json::from_str(&line(7, &e).unwrap()).unwrap();
        assert_eq!((l["event"].as_str(), l["at_ms"].as_i64()), (Some("removed"), Some(7)));
    }

    #[test]
    fn the_page_asks_only_its_own_server() {
        // No CDN: nothing loaded from elsewhere (the one URL is SVG's namespace name,
        // which is never fetched), and the one request is to the serving weftctl.
        let urls: Vec<&str> = PAGE.match_indices("http").map(|(i, _)| &PAGE[i..i + 26]).collect();
        assert!(
            urls.iter().all(|u| u.starts_with("http://www.w3.org/2000/svg")),
            "{urls:?}"
        );
        for needle in [" src=", "<link", "import ", "@import"] {
            assert!(!PAGE.contains(needle), "the page loads something: {needle}");
        }
        assert_eq!(PAGE.matches("fetch(").count(), 1);
        assert!(PAGE.contains("fetch(\"/api/live\""));
    }
}
