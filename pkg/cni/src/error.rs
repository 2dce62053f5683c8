//! CNI errors and the codes weft uses, shared by the plugin and the daemon. `docs/errors.md` documents the same table;
//! a test keeps the two in step.

use serde::Serialize;

/// The error codes weft answers with: the spec's well-known codes and weft's own (100
/// and up). Matches over it inside this crate are exhaustive, so a new code must be
/// given its number, name and class here before anything builds; other crates match
/// on [`Code::class`].
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(u32)]
pub enum Code {
    /// The config's `cniVersion` is missing, unknown, or does not allow the command.
    IncompatibleVersion = 1,
    /// The config holds a field weft does not support (for example `ipam`).
    UnsupportedField = 2,
    /// The container (attachment) is unknown to weft.
    UnknownContainer = 3,
    /// A required `CNI_*` variable is missing or invalid.
    InvalidEnv = 4,
    /// Reading input or writing output failed.
    IoFailure = 5,
    /// The config on stdin is not valid JSON for a CNI network configuration.
    Decode = 6,
    /// The config is well-formed but its values are invalid.
    InvalidConfig = 7,
    /// `CNI_NETNS` does not exist or is not a network namespace.
    InvalidNetns = 8,
    /// The daemon is unreachable, restarting or busy: the runtime should retry.
    TryAgainLater = 11,
    /// STATUS: the plugin cannot serve ADD requests now.
    NotAvailable = 50,
    /// An unexpected internal failure in the daemon.
    Internal = 100,
    /// Every configured range of an address family is fully allocated.
    RangeExhausted = 101,
    /// A kernel (netlink, sysctl, namespace) operation failed.
    Kernel = 102,
    /// The state store failed.
    Store = 103,
    /// CHECK found the pod's networking different from what weft set up.
    CheckFailed = 104,
    /// The interface name requested for the pod already exists in its namespace.
    InterfaceExists = 105,
    /// A host port the pod asks for is held by another pod.
    HostPortInUse = 106,
    /// The address the runtime asks for is held by another attachment.
    AddressInUse = 107,
    /// A route the attachment would install exists in the pod already (another
    /// network of the pod installed it).
    RouteExists = 108,
}

/// What kind of failure a code is, for transports that have codes of their own (gRPC):
/// every [`Code`] has exactly one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// The request itself is wrong: retrying it unchanged fails again.
    InvalidArgument,
    /// What the request names does not exist.
    NotFound,
    /// The daemon cannot serve now: retry later.
    Unavailable,
    /// A resource (addresses) is used up.
    ResourceExhausted,
    /// The state is not what the request expects (CHECK).
    FailedPrecondition,
    /// Something the request would create exists already.
    AlreadyExists,
    /// The daemon or the kernel failed.
    Internal,
}

impl Code {
    /// Every code, in order: the source of `docs/errors.md`.
    pub const ALL: [Code; 19] = [
        Code::IncompatibleVersion,
        Code::UnsupportedField,
        Code::UnknownContainer,
        Code::InvalidEnv,
        Code::IoFailure,
        Code::Decode,
        Code::InvalidConfig,
        Code::InvalidNetns,
        Code::TryAgainLater,
        Code::NotAvailable,
        Code::Internal,
        Code::RangeExhausted,
        Code::Kernel,
        Code::Store,
        Code::CheckFailed,
        Code::InterfaceExists,
        Code::HostPortInUse,
        Code::AddressInUse,
        Code::RouteExists,
    ];

    /// The code's number on the wire and in the error JSON.
    pub const fn number(self) -> u32 {
        self as u32
    }

    /// Whether the code is one of the spec's errors about the call's own input (its
    /// config, variables, namespace or stdin: the codes below 11), which a retry of the
    /// same call cannot cure.
    pub const fn is_about_input(self) -> bool {
        self.number() < Code::TryAgainLater.number()
    }

    /// The code with `number`, if weft defines it.
    pub fn from_number(number: u32) -> Option<Code> {
        Self::ALL.into_iter().find(|c| c.number() == number)
    }

    /// The code's standard short message.
    pub const fn name(self) -> &'static str {
        match self {
            Code::IncompatibleVersion => "incompatible CNI version",
            Code::UnsupportedField => "unsupported field in network configuration",
            Code::UnknownContainer => "unknown container",
            Code::InvalidEnv => "invalid necessary environment variables",
            Code::IoFailure => "I/O failure",
            Code::Decode => "failed to decode content",
            Code::InvalidConfig => "invalid network config",
            Code::InvalidNetns => "invalid network namespace",
            Code::TryAgainLater => "try again later",
            Code::NotAvailable => "plugin not available",
            Code::Internal => "internal error",
            Code::RangeExhausted => "address range exhausted",
            Code::Kernel => "kernel operation failed",
            Code::Store => "state store failure",
            Code::CheckFailed => "check failed",
            Code::InterfaceExists => "interface already exists",
            Code::HostPortInUse => "host port in use",
            Code::AddressInUse => "requested address in use",
            Code::RouteExists => "route already exists",
        }
    }

    /// What kind of failure the code is.
    pub const fn class(self) -> Class {
        match self {
            Code::IncompatibleVersion => Class::InvalidArgument,
            Code::UnsupportedField => Class::InvalidArgument,
            Code::UnknownContainer => Class::NotFound,
            Code::InvalidEnv => Class::InvalidArgument,
            Code::IoFailure => Class::Internal,
            Code::Decode => Class::InvalidArgument,
            Code::InvalidConfig => Class::InvalidArgument,
            Code::InvalidNetns => Class::InvalidArgument,
            Code::TryAgainLater => Class::Unavailable,
            Code::NotAvailable => Class::Unavailable,
            Code::Internal => Class::Internal,
            Code::RangeExhausted => Class::ResourceExhausted,
            Code::Kernel => Class::Internal,
            Code::Store => Class::Internal,
            Code::CheckFailed => Class::FailedPrecondition,
            Code::InterfaceExists => Class::AlreadyExists,
            // Internal since before the codes were typed (a catch-all arm then); kept,
            // as the class shows in gRPC metrics and alerts.
            Code::HostPortInUse => Class::Internal,
            Code::AddressInUse => Class::AlreadyExists,
            Code::RouteExists => Class::AlreadyExists,
        }
    }
}

impl std::fmt::Display for Code {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.number())
    }
}

impl Serialize for Code {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u32(self.number())
    }
}

/// A CNI error as the spec defines it: a code, a short message and details.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{msg}: {details} (CNI code {code})")]
pub struct CniError {
    /// The CNI error code.
    pub code: Code,
    /// A short message characterizing the error.
    pub msg: String,
    /// A longer description: what exactly was wrong and, where possible, what to do.
    pub details: String,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ErrorJson<'a> {
    cni_version: &'a str,
    code: Code,
    msg: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    details: &'a str,
}

impl CniError {
    /// An error with `code`, the code's standard short message, and `details`.
    pub fn new(code: Code, details: impl Into<String>) -> Self {
        Self {
            code,
            msg: code.name().to_string(),
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
        let e = CniError::new(Code::InvalidEnv, "required env variables [CNI_NETNS] missing");
        let v: serde_json::Value = serde_json::from_slice(&e.to_json("1.1.0")).unwrap();
        assert_eq!(v["cniVersion"], "1.1.0");
        assert_eq!(v["code"], 4);
        assert_eq!(v["msg"], "invalid necessary environment variables");
        assert_eq!(v["details"], "required env variables [CNI_NETNS] missing");
    }

    #[test]
    fn empty_details_are_omitted() {
        let e = CniError::new(Code::Internal, "");
        let v: serde_json::Value = serde_json::from_slice(&e.to_json("0.4.0")).unwrap();
        assert!(v.get("details").is_none());
    }

    #[test]
    fn codes_are_unique_and_weft_codes_are_at_least_100() {
        let mut seen = std::collections::HashSet::new();
        for c in Code::ALL {
            assert!(seen.insert(c.number()), "duplicate code {c}");
            assert_eq!(Code::from_number(c.number()), Some(c));
        }
        for c in [Code::Internal, Code::RangeExhausted, Code::Kernel, Code::Store] {
            assert!(c.number() >= 100);
        }
        assert_eq!(Code::from_number(9), None);
    }

    #[test]
    fn docs_table_lists_every_code() {
        let doc = include_str!("../../../docs/errors.md");
        for c in Code::ALL {
            let row = format!("| {c} | {} |", c.name());
            assert!(doc.contains(&row), "docs/errors.md lacks the row `{row}`");
        }
        // And no row for a code weft does not define: the table is the enum.
        let rows = doc
            .lines()
            .filter_map(|l| l.strip_prefix("| ")?.split(' ').next()?.parse::<u32>().ok())
            .collect::<Vec<_>>();
        assert_eq!(rows, Code::ALL.map(Code::number), "docs/errors.md's code rows");
    }
}
