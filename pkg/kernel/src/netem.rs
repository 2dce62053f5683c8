//! Link emulation on an interface: a `netem` root qdisc (delay, jitter, loss, rate,
//! corruption, duplication, reordering of what the interface sends) and carrier loss
//! by intent (`IFLA_PROTO_DOWN`), both through the netlink socket.
//!
//! netlink-packet-route 0.34 knows the qdisc messages
//! but not netem's options, so `TCA_OPTIONS` is encoded here by hand from
//! `<linux/pkt_sched.h>`: unlike most qdiscs, netem's options are a fixed
//! `struct tc_netem_qopt` followed by nested `TCA_NETEM_*` attributes, which the
//! crate's option list cannot express.

use std::io;

use netlink_packet_core::{DefaultNla, NLM_F_CREATE, NLM_F_REPLACE};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_packet_route::link::{LinkAttribute, LinkMessage};
use netlink_packet_route::tc::{TcAttribute, TcHandle, TcMessage};

use crate::Netlink;

/// netem's settings in the kernel's units.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Netem {
    /// Added latency, nanoseconds.
    pub latency_ns: u64,
    /// Latency variation, nanoseconds.
    pub jitter_ns: u64,
    /// Probabilities scaled to `u32::MAX` (the kernel's form): loss, duplication,
    /// corruption, reordering.
    pub loss: u32,
    /// See `loss`.
    pub duplicate: u32,
    /// See `loss`.
    pub corrupt: u32,
    /// See `loss`.
    pub reorder: u32,
    /// Sending rate, bytes per second (0: unlimited).
    pub rate_bytes: u64,
    /// Frames netem may hold (tc's default is 1000).
    pub limit: u32,
    /// A loss model instead of random loss (`loss gemodel`, `loss state`).
    pub loss_model: Option<NetemLoss>,
    /// The delay's distribution table (`TCA_NETEM_DELAY_DIST`: entries of 8192 per
    /// standard deviation; none: uniform).
    pub delay_dist: Option<&'static [i16]>,
    /// Frames leave in slots (`slot`).
    pub slot: Option<NetemSlot>,
    /// Mark ECN-capable frames instead of losing them (`ecn`).
    pub ecn: bool,
}

/// netem's loss models, probabilities in the kernel's `u32` form, fields as
/// `<linux/pkt_sched.h>` names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NetemLoss {
    /// `struct tc_netem_gemodel`: good to bad, bad to good, received in the bad state,
    /// lost in the good state.
    GilbertElliott {
        /// Good to bad.
        p: u32,
        /// Bad to good.
        r: u32,
        /// Received in the bad state.
        h: u32,
        /// Lost in the good state.
        k1: u32,
    },
    /// `struct tc_netem_gimodel`: the 4-state model's transitions.
    FourState {
        /// Gap to burst loss.
        p13: u32,
        /// Burst loss back to the gap.
        p31: u32,
        /// Burst loss to a received frame in the burst.
        p32: u32,
        /// Gap to an isolated loss.
        p14: u32,
        /// A received frame in the burst to a lost one.
        p23: u32,
    },
}

/// `struct tc_netem_slot`'s settings (uniform between the two delays, as weft has).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NetemSlot {
    /// The shortest gap before a slot, nanoseconds.
    pub min_delay_ns: i64,
    /// The longest, nanoseconds.
    pub max_delay_ns: i64,
    /// Frames per slot at most (0: no bound).
    pub max_packets: i32,
    /// Bytes per slot at most (0: no bound).
    pub max_bytes: i32,
}

/// A probability given in parts per million, scaled as the kernel takes it.
pub fn probability(ppm: u32) -> u32 {
    ((u64::from(ppm.min(1_000_000)) * u64::from(u32::MAX)) / 1_000_000) as u32
}

// From <linux/pkt_sched.h>.
const TCA_OPTIONS: u16 = 2;
const TCA_NETEM_DELAY_DIST: u16 = 2;
const TCA_NETEM_REORDER: u16 = 3;
const TCA_NETEM_CORRUPT: u16 = 4;
const TCA_NETEM_LOSS: u16 = 5;
const TCA_NETEM_RATE: u16 = 6;
const TCA_NETEM_ECN: u16 = 7;
const TCA_NETEM_RATE64: u16 = 8;
const TCA_NETEM_LATENCY64: u16 = 10;
const TCA_NETEM_JITTER64: u16 = 11;
const TCA_NETEM_SLOT: u16 = 12;
const NETEM_LOSS_GI: u16 = 1;
const NETEM_LOSS_GE: u16 = 2;
/// A psched tick is 64 ns (`PSCHED_SHIFT`).
const PSCHED_SHIFT: u32 = 6;

fn nla(out: &mut Vec<u8>, kind: u16, value: &[u8]) {
    let len = 4 + value.len();
    out.extend_from_slice(&(len as u16).to_ne_bytes());
    out.extend_from_slice(&kind.to_ne_bytes());
    out.extend_from_slice(value);
    out.resize(out.len().next_multiple_of(4), 0);
}

fn words(ws: &[u32]) -> Vec<u8> {
    ws.iter().flat_map(|w| w.to_ne_bytes()).collect()
}

impl Netem {
    /// The value of `TCA_OPTIONS`: `tc_netem_qopt`, then the nested attributes.
    pub fn options(&self) -> Vec<u8> {
        let ticks = |ns: u64| u32::try_from(ns >> PSCHED_SHIFT).unwrap_or(u32::MAX);
        // Reordering sends a frame at once instead of delayed; the kernel only does it
        // with a gap, and tc's default gap is 1 (every frame may be the one).
        let gap = u32::from(self.reorder > 0);
        let limit = if self.limit == 0 { 1000 } else { self.limit };
        // struct tc_netem_qopt { latency, limit, loss, gap, duplicate, jitter }
        let mut out = words(&[
            ticks(self.latency_ns),
            limit,
            self.loss,
            gap,
            self.duplicate,
            ticks(self.jitter_ns),
        ]);
        // The 64-bit forms override the tick fields with nanoseconds.
        nla(&mut out, TCA_NETEM_LATENCY64, &(self.latency_ns as i64).to_ne_bytes());
        nla(&mut out, TCA_NETEM_JITTER64, &(self.jitter_ns as i64).to_ne_bytes());
        if self.reorder > 0 {
            // struct tc_netem_reorder { probability, correlation }
            nla(&mut out, TCA_NETEM_REORDER, &words(&[self.reorder, 0]));
        }
        if self.corrupt > 0 {
            // struct tc_netem_corrupt { probability, correlation }
            nla(&mut out, TCA_NETEM_CORRUPT, &words(&[self.corrupt, 0]));
        }
        if let Some(table) = self.delay_dist {
            let bytes: Vec<u8> = table.iter().flat_map(|v| v.to_ne_bytes()).collect();
            nla(&mut out, TCA_NETEM_DELAY_DIST, &bytes);
        }
        if let Some(model) = self.loss_model {
            // A nest holding one model; the qopt's random loss stays 0 beside it.
            let mut nest = Vec::new();
            match model {
                NetemLoss::GilbertElliott { p, r, h, k1 } => nla(&mut nest, NETEM_LOSS_GE, &words(&[p, r, h, k1])),
                NetemLoss::FourState {
                    p13,
                    p31,
                    p32,
                    p14,
                    p23,
                } => nla(&mut nest, NETEM_LOSS_GI, &words(&[p13, p31, p32, p14, p23])),
            }
            nla(&mut out, TCA_NETEM_LOSS, &nest);
        }
        if self.ecn {
            nla(&mut out, TCA_NETEM_ECN, &1u32.to_ne_bytes());
        }
        if let Some(slot) = self.slot {
            // struct tc_netem_slot { s64 min_delay, max_delay; s32 max_packets, max_bytes;
            // s64 dist_delay, dist_jitter } (no slot distribution: uniform).
            let mut v = Vec::with_capacity(40);
            v.extend_from_slice(&slot.min_delay_ns.to_ne_bytes());
            v.extend_from_slice(&slot.max_delay_ns.to_ne_bytes());
            v.extend_from_slice(&slot.max_packets.to_ne_bytes());
            v.extend_from_slice(&slot.max_bytes.to_ne_bytes());
            v.extend_from_slice(&0i64.to_ne_bytes());
            v.extend_from_slice(&0i64.to_ne_bytes());
            nla(&mut out, TCA_NETEM_SLOT, &v);
        }
        if self.rate_bytes > 0 {
            // struct tc_netem_rate { rate, packet_overhead, cell_size, cell_overhead }
            let low = u32::try_from(self.rate_bytes).unwrap_or(u32::MAX);
            nla(&mut out, TCA_NETEM_RATE, &words(&[low, 0, 0, 0]));
            if self.rate_bytes > u64::from(u32::MAX) {
                nla(&mut out, TCA_NETEM_RATE64, &self.rate_bytes.to_ne_bytes());
            }
        }
        out
    }
}

// From <linux/pkt_sched.h>: tbf's attributes.
const TCA_TBF_PARMS: u16 = 1;
const TCA_TBF_RATE64: u16 = 4;
const TCA_TBF_BURST: u16 = 6;
/// `TC_LINKLAYER_ETHERNET`: the kernel computes the rate itself, no rate table needed.
const TC_LINKLAYER_ETHERNET: u8 = 1;

/// A token bucket (`tbf`): the one impairment, a rate, a kernel without netem can
/// still apply (encoded by hand for the same reason as netem's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tbf {
    /// Bytes per second.
    pub rate_bytes: u64,
    /// Bytes sent at line speed before the rate holds (at least a frame).
    pub burst: u32,
    /// Bytes queued before frames are dropped.
    pub limit: u32,
}

impl Tbf {
    /// A bucket for `rate_bytes` per second: a burst of 10 ms (at least 64 KiB, so
    /// a GSO frame passes whole) and 100 ms of queue, as `tc` users size them.
    pub fn for_rate(rate_bytes: u64) -> Tbf {
        let burst = (rate_bytes / 100).clamp(64 * 1024, u64::from(u32::MAX)) as u32;
        let limit = (rate_bytes / 10).clamp(u64::from(burst) * 2, u64::from(u32::MAX)) as u32;
        Tbf {
            rate_bytes,
            burst,
            limit,
        }
    }

    /// The value of `TCA_OPTIONS`: nested `TCA_TBF_*` attributes.
    pub fn options(&self) -> Vec<u8> {
        let low = u32::try_from(self.rate_bytes).unwrap_or(u32::MAX);
        // struct tc_ratespec { cell_log u8, linklayer u8, overhead u16, cell_align i16,
        // mpu u16, rate u32 }, twice (rate, peakrate: none), then limit, buffer, mtu.
        let mut parms = vec![0u8, TC_LINKLAYER_ETHERNET, 0, 0, 0, 0, 0, 0];
        parms.extend_from_slice(&low.to_ne_bytes());
        parms.extend_from_slice(&[0u8; 12]);
        // buffer in psched ticks (TCA_TBF_BURST below gives it in bytes and wins).
        let ticks = (u64::from(self.burst) * 1_000_000_000 / self.rate_bytes.max(1)) >> PSCHED_SHIFT;
        parms.extend_from_slice(&words(&[self.limit, u32::try_from(ticks).unwrap_or(u32::MAX), 0]));
        let mut out = Vec::new();
        nla(&mut out, TCA_TBF_PARMS, &parms);
        if self.rate_bytes > u64::from(u32::MAX) {
            nla(&mut out, TCA_TBF_RATE64, &self.rate_bytes.to_ne_bytes());
        }
        nla(&mut out, TCA_TBF_BURST, &self.burst.to_ne_bytes());
        out
    }
}

fn root_message(index: u32) -> TcMessage {
    let mut msg = TcMessage::default();
    msg.header.index = index as i32;
    msg.header.parent = TcHandle::ROOT;
    msg
}

impl Netlink {
    /// Makes `netem` with `netem`'s settings the root qdisc of link `index` (replacing
    /// whatever root qdisc it has; changing a netem in place).
    pub fn set_netem(&mut self, index: u32, netem: &Netem) -> io::Result<()> {
        let mut msg = root_message(index);
        msg.attributes = vec![
            TcAttribute::Kind("netem".into()),
            TcAttribute::Other(DefaultNla::new(TCA_OPTIONS, netem.options())),
        ];
        self.execute(
            RouteNetlinkMessage::NewQueueDiscipline(msg),
            NLM_F_CREATE | NLM_F_REPLACE,
        )
    }

    /// Makes a token bucket with `tbf`'s settings the root qdisc of link `index`.
    pub fn set_tbf(&mut self, index: u32, tbf: &Tbf) -> io::Result<()> {
        let mut msg = root_message(index);
        msg.attributes = vec![
            TcAttribute::Kind("tbf".into()),
            TcAttribute::Other(DefaultNla::new(TCA_OPTIONS, tbf.options())),
        ];
        self.execute(
            RouteNetlinkMessage::NewQueueDiscipline(msg),
            NLM_F_CREATE | NLM_F_REPLACE,
        )
    }

    /// The kind of link `index`'s root qdisc (`None`: the device's default).
    pub fn root_qdisc(&mut self, index: u32) -> io::Result<Option<String>> {
        let all = self.dump(RouteNetlinkMessage::GetQueueDiscipline(TcMessage::default()))?;
        Ok(all.into_iter().find_map(|m| match m {
            RouteNetlinkMessage::NewQueueDiscipline(q)
                if q.header.index == index as i32 && q.header.parent == TcHandle::ROOT =>
            {
                q.attributes.into_iter().find_map(|a| match a {
                    TcAttribute::Kind(k) => Some(k),
                    _ => None,
                })
            }
            _ => None,
        }))
    }

    /// Removes link `index`'s root qdisc when it is weft's (a netem, or the tbf that
    /// stands in for it; another root qdisc is left alone); returns whether there was one.
    pub fn clear_netem(&mut self, index: u32) -> io::Result<bool> {
        if !matches!(self.root_qdisc(index)?.as_deref(), Some("netem" | "tbf")) {
            return Ok(false);
        }
        self.execute_if_present(
            RouteNetlinkMessage::DelQueueDiscipline(root_message(index)),
            libc::ENOENT,
        )
    }

    /// Sets or clears `IFLA_PROTO_DOWN`: the link keeps its administrative state but
    /// loses its carrier (`NO-CARRIER`), as a pulled cable would. VXLAN devices support
    /// it; veth devices answer `EOPNOTSUPP`.
    pub fn set_proto_down(&mut self, index: u32, down: bool) -> io::Result<()> {
        let mut msg = LinkMessage::default();
        msg.header.index = index;
        msg.attributes = vec![LinkAttribute::ProtoDown(u8::from(down))];
        self.execute(RouteNetlinkMessage::SetLink(msg), 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn u32_at(b: &[u8], at: usize) -> u32 {
        u32::from_ne_bytes(b[at..at + 4].try_into().unwrap())
    }

    #[test]
    fn options_are_the_qopt_then_the_attributes() {
        let n = Netem {
            latency_ns: 20_000_000,
            jitter_ns: 2_000_000,
            loss: probability(10_000),
            rate_bytes: 6_250_000,
            reorder: probability(50_000),
            ..Netem::default()
        };
        let b = n.options();
        // qopt: latency in 64 ns ticks, the default limit, loss, gap 1 for reordering.
        assert_eq!(u32_at(&b, 0), 20_000_000 >> 6);
        assert_eq!(u32_at(&b, 4), 1000);
        assert_eq!(u32_at(&b, 8), probability(10_000));
        assert_eq!(u32_at(&b, 12), 1);
        assert_eq!(u32_at(&b, 20), 2_000_000 >> 6);
        // Then LATENCY64 (12 bytes), JITTER64, REORDER, RATE (no RATE64 below 4 GB/s).
        let mut at = 24;
        let mut kinds = Vec::new();
        while at < b.len() {
            let len = u16::from_ne_bytes([b[at], b[at + 1]]) as usize;
            kinds.push((u16::from_ne_bytes([b[at + 2], b[at + 3]]), len));
            at += len.next_multiple_of(4);
        }
        assert_eq!(kinds, vec![(10, 12), (11, 12), (3, 12), (6, 20)]);
        assert_eq!(u32_at(&b, 24 + 12 + 12 + 12 + 4), 6_250_000);
        assert_eq!(probability(1_000_000), u32::MAX);
        // tbf: PARMS (36 bytes of qopt), then BURST.
        let t = Tbf::for_rate(6_250_000).options();
        assert_eq!(u16::from_ne_bytes([t[0], t[1]]), 40);
        assert_eq!(t[5], TC_LINKLAYER_ETHERNET);
        assert_eq!(u32_at(&t, 4 + 8), 6_250_000);
        assert_eq!(u16::from_ne_bytes([t[42], t[43]]), TCA_TBF_BURST);
        assert_eq!(u32_at(&t, 44), 64 * 1024);
        assert_eq!(probability(0), 0);
    }

    /// The attributes after the qopt, as (kind, length, value).
    fn attributes(b: &[u8]) -> Vec<(u16, usize, Vec<u8>)> {
        let mut at = 24;
        let mut out = Vec::new();
        while at < b.len() {
            let len = u16::from_ne_bytes([b[at], b[at + 1]]) as usize;
            out.push((
                u16::from_ne_bytes([b[at + 2], b[at + 3]]),
                len,
                b[at + 4..at + len].to_vec(),
            ));
            at += len.next_multiple_of(4);
        }
        out
    }

    #[test]
    fn models_tables_slots_and_ecn_are_netems_attributes() {
        static TABLE: [i16; 3] = [-8192, 0, 8192];
        let ge = Netem {
            latency_ns: 50_000_000,
            jitter_ns: 10_000_000,
            loss_model: Some(NetemLoss::GilbertElliott {
                p: 1,
                r: 2,
                h: 3,
                k1: 4,
            }),
            delay_dist: Some(&TABLE),
            slot: Some(NetemSlot {
                min_delay_ns: 800_000,
                max_delay_ns: 1_000_000,
                max_packets: 32,
                max_bytes: 0,
            }),
            ecn: true,
            ..Netem::default()
        };
        let attrs = attributes(&ge.options());
        let kinds: Vec<(u16, usize)> = attrs.iter().map(|(k, l, _)| (*k, *l)).collect();
        // LATENCY64, JITTER64, DELAY_DIST (3 s16), LOSS (a nest of GE: 4 + 4 + 16),
        // ECN, SLOT (40 bytes).
        assert_eq!(kinds, vec![(10, 12), (11, 12), (2, 10), (5, 24), (7, 8), (12, 44)]);
        let table: Vec<u8> = TABLE.iter().flat_map(|v| v.to_ne_bytes()).collect();
        assert_eq!(attrs[2].2, table);
        let nest = &attrs[3].2;
        assert_eq!(u16::from_ne_bytes([nest[2], nest[3]]), NETEM_LOSS_GE);
        assert_eq!((1..=4).map(|i| u32_at(nest, i * 4)).collect::<Vec<_>>(), [1, 2, 3, 4]);
        assert_eq!(u32_at(&attrs[4].2, 0), 1);
        let slot = &attrs[5].2;
        assert_eq!(i64::from_ne_bytes(slot[0..8].try_into().unwrap()), 800_000);
        assert_eq!(i64::from_ne_bytes(slot[8..16].try_into().unwrap()), 1_000_000);
        assert_eq!(u32_at(slot, 16), 32);
        // The 4-state model: gimodel in the kernel's field order (p14 before p23).
        let gi = Netem {
            loss_model: Some(NetemLoss::FourState {
                p13: 1,
                p31: 2,
                p32: 3,
                p14: 4,
                p23: 5,
            }),
            ..Netem::default()
        };
        let attrs = attributes(&gi.options());
        let nest = &attrs[2].2;
        assert_eq!((attrs[2].0, u16::from_ne_bytes([nest[2], nest[3]])), (5, NETEM_LOSS_GI));
        assert_eq!(
            (1..=5).map(|i| u32_at(nest, i * 4)).collect::<Vec<_>>(),
            [1, 2, 3, 4, 5]
        );
        assert_eq!(u32_at(&gi.options(), 8), 0, "no random loss beside a model");
    }
}
