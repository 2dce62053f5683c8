//! OpenTelemetry tracing, configured by the standard `OTEL_*` environment variables:
//! `OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) turns OTLP
//! export over gRPC on, `OTEL_SERVICE_NAME`, `OTEL_TRACES_SAMPLER(_ARG)` and
//! `OTEL_RESOURCE_ATTRIBUTES` do what the specification says.
//!
//! Spans get trace and span ids even when nothing is exported, so log lines and
//! exemplars still name the trace the plugin started. Export runs on the batch
//! processor's own thread with a bounded queue: a slow or absent collector drops spans,
//! it never blocks or fails a CNI call.

use opentelemetry::KeyValue;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;

/// Whether the environment asks for OTLP export.
pub fn export_configured() -> bool {
    ["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"]
        .iter()
        .any(|v| std::env::var(v).is_ok_and(|s| !s.trim().is_empty()))
}

/// The tracer provider for weftd on `node_name`. Must be called inside a tokio runtime
/// (the gRPC exporter is built there).
pub fn provider(node_name: &str, version: &str) -> Result<SdkTracerProvider, String> {
    let mut resource = Resource::builder().with_attributes([
        KeyValue::new("k8s.node.name", node_name.to_string()),
        KeyValue::new("host.name", node_name.to_string()),
        KeyValue::new("service.version", version.to_string()),
    ]);
    if std::env::var("OTEL_SERVICE_NAME").is_err() {
        resource = resource.with_service_name("weftd");
    }
    let mut builder = SdkTracerProvider::builder().with_resource(resource.build());
    if export_configured() {
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .build()
            .map_err(|e| format!("building the OTLP exporter: {e}"))?;
        builder = builder.with_batch_exporter(exporter);
    }
    Ok(builder.build())
}
