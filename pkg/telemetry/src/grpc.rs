//! The tower layer on the gRPC server: one span per call (parented on the caller's
//! W3C `traceparent`), the `grpc_server_*` metrics, CNI outcome counters, exactly one
//! access-log line per finished call, and the call's entry in [`CallLog`].
//!
//! The layer only sees HTTP; what the call was about (pod, netns, command, CNI code) is
//! filled in by the service through the [`CallInfo`] the layer puts into the request's
//! extensions, and lands on the span, so every log line inside the call carries it
//! without the handler passing anything by hand.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::TraceContextExt;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tower::{Layer, Service};
use tracing::Span;
use tracing::field::Empty;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::calls::{CallLog, CallRecord};
use crate::metrics::{CniLabels, GrpcCodeLabels, GrpcLabels, Metrics, TraceExemplar};

/// What a CNI call is about, as the runtime gave it.
#[derive(Debug, Clone, Copy, Default)]
pub struct CniCallFields<'a> {
    /// `ADD`, `DEL`, `CHECK`, `STATUS`, `GC`.
    pub command: &'a str,
    /// `K8S_POD_NAMESPACE`.
    pub pod_namespace: &'a str,
    /// `K8S_POD_NAME`.
    pub pod_name: &'a str,
    /// `K8S_POD_UID`.
    pub pod_uid: &'a str,
    /// `CNI_CONTAINERID`.
    pub container_id: &'a str,
    /// `CNI_NETNS`.
    pub netns: &'a str,
    /// `CNI_IFNAME`.
    pub ifname: &'a str,
}

/// What the service learned about a call; shared with the layer through the request's
/// extensions.
#[derive(Debug)]
pub struct CallInfo {
    span: Span,
    trace_id: String,
    record: Mutex<CallRecord>,
}

impl CallInfo {
    /// The call's span.
    pub fn span(&self) -> &Span {
        &self.span
    }

    /// The call's trace id (32 hex digits; empty when tracing is off).
    pub fn trace_id(&self) -> &str {
        &self.trace_id
    }

    /// Records what a CNI call is about, on the span and in the call record.
    pub fn record_cni(&self, c: &CniCallFields<'_>) {
        let s = &self.span;
        s.record("cni.command", c.command);
        s.record("k8s.namespace.name", c.pod_namespace);
        s.record("k8s.pod.name", c.pod_name);
        s.record("k8s.pod.uid", c.pod_uid);
        s.record("container.id", c.container_id);
        s.record("cni.netns", c.netns);
        s.record("cni.ifname", c.ifname);
        let mut r = self.record.lock().expect("call record lock");
        r.command = c.command.to_string();
        r.pod_namespace = c.pod_namespace.to_string();
        r.pod_name = c.pod_name.to_string();
        r.container_id = c.container_id.to_string();
        r.netns = c.netns.to_string();
        r.ifname = c.ifname.to_string();
    }

    /// Records how a CNI call ended: its CNI code (0 for success) and error text.
    pub fn record_outcome(&self, cni_code: u32, error: &str) {
        self.span.record("cni.code", cni_code);
        let mut r = self.record.lock().expect("call record lock");
        r.cni_code = cni_code;
        r.error = error.to_string();
    }
}

/// Adds the per-call span, metrics, access log and call record to a gRPC server.
#[derive(Clone)]
pub struct GrpcLayer {
    metrics: Arc<Metrics>,
    calls: Arc<CallLog>,
}

impl GrpcLayer {
    /// Reports into `metrics` and `calls`.
    pub fn new(metrics: Arc<Metrics>, calls: Arc<CallLog>) -> Self {
        Self { metrics, calls }
    }
}

impl<S> Layer<S> for GrpcLayer {
    type Service = GrpcService<S>;
    fn layer(&self, inner: S) -> Self::Service {
        GrpcService {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service [`GrpcLayer`] wraps around the server.
#[derive(Clone)]
pub struct GrpcService<S> {
    inner: S,
    layer: GrpcLayer,
}

struct Headers<'a>(&'a http::HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }
    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(http::HeaderName::as_str).collect()
    }
}

/// The gRPC code name Prometheus labels use.
pub fn grpc_code_name(code: i32) -> &'static str {
    match code {
        0 => "OK",
        1 => "Canceled",
        2 => "Unknown",
        3 => "InvalidArgument",
        4 => "DeadlineExceeded",
        5 => "NotFound",
        6 => "AlreadyExists",
        7 => "PermissionDenied",
        8 => "ResourceExhausted",
        9 => "FailedPrecondition",
        10 => "Aborted",
        11 => "OutOfRange",
        12 => "Unimplemented",
        13 => "Internal",
        14 => "Unavailable",
        15 => "DataLoss",
        16 => "Unauthenticated",
        _ => "Unknown",
    }
}

fn split_path(path: &str) -> (String, String) {
    let p = path.trim_start_matches('/');
    match p.split_once('/') {
        Some((s, m)) => (s.to_string(), m.to_string()),
        None => (p.to_string(), String::new()),
    }
}

impl<S, B, R> Service<http::Request<B>> for GrpcService<S>
where
    S: Service<http::Request<B>, Response = http::Response<R>> + Send,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<B>) -> Self::Future {
        let start = Instant::now();
        let (service, method) = split_path(req.uri().path());
        let span = tracing::info_span!(
            target: "weft::rpc",
            "grpc.server",
            otel.name = %format!("{service}/{method}"),
            otel.kind = "server",
            rpc.system = "grpc",
            rpc.service = %service,
            rpc.method = %method,
            cni.command = Empty,
            k8s.namespace.name = Empty,
            k8s.pod.name = Empty,
            k8s.pod.uid = Empty,
            container.id = Empty,
            cni.netns = Empty,
            cni.ifname = Empty,
            rpc.grpc.status_code = Empty,
            cni.code = Empty,
            trace_id = Empty,
        );
        let parent = TraceContextPropagator::new().extract(&Headers(req.headers()));
        let _ = span.set_parent(parent);
        let sc = span.context().span().span_context().clone();
        let trace_id = if sc.is_valid() {
            sc.trace_id().to_string()
        } else {
            String::new()
        };
        if !trace_id.is_empty() {
            span.record("trace_id", trace_id.as_str());
        }
        let info = Arc::new(CallInfo {
            span: span.clone(),
            trace_id: trace_id.clone(),
            record: Mutex::new(CallRecord::default()),
        });
        req.extensions_mut().insert(info.clone());

        let labels = GrpcLabels {
            grpc_type: "unary",
            grpc_service: service.clone(),
            grpc_method: method.clone(),
        };
        let m = self.layer.metrics.clone();
        let calls = self.layer.calls.clone();
        m.grpc_started.get_or_create(&labels).inc();
        m.grpc_msg_received.get_or_create(&labels).inc();
        let fut = {
            let _enter = span.enter();
            self.inner.call(req)
        };
        Box::pin(async move {
            let res = tracing::Instrument::instrument(fut, span.clone()).await;
            let elapsed = start.elapsed();
            // A unary error is a trailers-only response: the status is in the headers.
            // Success carries it in the trailers, after this point: no header means OK.
            let code = match &res {
                Ok(r) => r
                    .headers()
                    .get("grpc-status")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0),
                Err(_) => 2,
            };
            let code_name = grpc_code_name(code);
            span.record("rpc.grpc.status_code", code);
            m.grpc_handled
                .get_or_create(&GrpcCodeLabels {
                    grpc_type: "unary",
                    grpc_service: labels.grpc_service.clone(),
                    grpc_method: labels.grpc_method.clone(),
                    grpc_code: code_name,
                })
                .inc();
            if code == 0 {
                m.grpc_msg_sent.get_or_create(&labels).inc();
            }
            let exemplar = (!info.trace_id.is_empty()).then(|| TraceExemplar {
                trace_id: info.trace_id.clone(),
            });
            m.grpc_handling
                .get_or_create(&labels)
                .observe(elapsed.as_secs_f64(), exemplar, None);

            let mut record = info.record.lock().expect("call record lock").clone();
            let duration_ms = elapsed.as_secs_f64() * 1000.0;
            let is_cni = !record.command.is_empty();
            if is_cni {
                m.cni_requests
                    .get_or_create(&CniLabels {
                        command: record.command.clone(),
                        cni_code: record.cni_code.to_string(),
                    })
                    .inc();
            }
            // The span already carries rpc.service, rpc.method, rpc.grpc.status_code,
            // cni.code and the pod fields; the access line adds the duration.
            span.in_scope(|| {
                if code == 0 {
                    tracing::info!(target: "weft::access", duration_ms, "finished call");
                } else {
                    tracing::warn!(target: "weft::access", duration_ms, error = %record.error, "finished call");
                }
            });
            if is_cni {
                record.finished_unix_ms = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map_or(0, |d| d.as_millis() as i64);
                record.duration_ms = duration_ms;
                record.grpc_code = code_name.to_string();
                record.trace_id.clone_from(&info.trace_id);
                calls.push(record);
            }
            res
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_split_into_service_and_method() {
        assert_eq!(
            split_path("/weft.cnirpc.v1.CNI/Add"),
            ("weft.cnirpc.v1.CNI".into(), "Add".into())
        );
        assert_eq!(grpc_code_name(14), "Unavailable");
    }
}
