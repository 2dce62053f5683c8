//! `CNI_ARGS`: `KEY=VALUE` pairs separated by `;`, as kubelet and containerd set them.

use std::collections::BTreeMap;

use crate::{CniError, Code};

/// `CNI_ARGS` key of the pod's name.
pub const K8S_POD_NAME: &str = "K8S_POD_NAME";
/// `CNI_ARGS` key of the pod's namespace.
pub const K8S_POD_NAMESPACE: &str = "K8S_POD_NAMESPACE";
/// `CNI_ARGS` key of the pod's UID.
pub const K8S_POD_UID: &str = "K8S_POD_UID";
/// `CNI_ARGS` key of the pod's sandbox (infra) container id.
pub const K8S_POD_INFRA_CONTAINER_ID: &str = "K8S_POD_INFRA_CONTAINER_ID";
/// `CNI_ARGS` key of the addresses a runtime asks for (podman's `--ip`): one per
/// family, comma-separated, each with or without a prefix. See [`crate::request`].
pub const IP: &str = "IP";
/// `CNI_ARGS` key of the MAC a runtime asks for on the pod's interface (podman's
/// `--mac-address`). See [`crate::request`].
pub const MAC: &str = "MAC";

/// Parses `CNI_ARGS` into a map. Unknown keys are kept (weft ignores what it does not
/// use, as `IgnoreUnknown=1` asks); a pair without `=` or with an empty key is an
/// invalid environment variable (code 4).
pub fn parse_cni_args(raw: &str) -> Result<BTreeMap<String, String>, CniError> {
    let mut out = BTreeMap::new();
    for pair in raw.split(';').filter(|p| !p.is_empty()) {
        let Some((k, v)) = pair.split_once('=') else {
            return Err(CniError::new(
                Code::InvalidEnv,
                format!("CNI_ARGS: invalid pair {pair:?}, expected KEY=VALUE"),
            ));
        };
        if k.is_empty() {
            return Err(CniError::new(
                Code::InvalidEnv,
                format!("CNI_ARGS: empty key in {pair:?}"),
            ));
        }
        out.insert(k.to_string(), v.to_string());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubelet_style_args_parse() {
        let m = parse_cni_args(
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0;K8S_POD_INFRA_CONTAINER_ID=abc;K8S_POD_UID=u-1",
        )
        .unwrap();
        assert_eq!(m[K8S_POD_NAME], "web-0");
        assert_eq!(m[K8S_POD_NAMESPACE], "default");
        assert_eq!(m[K8S_POD_UID], "u-1");
        assert_eq!(m["IgnoreUnknown"], "1");
    }

    #[test]
    fn empty_args_and_trailing_separator_are_fine() {
        assert!(parse_cni_args("").unwrap().is_empty());
        assert_eq!(parse_cni_args("A=1;").unwrap().len(), 1);
    }

    #[test]
    fn value_may_contain_equals() {
        assert_eq!(parse_cni_args("A=b=c").unwrap()["A"], "b=c");
    }

    #[test]
    fn podman_style_requests_are_kept_for_the_daemon() {
        let m = parse_cni_args("IgnoreUnknown=1;IP=10.88.0.7;MAC=0a:58:0a:58:00:07").unwrap();
        assert_eq!(m[IP], "10.88.0.7");
        assert_eq!(m[MAC], "0a:58:0a:58:00:07");
    }

    #[test]
    fn malformed_pairs_are_code_4() {
        assert_eq!(parse_cni_args("A=1;garbage").unwrap_err().code, Code::InvalidEnv);
        assert_eq!(parse_cni_args("=1").unwrap_err().code, Code::InvalidEnv);
    }
}
