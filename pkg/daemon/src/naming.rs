//! Names and MAC addresses derived from an attachment, so they are stable across
//! retries and restarts and need no coordination.

use sha2::{Digest, Sha256};

fn digest(container_id: &str, ifname: &str) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(container_id.as_bytes());
    h.update(b"/");
    h.update(ifname.as_bytes());
    h.finalize().into()
}

/// Name of the host end of a pod's veth: `weft` and 11 hex digits of a hash of the
/// container id and interface name (15 bytes, the kernel's limit).
pub fn host_ifname(container_id: &str, ifname: &str) -> String {
    let d = digest(container_id, ifname);
    let hex: String = d.iter().map(|b| format!("{b:02x}")).collect();
    format!("weft{}", &hex[..11])
}

/// MACs of the host and pod ends: locally administered unicast, from the same hash.
pub fn macs(container_id: &str, ifname: &str) -> ([u8; 6], [u8; 6]) {
    let d = digest(container_id, ifname);
    let host = [0x02, d[16], d[17], d[18], d[19], d[20]];
    let pod = [0x0a, d[21], d[22], d[23], d[24], d[25]];
    (host, pod)
}

/// `aa:bb:cc:dd:ee:ff`.
pub fn mac_string(mac: &[u8; 6]) -> String {
    mac.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_names_fit_ifnamsiz_and_are_stable() {
        let a = host_ifname(
            "3764257de70aaf34369dcb034d81869176c6c2938b3ee4c78f518ec96cc759d9",
            "eth0",
        );
        assert_eq!(a.len(), 15);
        assert!(a.starts_with("weft"));
        assert_eq!(
            a,
            host_ifname(
                "3764257de70aaf34369dcb034d81869176c6c2938b3ee4c78f518ec96cc759d9",
                "eth0"
            )
        );
        assert_ne!(
            a,
            host_ifname(
                "3764257de70aaf34369dcb034d81869176c6c2938b3ee4c78f518ec96cc759d9",
                "net1"
            )
        );
    }

    #[test]
    fn macs_are_local_unicast() {
        let (h, p) = macs("c", "eth0");
        for m in [h, p] {
            assert_eq!(m[0] & 0x01, 0, "unicast");
            assert_eq!(m[0] & 0x02, 0x02, "locally administered");
        }
        assert_ne!(h, p);
        assert_eq!(mac_string(&[2, 0, 0xab, 1, 2, 3]), "02:00:ab:01:02:03");
    }
}
