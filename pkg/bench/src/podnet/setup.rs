//! Reading a node's network setup (sysctls, device attributes, offloads) and comparing
//! weft's path with the hand-made one, so the reference is set up as weft's own path is.

use std::process::Command;

use super::{PathLab, PodMode, REF_DEVICE, ip_json};

pub(super) fn sysctl(ns: &str, setting: &str) -> Result<(), String> {
    let out = Command::new("ip")
        .args(["netns", "exec", ns, "sysctl", "-qw", setting])
        .output()
        .map_err(|e| format!("running sysctl: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "sysctl {setting} in {ns}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// A device as `ip -d -j link` describes it, without what names it (name, index, MAC).
pub(super) fn device_attributes(ns: &str, dev: &str) -> Result<serde_json::Map<String, serde_json::Value>, String> {
    let v = ip_json(&["-d", "-n", ns, "link", "show", "dev", dev])?;
    let mut m = v[0].as_object().cloned().ok_or_else(|| format!("no {dev} in {ns}"))?;
    for k in ["ifindex", "ifname", "address", "link_netnsid", "link_index"] {
        m.remove(k);
    }
    Ok(m)
}

/// `ethtool -k` of a device, without its name line; `None` without ethtool.
pub(super) fn offloads(ns: &str, dev: &str) -> Option<Vec<String>> {
    let out = Command::new("ip")
        .args(["netns", "exec", ns, "ethtool", "-k", dev])
        .output()
        .ok()?;
    out.status.success().then(|| {
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .skip(1)
            .map(str::to_string)
            .collect()
    })
}

pub(super) fn differences(what: &str, a: &[(String, String)], b: &[(String, String)]) -> Vec<String> {
    let mut out = Vec::new();
    for (k, va) in a {
        let vb = b.iter().find(|(kb, _)| kb == k).map(|(_, v)| v.as_str());
        if vb != Some(va.as_str()) {
            out.push(format!("{what} {k}: weft {va}, kernel {}", vb.unwrap_or("-")));
        }
    }
    for (k, vb) in b {
        if !a.iter().any(|(ka, _)| ka == k) {
            out.push(format!("{what} {k}: weft -, kernel {vb}"));
        }
    }
    out
}

pub(super) fn flatten(prefix: &str, v: &serde_json::Value, out: &mut Vec<(String, String)>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, x) in m {
                flatten(&format!("{prefix}{k}."), x, out);
            }
        }
        x => out.push((prefix.trim_end_matches('.').to_string(), x.to_string())),
    }
}

/// What differs between weft's set-up and the hand-made one of the same mode: pod MTU,
/// and for VXLAN the device's attributes and offloads. Returns them and whether the
/// offloads were compared.
pub(super) fn compare_setups(weft: &PathLab, kernel: &PathLab) -> Result<(Vec<String>, bool), String> {
    let mode = match weft.path.mode() {
        PodMode::Direct => "direct",
        PodMode::Vxlan => "VXLAN",
        PodMode::Bgp => "BGP",
    };
    let mut out = Vec::new();
    let (mw, mk) = (weft.pod_mtu(), kernel.pod_mtu());
    if mw != mk {
        out.push(format!("{mode}: pod MTU weft {mw}, kernel {mk}"));
    }
    if weft.path.mode() != PodMode::Vxlan {
        return Ok((out, true));
    }
    let (nw, nk) = (weft.guard.lab.node_ns("n1"), kernel.guard.lab.node_ns("n1"));
    let (dw, dk) = (
        device_attributes(&nw, "weft-vxlan")?,
        device_attributes(&nk, REF_DEVICE)?,
    );
    let (mut fw, mut fk) = (Vec::new(), Vec::new());
    flatten("", &serde_json::Value::Object(dw), &mut fw);
    flatten("", &serde_json::Value::Object(dk), &mut fk);
    out.extend(differences("VXLAN device", &fw, &fk));
    let compared = match (offloads(&nw, "weft-vxlan"), offloads(&nk, REF_DEVICE)) {
        (Some(a), Some(b)) => {
            let pairs = |v: Vec<String>| -> Vec<(String, String)> {
                v.iter()
                    .filter_map(|l| l.split_once(':'))
                    .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
                    .collect()
            };
            out.extend(differences("VXLAN offload", &pairs(a), &pairs(b)));
            true
        }
        _ => false,
    };
    Ok((out, compared))
}
