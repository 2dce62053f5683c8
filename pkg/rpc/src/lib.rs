//! The gRPC protocols of weft: the CNI relay (`cnirpc`) between plugin and daemon and
//! the admin service used by `weftctl`, generated from `proto/`; plus the helpers both
//! ends share: dialing the daemon's UNIX socket and carrying CNI errors in a status.

#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use prost::Message;
use tonic::transport::{Channel, Endpoint};

/// The CNI relay service and its messages (`weft.cnirpc.v1`).
pub mod cnirpc {
    #![allow(missing_docs, clippy::all)]
    tonic::include_proto!("weft.cnirpc.v1");
}

/// The operator service of weftd (`weft.admin.v1`).
pub mod admin {
    #![allow(missing_docs, clippy::all)]
    tonic::include_proto!("weft.admin.v1");
}

pub mod codec;

/// The node-to-node wire service (`weft.wire.v1`), on [`codec::WireCodec`].
pub mod wire {
    #![allow(missing_docs, clippy::all)]
    tonic::include_proto!("weft.wire.v1");
}

/// The standard gRPC rich-error envelope (`google.rpc.Status`).
pub mod rpc_status {
    #![allow(missing_docs, clippy::all)]
    tonic::include_proto!("google.rpc");
}

pub use cnirpc::CniError;

/// Fully qualified protobuf name of [`CniError`], used as the `Any` type URL suffix.
pub const CNI_ERROR_TYPE_URL: &str = "type.googleapis.com/weft.cnirpc.v1.CNIError";

/// Wraps a CNI error in a gRPC status: `grpc_code` for gRPC-level tooling, and the
/// CNI error itself as the single detail of a `google.rpc.Status`.
pub fn cni_error_status(grpc_code: tonic::Code, err: &CniError) -> tonic::Status {
    let envelope = rpc_status::Status {
        code: grpc_code as i32,
        message: err.msg.clone(),
        details: vec![prost_types::Any {
            type_url: CNI_ERROR_TYPE_URL.to_string(),
            value: err.encode_to_vec(),
        }],
    };
    let message = if err.details.is_empty() {
        err.msg.clone()
    } else {
        format!("{}: {}", err.msg, err.details)
    };
    tonic::Status::with_details(grpc_code, message, envelope.encode_to_vec().into())
}

/// Extracts the CNI error carried by a status made with [`cni_error_status`], if any.
pub fn cni_error_from_status(status: &tonic::Status) -> Option<CniError> {
    let envelope = rpc_status::Status::decode(status.details()).ok()?;
    envelope
        .details
        .iter()
        .find(|any| any.type_url == CNI_ERROR_TYPE_URL)
        .and_then(|any| CniError::decode(any.value.as_slice()).ok())
}

/// How a client dials the daemon's socket.
#[derive(Debug, Clone)]
pub struct DialOptions {
    /// How long to keep retrying while the socket is missing or refuses connections
    /// (the daemon is restarting). Zero means one attempt.
    pub connect_window: Duration,
    /// Deadline for each call.
    pub call_timeout: Duration,
    /// A connection whose peer stops answering HTTP/2 pings for this long is dropped,
    /// so a hung daemon fails calls instead of stalling them until the deadline.
    pub keepalive_timeout: Duration,
}

impl Default for DialOptions {
    fn default() -> Self {
        Self {
            connect_window: Duration::from_millis(1500),
            call_timeout: Duration::from_secs(30),
            keepalive_timeout: Duration::from_secs(2),
        }
    }
}

/// Dials the daemon's UNIX socket at `path` and returns a ready gRPC channel.
///
/// Connection failures that a restarting daemon produces (socket missing, connection
/// refused) are retried for `opts.connect_window`; the error returned afterwards is
/// the last one seen.
pub async fn dial_unix(path: &Path, opts: &DialOptions) -> Result<Channel, tonic::transport::Error> {
    let path: PathBuf = path.to_path_buf();
    let window = opts.connect_window;
    // The URI is required by the API but never resolved: the connector ignores it.
    let endpoint = Endpoint::from_static("http://weftd.invalid")
        .timeout(opts.call_timeout)
        .connect_timeout(window + Duration::from_secs(1))
        .http2_keep_alive_interval(Duration::from_secs(1))
        .keep_alive_timeout(opts.keepalive_timeout)
        .keep_alive_while_idle(true);
    endpoint
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let path = path.clone();
            async move {
                let stream = connect_with_retry(&path, window).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
            }
        }))
        .await
}

async fn connect_with_retry(path: &Path, window: Duration) -> std::io::Result<tokio::net::UnixStream> {
    let deadline = tokio::time::Instant::now() + window;
    let mut backoff = Duration::from_millis(20);
    loop {
        match tokio::net::UnixStream::connect(path).await {
            Ok(s) => return Ok(s),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
                ) && tokio::time::Instant::now() + backoff < deadline =>
            {
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_millis(200));
            }
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cni_error_round_trips_through_a_status() {
        let err = CniError {
            code: 101,
            msg: "address range exhausted".into(),
            details: "10.0.0.0/30 has no free address".into(),
        };
        let status = cni_error_status(tonic::Code::ResourceExhausted, &err);
        assert_eq!(status.code(), tonic::Code::ResourceExhausted);
        assert_eq!(cni_error_from_status(&status), Some(err));
    }

    #[test]
    fn a_plain_status_carries_no_cni_error() {
        let status = tonic::Status::unavailable("gone");
        assert_eq!(cni_error_from_status(&status), None);
    }
}
