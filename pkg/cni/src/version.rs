//! CNI spec versions weft speaks and the VERSION answer.

use serde::Serialize;

pub use rscni_types::version::SpecVersion;

use crate::{CniError, Code};
use rscni_types::types::Cmd;

/// The spec versions weft accepts in a network configuration, oldest first.
pub const SUPPORTED: [&str; 5] = ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];

/// The version weft reports as its own.
pub const CURRENT: &str = "1.1.0";

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct VersionJson<'a> {
    cni_version: &'a str,
    supported_versions: &'a [&'a str],
}

/// The JSON answer to the VERSION command.
pub fn version_json() -> Vec<u8> {
    serde_json::to_vec(&VersionJson {
        cni_version: CURRENT,
        supported_versions: &SUPPORTED,
    })
    .expect("static data serializes")
}

/// Checks the config's declared `cniVersion` against what weft supports and what
/// `cmd` requires, and returns it parsed.
pub fn negotiate(declared: &str, cmd: Cmd) -> Result<SpecVersion, CniError> {
    if declared.is_empty() {
        return Err(CniError::new(
            Code::IncompatibleVersion,
            format!("cniVersion is missing; weft supports {SUPPORTED:?}"),
        ));
    }
    if !SUPPORTED.contains(&declared) {
        return Err(CniError::new(
            Code::IncompatibleVersion,
            format!("config is {declared:?}, weft supports {SUPPORTED:?}"),
        ));
    }
    let version: SpecVersion = declared
        .parse()
        .map_err(|_| CniError::new(Code::IncompatibleVersion, format!("invalid cniVersion {declared:?}")))?;
    version.allows(cmd).map_err(|_| {
        CniError::new(
            Code::IncompatibleVersion,
            format!("config version {declared} does not allow {}", <&str>::from(cmd)),
        )
    })?;
    Ok(version)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_supported_version_negotiates_for_add() {
        for v in SUPPORTED {
            assert_eq!(negotiate(v, Cmd::Add).unwrap().to_string(), v);
        }
    }

    #[test]
    fn missing_unknown_and_malformed_versions_are_code_1() {
        for v in ["", "9.9.9", "0.2.0", "abc", "1.1"] {
            assert_eq!(
                negotiate(v, Cmd::Add).unwrap_err().code,
                Code::IncompatibleVersion,
                "{v}"
            );
        }
    }

    #[test]
    fn check_needs_0_4_and_gc_status_need_1_1() {
        assert_eq!(
            negotiate("0.3.1", Cmd::Check).unwrap_err().code,
            Code::IncompatibleVersion
        );
        assert!(negotiate("0.4.0", Cmd::Check).is_ok());
        assert_eq!(negotiate("1.0.0", Cmd::Gc).unwrap_err().code, Code::IncompatibleVersion);
        assert_eq!(
            negotiate("1.0.0", Cmd::Status).unwrap_err().code,
            Code::IncompatibleVersion
        );
        assert!(negotiate("1.1.0", Cmd::Status).is_ok());
    }

    #[test]
    fn version_answer_lists_the_supported_versions() {
        let v: serde_json::Value = serde_json::from_slice(&version_json()).unwrap();
        assert_eq!(v["cniVersion"], CURRENT);
        assert_eq!(v["supportedVersions"].as_array().unwrap().len(), SUPPORTED.len());
    }
}
