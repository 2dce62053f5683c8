//! The plugin's own exec cost: `CNI_COMMAND=VERSION` of weft beside the Go reference
//! plugins, each run as a runtime runs a plugin (a fresh process with the `CNI_*`
//! environment, the config on stdin, stdout captured), timed from spawn to exit.
//! VERSION does no work in either, so what is left is what every call pays before it
//! starts: exec, dynamic loading, runtime start-up, reading stdin, printing.
//!
//! The binaries take turns in blocks, each round in the opposite order, so that drift
//! on a shared machine hits all of them. `/bin/true` runs beside them as the floor: what
//! any exec costs here, so the rest can be told from what the machine charges anyway.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use serde::Serialize;
use weft_harness::{CallOptions, CniExec, RUNTIME_PATH};

use crate::table::Table;
use crate::{Percentiles, ms};

/// Execs per binary and block: small enough that drift between blocks is shared.
const BLOCK: usize = 25;
/// Untimed execs per binary first, so the binaries are in the page cache.
const WARMUP: usize = 10;

/// What to run.
#[derive(Debug, Clone)]
pub struct ExecOptions {
    /// The weft plugin binary.
    pub weft: PathBuf,
    /// Directory of the reference plugins (host-local, ptp).
    pub reference_dir: PathBuf,
    /// Timed execs per binary.
    pub execs: usize,
}

/// One binary's exec latency.
#[derive(Debug, Clone, Serialize)]
pub struct ExecSide {
    /// `weft`, `host-local` or `ptp`.
    pub binary: String,
    /// Its path.
    pub path: PathBuf,
    /// Its size in bytes (what has to be mapped).
    pub bytes: u64,
    /// `static` or `dynamic` (has an ELF interpreter), `unknown` when not an ELF file.
    pub linking: &'static str,
    /// Spawn-to-exit percentiles (ms).
    pub latency: Percentiles,
    /// Mean (ms).
    pub mean_ms: f64,
    /// Calls that did not exit 0 or printed no version.
    pub errors: usize,
    /// Every sample (ms), in the order taken.
    pub samples_ms: Vec<f64>,
}

/// The exec comparison.
#[derive(Debug, Clone, Serialize)]
pub struct ExecReport {
    /// Timed execs per binary.
    pub execs: usize,
    /// Execs per block.
    pub block: usize,
    /// weft first, then the references.
    pub sides: Vec<ExecSide>,
    /// weft p50 / host-local p50.
    pub weft_over_host_local_p50: f64,
    /// weft p50 / ptp p50.
    pub weft_over_ptp_p50: f64,
    /// weft p50 minus the floor's p50 (ms): what weft itself adds to an exec.
    pub weft_above_floor_p50_ms: f64,
    /// The target for weft's p50 (ms).
    pub target_p50_ms: f64,
    /// weft p50 / target.
    pub weft_p50_over_target: f64,
}

/// The ceiling for weft's p50: near the floor of any exec on this kind of machine.
pub const EXEC_TARGET_P50_MS: f64 = 1.0;

/// The do-nothing binary every exec is set beside.
const FLOOR: &str = "/bin/true";

/// Whether an ELF executable is linked statically (no `PT_INTERP` program header).
/// Read by hand: sixteen bytes of header and the program header table are all it
/// takes, not worth an ELF crate in the bench.
fn linking(path: &Path) -> &'static str {
    let Ok(b) = std::fs::read(path) else {
        return "unknown";
    };
    // 64-bit little-endian ELF only (what this machine runs).
    if b.len() < 64 || &b[..4] != b"\x7fELF" || b[4] != 2 || b[5] != 1 {
        return "unknown";
    }
    let u16_at = |o: usize| u16::from_le_bytes([b[o], b[o + 1]]) as usize;
    let phoff = u64::from_le_bytes(b[32..40].try_into().unwrap_or_default()) as usize;
    let (phentsize, phnum) = (u16_at(54), u16_at(56));
    const PT_INTERP: u32 = 3;
    for i in 0..phnum {
        let o = phoff + i * phentsize;
        let Some(t) = b.get(o..o + 4) else {
            return "unknown";
        };
        if u32::from_le_bytes(t.try_into().unwrap_or_default()) == PT_INTERP {
            return "dynamic";
        }
    }
    "static"
}

/// One VERSION call as a runtime makes it; its latency (ms) and whether it answered
/// (the floor, which prints nothing, answers by exiting 0).
fn version_call(binary: &Path, config: &[u8]) -> Result<(f64, bool), String> {
    let cni_path = binary.parent().unwrap_or(Path::new("/"));
    let env = [
        ("PATH", OsStr::new(RUNTIME_PATH)),
        ("CNI_COMMAND", OsStr::new("VERSION")),
        ("CNI_PATH", cni_path.as_os_str()),
    ];
    let out = CniExec::new(binary)
        .run(env, config, CallOptions::default())
        .map_err(|e| e.to_string())?;
    let ok = out.ok() && (binary == Path::new(FLOOR) || out.stdout.windows(17).any(|w| w == b"supportedVersions"));
    Ok((ms(out.elapsed), ok))
}

/// Runs the exec comparison.
pub fn run_exec(opts: &ExecOptions) -> Result<ExecReport, String> {
    let bins = [
        ("weft", opts.weft.clone()),
        ("host-local", opts.reference_dir.join("host-local")),
        ("ptp", opts.reference_dir.join("ptp")),
        ("true (floor)", PathBuf::from(FLOOR)),
    ];
    for (what, p) in &bins {
        if !p.exists() {
            return Err(format!("{what} not found at {}", p.display()));
        }
    }
    // What a runtime hands every plugin for VERSION: the network config.
    let config = br#"{"cniVersion":"1.0.0","name":"bench","type":"weft"}"#;
    let mut samples = vec![Vec::with_capacity(opts.execs); bins.len()];
    let mut errors = vec![0usize; bins.len()];
    for (_, p) in &bins {
        for _ in 0..WARMUP {
            version_call(p, config)?;
        }
    }
    let mut round = 0;
    while samples.iter().any(|s| s.len() < opts.execs) {
        let order: Vec<usize> = if round % 2 == 0 {
            (0..bins.len()).collect()
        } else {
            (0..bins.len()).rev().collect()
        };
        for i in order {
            let n = BLOCK.min(opts.execs - samples[i].len());
            for _ in 0..n {
                let (t, ok) = version_call(&bins[i].1, config)?;
                samples[i].push(t);
                if !ok {
                    errors[i] += 1;
                }
            }
        }
        round += 1;
    }
    let sides: Vec<ExecSide> = bins
        .iter()
        .zip(samples)
        .zip(errors)
        .map(|(((name, path), s), errors)| ExecSide {
            binary: (*name).to_string(),
            bytes: std::fs::metadata(path).map(|m| m.len()).unwrap_or(0),
            linking: linking(path),
            path: path.clone(),
            latency: Percentiles::of(&s),
            mean_ms: if s.is_empty() {
                0.0
            } else {
                s.iter().sum::<f64>() / s.len() as f64
            },
            errors,
            samples_ms: s,
        })
        .collect();
    let div = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
    let w = sides[0].latency.p50;
    Ok(ExecReport {
        execs: opts.execs,
        block: BLOCK,
        weft_over_host_local_p50: div(w, sides[1].latency.p50),
        weft_over_ptp_p50: div(w, sides[2].latency.p50),
        weft_above_floor_p50_ms: w - sides[3].latency.p50,
        target_p50_ms: EXEC_TARGET_P50_MS,
        weft_p50_over_target: div(w, EXEC_TARGET_P50_MS),
        sides,
    })
}

pub(crate) fn met(ok: bool) -> &'static str {
    if ok { "met" } else { "missed" }
}

impl ExecReport {
    /// The report as markdown tables.
    pub fn markdown(&self) -> String {
        let mut out = format!(
            "Plugin exec cost: CNI_COMMAND=VERSION, {} execs per binary in alternating blocks of {}, spawn to exit with stdin written and stdout captured\n\n",
            self.execs, self.block
        );
        let mut t = Table::new()
            .text("binary")
            .num("size (MB)")
            .text("linking")
            .num("p50 (ms)")
            .num("p90 (ms)")
            .num("p99 (ms)")
            .num("mean (ms)")
            .num("weft / this (p50)")
            .num("failed");
        let w = self.sides[0].latency.p50;
        for s in &self.sides {
            let r = if s.latency.p50 > 0.0 { w / s.latency.p50 } else { 0.0 };
            t.row([
                s.binary.to_string(),
                format!("{:.1}", s.bytes as f64 / 1e6),
                s.linking.to_string(),
                format!("{:.2}", s.latency.p50),
                format!("{:.2}", s.latency.p90),
                format!("{:.2}", s.latency.p99),
                format!("{:.2}", s.mean_ms),
                format!("{r:.2}"),
                s.errors.to_string(),
            ]);
        }
        out.push_str(&t.to_string());
        out.push_str(&format!(
            "\nweft above the floor (p50): {:.2} ms\ntarget: weft p50 <= {:.1} ms: {:.2} ms = {:.2}x the target, {}\n",
            self.weft_above_floor_p50_ms,
            self.target_p50_ms,
            w,
            self.weft_p50_over_target,
            met(w <= self.target_p50_ms)
        ));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tells_static_from_dynamic_executables() {
        // Debian ships ldconfig static-pie and coreutils dynamic.
        assert_eq!(linking(Path::new("/sbin/ldconfig")), "static");
        assert_eq!(linking(Path::new(FLOOR)), "dynamic");
        assert_eq!(linking(Path::new("/etc/hostname")), "unknown");
        assert_eq!(linking(Path::new("/nonexistent/weft")), "unknown");
    }
}
