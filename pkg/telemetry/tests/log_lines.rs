//! Log lines written from several threads inside one span: every line carries the
//! span's OpenTelemetry id, and no thread panics (weftd once aborted when two threads
//! cached that id at the same time).

use std::io::Write;
use std::sync::{Arc, Barrier, Mutex};

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::SubscriberExt;
use weft_telemetry::logs::JsonLogLayer;

/// Lines collected in memory.
#[derive(Clone, Default)]
struct Lines(Arc<Mutex<Vec<u8>>>);

struct LineWriter(Arc<Mutex<Vec<u8>>>);

impl Write for LineWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for Lines {
    type Writer = LineWriter;
    fn make_writer(&'a self) -> LineWriter {
        LineWriter(self.0.clone())
    }
}

const THREADS: usize = 4;
const SPANS: usize = 300;

#[test]
fn threads_logging_in_one_span_all_carry_its_id() {
    let provider = SdkTracerProvider::builder().build();
    let lines = Lines::default();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")))
        .with(JsonLogLayer::with_writer(lines.clone()));
    // The global default, as in weftd: the layer looks the OpenTelemetry context up
    // through the current dispatcher, which a scoped default hides while it dispatches.
    tracing::subscriber::set_global_default(subscriber).expect("the only subscriber of this test binary");
    let spans: Vec<tracing::Span> = (0..SPANS).map(|n| tracing::info_span!("call", n)).collect();
    // Each round, all threads log in a fresh span at once, so they race for its
    // first (uncached) id lookup.
    let barrier = Barrier::new(THREADS);
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..THREADS)
            .map(|t| {
                let (spans, barrier) = (&spans, &barrier);
                s.spawn(move || {
                    for span in spans {
                        barrier.wait();
                        span.in_scope(|| tracing::info!(thread = t, "hello"));
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().expect("a thread panicked while logging");
        }
    });
    let text = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
    let parsed: Vec<serde_json::Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(parsed.len(), THREADS * SPANS, "one line per event");
    for n in 0..SPANS {
        let ids: std::collections::BTreeSet<&str> = parsed
            .iter()
            .filter(|l| l["n"] == n)
            .map(|l| l["span_id"].as_str().expect("a span id on every line"))
            .collect();
        assert_eq!(ids.len(), 1, "span {n}: the lines disagree on its id: {ids:?}");
        assert_eq!(ids.iter().next().unwrap().len(), 16);
    }
}
