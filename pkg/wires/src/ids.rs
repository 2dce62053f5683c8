//! Identities derived from a link, so both nodes compute the same ones without asking
//! each other and a restarted daemon finds the same ones again.

use sha2::{Digest, Sha256};

fn digest(parts: &[&str]) -> [u8; 32] {
    let mut h = Sha256::new();
    for p in parts {
        h.update(p.as_bytes());
        h.update([0]);
    }
    h.finalize().into()
}

/// The wire id of one end: from (namespace, link uid, pod). Frames on a gRPC stream
/// are tagged with the receiving end's id; an id nobody holds is dropped, so a frame
/// can never reach another wire.
pub fn wire_id(namespace: &str, uid: i64, pod: &str) -> u64 {
    let d = digest(&["wire", namespace, &uid.to_string(), pod]);
    u64::from_be_bytes(d[..8].try_into().expect("8 bytes")).max(1)
}

/// The VNI a link tries first: 24 bits derived from (namespace, uid), never 0.
/// Collisions are resolved by the nodes agreeing on the next free one.
pub fn derived_vni(namespace: &str, uid: i64) -> u32 {
    let d = digest(&["vni", namespace, &uid.to_string()]);
    let v = u32::from_be_bytes([0, d[0], d[1], d[2]]);
    if v == 0 { 1 } else { v }
}

/// The VNI tried after `vni` when it is taken.
pub fn next_vni(vni: u32) -> u32 {
    if vni >= 0x00ff_ffff { 1 } else { vni + 1 }
}

/// The MAC of a pod's wire interface when the Topology gives none: locally
/// administered unicast, from (namespace, pod, interface), so the peer knows it too.
pub fn derived_mac(namespace: &str, pod: &str, intf: &str) -> [u8; 6] {
    let d = digest(&["mac", namespace, pod, intf]);
    [0x0a, d[0], d[1], d[2], d[3], d[4]]
}

/// Parses `aa:bb:cc:dd:ee:ff`.
pub fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let mut out = [0u8; 6];
    let mut parts = s.split(':');
    for b in &mut out {
        *b = u8::from_str_radix(parts.next()?, 16).ok()?;
    }
    parts.next().is_none().then_some(out)
}

/// The bits of a wire id a link detour's interface names keep.
pub(crate) const DETOUR_ID_BITS: u64 = (1 << 52) - 1;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_stable_distinct_and_nonzero() {
        assert_eq!(wire_id("lab", 1, "r1"), wire_id("lab", 1, "r1"));
        assert_ne!(wire_id("lab", 1, "r1"), wire_id("lab", 1, "r2"));
        assert_ne!(wire_id("lab", 1, "r1"), wire_id("lab2", 1, "r1"));
        assert_ne!(wire_id("lab", 1, "r1"), wire_id("lab", 2, "r1"));
        let v = derived_vni("lab", 7);
        assert!(v > 0 && v <= 0x00ff_ffff);
        assert_eq!(next_vni(0x00ff_ffff), 1);
    }

    #[test]
    fn macs() {
        let m = derived_mac("lab", "r1", "eth1");
        assert_eq!(m[0] & 0x03, 0x02, "locally administered unicast");
        assert_eq!(parse_mac("02:00:0a:0B:ff:01"), Some([2, 0, 10, 11, 255, 1]));
        assert_eq!(parse_mac("02:00:0a:0b:ff"), None);
        assert_eq!(parse_mac("02:00:0a:0b:ff:01:02"), None);
    }
}
