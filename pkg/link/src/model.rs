//! The impairment models of weft's own detour (this machine's kernel has no netem),
//! as netem defines them: the 4-state Markov loss model (`loss state`) and the
//! Gilbert-Elliott model (`loss gemodel`) with the kernel's arithmetic and defaults
//! (linux/net/sched/sch_netem.c, iproute2), delay drawn from a distribution table
//! (`distribution normal|pareto|paretonormal`, or uniform jitter) with netem's
//! fixed-point `tabledist`, and slots (`slot`: frames released in bursts). Correlation
//! is where weft departs from netem, on purpose: netem's correlated draws change the
//! rate they are drawn for; here a correlated event keeps its rate and comes in runs,
//! and a correlated delay keeps its distribution (see [`Correlated`]).
//!
//! Everything is driven by a seeded generator, so a run is repeatable and the tests'
//! statistics are exact for a seed. Probabilities are `u32` fractions of 2^32
//! ([`Prob`]), as netem keeps them; delays are microseconds. Nothing here knows about
//! frames or clocks: the dataplane asks for decisions and applies them.

use std::sync::OnceLock;

/// A probability as netem keeps it: `p * 2^32`, saturating at `u32::MAX` for 100 %.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Prob(pub u32);

impl Prob {
    /// From parts per million (weft's exact form of a percentage).
    pub fn from_ppm(ppm: u32) -> Self {
        Prob((u64::from(ppm.min(1_000_000)) * (1u64 << 32) / 1_000_000).min(u64::from(u32::MAX)) as u32)
    }

    /// As parts per million, rounded.
    pub fn ppm(self) -> u32 {
        ((u64::from(self.0) * 1_000_000 + (1 << 31)) >> 32) as u32
    }

    /// `1 - p`.
    pub fn complement(self) -> Self {
        Prob(u32::MAX - self.0)
    }
}

/// The generator every decision draws from: xorshift64* (cheap and uniform; emulation
/// needs no cryptographic draws), seeded so a run can be repeated.
#[derive(Debug, Clone)]
pub struct Prng(u64);

impl Prng {
    /// A generator from `seed` (any value; zero is moved off the fixed point).
    pub fn new(seed: u64) -> Self {
        Prng(seed | 1)
    }

    /// The next 32 uniform bits.
    pub fn next_u32(&mut self) -> u32 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        (x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 32) as u32
    }
}

/// A correlated yes/no event (loss, duplication, corruption, reordering): with
/// correlation `rho`, the next frame repeats this one's outcome with probability
/// `rho`, and otherwise draws afresh with the event's probability. The rate stays the
/// event's probability whatever the correlation, and outcomes come in runs: a run of
/// events lasts `1 / ((1 - rho)(1 - p))` frames on average.
///
/// netem's own correlation (a running weighted mean of uniform draws, `get_crandom`)
/// narrows the draws towards one half, so a correlated loss of 5 % loses almost
/// nothing: a known flaw weft's detour does not copy (the Gilbert-Elliott and 4-state
/// models are netem's answer to it, and are the kernel's arithmetic here).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Correlated {
    /// The correlation, as a fraction of 2^32.
    pub rho: Prob,
    last: bool,
}

impl Correlated {
    /// Events correlated by `rho` with the one before.
    pub fn new(rho: Prob) -> Self {
        Correlated { rho, last: false }
    }

    /// Whether the event of probability `p` happens on this frame.
    pub fn hit(&mut self, p: Prob, rng: &mut Prng) -> bool {
        if p.0 == 0 {
            self.last = false;
            return false;
        }
        let hit = if self.rho.0 != 0 && rng.next_u32() < self.rho.0 {
            self.last
        } else {
            rng.next_u32() < p.0
        };
        self.last = hit;
        hit
    }
}

/// Correlated uniform draws for delays: successive values are correlated by `rho` in
/// a normal space (an AR(1) process through the normal's quantile and distribution
/// functions), so each value is still uniform (the delay keeps its distribution) while
/// the next stays near the last. netem indexes its table with the low bits of its
/// correlated draw, which the correlation does not reach; weft's does.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CorrelatedUniform {
    rho: f64,
    z: f64,
}

impl CorrelatedUniform {
    /// Draws correlated by `rho`.
    pub fn new(rho: Prob) -> Self {
        CorrelatedUniform {
            rho: f64::from(rho.0) / 4_294_967_296.0,
            z: 0.0,
        }
    }

    /// The next value in (0, 1).
    pub fn next(&mut self, rng: &mut Prng) -> f64 {
        let u = (f64::from(rng.next_u32()) + 0.5) / 4_294_967_296.0;
        if self.rho == 0.0 {
            return u;
        }
        let e = normal_quantile(u);
        self.z = self.rho * self.z + (1.0 - self.rho * self.rho).sqrt() * e;
        normal_cdf(self.z)
    }
}

/// The standard normal's distribution function (Abramowitz and Stegun 7.1.26 through
/// erfc, absolute error under 1.5e-7).
fn normal_cdf(z: f64) -> f64 {
    let x = z.abs() / std::f64::consts::SQRT_2;
    let t = 1.0 / (1.0 + 0.327_591_1 * x);
    let poly =
        t * (0.254_829_592 + t * (-0.284_496_736 + t * (1.421_413_741 + t * (-1.453_152_027 + t * 1.061_405_429))));
    let erfc = poly * (-x * x).exp();
    if z >= 0.0 { 1.0 - erfc / 2.0 } else { erfc / 2.0 }
}

/// How frames are lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LossModel {
    /// Each frame lost with probability `p`, draws correlated by `corr` (`loss random
    /// P [CORR]`).
    Random {
        /// The probability.
        p: Prob,
        /// The correlation of successive draws.
        corr: Prob,
    },
    /// The 4-state Markov model (`loss state p13 [p31 [p32 [p23 [p14]]]]`): 1 is
    /// "received in a gap", 2 "received in a burst", 3 "lost in a burst", 4 "lost
    /// alone in a gap"; `pXY` is the probability of going from X to Y.
    State {
        /// Gap to burst loss.
        p13: Prob,
        /// Burst loss back to the gap.
        p31: Prob,
        /// Burst loss to a received frame in the burst.
        p32: Prob,
        /// A received frame in the burst to a lost one.
        p23: Prob,
        /// Gap to an isolated loss.
        p14: Prob,
    },
    /// The Gilbert-Elliott model (`loss gemodel p [r [1-h [1-k]]]`): a good and a bad
    /// state; `p` good to bad, `r` bad to good, `1-h` the loss in the bad state, `1-k`
    /// in the good one.
    GilbertElliott {
        /// Good to bad.
        p: Prob,
        /// Bad to good.
        r: Prob,
        /// Received in the bad state (`h`; the file says `1-h`).
        h: Prob,
        /// Lost in the good state (`1-k`).
        k1: Prob,
    },
}

impl LossModel {
    /// `loss state` with netem's defaults for what is not given: `p31 = 1 - p13`,
    /// `p32 = 0`, `p23 = 1`, `p14 = 0`.
    pub fn state(p13: Prob, p31: Option<Prob>, p32: Option<Prob>, p23: Option<Prob>, p14: Option<Prob>) -> Self {
        LossModel::State {
            p13,
            p31: p31.unwrap_or(p13.complement()),
            p32: p32.unwrap_or_default(),
            p23: p23.unwrap_or(Prob(u32::MAX)),
            p14: p14.unwrap_or_default(),
        }
    }

    /// `loss gemodel` with netem's defaults: `r = 1 - p`, `1-h = 1` (every frame of
    /// the bad state lost), `1-k = 0` (none of the good).
    pub fn gilbert_elliott(p: Prob, r: Option<Prob>, one_minus_h: Option<Prob>, one_minus_k: Option<Prob>) -> Self {
        LossModel::GilbertElliott {
            p,
            r: r.unwrap_or(p.complement()),
            h: one_minus_h.unwrap_or(Prob(u32::MAX)).complement(),
            k1: one_minus_k.unwrap_or_default(),
        }
    }
}

/// The state of a loss model between frames.
#[derive(Debug, Clone)]
pub struct Loss {
    model: LossModel,
    corr: Correlated,
    /// 1-4 for the 4-state model; good (1) or bad (2) for Gilbert-Elliott.
    state: u8,
}

impl Loss {
    /// The model at its start (the gap, or the good state).
    pub fn new(model: LossModel) -> Self {
        let corr = match model {
            LossModel::Random { corr, .. } => Correlated::new(corr),
            LossModel::State { .. } | LossModel::GilbertElliott { .. } => Correlated::default(),
        };
        Loss { model, corr, state: 1 }
    }

    /// Whether the next frame is lost.
    pub fn lost(&mut self, rng: &mut Prng) -> bool {
        match self.model {
            LossModel::Random { p, .. } => self.corr.hit(p, rng),
            LossModel::State {
                p13,
                p31,
                p32,
                p23,
                p14,
            } => {
                let rnd = u64::from(rng.next_u32());
                let (a1, a2, a3, a4, a5) = (
                    u64::from(p13.0),
                    u64::from(p31.0),
                    u64::from(p32.0),
                    u64::from(p14.0),
                    u64::from(p23.0),
                );
                // The kernel's transitions, comparison for comparison.
                match self.state {
                    1 => {
                        if rnd < a4 {
                            self.state = 4;
                            true
                        } else if a4 < rnd && rnd < a1 + a4 {
                            self.state = 3;
                            true
                        } else {
                            false
                        }
                    }
                    2 => {
                        if rnd < a5 {
                            self.state = 3;
                            true
                        } else {
                            false
                        }
                    }
                    3 => {
                        if rnd < a3 {
                            self.state = 2;
                            false
                        } else if a2 + a3 < rnd {
                            true
                        } else {
                            self.state = 1;
                            false
                        }
                    }
                    _ => {
                        self.state = 1;
                        false
                    }
                }
            }
            LossModel::GilbertElliott { p, r, h, k1 } => {
                if self.state == 1 {
                    if rng.next_u32() < p.0 {
                        self.state = 2;
                    }
                    rng.next_u32() < k1.0
                } else {
                    if rng.next_u32() < r.0 {
                        self.state = 1;
                    }
                    rng.next_u32() > h.0
                }
            }
        }
    }
}

/// The shape of the delay's variation around its mean.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Distribution {
    /// Uniform over `delay ± jitter` (netem's default).
    #[default]
    Uniform,
    /// Normal: mean `delay`, standard deviation `jitter`.
    Normal,
    /// Pareto (shape 3), standardized: mean `delay`, standard deviation `jitter`, a
    /// long tail above it and nothing below `delay - 0.63 jitter`.
    Pareto,
    /// A quarter normal and three quarters Pareto (as netem's table mixes them),
    /// standardized the same way.
    ParetoNormal,
}

impl Distribution {
    /// Its name in netem's syntax.
    pub fn as_str(self) -> &'static str {
        match self {
            Distribution::Uniform => "uniform",
            Distribution::Normal => "normal",
            Distribution::Pareto => "pareto",
            Distribution::ParetoNormal => "paretonormal",
        }
    }

    /// Reads a name of netem's syntax.
    pub fn parse(s: &str) -> Option<Self> {
        [
            Distribution::Uniform,
            Distribution::Normal,
            Distribution::Pareto,
            Distribution::ParetoNormal,
        ]
        .into_iter()
        .find(|d| d.as_str() == s)
    }

    /// Its table as netem takes it (`TCA_NETEM_DELAY_DIST`, 16-bit entries): the
    /// same quantiles with each entry clamped to ±32,767 (four standard deviations),
    /// which trims Pareto's far tail, as iproute2's own tables do. None for uniform.
    pub fn netem_table(self) -> Option<&'static [i16]> {
        static NORMAL: OnceLock<Vec<i16>> = OnceLock::new();
        static PARETO: OnceLock<Vec<i16>> = OnceLock::new();
        static PARETONORMAL: OnceLock<Vec<i16>> = OnceLock::new();
        let cell = match self {
            Distribution::Uniform => return None,
            Distribution::Normal => &NORMAL,
            Distribution::Pareto => &PARETO,
            Distribution::ParetoNormal => &PARETONORMAL,
        };
        let wide = self.table()?;
        Some(cell.get_or_init(|| {
            wide.iter()
                .map(|v| (*v).clamp(i32::from(i16::MIN) + 1, i32::from(i16::MAX)) as i16)
                .collect()
        }))
    }

    /// Its table (none for uniform, which netem computes directly).
    fn table(self) -> Option<&'static [i32]> {
        static NORMAL: OnceLock<Vec<i32>> = OnceLock::new();
        static PARETO: OnceLock<Vec<i32>> = OnceLock::new();
        static PARETONORMAL: OnceLock<Vec<i32>> = OnceLock::new();
        match self {
            Distribution::Uniform => None,
            Distribution::Normal => Some(NORMAL.get_or_init(|| standardized(&quantiles(normal_quantile)))),
            Distribution::Pareto => Some(PARETO.get_or_init(|| standardized(&quantiles(pareto_quantile)))),
            Distribution::ParetoNormal => Some(PARETONORMAL.get_or_init(paretonormal_table)),
        }
    }
}

/// Entries of a distribution table (netem's `NETEM_DIST_SIZE` is a maximum; iproute2's
/// tables have 4096 after binning).
pub const TABLE_SIZE: usize = 4096;
/// The table's fixed point: an entry of 8192 is one standard deviation.
pub const TABLE_SCALE: i64 = 8192;

/// The quantiles of `q` at the midpoints of `TABLE_SIZE` equal slices.
fn quantiles(q: fn(f64) -> f64) -> Vec<f64> {
    (0..TABLE_SIZE)
        .map(|i| q((i as f64 + 0.5) / TABLE_SIZE as f64))
        .collect()
}

/// `values` moved to mean 0 and scaled to standard deviation 1, in table units: the
/// mean and spread of what the table gives are exactly the delay and jitter.
fn standardized(values: &[f64]) -> Vec<i32> {
    let n = values.len() as f64;
    let mean = values.iter().sum::<f64>() / n;
    let sd = (values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n).sqrt();
    values
        .iter()
        .map(|v| ((v - mean) / sd * TABLE_SCALE as f64).round() as i32)
        .collect()
}

/// The standard normal's quantile (Acklam's rational approximation, relative error
/// under 1.2e-9: far below a table entry's resolution).
fn normal_quantile(p: f64) -> f64 {
    const A: [f64; 6] = [
        -3.969_683_028_665_376e1,
        2.209_460_984_245_205e2,
        -2.759_285_104_469_687e2,
        1.383_577_518_672_69e2,
        -3.066_479_806_614_716e1,
        2.506_628_277_459_239,
    ];
    const B: [f64; 5] = [
        -5.447_609_879_822_406e1,
        1.615_858_368_580_409e2,
        -1.556_989_798_598_866e2,
        6.680_131_188_771_972e1,
        -1.328_068_155_288_572e1,
    ];
    const C: [f64; 6] = [
        -7.784_894_002_430_293e-3,
        -3.223_964_580_411_365e-1,
        -2.400_758_277_161_838,
        -2.549_732_539_343_734,
        4.374_664_141_464_968,
        2.938_163_982_698_783,
    ];
    const D: [f64; 4] = [
        7.784_695_709_041_462e-3,
        3.224_671_290_700_398e-1,
        2.445_134_137_142_996,
        3.754_408_661_907_416,
    ];
    let tail = |q: f64| {
        (((((C[0] * q + C[1]) * q + C[2]) * q + C[3]) * q + C[4]) * q + C[5])
            / ((((D[0] * q + D[1]) * q + D[2]) * q + D[3]) * q + 1.0)
    };
    if p < 0.02425 {
        tail((-2.0 * p.ln()).sqrt())
    } else if p > 1.0 - 0.02425 {
        -tail((-2.0 * (1.0 - p).ln()).sqrt())
    } else {
        let q = p - 0.5;
        let r = q * q;
        (((((A[0] * r + A[1]) * r + A[2]) * r + A[3]) * r + A[4]) * r + A[5]) * q
            / (((((B[0] * r + B[1]) * r + B[2]) * r + B[3]) * r + B[4]) * r + 1.0)
    }
}

/// Pareto of shape 3 and scale 1: its quantile.
fn pareto_quantile(p: f64) -> f64 {
    (1.0 - p).powf(-1.0 / 3.0)
}

/// A quarter normal plus three quarters Pareto, both independent: its quantiles, from
/// a large fixed-seed sample (the same table on every run and node).
fn paretonormal_table() -> Vec<i32> {
    const SAMPLES: usize = TABLE_SIZE * 64;
    let mut rng = Prng::new(0x7765_6674);
    let u = |rng: &mut Prng| (f64::from(rng.next_u32()) + 0.5) / 4_294_967_296.0;
    let mut xs: Vec<f64> = (0..SAMPLES)
        .map(|_| 0.25 * normal_quantile(u(&mut rng)) + 0.75 * pareto_quantile(u(&mut rng)))
        .collect();
    xs.sort_by(f64::total_cmp);
    let picked: Vec<f64> = (0..TABLE_SIZE).map(|i| xs[i * 64 + 32]).collect();
    standardized(&picked)
}

/// A delay's draws: `mu` and `sigma` in microseconds, the distribution's table (netem's
/// `tabledist` arithmetic on the entry), successive draws correlated by `corr`.
#[derive(Debug, Clone)]
pub struct DelayDraw {
    mu: i64,
    sigma: i64,
    dist: Distribution,
    corr: CorrelatedUniform,
}

impl DelayDraw {
    /// Delays of mean `mu` and spread `sigma` (µs), shaped by `dist`, successive draws
    /// correlated by `corr`.
    pub fn new(mu_us: u64, sigma_us: u64, dist: Distribution, corr: Prob) -> Self {
        DelayDraw {
            mu: i64::try_from(mu_us).unwrap_or(i64::MAX),
            sigma: i64::try_from(sigma_us).unwrap_or(i64::MAX),
            dist,
            corr: CorrelatedUniform::new(corr),
        }
    }

    /// The next delay in microseconds (never negative).
    pub fn next(&mut self, rng: &mut Prng) -> u64 {
        if self.sigma == 0 {
            return self.mu.max(0) as u64;
        }
        let u = self.corr.next(rng);
        let d = match self.dist.table() {
            // Uniform over [mu - sigma, mu + sigma), as netem's default.
            None => self.mu - self.sigma + ((2 * self.sigma) as f64 * u) as i64,
            Some(table) => {
                let i = ((u * table.len() as f64) as usize).min(table.len() - 1);
                let t = i64::from(table[i]);
                let mut x = (self.sigma % TABLE_SCALE) * t;
                x += if x >= 0 { TABLE_SCALE / 2 } else { -TABLE_SCALE / 2 };
                x / TABLE_SCALE + (self.sigma / TABLE_SCALE) * t + self.mu
            }
        };
        d.max(0) as u64
    }
}

/// `slot`: frames leave in bursts, at slot boundaries spaced by a delay drawn between
/// `min_us` and `max_us` (uniform), each slot taking at most `packets` frames and
/// `bytes` bytes (netem's `slot MIN [MAX] [packets N] [bytes B]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SlotConfig {
    /// The shortest gap between slots, µs.
    pub min_us: u64,
    /// The longest, µs.
    pub max_us: u64,
    /// Frames per slot at most (`None`: no bound).
    pub packets: Option<u32>,
    /// Bytes per slot at most (`None`: no bound).
    pub bytes: Option<u64>,
}

/// The slots' state: when the next one opens and what it has left.
#[derive(Debug, Clone)]
pub struct Slots {
    cfg: SlotConfig,
    next_us: Option<u64>,
    packets_left: i64,
    bytes_left: i64,
}

impl Slots {
    /// Slots as `cfg` says, the first drawn when the first frame comes.
    pub fn new(cfg: SlotConfig) -> Self {
        Slots {
            cfg,
            next_us: None,
            packets_left: 0,
            bytes_left: 0,
        }
    }

    fn open_next(&mut self, now_us: u64, rng: &mut Prng) {
        let span = self.cfg.max_us.saturating_sub(self.cfg.min_us);
        let gap = self.cfg.min_us + ((u64::from(rng.next_u32()) * span) >> 32);
        self.next_us = Some(now_us + gap);
        self.packets_left = self.cfg.packets.map_or(i64::MAX, i64::from);
        self.bytes_left = self
            .cfg
            .bytes
            .map_or(i64::MAX, |b| i64::try_from(b).unwrap_or(i64::MAX));
    }

    /// When a frame of `len` bytes ready at `ready_us` leaves: at the open slot if it
    /// opens at or after the frame is ready; a slot that opened before is stale, and a
    /// new one is drawn from the frame's time (netem's dequeue), so frames that come
    /// while a slot is pending leave together at its opening. A slot whose frames or
    /// bytes run out draws the next from its own opening.
    pub fn release(&mut self, ready_us: u64, len: u64, rng: &mut Prng) -> u64 {
        if self.next_us.is_none_or(|next| next < ready_us) {
            self.open_next(ready_us, rng);
        }
        let at = self.next_us.unwrap_or(ready_us);
        self.packets_left -= 1;
        self.bytes_left -= i64::try_from(len).unwrap_or(i64::MAX);
        if self.packets_left <= 0 || self.bytes_left <= 0 {
            self.open_next(at, rng);
        }
        at
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const N: usize = 100_000;

    fn pct(p: f64) -> Prob {
        Prob(((p / 100.0) * 4_294_967_296.0).min(u32::MAX as f64) as u32)
    }

    /// The loss rate and the mean length of loss bursts over `N` frames.
    fn losses(model: LossModel, seed: u64) -> (f64, f64) {
        let mut rng = Prng::new(seed);
        let mut loss = Loss::new(model);
        let (mut lost, mut bursts, mut in_burst) = (0usize, 0usize, false);
        for _ in 0..N {
            let l = loss.lost(&mut rng);
            lost += usize::from(l);
            if l && !in_burst {
                bursts += 1;
            }
            in_burst = l;
        }
        (lost as f64 / N as f64, lost as f64 / bursts.max(1) as f64)
    }

    #[test]
    fn probabilities_convert_exactly_enough() {
        assert_eq!(Prob::from_ppm(1_000_000), Prob(u32::MAX));
        assert_eq!(Prob::from_ppm(0), Prob(0));
        for ppm in [1, 10_000, 123_456, 999_999] {
            assert!(Prob::from_ppm(ppm).ppm().abs_diff(ppm) <= 1, "{ppm}");
        }
    }

    #[test]
    fn random_loss_keeps_its_rate_and_correlation_lengthens_bursts() {
        let (rate, burst) = losses(
            LossModel::Random {
                p: pct(5.0),
                corr: Prob(0),
            },
            1,
        );
        assert!((rate - 0.05).abs() < 0.004, "{rate}");
        assert!(
            (burst - 1.0 / 0.95).abs() < 0.05,
            "independent: geometric bursts, {burst}"
        );
        // Correlated: the same rate, runs of mean 1 / ((1 - rho)(1 - p)).
        let (rate, correlated) = losses(
            LossModel::Random {
                p: pct(5.0),
                corr: pct(75.0),
            },
            1,
        );
        assert!((rate - 0.05).abs() < 0.01, "{rate}");
        let want = 1.0 / (0.25 * 0.95);
        assert!((correlated - want).abs() < want * 0.1, "{correlated} vs {want}");
    }

    /// Gilbert-Elliott: loss rate `p / (p + r)` of the time in the bad state (with
    /// `1-h` = 1 and `1-k` = 0), bursts of mean length `1 / r`.
    #[test]
    fn gilbert_elliott_gives_its_stationary_rate_and_burst_length() {
        for (p, r, seed) in [(1.0, 10.0, 3), (5.0, 50.0, 4), (0.5, 25.0, 5)] {
            let (rate, burst) = losses(LossModel::gilbert_elliott(pct(p), Some(pct(r)), None, None), seed);
            let want_rate = p / (p + r);
            let want_burst = 100.0 / r;
            assert!(
                (rate - want_rate).abs() < want_rate * 0.1 + 0.001,
                "p {p} r {r}: rate {rate}, want {want_rate}"
            );
            assert!(
                (burst - want_burst).abs() < want_burst * 0.1,
                "p {p} r {r}: burst {burst}, want {want_burst}"
            );
        }
        // Only p given: r = 1 - p, a Bernoulli loss of rate p.
        let (rate, _) = losses(LossModel::gilbert_elliott(pct(2.0), None, None, None), 6);
        assert!((rate - 0.02).abs() < 0.003, "{rate}");
        // Lossy good state, half-lossy bad state.
        let m = LossModel::gilbert_elliott(pct(1.0), Some(pct(10.0)), Some(pct(50.0)), Some(pct(1.0)));
        let (rate, _) = losses(m, 7);
        let bad = 1.0 / 11.0;
        let want = bad * 0.5 + (1.0 - bad) * 0.01;
        assert!((rate - want).abs() < want * 0.1, "{rate} vs {want}");
    }

    /// The 4-state model with p13 and p31 (p32 = 0, p23 = 1, p14 = 0): bursts of mean
    /// length `1 / p31`, gaps of mean `1 / p13`.
    #[test]
    fn the_four_state_model_gives_its_bursts() {
        let (rate, burst) = losses(LossModel::state(pct(1.0), Some(pct(20.0)), None, None, None), 8);
        assert!((burst - 5.0).abs() < 0.5, "{burst}");
        let want = 5.0 / (5.0 + 100.0);
        assert!((rate - want).abs() < want * 0.1, "{rate} vs {want}");
        // Isolated losses only (p14): rate p14, bursts of one.
        let (rate, burst) = losses(LossModel::state(Prob(0), None, None, None, Some(pct(3.0))), 9);
        assert!((rate - 0.03 / 1.03).abs() < 0.003, "{rate}");
        assert!((burst - 1.0).abs() < 0.01, "{burst}");
    }

    fn delays(mu: u64, sigma: u64, dist: Distribution, corr: Prob) -> (f64, f64, u64) {
        let mut rng = Prng::new(11);
        let mut d = DelayDraw::new(mu, sigma, dist, corr);
        let xs: Vec<f64> = (0..N).map(|_| d.next(&mut rng) as f64).collect();
        let mean = xs.iter().sum::<f64>() / N as f64;
        let sd = (xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / N as f64).sqrt();
        let min = xs.iter().fold(f64::MAX, |a, b| a.min(*b)) as u64;
        (mean, sd, min)
    }

    #[test]
    fn each_distribution_has_the_delay_as_mean_and_the_jitter_as_spread() {
        for dist in [Distribution::Normal, Distribution::Pareto, Distribution::ParetoNormal] {
            let (mean, sd, _) = delays(50_000, 10_000, dist, Prob(0));
            assert!((mean - 50_000.0).abs() < 300.0, "{dist:?}: mean {mean}");
            assert!((sd - 10_000.0).abs() < 500.0, "{dist:?}: sd {sd}");
        }
        // Uniform ± jitter: sd = jitter / sqrt(3).
        let (mean, sd, min) = delays(50_000, 10_000, Distribution::Uniform, Prob(0));
        assert!((mean - 50_000.0).abs() < 300.0, "{mean}");
        assert!((sd - 10_000.0 / 3f64.sqrt()).abs() < 200.0, "{sd}");
        assert!(min >= 40_000, "{min}");
        // Pareto has nothing far below its mean: its floor is 0.58 sd under it.
        let (_, _, min) = delays(50_000, 10_000, Distribution::Pareto, Prob(0));
        assert!((43_500..=44_500).contains(&min), "{min}");
        // Correlated draws keep the distribution.
        let (mean, sd, _) = delays(50_000, 10_000, Distribution::Normal, pct(80.0));
        assert!((mean - 50_000.0).abs() < 1_000.0, "correlated mean {mean}");
        assert!((sd - 10_000.0).abs() < 1_000.0, "correlated sd {sd}");
        // Without jitter every delay is the delay.
        assert_eq!(delays(7_000, 0, Distribution::Normal, Prob(0)).1, 0.0);
    }

    #[test]
    fn correlated_delays_change_slowly() {
        let step = |corr: Prob| {
            let mut rng = Prng::new(12);
            let mut d = DelayDraw::new(50_000, 10_000, Distribution::Normal, corr);
            let xs: Vec<i64> = (0..N).map(|_| d.next(&mut rng) as i64).collect();
            xs.windows(2).map(|w| (w[1] - w[0]).abs()).sum::<i64>() / N as i64
        };
        assert!(
            step(pct(90.0)) * 3 < step(Prob(0)),
            "{} vs {}",
            step(pct(90.0)),
            step(Prob(0))
        );
    }

    #[test]
    fn slots_release_frames_in_bursts() {
        let cfg = SlotConfig {
            min_us: 1_000,
            max_us: 1_000,
            packets: Some(4),
            bytes: None,
        };
        let mut slots = Slots::new(cfg);
        let mut rng = Prng::new(13);
        // Ten frames ready at once leave four, four and two at slot openings.
        let at: Vec<u64> = (0..10).map(|_| slots.release(0, 1500, &mut rng)).collect();
        assert_eq!(
            at,
            [1_000, 1_000, 1_000, 1_000, 2_000, 2_000, 2_000, 2_000, 3_000, 3_000]
        );
        // A frame after the pending slot opened finds it stale: a new one from its time.
        assert_eq!(slots.release(10_000, 100, &mut rng), 11_000);
        assert_eq!(
            slots.release(10_500, 100, &mut rng),
            11_000,
            "waits for the pending slot"
        );
        // A byte budget closes a slot too.
        let mut slots = Slots::new(SlotConfig {
            bytes: Some(3000),
            packets: None,
            ..cfg
        });
        let at: Vec<u64> = (0..4).map(|_| slots.release(0, 1500, &mut rng)).collect();
        assert_eq!(at, [1_000, 1_000, 2_000, 2_000]);
        // Gaps between min and max.
        let mut slots = Slots::new(SlotConfig {
            min_us: 500,
            max_us: 1_500,
            packets: Some(1),
            bytes: None,
        });
        let times: Vec<u64> = (0..N).map(|_| slots.release(0, 100, &mut rng)).collect();
        let gaps: Vec<u64> = times.windows(2).map(|w| w[1] - w[0]).collect();
        assert!(gaps.iter().all(|g| (500..=1_500).contains(g)));
        let mean = gaps.iter().sum::<u64>() as f64 / gaps.len() as f64;
        assert!((mean - 1_000.0).abs() < 10.0, "{mean}");
    }
}
