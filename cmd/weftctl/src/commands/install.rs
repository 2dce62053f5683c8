//! `weftctl install-cni`: what the DaemonSet's init container runs to put weft on a
//! node. The image has no shell, so this is the whole install step: the plugin binary
//! into the CNI bin directory and the network config into the CNI config directory,
//! each written to a temporary file in the same directory, flushed, and renamed over
//! the final name, so a runtime never sees half a file. No other file in either
//! directory is read, changed or removed.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use clap::Args;
use serde_json::Value;

/// Where the plugin and the network config come from and go to.
#[derive(Debug, Args)]
pub struct InstallArgs {
    /// The plugin binary to install (in the image: the statically linked one).
    #[arg(long, default_value = "/usr/local/bin/weft")]
    pub plugin: PathBuf,
    /// The node's CNI bin directory, as mounted in the container.
    #[arg(long, default_value = "/host/opt/cni/bin")]
    pub bin_dir: PathBuf,
    /// The network config to install (a conflist with a `weft` plugin entry); it keeps
    /// its file name.
    #[arg(long, default_value = "/etc/weft/10-weft.conflist")]
    pub conflist: PathBuf,
    /// The node's CNI config directory, as mounted in the container.
    #[arg(long, default_value = "/host/etc/cni/net.d")]
    pub conf_dir: PathBuf,
}

/// What was installed where.
#[derive(Debug, serde::Serialize)]
struct Installed {
    plugin: PathBuf,
    conflist: PathBuf,
}

/// Installs the plugin, then the config (a runtime that sees the config finds the plugin).
pub fn run(args: InstallArgs, json: bool) -> anyhow::Result<()> {
    let installed = install(&args)?;
    if json {
        outln!("{}", serde_json::to_string(&installed)?);
    } else {
        outln!(
            "installed {} and {}",
            installed.plugin.display(),
            installed.conflist.display()
        );
    }
    Ok(())
}

fn install(args: &InstallArgs) -> anyhow::Result<Installed> {
    let config = std::fs::read(&args.conflist).with_context(|| format!("reading {}", args.conflist.display()))?;
    check_conflist(&config).with_context(|| format!("{} is not a weft network config", args.conflist.display()))?;
    let plugin =
        std::fs::read(&args.plugin).with_context(|| format!("reading the plugin {}", args.plugin.display()))?;
    let plugin_name = file_name(&args.plugin)?;
    let conf_name = file_name(&args.conflist)?;
    let plugin_dst = args.bin_dir.join(plugin_name);
    let conf_dst = args.conf_dir.join(conf_name);
    write_atomic(&plugin_dst, &plugin, 0o755)?;
    write_atomic(&conf_dst, &config, 0o644)?;
    Ok(Installed {
        plugin: plugin_dst,
        conflist: conf_dst,
    })
}

fn file_name(p: &Path) -> anyhow::Result<&std::ffi::OsStr> {
    p.file_name().with_context(|| format!("{} names no file", p.display()))
}

/// A network config list weft can serve: JSON with `cniVersion`, `name` and a
/// `plugins` list holding a `weft` entry.
fn check_conflist(raw: &[u8]) -> anyhow::Result<()> {
    let v: Value = serde_json::from_slice(raw).context("not JSON")?;
    for key in ["cniVersion", "name"] {
        if !v.get(key).is_some_and(Value::is_string) {
            bail!("no {key:?}");
        }
    }
    let plugins = v
        .get("plugins")
        .and_then(Value::as_array)
        .context("no \"plugins\" list")?;
    if !plugins.iter().any(|p| p["type"] == "weft") {
        bail!("no plugin of type \"weft\" in \"plugins\"");
    }
    Ok(())
}

/// Writes `data` to `dst` through `.<name>.weft-tmp` in the same directory (flushed to
/// disk, given `mode`), renamed over `dst`. The temporary name is fixed, so a crash
/// leaves at most that one file, which the next install overwrites; it ends in neither
/// `.conf`, `.conflist` nor `.json`, so no runtime loads it as a config.
fn write_atomic(dst: &Path, data: &[u8], mode: u32) -> anyhow::Result<()> {
    let dir = dst.parent().context("no directory")?;
    let name = file_name(dst)?;
    let tmp = dir.join(format!(".{}.weft-tmp", name.to_string_lossy()));
    let write = || -> std::io::Result<()> {
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode)
            .open(&tmp)?;
        f.write_all(data)?;
        // The mode at creation is masked by the umask; an existing file keeps its own.
        f.set_permissions(std::fs::Permissions::from_mode(mode))?;
        f.sync_all()?;
        drop(f);
        std::fs::rename(&tmp, dst)?;
        // The rename itself survives a crash once the directory is flushed.
        File::open(dir)?.sync_all()
    };
    write().map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        anyhow::Error::new(e).context(format!("installing {}", dst.display()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    struct Dir(PathBuf);
    impl Dir {
        fn new(tag: &str) -> Self {
            let p = std::env::temp_dir().join(format!("weftctl-install-{tag}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&p);
            std::fs::create_dir_all(&p).unwrap();
            Dir(p)
        }
    }
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    const CONF: &str =
        r#"{"cniVersion":"1.0.0","name":"weft","plugins":[{"type":"weft","capabilities":{"portMappings":true}}]}"#;

    fn listing(dir: &Path) -> BTreeMap<String, (Vec<u8>, u32)> {
        std::fs::read_dir(dir)
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                let m = e.metadata().unwrap();
                (
                    e.file_name().to_string_lossy().into_owned(),
                    (std::fs::read(e.path()).unwrap(), m.permissions().mode() & 0o7777),
                )
            })
            .collect()
    }

    fn setup(tag: &str) -> (Dir, InstallArgs) {
        let d = Dir::new(tag);
        for sub in ["src", "bin", "conf"] {
            std::fs::create_dir_all(d.0.join(sub)).unwrap();
        }
        std::fs::write(d.0.join("src/weft"), b"\x7fELF plugin v2").unwrap();
        std::fs::write(d.0.join("src/10-weft.conflist"), CONF).unwrap();
        let args = InstallArgs {
            plugin: d.0.join("src/weft"),
            bin_dir: d.0.join("bin"),
            conflist: d.0.join("src/10-weft.conflist"),
            conf_dir: d.0.join("conf"),
        };
        (d, args)
    }

    #[test]
    fn installs_both_and_touches_nothing_else() {
        let (d, args) = setup("fresh");
        // What the node already has: other plugins, other configs, an old weft.
        std::fs::write(d.0.join("bin/loopback"), b"loopback").unwrap();
        std::fs::write(d.0.join("bin/weft"), b"old weft").unwrap();
        std::fs::write(d.0.join("conf/05-other.conflist"), b"{}").unwrap();
        std::fs::write(d.0.join("conf/10-weft.conflist"), b"old").unwrap();
        std::fs::set_permissions(
            d.0.join("conf/10-weft.conflist"),
            std::fs::Permissions::from_mode(0o600),
        )
        .unwrap();
        let installed = install(&args).unwrap();
        assert_eq!(installed.plugin, d.0.join("bin/weft"));
        assert_eq!(installed.conflist, d.0.join("conf/10-weft.conflist"));

        let bin = listing(&d.0.join("bin"));
        assert_eq!(bin.keys().collect::<Vec<_>>(), ["loopback", "weft"]);
        assert_eq!(bin["loopback"].0, b"loopback");
        assert_eq!(bin["weft"], (b"\x7fELF plugin v2".to_vec(), 0o755));
        let conf = listing(&d.0.join("conf"));
        assert_eq!(
            conf.keys().collect::<Vec<_>>(),
            ["05-other.conflist", "10-weft.conflist"]
        );
        assert_eq!(conf["05-other.conflist"].0, b"{}");
        assert_eq!(conf["10-weft.conflist"], (CONF.as_bytes().to_vec(), 0o644));
    }

    #[test]
    fn a_crash_leftover_is_overwritten_and_gone_afterwards() {
        let (d, args) = setup("leftover");
        std::fs::write(d.0.join("bin/.weft.weft-tmp"), b"half a binary from a crash, longer").unwrap();
        install(&args).unwrap();
        install(&args).unwrap();
        let bin = listing(&d.0.join("bin"));
        assert_eq!(bin.keys().collect::<Vec<_>>(), ["weft"]);
        assert_eq!(bin["weft"].0, b"\x7fELF plugin v2");
    }

    #[test]
    fn a_bad_config_installs_nothing() {
        for bad in [
            "not json",
            r#"{"cniVersion":"1.0.0","name":"weft","plugins":[{"type":"ptp"}]}"#,
            r#"{"name":"weft","plugins":[{"type":"weft"}]}"#,
            r#"{"cniVersion":"1.0.0","name":"weft","type":"weft"}"#,
        ] {
            let (d, args) = setup("bad");
            std::fs::write(&args.conflist, bad).unwrap();
            let err = install(&args).unwrap_err();
            assert!(format!("{err:#}").contains("not a weft network config"), "{err:#}");
            assert!(listing(&d.0.join("bin")).is_empty(), "{bad}: the plugin was installed");
            assert!(listing(&d.0.join("conf")).is_empty(), "{bad}: a config was written");
        }
    }

    #[test]
    fn a_missing_directory_fails_without_creating_it() {
        let (d, mut args) = setup("missing");
        args.conf_dir = d.0.join("nope");
        assert!(install(&args).is_err());
        assert!(!d.0.join("nope").exists());
    }

    #[test]
    fn the_manifests_config_is_accepted() {
        // manifests/cni-config.yaml holds the conflist inside a ConfigMap: take the
        // block after the key and check it as install-cni would.
        let yaml = include_str!("../../../../manifests/cni-config.yaml");
        let (_, block) = yaml.split_once("10-weft.conflist: |").expect("the conflist key");
        let json: String = block.lines().map(|l| format!("{}\n", l.trim_start())).collect();
        check_conflist(json.as_bytes()).unwrap();
        let v: Value = serde_json::from_str(&json).unwrap();
        let weft = &v["plugins"][0];
        assert!(weft.get("ranges").is_none() && weft.get("mtu").is_none(), "{weft}");
        assert_eq!(weft["capabilities"]["portMappings"], true);
    }
}
