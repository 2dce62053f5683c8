//! A real OpenTelemetry collector for the tests: rotel (PyPI `rotel`, installed by
//! test/install-deps.sh) listening for OTLP over gRPC on 127.0.0.1:4317 inside a
//! network namespace, forwarding what it receives (traces and logs) to a receiver in
//! the test process, bound in the same namespace, where the test reads it back.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use opentelemetry_proto::tonic::collector::logs::v1::logs_service_server::{LogsService, LogsServiceServer};
use opentelemetry_proto::tonic::collector::logs::v1::{ExportLogsServiceRequest, ExportLogsServiceResponse};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{TraceService, TraceServiceServer};
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::logs::v1::ResourceLogs;
use opentelemetry_proto::tonic::trace::v1::ResourceSpans;
use weft_harness::{ChildGuard, NamedNetns};

use crate::{TempDir, run};

/// Where weftd sends OTLP in the collector's namespace.
pub const ENDPOINT: &str = "http://127.0.0.1:4317";

/// The rotel collector's executable.
pub fn rotel_agent() -> PathBuf {
    if let Ok(p) = std::env::var("WEFT_ROTEL_AGENT") {
        return PathBuf::from(p);
    }
    let lib = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .join(".venv/lib");
    let found = std::fs::read_dir(&lib)
        .ok()
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .map(|e| e.path().join("site-packages/rotel/rotel-agent"))
        .find(|p| p.exists());
    found.unwrap_or_else(|| {
        panic!(
            "rotel-agent not found under {}: run test/install-deps.sh (or set WEFT_ROTEL_AGENT)",
            lib.display()
        )
    })
}

/// What reached the receiver.
#[derive(Clone, Default)]
struct Sink {
    spans: Arc<Mutex<Vec<ResourceSpans>>>,
    logs: Arc<Mutex<Vec<ResourceLogs>>>,
}

#[tonic::async_trait]
impl TraceService for Sink {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        self.spans.lock().unwrap().extend(request.into_inner().resource_spans);
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

#[tonic::async_trait]
impl LogsService for Sink {
    async fn export(
        &self,
        request: tonic::Request<ExportLogsServiceRequest>,
    ) -> Result<tonic::Response<ExportLogsServiceResponse>, tonic::Status> {
        self.logs.lock().unwrap().extend(request.into_inner().resource_logs);
        Ok(tonic::Response::new(ExportLogsServiceResponse {
            partial_success: None,
        }))
    }
}

/// rotel and its receiver, running; stopped on drop.
pub struct Collector {
    sink: Sink,
    dir: TempDir,
    _proc: ChildGuard,
    _rt: tokio::runtime::Runtime,
}

impl Collector {
    /// Starts the receiver and rotel inside namespace `netns` and waits until rotel
    /// listens on 127.0.0.1:4317.
    pub fn start(netns: &str) -> Self {
        let rotel = rotel_agent();
        let ns = NamedNetns::existing(netns);
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let sink = Sink::default();
        let listener = ns.bind_tcp("127.0.0.1:0").expect("binding the OTLP receiver");
        let recv_port = listener.local_addr().unwrap().port();
        listener.set_nonblocking(true).unwrap();
        {
            let _g = rt.enter();
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            // rotel compresses its exports with gzip by default.
            let gzip = tonic::codec::CompressionEncoding::Gzip;
            rt.spawn(
                tonic::transport::Server::builder()
                    .add_service(TraceServiceServer::new(sink.clone()).accept_compressed(gzip))
                    .add_service(LogsServiceServer::new(sink.clone()).accept_compressed(gzip))
                    .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
            );
        }
        let dir = TempDir::new("rotel");
        let log = dir.path().join("rotel.log");
        let out = std::fs::File::create(&log).expect("log file");
        let child = ns
            .command([rotel.to_str().unwrap()])
            .args(["start", "--otlp-grpc-endpoint", "127.0.0.1:4317"])
            .args(["--otlp-http-endpoint", "127.0.0.1:4318", "--exporter", "otlp"])
            .arg("--otlp-exporter-endpoint")
            .arg(format!("http://127.0.0.1:{recv_port}"))
            .args(["--otlp-exporter-protocol", "grpc"])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::from(out.try_clone().unwrap()))
            .stderr(std::process::Stdio::from(out))
            .spawn()
            .expect("starting rotel");
        let c = Collector {
            sink,
            dir,
            _proc: ChildGuard::new(child),
            _rt: rt,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while !run(&mut ns.command(["bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/4317"]))
            .status
            .success()
        {
            assert!(Instant::now() < deadline, "rotel did not listen: {}", c.log());
            std::thread::sleep(Duration::from_millis(50));
        }
        c
    }

    /// rotel's own log.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("rotel.log")).unwrap_or_default()
    }

    /// The spans received so far.
    pub fn spans(&self) -> Vec<ResourceSpans> {
        self.sink.spans.lock().unwrap().clone()
    }

    /// The log records received so far.
    pub fn logs(&self) -> Vec<ResourceLogs> {
        self.sink.logs.lock().unwrap().clone()
    }
}

/// The string value of attribute `key`, if it has one.
pub fn attr<'a>(attrs: &'a [KeyValue], key: &str) -> Option<&'a str> {
    attrs.iter().find(|kv| kv.key == key).and_then(|kv| match &kv.value {
        Some(AnyValue {
            value: Some(any_value::Value::StringValue(s)),
        }) => Some(s.as_str()),
        _ => None,
    })
}

/// The integer value of attribute `key`, if it has one.
pub fn int_attr(attrs: &[KeyValue], key: &str) -> Option<i64> {
    attrs.iter().find(|kv| kv.key == key).and_then(|kv| match &kv.value {
        Some(AnyValue {
            value: Some(any_value::Value::IntValue(i)),
        }) => Some(*i),
        _ => None,
    })
}
