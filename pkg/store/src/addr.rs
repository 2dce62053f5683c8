//! Address arithmetic for ranges: which addresses a range hands out, and the 16-byte
//! encoding addresses are stored under.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;

/// Encodes an address as 16 big-endian bytes, IPv4 as IPv4-mapped IPv6, so IPv4 and
/// IPv6 rows compare correctly in one index.
pub fn to_key(a: IpAddr) -> u128 {
    match a {
        IpAddr::V4(v4) => u128::from(v4.to_ipv6_mapped()),
        IpAddr::V6(v6) => u128::from(v6),
    }
}

/// Decodes [`to_key`] for an address of `range`'s family.
pub fn from_key(range: &IpNet, k: u128) -> IpAddr {
    match range {
        IpNet::V4(_) => IpAddr::V4(Ipv4Addr::from((k & 0xffff_ffff) as u32)),
        IpNet::V6(_) => IpAddr::V6(Ipv6Addr::from(k)),
    }
}

/// The gateway of a range: its first address after the network address. weft puts
/// it on every host-side veth, and pods route through it.
pub fn gateway(range: &IpNet) -> IpAddr {
    from_key(range, to_key(range.network()) + 1)
}

/// First and last address a range hands to pods, as keys: everything after the
/// gateway, except the IPv4 broadcast address.
pub fn pool(range: &IpNet) -> (u128, u128) {
    let first = to_key(range.network()) + 2;
    let last = match range {
        IpNet::V4(_) => to_key(range.broadcast()) - 1,
        IpNet::V6(_) => to_key(range.broadcast()),
    };
    (first, last)
}

/// How many addresses a range hands out, saturating at `u64::MAX`.
pub fn capacity(range: &IpNet) -> u64 {
    let (first, last) = pool(range);
    u64::try_from(last - first + 1).unwrap_or(u64::MAX)
}

/// The narrowest range whose gateway is `gateway` and whose pool holds every one of
/// `addresses`; `None` when no range of that gateway holds them all.
///
/// What a state rebuilt from the kernel records its addresses under: the kernel keeps
/// each pod's address and gateway but not the prefix of the range they came from. The
/// narrowest range is the one claim the kernel does support; allocations are keyed by
/// address alone, so the real (wider) range of a later ADD still sees them as taken.
pub fn narrowest_range(gateway: IpAddr, addresses: &[IpAddr]) -> Option<IpNet> {
    let bits: u8 = if gateway.is_ipv4() { 32 } else { 128 };
    let gw = to_key(gateway);
    let network = gw.checked_sub(1)?;
    if addresses.iter().any(|a| a.is_ipv4() != gateway.is_ipv4()) {
        return None;
    }
    (0..=bits).rev().find_map(|prefix| {
        let range = IpNet::new(from_key_family(gateway, network), prefix).ok()?.trunc();
        if to_key(range.network()) != network {
            return None;
        }
        let (lo, hi) = pool(&range);
        addresses
            .iter()
            .all(|a| (lo..=hi).contains(&to_key(*a)))
            .then_some(range)
    })
}

fn from_key_family(like: IpAddr, k: u128) -> IpAddr {
    match like {
        IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::from((k & 0xffff_ffff) as u32)),
        IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::from(k)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v4_pool_skips_network_gateway_and_broadcast() {
        let r: IpNet = "10.0.0.0/30".parse().unwrap();
        assert_eq!(gateway(&r), "10.0.0.1".parse::<IpAddr>().unwrap());
        let (a, b) = pool(&r);
        assert_eq!(from_key(&r, a), "10.0.0.2".parse::<IpAddr>().unwrap());
        assert_eq!(a, b);
        assert_eq!(capacity(&r), 1);
        assert_eq!(capacity(&"10.0.0.0/24".parse().unwrap()), 253);
    }

    #[test]
    fn v6_pool_and_huge_capacity() {
        let r: IpNet = "fd00::/126".parse().unwrap();
        assert_eq!(gateway(&r), "fd00::1".parse::<IpAddr>().unwrap());
        assert_eq!(capacity(&r), 2);
        assert_eq!(capacity(&"fd00::/64".parse().unwrap()), u64::MAX - 1);
        assert_eq!(capacity(&"fd00::/48".parse().unwrap()), u64::MAX);
    }

    #[test]
    fn keys_round_trip_and_v4_sorts_below_ula_v6() {
        let r4: IpNet = "10.1.2.0/24".parse().unwrap();
        let a: IpAddr = "10.1.2.3".parse().unwrap();
        assert_eq!(from_key(&r4, to_key(a)), a);
        let r6: IpNet = "fd00::/64".parse().unwrap();
        let b: IpAddr = "fd00::3".parse().unwrap();
        assert_eq!(from_key(&r6, to_key(b)), b);
        assert!(to_key(a) < to_key(b));
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn the_narrowest_range_of_a_gateway_holds_every_address_in_its_pool() {
        let r = narrowest_range(ip("10.244.1.1"), &[ip("10.244.1.2"), ip("10.244.1.4")]).unwrap();
        assert_eq!(r.to_string(), "10.244.1.0/29");
        assert_eq!(gateway(&r), ip("10.244.1.1"));
        // .7 is the broadcast address of a /29: the range widens.
        let r = narrowest_range(ip("10.244.1.1"), &[ip("10.244.1.7")]).unwrap();
        assert_eq!(r.to_string(), "10.244.1.0/28");
        let r = narrowest_range(ip("fd00::1"), &[ip("fd00::3")]).unwrap();
        assert_eq!(r.to_string(), "fd00::/126");
        // 10.244.1.9 is no range's gateway that could hold .2 (its network .8 is past it).
        assert_eq!(narrowest_range(ip("10.244.1.9"), &[ip("10.244.1.2")]), None);
        assert_eq!(narrowest_range(ip("10.244.1.1"), &[ip("fd00::2")]), None);
    }
}
