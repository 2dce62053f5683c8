//! Observability for weftd: flat JSON logs in which every line of a CNI call carries
//! the call's pod fields, OpenTelemetry traces (one per CNI call, started by the
//! plugin), Prometheus metrics with trace-id exemplars, the tower layer that ties
//! them to each gRPC call, and the HTTP endpoints (`/metrics`, `/healthz`, `/readyz`).
//!
//! [`init`] composes the tracing layers in one place; [`GrpcLayer`] is the tower layer
//! for the gRPC server; [`router`] serves HTTP.

pub mod calls;
pub mod grpc;
pub mod logs;
pub mod metrics;
pub mod otel;
pub mod phases;
mod process;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::http::{HeaderMap, StatusCode, header};
use axum::routing::get;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::filter::{EnvFilter, LevelFilter, filter_fn};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{Layer, Registry};

pub use calls::{CallLog, CallRecord};
pub use grpc::{CallInfo, CniCallFields, GrpcLayer};
pub use metrics::{Families, Metrics};
pub use phases::PHASE_TARGET;

/// How log lines are written (to stderr).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// One flat JSON object per line.
    Json,
    /// Human-readable text.
    Text,
}

/// Whether a span or event is weft's own (not a dependency's).
fn ours(meta: &tracing::Metadata<'_>) -> bool {
    meta.target().starts_with("weft")
}

/// Installs the global subscriber: logs (filtered by `RUST_LOG`, default `info`),
/// OpenTelemetry spans for weft's own spans through `provider`, and phase metrics
/// into `metrics`. Returns the provider to shut down at exit.
pub fn init(format: LogFormat, provider: SdkTracerProvider, metrics: Arc<Metrics>) -> SdkTracerProvider {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let logs = match format {
        LogFormat::Json => logs::JsonLogLayer::stderr().with_filter(filter).boxed(),
        LogFormat::Text => tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_filter(filter)
            .boxed(),
    };
    let tracer = provider.tracer("weft");
    // With nothing exported, only the calls' spans need OpenTelemetry ids (for log
    // lines and exemplars): phase spans would be built and dropped, some 0.05 ms of an
    // ADD.
    let export = otel::export_configured();
    let otel = tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_filter(LevelFilter::INFO)
        .with_filter(filter_fn(move |m| ours(m) && (export || m.target() != PHASE_TARGET)));
    let phases = phases::PhaseLayer::new(metrics).with_filter(filter_fn(ours));
    let _ = Registry::default().with(otel).with(phases).with(logs).try_init();
    opentelemetry::global::set_text_map_propagator(opentelemetry_sdk::propagation::TraceContextPropagator::new());
    provider
}

/// Installs plain logging only (for tools and tests that need no traces or metrics).
pub fn init_logging(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let logs = match format {
        LogFormat::Json => logs::JsonLogLayer::stderr().with_filter(filter).boxed(),
        LogFormat::Text => tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_filter(filter)
            .boxed(),
    };
    let _ = Registry::default().with(logs).try_init();
}

/// A condition `/readyz` checks at each request besides the flag (for example "the
/// store can still write"): a name for the answer and the check itself.
pub type ReadyCheck = Arc<dyn Fn() -> bool + Send + Sync>;

/// Readiness of the daemon: set once the store is open and the socket is served, and
/// withdrawn while any check added with [`Readiness::require`] fails.
#[derive(Clone, Default)]
pub struct Readiness {
    flag: Arc<AtomicBool>,
    // Evaluated at each request rather than folded into the flag, so a condition that
    // turns (a store that stopped writing) shows at once without a task to follow it.
    checks: Arc<std::sync::RwLock<Vec<(&'static str, ReadyCheck)>>>,
    // Conditions said in the answer that do not make the daemon unready.
    notes: Arc<std::sync::RwLock<Vec<(&'static str, ReadyCheck)>>>,
}

impl std::fmt::Debug for Readiness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let checks: Vec<&str> = self
            .checks
            .read()
            .map(|c| c.iter().map(|(n, _)| *n).collect())
            .unwrap_or_default();
        f.debug_struct("Readiness")
            .field("flag", &self.flag.load(Ordering::Relaxed))
            .field("checks", &checks)
            .finish()
    }
}

impl Readiness {
    /// Marks the daemon ready (or not).
    pub fn set(&self, ready: bool) {
        self.flag.store(ready, Ordering::Relaxed);
    }

    /// Whether the daemon is ready: the flag is set and every check passes.
    pub fn get(&self) -> bool {
        self.flag.load(Ordering::Relaxed) && self.failing().is_none()
    }

    /// Also requires `check` to pass for the daemon to be ready; `what` names it in the
    /// answer of `/readyz` when it does not.
    pub fn require(&self, what: &'static str, check: impl Fn() -> bool + Send + Sync + 'static) {
        if let Ok(mut checks) = self.checks.write() {
            checks.push((what, Arc::new(check)));
        }
    }

    /// Says `what` in the answer of `/readyz` whenever `holds` does, without making the
    /// daemon unready (a degraded state that still serves, as stale policy objects).
    pub fn note(&self, what: &'static str, holds: impl Fn() -> bool + Send + Sync + 'static) {
        if let Ok(mut notes) = self.notes.write() {
            notes.push((what, Arc::new(holds)));
        }
    }

    /// The notes that hold now.
    pub fn notes(&self) -> Vec<&'static str> {
        self.notes
            .read()
            .map(|n| n.iter().filter(|(_, holds)| holds()).map(|(what, _)| *what).collect())
            .unwrap_or_default()
    }

    /// The name of the first check that fails now, if any (whatever the flag says).
    pub fn failing(&self) -> Option<&'static str> {
        let checks = self.checks.read().ok()?;
        checks.iter().find(|(_, check)| !check()).map(|(what, _)| *what)
    }
}

/// Refreshes gauges that are read from elsewhere (the store) just before a scrape.
pub type Refresh = Arc<dyn Fn() -> std::pin::Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

/// The HTTP router: `/metrics`, `/healthz` (alive) and `/readyz` (ready).
pub fn router(ready: Readiness, metrics: Arc<Metrics>, refresh: Option<Refresh>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route(
            "/readyz",
            get(move || {
                let ready = ready.clone();
                async move {
                    if !ready.flag.load(Ordering::Relaxed) {
                        return (StatusCode::SERVICE_UNAVAILABLE, "not ready\n".to_string());
                    }
                    match ready.failing() {
                        None => (
                            StatusCode::OK,
                            ready
                                .notes()
                                .iter()
                                .fold("ready\n".to_string(), |s, n| format!("{s}{n}\n")),
                        ),
                        Some(what) => (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {what}\n")),
                    }
                }
            }),
        )
        .route(
            "/metrics",
            get(move |headers: HeaderMap| {
                let (metrics, refresh) = (metrics.clone(), refresh.clone());
                async move {
                    if let Some(r) = refresh {
                        r().await;
                    }
                    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()).unwrap_or("");
                    let (content_type, body) = metrics.render(accept);
                    ([(header::CONTENT_TYPE, content_type)], body)
                }
            }),
        )
}

/// Binds `addr` for the HTTP endpoints.
pub async fn bind_http(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr).await
}

/// Serves `router` on `listener` until `shutdown` resolves.
pub async fn serve_http(
    listener: tokio::net::TcpListener,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router).with_graceful_shutdown(shutdown).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::ServiceExt;

    async fn get_path(r: Router, path: &str, accept: &str) -> (StatusCode, String) {
        let res = r
            .oneshot(
                http::Request::get(path)
                    .header("accept", accept)
                    .body(axum::body::Body::empty())
                    .unwrap(),
            )
            .await
            .unwrap();
        let status = res.status();
        let body = axum::body::to_bytes(res.into_body(), 1 << 20).await.unwrap();
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    #[tokio::test]
    async fn readiness_follows_the_flag_and_metrics_negotiate() {
        let ready = Readiness::default();
        let m = Metrics::new("v", "c");
        let r = || router(ready.clone(), m.clone(), None);
        assert_eq!(get_path(r(), "/healthz", "").await.0, StatusCode::OK);
        assert_eq!(get_path(r(), "/readyz", "").await.0, StatusCode::SERVICE_UNAVAILABLE);
        ready.set(true);
        assert_eq!(get_path(r(), "/readyz", "").await.0, StatusCode::OK);
        let store_ok = Arc::new(AtomicBool::new(true));
        let check = store_ok.clone();
        ready.require("the store cannot write", move || check.load(Ordering::Relaxed));
        assert_eq!(get_path(r(), "/readyz", "").await.0, StatusCode::OK);
        store_ok.store(false, Ordering::Relaxed);
        assert_eq!(
            get_path(r(), "/readyz", "").await,
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "not ready: the store cannot write\n".to_string()
            )
        );
        assert!(!ready.get());
        store_ok.store(true, Ordering::Relaxed);
        assert_eq!(get_path(r(), "/readyz", "").await.0, StatusCode::OK);
        // A note is said while it holds, and the daemon stays ready.
        let stale = Arc::new(AtomicBool::new(true));
        let holds = stale.clone();
        ready.note("policy objects are stale", move || holds.load(Ordering::Relaxed));
        assert_eq!(
            get_path(r(), "/readyz", "").await,
            (StatusCode::OK, "ready\npolicy objects are stale\n".to_string())
        );
        stale.store(false, Ordering::Relaxed);
        assert_eq!(get_path(r(), "/readyz", "").await.1, "ready\n");
        assert_eq!(get_path(r(), "/nope", "").await.0, StatusCode::NOT_FOUND);
        let (_, om) = get_path(r(), "/metrics", "application/openmetrics-text;version=1.0.0").await;
        assert!(om.ends_with("# EOF\n"));
        let (_, classic) = get_path(r(), "/metrics", "text/plain").await;
        assert!(classic.contains("weft_build_info"));
        assert!(!classic.contains("# EOF"));
    }
}
