//! Observability for weftd: how logs are written, and the HTTP endpoints served on
//! `--metrics-addr` (`/healthz` for liveness, `/readyz` for readiness).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::http::StatusCode;
use axum::routing::get;
use tracing_subscriber::EnvFilter;

/// How log lines are written (to stderr).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// One JSON object per line.
    Json,
    /// Human-readable text.
    Text,
}

/// Installs the global log subscriber. `RUST_LOG` overrides the default `info` level.
pub fn init_logging(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(false)
            .init(),
        LogFormat::Text => builder.init(),
    }
}

/// Readiness of the daemon: set once the store is open and the socket is served.
#[derive(Debug, Clone, Default)]
pub struct Readiness(Arc<AtomicBool>);

impl Readiness {
    /// Marks the daemon ready (or not).
    pub fn set(&self, ready: bool) {
        self.0.store(ready, Ordering::Relaxed);
    }

    /// Whether the daemon is ready.
    pub fn get(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }

    /// The shared flag.
    pub fn flag(&self) -> Arc<AtomicBool> {
        self.0.clone()
    }
}

/// The HTTP router: `/healthz` answers while the process lives, `/readyz` once ready.
pub fn router(ready: Readiness) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route(
            "/readyz",
            get(move || {
                let ready = ready.clone();
                async move {
                    if ready.get() {
                        (StatusCode::OK, "ready\n")
                    } else {
                        (StatusCode::SERVICE_UNAVAILABLE, "not ready\n")
                    }
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
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::ServiceExt;

    async fn status(r: Router, path: &str) -> StatusCode {
        r.oneshot(
            http::Request::get(path)
                .body(axum::body::Body::empty())
                .unwrap(),
        )
        .await
        .unwrap()
        .status()
    }

    #[tokio::test]
    async fn readiness_follows_the_flag() {
        let ready = Readiness::default();
        assert_eq!(
            status(router(ready.clone()), "/healthz").await,
            StatusCode::OK
        );
        assert_eq!(
            status(router(ready.clone()), "/readyz").await,
            StatusCode::SERVICE_UNAVAILABLE
        );
        ready.set(true);
        assert_eq!(
            status(router(ready.clone()), "/readyz").await,
            StatusCode::OK
        );
        assert_eq!(status(router(ready), "/nope").await, StatusCode::NOT_FOUND);
    }
}
