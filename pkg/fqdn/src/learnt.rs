//! The addresses a node learnt from DNS answers, by the name asked: each allowed until
//! its TTL ends (never less than a minimum), a bounded number per name (the soonest to
//! expire makes room for a new one, and is counted) and in all (past it an address is
//! refused, and counted): what `weftctl policy names` lists and the metrics count.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;

/// The bounds of the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The shortest time an address is allowed, in seconds, whatever its TTL: an app
    /// connects a moment after its answer, and a TTL of 0 or 1 must not race it.
    pub min_ttl: u32,
    /// The longest, in seconds: a name whose answer changes is followed within it.
    pub max_ttl: u32,
    /// Addresses kept per name (upstream's proposal asks for at least 100).
    pub per_name: usize,
    /// Addresses kept in all.
    pub total: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            min_ttl: 30,
            max_ttl: 86_400,
            per_name: 256,
            total: 262_144,
        }
    }
}

/// What became of one learnt address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// New for the name.
    New,
    /// Known, and now allowed longer.
    Extended,
    /// Known, and already allowed at least as long.
    Kept,
    /// Refused: the table holds [`Limits::total`] addresses.
    Refused,
}

/// An address learnt for a name, as listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LearntAddress {
    /// The name asked.
    pub name: String,
    /// The address.
    pub ip: IpAddr,
    /// When it stops being allowed for new connections (Unix ms).
    pub expires_ms: i64,
}

/// The table.
#[derive(Debug, Default)]
pub struct Learnt {
    limits: Limits,
    /// Name to address to expiry (Unix ms).
    names: HashMap<String, BTreeMap<IpAddr, i64>>,
    /// Address to the names it was learnt for.
    by_ip: HashMap<IpAddr, Vec<String>>,
    total: usize,
    /// Addresses pushed out by a newer one of the same name (per-name bound).
    pub evictions: u64,
    /// Addresses refused over the total bound.
    pub refused: u64,
}

impl Learnt {
    /// An empty table bounded by `limits`.
    pub fn new(limits: Limits) -> Self {
        Learnt {
            limits,
            ..Learnt::default()
        }
    }

    /// Its bounds.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// When an address learnt now (`now_ms`) with `ttl` stops being allowed.
    pub fn expiry(&self, ttl: u32, now_ms: i64) -> i64 {
        let ttl = ttl.clamp(self.limits.min_ttl, self.limits.max_ttl.max(self.limits.min_ttl));
        now_ms + i64::from(ttl) * 1000
    }

    /// Learns `ip` for `name` (normalized) from an answer with `ttl`; the outcome, and
    /// the address pushed out of the name to make room, if one was.
    pub fn learn(&mut self, name: &str, ip: IpAddr, ttl: u32, now_ms: i64) -> (Outcome, Option<IpAddr>) {
        let expires = self.expiry(ttl, now_ms);
        if let Some(known) = self.names.get_mut(name).and_then(|m| m.get_mut(&ip)) {
            if *known >= expires {
                return (Outcome::Kept, None);
            }
            *known = expires;
            return (Outcome::Extended, None);
        }
        if self.total >= self.limits.total {
            self.refused += 1;
            return (Outcome::Refused, None);
        }
        let per_name = self.limits.per_name;
        let addrs = self.names.entry(name.to_string()).or_default();
        let mut evicted = None;
        if addrs.len() >= per_name
            && let Some((&soonest, _)) = addrs.iter().min_by_key(|(_, e)| **e)
        {
            addrs.remove(&soonest);
            evicted = Some(soonest);
        }
        addrs.insert(ip, expires);
        if let Some(old) = evicted {
            self.evictions += 1;
            self.unlink(old, name);
        } else {
            self.total += 1;
        }
        self.by_ip.entry(ip).or_default().push(name.to_string());
        (Outcome::New, evicted)
    }

    /// Takes back an address the kernel holds for `name` until `expires_ms` (read back
    /// after a restart): kept as it is, whatever the minimum TTL, unless the table
    /// holds it already or is full.
    pub fn restore(&mut self, name: &str, ip: IpAddr, expires_ms: i64) {
        if self.names.get(name).is_some_and(|m| m.contains_key(&ip)) || self.total >= self.limits.total {
            return;
        }
        let addrs = self.names.entry(name.to_string()).or_default();
        if addrs.len() >= self.limits.per_name {
            return;
        }
        addrs.insert(ip, expires_ms);
        self.total += 1;
        self.by_ip.entry(ip).or_default().push(name.to_string());
    }

    fn unlink(&mut self, ip: IpAddr, name: &str) {
        if let Some(names) = self.by_ip.get_mut(&ip) {
            names.retain(|n| n != name);
            if names.is_empty() {
                self.by_ip.remove(&ip);
            }
        }
    }

    /// Forgets what expired by `now_ms`; what was forgotten.
    pub fn expire(&mut self, now_ms: i64) -> Vec<LearntAddress> {
        let mut gone = Vec::new();
        for (name, addrs) in &mut self.names {
            addrs.retain(|ip, e| {
                let keep = *e > now_ms;
                if !keep {
                    gone.push(LearntAddress {
                        name: name.clone(),
                        ip: *ip,
                        expires_ms: *e,
                    });
                }
                keep
            });
        }
        self.names.retain(|_, a| !a.is_empty());
        for g in &gone {
            self.total -= 1;
            self.unlink(g.ip, &g.name);
        }
        gone
    }

    /// The names `ip` was learnt for (and is still allowed by, until the next
    /// [`Self::expire`]).
    pub fn names_of(&self, ip: IpAddr) -> &[String] {
        self.by_ip.get(&ip).map_or(&[], Vec::as_slice)
    }

    /// Every learnt address, by name then address.
    pub fn list(&self) -> Vec<LearntAddress> {
        let mut out: Vec<LearntAddress> = self
            .names
            .iter()
            .flat_map(|(name, addrs)| {
                addrs.iter().map(|(ip, e)| LearntAddress {
                    name: name.clone(),
                    ip: *ip,
                    expires_ms: *e,
                })
            })
            .collect();
        out.sort_by(|a, b| (&a.name, a.ip).cmp(&(&b.name, b.ip)));
        out
    }

    /// How many names are held.
    pub fn names(&self) -> usize {
        self.names.len()
    }

    /// How many addresses are held (an address learnt for two names counts twice).
    pub fn addresses(&self) -> usize {
        self.total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(i: u32) -> IpAddr {
        IpAddr::V4(std::net::Ipv4Addr::from(0xc000_0200 + i))
    }

    #[test]
    fn an_address_lives_its_ttl_never_less_than_the_minimum() {
        let mut t = Learnt::new(Limits::default());
        assert_eq!(t.learn("api.example.test", ip(1), 0, 1_000), (Outcome::New, None));
        assert_eq!(t.learn("api.example.test", ip(2), 300, 1_000), (Outcome::New, None));
        assert_eq!(t.names_of(ip(1)), ["api.example.test"]);
        assert!(t.expire(30_999).is_empty(), "30 s at least");
        let gone = t.expire(31_000);
        assert_eq!(gone.len(), 1);
        assert_eq!(gone[0].ip, ip(1));
        assert!(t.names_of(ip(1)).is_empty());
        assert_eq!((t.names(), t.addresses()), (1, 1));
        // A later answer extends; an earlier one keeps.
        assert_eq!(t.learn("api.example.test", ip(2), 600, 2_000).0, Outcome::Extended);
        assert_eq!(t.learn("api.example.test", ip(2), 60, 3_000).0, Outcome::Kept);
        assert_eq!(t.list()[0].expires_ms, 602_000);
        t.expire(602_000);
        assert_eq!((t.names(), t.addresses()), (0, 0));
    }

    #[test]
    fn what_the_kernel_holds_is_taken_back_as_it_is() {
        let mut t = Learnt::new(Limits::default());
        t.restore("api.example.test", ip(1), 5_000);
        t.restore("api.example.test", ip(1), 9_000);
        assert_eq!(t.list()[0].expires_ms, 5_000, "once, as held");
        assert_eq!(t.names_of(ip(1)), ["api.example.test"]);
        assert_eq!(t.learn("api.example.test", ip(1), 60, 0).0, Outcome::Extended);
        assert_eq!(t.expire(61_000).len(), 1);
        assert_eq!(t.addresses(), 0);
    }

    #[test]
    fn a_name_keeps_its_bound_by_pushing_out_the_soonest_and_the_table_refuses_past_its_own() {
        let mut t = Learnt::new(Limits {
            per_name: 100,
            total: 150,
            ..Limits::default()
        });
        for i in 0..100 {
            assert_eq!(t.learn("many.test", ip(i), 100 + i, 0).0, Outcome::New);
        }
        assert_eq!(t.addresses(), 100, "100 addresses for one name");
        let (o, out) = t.learn("many.test", ip(500), 1000, 0);
        assert_eq!((o, out), (Outcome::New, Some(ip(0))), "the soonest to expire goes");
        assert_eq!((t.addresses(), t.evictions), (100, 1));
        assert!(t.names_of(ip(0)).is_empty());
        for i in 0..50 {
            t.learn("other.test", ip(1000 + i), 60, 0);
        }
        assert_eq!(t.addresses(), 150);
        assert_eq!(t.learn("third.test", ip(9999), 60, 0).0, Outcome::Refused);
        assert_eq!(t.refused, 1);
        // One address, two names: listed under both.
        let mut u = Learnt::new(Limits::default());
        u.learn("a.test", ip(1), 60, 0);
        u.learn("b.test", ip(1), 60, 0);
        assert_eq!(u.names_of(ip(1)), ["a.test", "b.test"]);
        assert_eq!(u.list().len(), 2);
    }
}
