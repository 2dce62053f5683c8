//! `weftctl calls`: the daemon's most recent finished CNI calls.

use std::path::Path;
use std::time::{Duration, UNIX_EPOCH};

use serde::Serialize;
use weft_rpc::admin::CallsRequest;
use weft_rpc::admin::admin_client::AdminClient;

/// Options of `weftctl calls`.
#[derive(Debug, clap::Args)]
pub struct CallsArgs {
    /// Only calls that failed.
    #[arg(long)]
    failed: bool,
    /// Only calls for pods of this name.
    #[arg(long)]
    pod: Option<String>,
}

#[derive(Serialize)]
struct Call {
    finished: String,
    command: String,
    pod_namespace: String,
    pod: String,
    ifname: String,
    container_id: String,
    netns: String,
    duration_ms: f64,
    cni_code: u32,
    grpc_code: String,
    trace_id: String,
    error: String,
}

/// RFC 3339 UTC time of a Unix-milliseconds instant.
fn rfc3339(ms: i64) -> String {
    humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64)).to_string()
}

/// Prints the calls.
pub async fn run(socket: &Path, args: CallsArgs, json: bool) -> anyhow::Result<()> {
    let mut client = AdminClient::new(super::connect(socket).await?);
    let reply = client
        .calls(CallsRequest {
            failed_only: args.failed,
            pod: args.pod.unwrap_or_default(),
        })
        .await?
        .into_inner();
    let calls: Vec<Call> = reply
        .calls
        .into_iter()
        .map(|c| Call {
            finished: rfc3339(c.finished_unix_ms),
            command: c.command,
            pod_namespace: c.pod_namespace,
            pod: c.pod_name,
            ifname: c.ifname,
            container_id: c.container_id,
            netns: c.netns,
            duration_ms: c.duration_ms,
            cni_code: c.cni_code,
            grpc_code: c.grpc_code,
            trace_id: c.trace_id,
            error: c.error,
        })
        .collect();
    if json {
        outln!("{}", serde_json::to_string_pretty(&calls)?);
        return Ok(());
    }
    outln!(
        "{:<24} {:<7} {:<40} {:<8} {:>10} {:>4}  {:<32}",
        "TIME",
        "COMMAND",
        "POD",
        "IFNAME",
        "DURATION",
        "CODE",
        "TRACE"
    );
    for c in &calls {
        let pod = super::pod_label(&c.pod_namespace, &c.pod, &c.container_id);
        outln!(
            "{:<24} {:<7} {:<40} {:<8} {:>8.1}ms {:>4}  {:<32}",
            c.finished,
            c.command,
            pod,
            if c.ifname.is_empty() { "-" } else { &c.ifname },
            c.duration_ms,
            c.cni_code,
            c.trace_id
        );
        if !c.error.is_empty() {
            outln!("{:<24} {}", "", c.error);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn rfc3339_formats_utc() {
        assert_eq!(super::rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(super::rfc3339(1_795_305_600_123), "2026-11-22T00:00:00.123Z");
        assert_eq!(super::rfc3339(951_782_400_000), "2000-02-29T00:00:00.000Z");
    }
}
