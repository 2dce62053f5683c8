//! Phase durations from spans: every span with target `weft::phase` (lock wait, IPAM,
//! each netlink step, store commit, ...) is timed when it closes and observed into
//! `weft_cni_phase_duration_seconds{command, phase}`, with the call's trace id as
//! exemplar. The kernel and store code only open spans; they know nothing of metrics.

use std::sync::Arc;
use std::time::Instant;

use tracing::Subscriber;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing_subscriber::layer::{Context, Layer};
use tracing_subscriber::registry::LookupSpan;

use crate::metrics::{Metrics, PhaseLabels, TraceExemplar};

/// Target of spans that are phases of a call.
pub const PHASE_TARGET: &str = "weft::phase";

/// Turns closed phase spans into histogram observations.
pub struct PhaseLayer {
    metrics: Arc<Metrics>,
}

impl PhaseLayer {
    /// Observes into `metrics`.
    pub fn new(metrics: Arc<Metrics>) -> Self {
        Self { metrics }
    }
}

struct PhaseStart(Instant);

/// What a call span knows that its phases need.
#[derive(Default)]
struct CallCtx {
    command: String,
    trace_id: String,
}

impl Visit for CallCtx {
    fn record_str(&mut self, field: &Field, value: &str) {
        match field.name() {
            "cni.command" => self.command = value.to_string(),
            "trace_id" => self.trace_id = value.to_string(),
            _ => {}
        }
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if matches!(field.name(), "cni.command" | "trace_id") {
            self.record_str(field, format!("{value:?}").trim_matches('"'));
        }
    }
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for PhaseLayer {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let meta = attrs.metadata();
        if meta.target() == PHASE_TARGET {
            span.extensions_mut().insert(PhaseStart(Instant::now()));
        } else if meta.name() == "grpc.server" {
            let mut c = CallCtx::default();
            attrs.record(&mut c);
            span.extensions_mut().insert(c);
        }
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let mut ext = span.extensions_mut();
        if let Some(c) = ext.get_mut::<CallCtx>() {
            values.record(c);
        }
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(&id) else { return };
        let Some(elapsed) = span.extensions().get::<PhaseStart>().map(|s| s.0.elapsed()) else {
            return;
        };
        let (command, trace_id) = span
            .scope()
            .skip(1)
            .find_map(|s| {
                s.extensions()
                    .get::<CallCtx>()
                    .map(|c| (c.command.clone(), c.trace_id.clone()))
            })
            .unwrap_or_default();
        if command.is_empty() {
            return;
        }
        let exemplar = (!trace_id.is_empty()).then_some(TraceExemplar { trace_id });
        self.metrics
            .cni_phase
            .get_or_create(&PhaseLabels {
                command,
                phase: span.name().to_string(),
            })
            .observe(elapsed.as_secs_f64(), exemplar, None);
    }
}
