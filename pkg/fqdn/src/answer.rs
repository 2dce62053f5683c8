//! What a DNS response says for policy: the name asked, the names its CNAME chain
//! leads through (within this one response), and the A and AAAA addresses at the end
//! of the chain, each with the shortest TTL on its way.

use std::net::IpAddr;

use hickory_proto::op::{Message, MessageType, ResponseCode};
use hickory_proto::rr::RData;

/// A response's addresses for the name asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// The name asked (lower case, no final dot).
    pub query: String,
    /// The names of the CNAME chain after it, in order.
    pub chain: Vec<String>,
    /// The addresses, each with its TTL in seconds (the shortest of its record's and
    /// the chain's records' leading to it).
    pub addresses: Vec<Learned>,
}

/// An address an answer gave, and for how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Learned {
    /// The address.
    pub ip: IpAddr,
    /// Its TTL in seconds.
    pub ttl: u32,
}

fn name(n: &hickory_proto::rr::Name) -> String {
    crate::pattern::normalize(&n.to_ascii())
}

/// The longest CNAME chain followed (a loop or a very long chain ends there).
const MAX_CHAIN: usize = 16;

/// Reads a DNS message from a UDP payload. `Ok(None)` for what is not a successful
/// answer to one question (a query, an error code, no question, several questions):
/// nothing to learn. An error for what does not decode as DNS at all.
pub fn read_response(payload: &[u8]) -> Result<Option<Answer>, String> {
    let m = Message::from_vec(payload).map_err(|e| format!("not a DNS message: {e}"))?;
    if m.metadata.message_type != MessageType::Response
        || m.metadata.response_code != ResponseCode::NoError
        || m.queries.len() != 1
    {
        return Ok(None);
    }
    let query = name(&m.queries[0].name);
    let mut chain = Vec::new();
    // The TTL of the chain so far: an address is as good as the shortest link to it.
    let mut current = query.clone();
    let mut chain_ttl = u32::MAX;
    let mut names = vec![(query.clone(), u32::MAX)];
    for _ in 0..MAX_CHAIN {
        let next = m.answers.iter().find_map(|r| match &r.data {
            RData::CNAME(c) if name(&r.name) == current => Some((name(&c.0), r.ttl)),
            _ => None,
        });
        let Some((target, ttl)) = next else { break };
        if names.iter().any(|(n, _)| *n == target) {
            break;
        }
        chain_ttl = chain_ttl.min(ttl);
        chain.push(target.clone());
        names.push((target.clone(), chain_ttl));
        current = target;
    }
    let mut addresses = Vec::new();
    for r in &m.answers {
        let ip = match &r.data {
            RData::A(a) => IpAddr::V4(a.0),
            RData::AAAA(a) => IpAddr::V6(a.0),
            _ => continue,
        };
        let owner = name(&r.name);
        if let Some((_, via)) = names.iter().find(|(n, _)| *n == owner) {
            addresses.push(Learned {
                ip,
                ttl: r.ttl.min(*via),
            });
        }
    }
    Ok(Some(Answer {
        query,
        chain,
        addresses,
    }))
}

/// Builds DNS responses for tests (here and in the crates that take answers).
pub mod build {
    use std::net::IpAddr;

    pub use hickory_proto::op::ResponseCode;
    use hickory_proto::op::{Message, MessageType, OpCode, Query};
    use hickory_proto::rr::rdata::{A, AAAA, CNAME};
    use hickory_proto::rr::{Name, RData, Record, RecordType};

    /// A record of a response being built.
    pub enum Rec<'a> {
        /// `NAME TTL IN A|AAAA ADDRESS`.
        Addr(&'a str, u32, IpAddr),
        /// `NAME TTL IN CNAME TARGET`.
        Cname(&'a str, u32, &'a str),
    }

    /// The wire form of a query for `name`'s A (or, `aaaa`, AAAA) records, recursion
    /// desired, with id `id`, taking answers of up to 4096 bytes over UDP (EDNS): what
    /// a pod's resolver sends.
    pub fn query(name: &str, id: u16, aaaa: bool) -> Vec<u8> {
        let mut m = Message::new(id, MessageType::Query, OpCode::Query);
        m.metadata.recursion_desired = true;
        let mut edns = hickory_proto::op::Edns::new();
        edns.set_max_payload(4096);
        m.set_edns(edns);
        let t = if aaaa { RecordType::AAAA } else { RecordType::A };
        m.add_query(Query::query(Name::from_ascii(name).expect("a name"), t));
        m.to_vec().expect("a query encodes")
    }

    /// The wire form of a response to `query` (type A) with `records`, and `code`.
    pub fn response(query: &str, code: ResponseCode, records: &[Rec<'_>]) -> Vec<u8> {
        let n = |s: &str| Name::from_ascii(s).expect("a name");
        let mut m = Message::new(7, MessageType::Response, OpCode::Query);
        m.metadata.response_code = code;
        m.add_query(Query::query(n(query), RecordType::A));
        for r in records {
            let rec = match r {
                Rec::Addr(name, ttl, IpAddr::V4(a)) => Record::from_rdata(n(name), *ttl, RData::A(A(*a))),
                Rec::Addr(name, ttl, IpAddr::V6(a)) => Record::from_rdata(n(name), *ttl, RData::AAAA(AAAA(*a))),
                Rec::Cname(name, ttl, to) => Record::from_rdata(n(name), *ttl, RData::CNAME(CNAME(n(to)))),
            };
            m.add_answer(rec);
        }
        m.to_vec().expect("a response encodes")
    }
}

#[cfg(test)]
mod tests {
    use super::build::{Rec, response};
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn a_cname_chain_is_followed_and_its_shortest_ttl_kept() {
        let wire = response(
            "www.example.test.",
            ResponseCode::NoError,
            &[
                Rec::Cname("www.example.test.", 300, "edge.cdn.test."),
                Rec::Cname("edge.cdn.test.", 20, "pop1.cdn.test."),
                Rec::Addr("pop1.cdn.test.", 600, ip("192.0.2.10")),
                Rec::Addr("pop1.cdn.test.", 5, ip("2001:db8::10")),
                // Not on the chain: an answer may carry what it likes, it is not learnt.
                Rec::Addr("evil.test.", 600, ip("192.0.2.66")),
            ],
        );
        let a = read_response(&wire).unwrap().expect("an answer");
        assert_eq!(a.query, "www.example.test");
        assert_eq!(a.chain, ["edge.cdn.test", "pop1.cdn.test"]);
        assert_eq!(
            a.addresses,
            [
                Learned {
                    ip: ip("192.0.2.10"),
                    ttl: 20
                },
                Learned {
                    ip: ip("2001:db8::10"),
                    ttl: 5
                }
            ]
        );
    }

    #[test]
    fn errors_queries_and_loops_teach_nothing_and_garbage_is_an_error() {
        let nx = response("gone.example.test.", ResponseCode::NXDomain, &[]);
        assert_eq!(read_response(&nx).unwrap(), None);
        let looped = response(
            "a.test.",
            ResponseCode::NoError,
            &[
                Rec::Cname("a.test.", 60, "b.test."),
                Rec::Cname("b.test.", 60, "a.test."),
            ],
        );
        let a = read_response(&looped).unwrap().unwrap();
        assert_eq!(a.chain, ["b.test"], "the loop ends where it closes");
        assert!(a.addresses.is_empty());
        let mut query = response("a.test.", ResponseCode::NoError, &[]);
        query[2] &= 0x7f; // QR bit off: a query.
        assert_eq!(read_response(&query).unwrap(), None);
        assert!(read_response(&[1, 2, 3]).is_err());
    }
}
