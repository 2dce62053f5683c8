//! `xtask`: build chores a cargo alias cannot do alone (the cargo-xtask convention).
//! Standard library only, so it builds in seconds.
//!
//! `cargo plugin-static` (an alias in `.cargo/config.toml`) runs `xtask plugin-static`:
//! it builds the CNI plugin statically linked against musl and puts it at
//! `target/release/weft`, beside the release `weftd` and `weftctl` that the lab, the
//! benchmarks and the image take it from.
//!
//! Why musl rather than glibc's `+crt-static`: the plugin is exec'd for every CNI call,
//! and a static glibc binary spends about a quarter of a millisecond at start in
//! `init_cpu_features`, whose `cpuid` instructions each trap to the hypervisor on a
//! virtual machine (where most nodes run). musl asks the processor nothing: on this
//! project's test machine an exec of `CNI_COMMAND=VERSION` took 0.30-0.34 ms against
//! 0.57-0.65 ms (docs/BENCHMARKS.md, "Plugin exec cost"). Where the musl target is not
//! installed (`rustup target add x86_64-unknown-linux-musl`), the glibc build is made
//! instead, and said so.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
        ["plugin-static"] => match plugin_static() {
            Ok(out) => {
                eprintln!("xtask: the static plugin is {}", out.display());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("xtask plugin-static: {e}");
                ExitCode::FAILURE
            }
        },
        _ => {
            eprintln!("usage: cargo plugin-static   (xtask plugin-static)");
            ExitCode::from(2)
        }
    }
}

/// How the static plugin is linked.
enum Libc {
    /// musl, for this target triple.
    Musl(String),
    /// glibc with `+crt-static`: the fallback when no musl target is installed.
    Glibc,
}

/// Builds the static plugin and puts it at `<target dir>/release/weft`.
fn plugin_static() -> Result<PathBuf, String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let root = root
        .canonicalize()
        .map_err(|e| format!("the workspace at {}: {e}", root.display()))?;
    let target = match std::env::var_os("CARGO_TARGET_DIR") {
        Some(d) => root.join(d),
        None => root.join("target"),
    };
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = target.join("release").join("weft");
    let mut build = Command::new(&cargo);
    build
        .current_dir(&root)
        .args(["rustc", "--release", "-p", "weft", "--bin", "weft"]);
    match libc()? {
        Libc::Musl(triple) => {
            build
                .args(["--target", &triple])
                .args(["--", "-C", "target-feature=+crt-static", "-C", "strip=debuginfo"]);
            run(&mut build)?;
            let built = target.join(&triple).join("release").join("weft");
            std::fs::create_dir_all(target.join("release")).map_err(|e| format!("{}: {e}", target.display()))?;
            // Through a new file and a rename: `target/release/weft` may be a hard
            // link to cargo's own copy of the dynamic build, or running right now.
            let tmp = out.with_extension("static.tmp");
            std::fs::copy(&built, &tmp).map_err(|e| format!("copying {}: {e}", built.display()))?;
            std::fs::rename(&tmp, &out).map_err(|e| format!("placing {}: {e}", out.display()))?;
        }
        Libc::Glibc => {
            build.args(["--", "-C", "target-feature=+crt-static", "-C", "strip=debuginfo"]);
            run(&mut build)?;
        }
    }
    Ok(out)
}

/// musl when the toolchain has the host's musl target, else glibc (with a word why).
fn libc() -> Result<Libc, String> {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let host = output(Command::new(&rustc).arg("-vV"))?
        .lines()
        .find_map(|l| l.strip_prefix("host: ").map(str::to_string))
        .ok_or("`rustc -vV` names no host")?;
    let Some(arch) = host.strip_suffix("-unknown-linux-gnu") else {
        eprintln!("xtask: the host is {host}, not *-unknown-linux-gnu: linking against its libc statically");
        return Ok(Libc::Glibc);
    };
    let musl = format!("{arch}-unknown-linux-musl");
    let sysroot = output(Command::new(&rustc).args(["--print", "sysroot"]))?;
    if Path::new(sysroot.trim())
        .join("lib/rustlib")
        .join(&musl)
        .join("lib")
        .is_dir()
    {
        Ok(Libc::Musl(musl))
    } else {
        eprintln!(
            "xtask: the {musl} target is not installed (rustup target add {musl}): linking against \
             glibc statically instead, whose start costs about 0.25 ms more per CNI call on a virtual machine"
        );
        Ok(Libc::Glibc)
    }
}

fn run(cmd: &mut Command) -> Result<(), String> {
    let st = cmd.status().map_err(|e| format!("running {cmd:?}: {e}"))?;
    if st.success() {
        Ok(())
    } else {
        Err(format!("{cmd:?} failed ({st})"))
    }
}

fn output(cmd: &mut Command) -> Result<String, String> {
    let out = cmd.output().map_err(|e| format!("running {cmd:?}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{cmd:?} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    String::from_utf8(out.stdout).map_err(|e| format!("{cmd:?}: {e}"))
}
