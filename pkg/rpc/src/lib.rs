//! The gRPC protocols of weft: the CNI relay (`cnirpc`) between plugin and daemon and
//! the admin service used by `weftctl`, generated from `proto/`; plus the helpers both
//! ends share: dialing the daemon's UNIX socket and carrying CNI errors in a status.

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

/// The node-to-node services (`weft.wire.v1`: `Wire`, and `Policy`, which announces new
/// pods' addresses), on [`codec::WireCodec`].
pub mod wire {
    #![allow(missing_docs, clippy::all)]
    tonic::include_proto!("weft.wire.v1");
}

/// The standard gRPC rich-error envelope (`google.rpc.Status`).
pub mod rpc_status {
    #![allow(missing_docs, clippy::all)]
    tonic::include_proto!("google.rpc");
}

/// The wire form of a CNI error; plugin and daemon both work with [`weft_cni::CniError`]
/// and convert at the edge ([`cni_error_status`], [`cni_error_from_status`]).
pub use cnirpc::CniError as WireCniError;

/// Fully qualified protobuf name of [`WireCniError`], used as the `Any` type URL suffix.
pub const CNI_ERROR_TYPE_URL: &str = "type.googleapis.com/weft.cnirpc.v1.CNIError";

/// The gRPC code a CNI error travels under, by its class (gRPC tooling sees it; the
/// plugin reads the CNI error itself). Exhaustive: a new class is mapped here or
/// nothing builds.
pub fn grpc_code(class: weft_cni::Class) -> tonic::Code {
    use weft_cni::Class;
    match class {
        Class::InvalidArgument => tonic::Code::InvalidArgument,
        Class::NotFound => tonic::Code::NotFound,
        Class::Unavailable => tonic::Code::Unavailable,
        Class::ResourceExhausted => tonic::Code::ResourceExhausted,
        Class::FailedPrecondition => tonic::Code::FailedPrecondition,
        Class::AlreadyExists => tonic::Code::AlreadyExists,
        Class::Internal => tonic::Code::Internal,
    }
}

impl From<&weft_cni::CniError> for WireCniError {
    fn from(e: &weft_cni::CniError) -> Self {
        Self {
            code: e.code.number(),
            msg: e.msg.clone(),
            details: e.details.clone(),
        }
    }
}

impl From<WireCniError> for weft_cni::CniError {
    /// A code this build does not know (a newer daemon's) is reported as internal,
    /// with the daemon's number kept in the details.
    fn from(e: WireCniError) -> Self {
        match weft_cni::Code::from_number(e.code) {
            Some(code) => Self {
                code,
                msg: e.msg,
                details: e.details,
            },
            None => Self {
                code: weft_cni::Code::Internal,
                msg: e.msg,
                details: format!(
                    "{} (the daemon answered CNI code {}, unknown to this plugin)",
                    e.details, e.code
                ),
            },
        }
    }
}

/// Wraps a CNI error in a gRPC status: the code of its class for gRPC-level tooling,
/// and the CNI error itself as the single detail of a `google.rpc.Status`.
pub fn cni_error_status(err: &weft_cni::CniError) -> tonic::Status {
    let grpc = grpc_code(err.code.class());
    let wire = WireCniError::from(err);
    let envelope = rpc_status::Status {
        code: grpc as i32,
        message: wire.msg.clone(),
        details: vec![prost_types::Any {
            type_url: CNI_ERROR_TYPE_URL.to_string(),
            value: wire.encode_to_vec(),
        }],
    };
    let message = if wire.details.is_empty() {
        wire.msg.clone()
    } else {
        format!("{}: {}", wire.msg, wire.details)
    };
    tonic::Status::with_details(grpc, message, envelope.encode_to_vec().into())
}

/// Extracts the CNI error carried by a status made with [`cni_error_status`], if any.
pub fn cni_error_from_status(status: &tonic::Status) -> Option<weft_cni::CniError> {
    let envelope = rpc_status::Status::decode(status.details()).ok()?;
    envelope
        .details
        .iter()
        .find(|any| any.type_url == CNI_ERROR_TYPE_URL)
        .and_then(|any| WireCniError::decode(any.value.as_slice()).ok())
        .map(weft_cni::CniError::from)
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
        let err = weft_cni::CniError::new(weft_cni::Code::RangeExhausted, "10.0.0.0/30 has no free address");
        let status = cni_error_status(&err);
        assert_eq!(status.code(), tonic::Code::ResourceExhausted);
        assert_eq!(cni_error_from_status(&status), Some(err));
    }

    #[test]
    fn every_code_keeps_its_grpc_code() {
        use tonic::Code as G;
        use weft_cni::Code as C;
        // The table from before the codes were typed: a change here is a change of
        // what gRPC tooling and its metrics see.
        let want = [
            (C::IncompatibleVersion, G::InvalidArgument),
            (C::UnsupportedField, G::InvalidArgument),
            (C::UnknownContainer, G::NotFound),
            (C::InvalidEnv, G::InvalidArgument),
            (C::IoFailure, G::Internal),
            (C::Decode, G::InvalidArgument),
            (C::InvalidConfig, G::InvalidArgument),
            (C::InvalidNetns, G::InvalidArgument),
            (C::TryAgainLater, G::Unavailable),
            (C::NotAvailable, G::Unavailable),
            (C::Internal, G::Internal),
            (C::RangeExhausted, G::ResourceExhausted),
            (C::Kernel, G::Internal),
            (C::Store, G::Internal),
            (C::CheckFailed, G::FailedPrecondition),
            (C::InterfaceExists, G::AlreadyExists),
            (C::HostPortInUse, G::Internal),
            (C::AddressInUse, G::AlreadyExists),
            (C::RouteExists, G::AlreadyExists),
        ];
        assert_eq!(want.map(|(c, _)| c), C::ALL, "every code is in the table");
        for (c, g) in want {
            assert_eq!(grpc_code(c.class()), g, "{c:?}");
        }
    }

    #[test]
    fn an_unknown_code_from_a_newer_daemon_is_internal_with_its_number() {
        let wire = WireCniError {
            code: 150,
            msg: "something new".into(),
            details: "why".into(),
        };
        let e = weft_cni::CniError::from(wire);
        assert_eq!(e.code, weft_cni::Code::Internal);
        assert_eq!(e.msg, "something new");
        assert!(e.details.contains("CNI code 150"), "{}", e.details);
    }

    #[test]
    fn a_plain_status_carries_no_cni_error() {
        let status = tonic::Status::unavailable("gone");
        assert_eq!(cni_error_from_status(&status), None);
    }
}
