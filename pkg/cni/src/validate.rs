//! Checks on the runtime-provided identifiers, done before anything is touched.

use rscni_types::types::{ContainerId, InterfaceName};

use crate::{CniError, Code};

/// Longest container id weft accepts; runtimes use 64 hex digits.
pub const MAX_CONTAINER_ID: usize = 256;

/// Checks `CNI_CONTAINERID`: non-empty, alphanumerics plus `_ . -`, bounded length.
pub fn container_id(id: &str) -> Result<(), CniError> {
    if id.len() > MAX_CONTAINER_ID {
        return Err(CniError::new(
            Code::InvalidEnv,
            format!(
                "CNI_CONTAINERID is {} bytes long, at most {MAX_CONTAINER_ID} allowed",
                id.len()
            ),
        ));
    }
    ContainerId::try_from(id.to_string())
        .map(|_| ())
        .map_err(|e| CniError::new(Code::InvalidEnv, format!("CNI_CONTAINERID: {}", e.details())))
}

/// Checks `CNI_IFNAME` against the kernel's rules: 1-15 bytes, no `/`, `:` or whitespace.
pub fn ifname(name: &str) -> Result<(), CniError> {
    InterfaceName::try_from(name.to_string())
        .map(|_| ())
        .map_err(|e| CniError::new(Code::InvalidEnv, format!("CNI_IFNAME {name:?}: {}", e.details())))
}

/// Checks the form of `CNI_NETNS`: an absolute path. Whether it names a network
/// namespace is checked when it is opened.
pub fn netns_path(path: &str) -> Result<(), CniError> {
    if !path.starts_with('/') {
        return Err(CniError::new(
            Code::InvalidNetns,
            format!("CNI_NETNS {path:?} is not an absolute path"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interface_names() {
        assert!(ifname("eth0").is_ok());
        assert!(ifname("a23456789012345").is_ok());
        for bad in ["", "a234567890123456", "et/h0", "eth 0", "eth\t0", "a:b"] {
            assert_eq!(ifname(bad).unwrap_err().code, Code::InvalidEnv, "{bad:?}");
        }
    }

    #[test]
    fn container_ids() {
        assert!(container_id("3764257de70aaf34369dcb034d81869176c6c2938b3ee4c78f518ec96cc759d9").is_ok());
        assert!(container_id("pod_1.a-b").is_ok());
        for bad in ["", "a/b", "a b", "-x"] {
            assert_eq!(container_id(bad).unwrap_err().code, Code::InvalidEnv, "{bad:?}");
        }
        assert!(container_id(&"a".repeat(MAX_CONTAINER_ID + 1)).is_err());
    }

    #[test]
    fn netns_must_be_absolute() {
        assert!(netns_path("/run/netns/x").is_ok());
        assert_eq!(netns_path("run/netns/x").unwrap_err().code, Code::InvalidNetns);
    }
}
