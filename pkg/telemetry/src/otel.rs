//! OpenTelemetry tracing (and the logger flow records are exported with), configured by the standard `OTEL_*` environment variables:
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
use opentelemetry_sdk::logs::SdkLoggerProvider;
use opentelemetry_sdk::trace::SdkTracerProvider;

fn set(var: &str) -> bool {
    std::env::var(var).is_ok_and(|s| !s.trim().is_empty())
}

/// Whether the environment asks for OTLP export of traces.
pub fn export_configured() -> bool {
    set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") || set("OTEL_EXPORTER_OTLP_ENDPOINT")
}

/// Whether the environment names an endpoint for OTLP logs (flow records).
pub fn logs_export_configured() -> bool {
    set("OTEL_EXPORTER_OTLP_LOGS_ENDPOINT") || set("OTEL_EXPORTER_OTLP_ENDPOINT")
}

/// weftd's resource: the node, the host and the version, and the service name unless
/// `OTEL_SERVICE_NAME` gives one (the SDK reads it and `OTEL_RESOURCE_ATTRIBUTES`).
fn resource(node_name: &str, version: &str) -> Resource {
    let mut resource = Resource::builder().with_attributes([
        KeyValue::new("k8s.node.name", node_name.to_string()),
        KeyValue::new("host.name", node_name.to_string()),
        KeyValue::new("service.version", version.to_string()),
    ]);
    if std::env::var("OTEL_SERVICE_NAME").is_err() {
        resource = resource.with_service_name("weftd");
    }
    resource.build()
}

/// The logger provider that exports weftd's flow records as OTLP logs over gRPC, with
/// the SDK's batch processor (its own thread, a bounded queue: `OTEL_BLRP_*` tune it; a
/// slow or absent collector drops records, it never stalls the flow reader); `None`
/// when no endpoint is configured. Must be called inside a tokio runtime.
pub fn logger_provider(node_name: &str, version: &str) -> Result<Option<SdkLoggerProvider>, String> {
    if !logs_export_configured() {
        return Ok(None);
    }
    let exporter = opentelemetry_otlp::LogExporter::builder()
        .with_tonic()
        .build()
        .map_err(|e| format!("building the OTLP log exporter: {e}"))?;
    Ok(Some(
        SdkLoggerProvider::builder()
            .with_resource(resource(node_name, version))
            .with_batch_exporter(exporter)
            .build(),
    ))
}

/// The tracer provider for weftd on `node_name`. Must be called inside a tokio runtime
/// (the gRPC exporter is built there).
pub fn provider(node_name: &str, version: &str) -> Result<SdkTracerProvider, String> {
    let mut builder = SdkTracerProvider::builder().with_resource(resource(node_name, version));
    if export_configured() {
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .build()
            .map_err(|e| format!("building the OTLP exporter: {e}"))?;
        builder = builder.with_batch_exporter(exporter);
    }
    Ok(builder.build())
}
