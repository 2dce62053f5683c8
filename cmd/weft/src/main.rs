//! `weft`, the CNI plugin. It runs once per pod and does three things only: parse
//! what the runtime gave it (environment and stdin), relay it to weftd over the UNIX
//! socket, and print the answer. VERSION is answered here. It has no networking logic.
//! A DEL weftd cannot be reached for is written to weftd's DEL spool and answered
//! with success (`weft_cni::spool`).

use std::io::{Read, Write};
use std::path::Path;
use std::process::ExitCode;

use weft_cni::conf::{self, PluginConfig};
use weft_cni::{Cmd, CniError, Code, spool, version};
use weft_rpc::cnirpc::CniArgs;
use weft_rpc::cnirpc::cni_client::CniClient;
use weft_rpc::{DialOptions, UnixConnection, cni_error_from_status, connect_unix};

/// How long a DEL keeps trying to connect to a restarting weftd before it spools the
/// DEL instead: well inside a second, so teardown never waits on a down daemon.
const DEL_CONNECT_WINDOW: std::time::Duration = std::time::Duration::from_millis(300);

fn main() -> ExitCode {
    let command = std::env::var("CNI_COMMAND").unwrap_or_default();
    if command.is_empty() {
        eprintln!(
            "weft CNI plugin {}\nCNI protocol versions supported: {}",
            env!("CARGO_PKG_VERSION"),
            version::SUPPORTED.join(", ")
        );
        return ExitCode::SUCCESS;
    }
    let mut stdin = Vec::new();
    let read = std::io::stdin()
        .take(conf::MAX_CONFIG_BYTES as u64 + 1)
        .read_to_end(&mut stdin);
    let reported_version = conf::declared_version(&stdin);
    let outcome = match read {
        Ok(_) => run(&command, stdin),
        Err(e) => Err(CniError::new(Code::IoFailure, format!("reading stdin: {e}"))),
    };
    let out = std::io::stdout();
    let mut out = out.lock();
    match outcome {
        Ok(bytes) => {
            if out.write_all(&bytes).and_then(|()| out.flush()).is_err() {
                return ExitCode::FAILURE;
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            let _ = out.write_all(&e.to_json(&reported_version));
            let _ = out.flush();
            ExitCode::FAILURE
        }
    }
}

/// Which `CNI_*` variables a command cannot do without.
fn required_env(cmd: Cmd) -> &'static [&'static str] {
    match cmd {
        Cmd::Add | Cmd::Check => &["CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_PATH"],
        Cmd::Del => &["CNI_CONTAINERID", "CNI_IFNAME", "CNI_PATH"],
        Cmd::Gc | Cmd::Status | Cmd::Version => &[],
    }
}

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_default()
}

fn run(command: &str, stdin: Vec<u8>) -> Result<Vec<u8>, CniError> {
    let cmd: Cmd = command
        .parse()
        .map_err(|_| CniError::new(Code::InvalidEnv, format!("unknown CNI_COMMAND: {command}")))?;
    if cmd == Cmd::Version {
        return Ok(version::version_json());
    }
    let cfg = PluginConfig::parse(&stdin, cmd)?;
    let missing: Vec<&str> = required_env(cmd)
        .iter()
        .copied()
        .filter(|v| std::env::var_os(v).is_none_or(|x| x.is_empty()))
        .collect();
    if !missing.is_empty() {
        return Err(CniError::new(
            Code::InvalidEnv,
            format!("required env variables [{}] missing", missing.join(",")),
        ));
    }
    let args = CniArgs {
        container_id: env("CNI_CONTAINERID"),
        netns: env("CNI_NETNS"),
        ifname: env("CNI_IFNAME"),
        args: weft_cni::parse_cni_args(&env("CNI_ARGS"))?.into_iter().collect(),
        path: env("CNI_PATH"),
        stdin_data: stdin,
    };
    if matches!(cmd, Cmd::Add | Cmd::Check | Cmd::Del) {
        weft_cni::validate::container_id(&args.container_id)?;
        weft_cni::validate::ifname(&args.ifname)?;
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
        .map_err(|e| CniError::new(Code::Internal, format!("starting the plugin runtime: {e}")))?;
    match runtime.block_on(relay(cmd, &cfg.socket, args.clone())) {
        Ok(bytes) => Ok(bytes),
        Err(Failed::Answered(e)) => Err(e),
        // DEL never waits for a down daemon: it is recorded for weftd to replay
        // before it serves again, and the runtime may go on tearing the pod down.
        Err(Failed::Unreachable(e)) if cmd == Cmd::Del => spool_del(&cfg, &args, e),
        Err(Failed::Unreachable(e)) => Err(e),
    }
}

/// Records a DEL weftd could not be reached for in its spool; the DEL succeeds once
/// it is recorded. If even that fails, the runtime gets the original error and retries.
fn spool_del(cfg: &PluginConfig, args: &CniArgs, unreachable: CniError) -> Result<Vec<u8>, CniError> {
    let del = spool::SpooledDel {
        network: cfg.name.clone(),
        container_id: args.container_id.clone(),
        ifname: args.ifname.clone(),
        netns: args.netns.clone(),
        args: args.args.clone().into_iter().collect(),
        config: String::from_utf8_lossy(&args.stdin_data).into_owned(),
        spooled_at_ms: spool::now_ms(),
    };
    let dir = spool::dir_for_socket(Path::new(&cfg.socket));
    // Tests hold the plugin here to land the file at a moment of their choosing.
    weft_failpoint::pause!("plugin.spool");
    match spool::write(&dir, &del) {
        Ok(path) => {
            // stderr goes to the runtime's log; stdout stays the (empty) DEL answer.
            eprintln!(
                "weft: {}; DEL recorded in {} for weftd to replay",
                unreachable.msg,
                path.display()
            );
            Ok(Vec::new())
        }
        Err(e) => Err(CniError::new(
            unreachable.code,
            format!("{}; and the DEL could not be spooled: {e}", unreachable.msg),
        )),
    }
}

/// Why a relayed call failed: weftd answered with an error, or never answered.
enum Failed {
    /// weftd judged the call and refused it.
    Answered(CniError),
    /// weftd could not be reached or did not answer (gone, restarting, timed out).
    Unreachable(CniError),
}

/// The W3C `traceparent` the call carries: the runtime's (`TRACEPARENT`) when it gave
/// a valid one, so the call joins its trace; otherwise a new trace.
fn traceparent() -> String {
    if let Ok(tp) = std::env::var("TRACEPARENT")
        && valid_traceparent(&tp)
    {
        return tp;
    }
    let mut b = [0u8; 24];
    fill_random(&mut b);
    if b[..16].iter().all(|&x| x == 0) || b[16..].iter().all(|&x| x == 0) {
        // All-zero ids are invalid (a chance of 2^-64 at most): derive something unique
        // enough from the clock and pid instead.
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos());
        b[..16].copy_from_slice(&t.to_be_bytes());
        b[16..20].copy_from_slice(&std::process::id().to_be_bytes());
        b[20..].copy_from_slice(&[0, 0, 0, 1]);
    }
    let hex = |x: &[u8]| x.iter().map(|v| format!("{v:02x}")).collect::<String>();
    format!("00-{}-{}-01", hex(&b[..16]), hex(&b[16..]))
}

/// Fills `buf` with random bytes: SipHash outputs under the random keys std draws from
/// the kernel once per process (one getrandom(2) call the plugin makes anyway). The
/// `getrandom` crate was dropped for this: in the static plugin it cannot find glibc's
/// wrapper and falls back to polling `/dev/random` and reading `/dev/urandom`, four
/// system calls on every CNI call. Trace and span ids need to be unique and
/// unpredictable enough, not secret.
fn fill_random(buf: &mut [u8]) {
    use std::hash::{BuildHasher, Hasher};
    let keys = std::collections::hash_map::RandomState::new();
    for (i, chunk) in buf.chunks_mut(8).enumerate() {
        let mut h = keys.build_hasher();
        h.write_usize(i);
        chunk.copy_from_slice(&h.finish().to_le_bytes()[..chunk.len()]);
    }
}

/// `00-<32 hex trace id>-<16 hex span id>-<2 hex flags>`, ids not all zero.
fn valid_traceparent(tp: &str) -> bool {
    let parts: Vec<&str> = tp.split('-').collect();
    let hex = |s: &str, n: usize| s.len() == n && s.bytes().all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase());
    parts.len() == 4
        && hex(parts[0], 2)
        && parts[0] != "ff"
        && hex(parts[1], 32)
        && parts[1].bytes().any(|c| c != b'0')
        && hex(parts[2], 16)
        && parts[2].bytes().any(|c| c != b'0')
        && hex(parts[3], 2)
}

async fn relay(cmd: Cmd, socket: &str, args: CniArgs) -> Result<Vec<u8>, Failed> {
    let unreachable_code = if cmd == Cmd::Status {
        Code::NotAvailable
    } else {
        Code::TryAgainLater
    };
    let mut opts = DialOptions::default();
    if cmd == Cmd::Del {
        // A DEL that cannot connect is spooled, not failed: wait less for a restart.
        opts.connect_window = DEL_CONNECT_WINDOW;
    }
    let conn = connect_unix(Path::new(socket), &opts).await.map_err(|e| {
        Failed::Unreachable(CniError::new(
            unreachable_code,
            format!("cannot reach weftd at {socket}: {}", source_chain(&e)),
        ))
    })?;
    let mut client = CniClient::with_origin(conn, UnixConnection::origin());
    let mut request = tonic::Request::new(args);
    if let Ok(v) = traceparent().parse() {
        request.metadata_mut().insert("traceparent", v);
    }
    let call = async {
        match cmd {
            Cmd::Add => client.add(request).await.map(|r| r.into_inner().result),
            Cmd::Del => client.del(request).await.map(|_| Vec::new()),
            Cmd::Check => client.check(request).await.map(|_| Vec::new()),
            Cmd::Status => client.status(request).await.map(|_| Vec::new()),
            Cmd::Gc => client.gc(request).await.map(|_| Vec::new()),
            Cmd::Version => unreachable!("answered locally"),
        }
    };
    let outcome = tokio::time::timeout(opts.call_timeout, call).await.unwrap_or_else(|_| {
        Err(tonic::Status::deadline_exceeded(format!(
            "no answer within {:?}",
            opts.call_timeout
        )))
    });
    outcome.map_err(|status| status_to_cni(&status, socket, unreachable_code))
}

/// Turns a failed call back into the CNI error the daemon meant, or, when the daemon
/// never answered (gone, restarting, timed out), into "try again later".
fn status_to_cni(status: &tonic::Status, socket: &str, unreachable_code: Code) -> Failed {
    if let Some(e) = cni_error_from_status(status) {
        return Failed::Answered(e);
    }
    match status.code() {
        tonic::Code::Unavailable | tonic::Code::Cancelled | tonic::Code::DeadlineExceeded | tonic::Code::Unknown => {
            Failed::Unreachable(CniError::new(
                unreachable_code,
                format!(
                    "weftd at {socket} did not answer ({:?}): {}",
                    status.code(),
                    status.message()
                ),
            ))
        }
        other => Failed::Answered(CniError::new(
            Code::Internal,
            format!("weftd at {socket} failed the call ({other:?}): {}", status.message()),
        )),
    }
}

fn source_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_traceparents_are_valid_and_distinct() {
        let (a, b) = (traceparent(), traceparent());
        assert!(valid_traceparent(&a), "{a}");
        assert_ne!(a, b);
    }

    #[test]
    fn traceparent_validation() {
        assert!(valid_traceparent(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        ));
        for bad in [
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "garbage",
        ] {
            assert!(!valid_traceparent(bad), "{bad}");
        }
    }
}
