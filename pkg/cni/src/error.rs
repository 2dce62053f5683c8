//! CNI errors and the codes weft uses. `docs/errors.md` documents the same table;
//! a test keeps the two in step.

use serde::Serialize;

/// The error codes weft answers with: the spec's well-known codes and weft's own
/// (100 and up).
pub mod code {
    /// The config's `cniVersion` is missing, unknown, or does not allow the command.
    pub const INCOMPATIBLE_VERSION: u32 = 1;
    /// The config holds a field weft does not support (for example `ipam`).
    pub const UNSUPPORTED_FIELD: u32 = 2;
    /// The container (attachment) is unknown to weft.
    pub const UNKNOWN_CONTAINER: u32 = 3;
    /// A required `CNI_*` variable is missing or invalid.
    pub const INVALID_ENV: u32 = 4;
    /// Reading input or writing output failed.
    pub const IO_FAILURE: u32 = 5;
    /// The config on stdin is not valid JSON for a CNI network configuration.
    pub const DECODE: u32 = 6;
    /// The config is well-formed but its values are invalid.
    pub const INVALID_CONFIG: u32 = 7;
    /// `CNI_NETNS` does not exist or is not a network namespace.
    pub const INVALID_NETNS: u32 = 8;
    /// The daemon is unreachable, restarting or busy: the runtime should retry.
    pub const TRY_AGAIN_LATER: u32 = 11;
    /// STATUS: the plugin cannot serve ADD requests now.
    pub const NOT_AVAILABLE: u32 = 50;
    /// An unexpected internal failure in the daemon.
    pub const INTERNAL: u32 = 100;
    /// Every configured range of an address family is fully allocated.
    pub const RANGE_EXHAUSTED: u32 = 101;
    /// A kernel (netlink, sysctl, namespace) operation failed.
    pub const KERNEL: u32 = 102;
    /// The state store failed.
    pub const STORE: u32 = 103;
    /// CHECK found the pod's networking different from what weft set up.
    pub const CHECK_FAILED: u32 = 104;
    /// The interface name requested for the pod already exists in its namespace.
    pub const INTERFACE_EXISTS: u32 = 105;
    /// A host port the pod asks for is held by another pod.
    pub const HOST_PORT_IN_USE: u32 = 106;
    /// The address the runtime asks for is held by another attachment.
    pub const ADDRESS_IN_USE: u32 = 107;
    /// A route the attachment would install exists in the pod already (another
    /// network of the pod installed it).
    pub const ROUTE_EXISTS: u32 = 108;

    /// Every code above with its short name, in order: the source of `docs/errors.md`.
    pub const ALL: &[(u32, &str)] = &[
        (INCOMPATIBLE_VERSION, "incompatible CNI version"),
        (UNSUPPORTED_FIELD, "unsupported field in network configuration"),
        (UNKNOWN_CONTAINER, "unknown container"),
        (INVALID_ENV, "invalid necessary environment variables"),
        (IO_FAILURE, "I/O failure"),
        (DECODE, "failed to decode content"),
        (INVALID_CONFIG, "invalid network config"),
        (INVALID_NETNS, "invalid network namespace"),
        (TRY_AGAIN_LATER, "try again later"),
        (NOT_AVAILABLE, "plugin not available"),
        (INTERNAL, "internal error"),
        (RANGE_EXHAUSTED, "address range exhausted"),
        (KERNEL, "kernel operation failed"),
        (STORE, "state store failure"),
        (CHECK_FAILED, "check failed"),
        (INTERFACE_EXISTS, "interface already exists"),
        (HOST_PORT_IN_USE, "host port in use"),
        (ADDRESS_IN_USE, "requested address in use"),
        (ROUTE_EXISTS, "route already exists"),
    ];

    /// The short name of `code`, or "error" for a code weft does not define.
    pub fn name(code: u32) -> &'static str {
        ALL.iter().find(|(c, _)| *c == code).map_or("error", |(_, n)| n)
    }
}

/// A CNI error as the spec defines it: a code, a short message and details.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{msg}: {details} (CNI code {code})")]
pub struct CniError {
    /// The CNI error code (see [`code`]).
    pub code: u32,
    /// A short message characterizing the error.
    pub msg: String,
    /// A longer description: what exactly was wrong and, where possible, what to do.
    pub details: String,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ErrorJson<'a> {
    cni_version: &'a str,
    code: u32,
    msg: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    details: &'a str,
}

impl CniError {
    /// An error with `code`, the code's standard short message, and `details`.
    pub fn new(code: u32, details: impl Into<String>) -> Self {
        Self {
            code,
            msg: code::name(code).to_string(),
            details: details.into(),
        }
    }

    /// The error JSON the spec prescribes, reported under `cni_version`.
    pub fn to_json(&self, cni_version: &str) -> Vec<u8> {
        serde_json::to_vec(&ErrorJson {
            cni_version,
            code: self.code,
            msg: &self.msg,
            details: &self.details,
        })
        .unwrap_or_else(|_| b"{\"code\":100,\"msg\":\"internal error\"}".to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_json_has_the_spec_shape() {
        let e = CniError::new(code::INVALID_ENV, "required env variables [CNI_NETNS] missing");
        let v: serde_json::Value = serde_json::from_slice(&e.to_json("1.1.0")).unwrap();
        assert_eq!(v["cniVersion"], "1.1.0");
        assert_eq!(v["code"], 4);
        assert_eq!(v["msg"], "invalid necessary environment variables");
        assert_eq!(v["details"], "required env variables [CNI_NETNS] missing");
    }

    #[test]
    fn empty_details_are_omitted() {
        let e = CniError::new(code::INTERNAL, "");
        let v: serde_json::Value = serde_json::from_slice(&e.to_json("0.4.0")).unwrap();
        assert!(v.get("details").is_none());
    }

    #[test]
    fn codes_are_unique_and_weft_codes_are_at_least_100() {
        let mut seen = std::collections::HashSet::new();
        for (c, _) in code::ALL {
            assert!(seen.insert(*c), "duplicate code {c}");
        }
        for c in [code::INTERNAL, code::RANGE_EXHAUSTED, code::KERNEL, code::STORE] {
            assert!(c >= 100);
        }
    }

    #[test]
    fn docs_table_lists_every_code() {
        let doc = include_str!("../../../docs/errors.md");
        for (c, name) in code::ALL {
            let row = format!("| {c} | {name} |");
            assert!(doc.contains(&row), "docs/errors.md lacks the row `{row}`");
        }
    }
}
