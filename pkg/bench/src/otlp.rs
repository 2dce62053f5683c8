//! A counting OTLP/gRPC trace receiver, run inside a node namespace so weftd's
//! exporter ships its spans over a real connection while the benchmark measures.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{TraceService, TraceServiceServer};
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use weft_harness::NamedNetns;

#[derive(Clone, Default)]
struct Counter(Arc<AtomicU64>);

#[tonic::async_trait]
impl TraceService for Counter {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let n: usize = request
            .into_inner()
            .resource_spans
            .iter()
            .flat_map(|r| &r.scope_spans)
            .map(|s| s.spans.len())
            .sum();
        self.0.fetch_add(n as u64, Ordering::Relaxed);
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

/// A running receiver; stops with its runtime on drop.
pub struct Sink {
    _runtime: tokio::runtime::Runtime,
    spans: Arc<AtomicU64>,
    /// `http://127.0.0.1:<port>`, reachable from inside the namespace.
    pub endpoint: String,
}

impl Sink {
    /// Starts a receiver on a loopback port inside `node`.
    pub fn start(node: &NamedNetns) -> Result<Self, String> {
        let listener = node.bind_tcp("127.0.0.1:0").map_err(|e| e.to_string())?;
        let port = listener.local_addr().map_err(|e| e.to_string())?.port();
        listener.set_nonblocking(true).map_err(|e| e.to_string())?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        let counter = Counter::default();
        let spans = counter.0.clone();
        let listener = {
            let _g = runtime.enter();
            tokio::net::TcpListener::from_std(listener).map_err(|e| e.to_string())?
        };
        runtime.spawn(
            tonic::transport::Server::builder()
                .add_service(
                    TraceServiceServer::new(counter).accept_compressed(tonic::codec::CompressionEncoding::Gzip),
                )
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        Ok(Self {
            _runtime: runtime,
            spans,
            endpoint: format!("http://127.0.0.1:{port}"),
        })
    }

    /// Spans received so far.
    pub fn spans(&self) -> u64 {
        self.spans.load(Ordering::Relaxed)
    }
}
