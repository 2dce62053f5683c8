//! Log lines. JSON (the default) is one flat object per line: timestamp, level,
//! target, message, the fields of every span the event is inside (outermost first),
//! the event's own fields, and `trace_id`/`span_id` of the OpenTelemetry span it
//! belongs to. Because a call's span carries the pod fields, every line logged inside
//! a call carries them too.

use std::io::Write;

use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::layer::{Context, Layer};
use tracing_subscriber::registry::LookupSpan;

/// Fields recorded on a span so far.
struct SpanFields(Map<String, Value>);

struct JsonVisitor<'a>(&'a mut Map<String, Value>);

impl Visit for JsonVisitor<'_> {
    fn record_f64(&mut self, f: &Field, v: f64) {
        self.0.insert(f.name().to_string(), Value::from(v));
    }
    fn record_i64(&mut self, f: &Field, v: i64) {
        self.0.insert(f.name().to_string(), Value::from(v));
    }
    fn record_u64(&mut self, f: &Field, v: u64) {
        self.0.insert(f.name().to_string(), Value::from(v));
    }
    fn record_bool(&mut self, f: &Field, v: bool) {
        self.0.insert(f.name().to_string(), Value::from(v));
    }
    fn record_str(&mut self, f: &Field, v: &str) {
        self.0.insert(f.name().to_string(), Value::from(v));
    }
    fn record_error(&mut self, f: &Field, v: &(dyn std::error::Error + 'static)) {
        self.0.insert(f.name().to_string(), Value::from(v.to_string()));
    }
    fn record_debug(&mut self, f: &Field, v: &dyn std::fmt::Debug) {
        self.0.insert(f.name().to_string(), Value::from(format!("{v:?}")));
    }
}

/// Span fields that are for the tracing backend, not for log lines.
fn internal(name: &str) -> bool {
    name.starts_with("otel.")
}

/// A layer writing flat JSON lines, one `write_all` each, to what `W` makes (stderr
/// in the daemon; a buffer in tests).
pub struct JsonLogLayer<W = fn() -> std::io::Stderr> {
    make_writer: W,
}

impl JsonLogLayer {
    /// The daemon's layer: lines to stderr.
    pub fn stderr() -> Self {
        JsonLogLayer {
            make_writer: std::io::stderr,
        }
    }
}

impl<W> JsonLogLayer<W> {
    /// A layer writing to what `make_writer` makes.
    pub fn with_writer(make_writer: W) -> Self {
        JsonLogLayer { make_writer }
    }
}

/// The OpenTelemetry span id of a span, cached on first use.
struct OtelSpanId(String);

impl<S, W> Layer<S> for JsonLogLayer<W>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    W: for<'w> MakeWriter<'w> + 'static,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let mut m = Map::new();
        attrs.record(&mut JsonVisitor(&mut m));
        m.retain(|k, _| !internal(k));
        span.extensions_mut().insert(SpanFields(m));
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let mut ext = span.extensions_mut();
        if let Some(SpanFields(m)) = ext.get_mut::<SpanFields>() {
            values.record(&mut JsonVisitor(m));
            m.retain(|k, _| !internal(k));
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let mut line = Map::new();
        let mut ts = String::new();
        let _ = SystemTime.format_time(&mut Writer::new(&mut ts));
        line.insert("timestamp".into(), Value::from(ts));
        line.insert("level".into(), Value::from(event.metadata().level().as_str()));
        line.insert("target".into(), Value::from(event.metadata().target()));
        let mut spans = Vec::new();
        if let Some(scope) = ctx.event_scope(event) {
            for span in scope.from_root() {
                if let Some(SpanFields(m)) = span.extensions().get::<SpanFields>() {
                    line.extend(m.iter().map(|(k, v)| (k.clone(), v.clone())));
                }
                spans.push(span.id());
            }
        }
        let mut fields = Map::new();
        event.record(&mut JsonVisitor(&mut fields));
        line.extend(fields);
        // The innermost span OpenTelemetry knows (phase spans it knows only when they
        // are exported).
        if let Some(span_id) = spans.iter().rev().find_map(|id| otel_span_id(id, &ctx)) {
            line.insert("span_id".into(), Value::from(span_id));
        }
        let mut out = serde_json::to_vec(&line).unwrap_or_default();
        out.push(b'\n');
        let _ = self.make_writer.make_writer().write_all(&out);
    }
}

/// The OpenTelemetry span id of `id` (16 hex digits), when the OpenTelemetry layer
/// is installed.
fn otel_span_id<S: Subscriber + for<'a> LookupSpan<'a>>(id: &Id, ctx: &Context<'_, S>) -> Option<String> {
    let span = ctx.span(id)?;
    if let Some(OtelSpanId(s)) = span.extensions().get::<OtelSpanId>() {
        return Some(s.clone());
    }
    use opentelemetry::trace::TraceContextExt;
    let cx = tracing::dispatcher::get_default(|d| tracing_opentelemetry::get_otel_context(id, d))?;
    let sc = cx.span().span_context().clone();
    if !sc.is_valid() {
        return None;
    }
    let s = sc.span_id().to_string();
    // `replace`, not `insert`: two threads logging in the same span at once both miss
    // the cache and both store it (`insert` asserts the slot was empty, and a panic
    // here aborts the daemon). They store the same id.
    span.extensions_mut().replace(OtelSpanId(s.clone()));
    Some(s)
}
