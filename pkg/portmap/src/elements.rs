//! Map elements of the host port table, through the kernel crate's nfnetlink element
//! batches ([`weft_kernel::nftset`]): one batch per call, one message per map, so a
//! pod's ports cost the same however many other mappings the maps hold. Here: how a
//! mapping and a hairpin become keys and data.

use std::io;

use weft_kernel::nftset::{self, ElementData, NFPROTO_INET, SetElement, key_addr, key_port};

use crate::{Entries, Hairpin, HostPort, PortmapError, TABLE};

/// The key of a mapping's element: `[daddr .] l4proto . dport`.
pub(crate) fn key(m: &HostPort) -> Vec<u8> {
    let mut k = m.host_ip.map(key_addr).unwrap_or_default();
    k.extend_from_slice(&nftset::key_proto(m.protocol.number()));
    k.extend_from_slice(&key_port(m.host_port));
    k
}

/// The data of a mapping's element: `pod address . pod port`.
pub(crate) fn data(m: &HostPort) -> Vec<u8> {
    let mut d = key_addr(m.container_ip);
    d.extend_from_slice(&key_port(m.container_port));
    d
}

/// The key of a hairpin element: `ifname . address`, the name NUL-padded to IFNAMSIZ.
pub(crate) fn hairpin_key(h: &Hairpin) -> Vec<u8> {
    let mut k = nftset::key_ifname(&h.ifname);
    k.extend(key_addr(h.addr));
    k
}

fn elems(entries: &Entries, add: bool) -> Vec<SetElement> {
    let ports = entries.ports.iter().map(|m| SetElement {
        set: m.map().to_string(),
        key: key(m),
        data: add.then(|| ElementData::Value(data(m))),
        expiry: None,
    });
    let hairpins = entries.hairpins.iter().map(|h| SetElement {
        set: h.set().to_string(),
        key: hairpin_key(h),
        data: None,
        expiry: None,
    });
    ports.chain(hairpins).collect()
}

/// Sends one batch and waits for every message's acknowledgement.
fn transact(elements: &[SetElement], add: bool) -> io::Result<()> {
    nftset::transact(TABLE, NFPROTO_INET, elements, add)
}

/// Adds the elements (adding one that is there already, with the same data, is not an
/// error).
pub fn add(entries: &Entries) -> Result<(), PortmapError> {
    transact(&elems(entries, true), true).map_err(|source| PortmapError::Netlink {
        step: "adding host port elements",
        source,
    })
}

/// Removes the elements. Elements that are already gone are not an error.
pub fn remove(entries: &Entries) -> Result<(), PortmapError> {
    let err = |source| PortmapError::Netlink {
        step: "removing host port elements",
        source,
    };
    let all = elems(entries, false);
    match transact(&all, false) {
        Ok(()) => Ok(()),
        // One missing element aborts the batch: remove them one by one instead.
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
            for one in all {
                match transact(std::slice::from_ref(&one), false) {
                    Ok(()) => {}
                    Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
                    Err(e) => return Err(err(e)),
                }
            }
            Ok(())
        }
        Err(e) => Err(err(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Protocol;

    #[test]
    fn keys_and_data_use_whole_registers() {
        let m = HostPort {
            host_ip: Some("10.0.0.1".parse().unwrap()),
            host_port: 80,
            protocol: Protocol::Tcp,
            container_ip: "10.244.1.5".parse().unwrap(),
            container_port: 8080,
        };
        assert_eq!(key(&m), vec![10, 0, 0, 1, 6, 0, 0, 0, 0, 80, 0, 0]);
        assert_eq!(data(&m), vec![10, 244, 1, 5, 0x1f, 0x90, 0, 0]);
        let any6 = HostPort {
            host_ip: None,
            container_ip: "fd00::5".parse().unwrap(),
            protocol: Protocol::Udp,
            ..m
        };
        assert_eq!(key(&any6), vec![17, 0, 0, 0, 0, 80, 0, 0]);
        assert_eq!(data(&any6).len(), 20);
        assert_eq!(any6.map(), "hostports_v6_any");
    }

    #[test]
    fn a_batch_has_one_message_per_map_between_begin_and_end() {
        let m = |port| HostPort {
            host_ip: None,
            host_port: port,
            protocol: Protocol::Tcp,
            container_ip: "10.244.1.5".parse().unwrap(),
            container_port: 80,
        };
        let entries = Entries {
            ports: vec![
                m(1),
                m(2),
                HostPort {
                    host_ip: Some("10.0.0.1".parse().unwrap()),
                    ..m(3)
                },
            ],
            hairpins: vec![Hairpin {
                ifname: "weftabc".into(),
                addr: "10.244.1.5".parse().unwrap(),
            }],
        };
        let msgs = nftset::batch(TABLE, NFPROTO_INET, &elems(&entries, true), true);
        // Begin, three element messages (one per map or set), end; only the element
        // messages ask for an acknowledgement.
        let types: Vec<u16> = msgs.iter().map(|(m, _)| m.message_type).collect();
        assert_eq!(types, vec![0x10, (10 << 8) | 12, (10 << 8) | 12, (10 << 8) | 12, 0x11]);
        let acked: Vec<bool> = msgs.iter().map(|(_, f)| f & 0x4 != 0).collect();
        assert_eq!(acked, vec![false, true, true, true, false]);
        assert!(msgs.iter().all(|(m, _)| m.body.len() % 4 == 0), "attributes are padded");
        let h = hairpin_key(&entries.hairpins[0]);
        assert_eq!(h.len(), 20);
        assert_eq!(&h[..8], b"weftabc\0");
    }
}
