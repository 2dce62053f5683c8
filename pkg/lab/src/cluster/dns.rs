//! The lab's DNS: a dnsmasq of its own in the "outside" namespace, answering the
//! lab's `dns` records (names for addresses the outside holds, each with its TTL, and
//! CNAMEs) at the outside's address, and nothing else (no upstream, no hosts file).
//! The outside holds every address a record names, and all of [`NAMES_BLOCK`].
//! Pods use it: each pod's `/etc/netns/<namespace>/resolv.conf` names it, which `ip
//! netns exec` mounts as the pod's resolv.conf. Changing the records and calling
//! [`Lab::dns_restart`] makes a name's answer change at run time.

use std::fs;
use std::net::IpAddr;
use std::path::PathBuf;
use std::process::Command;

use weft_harness::ip;

use super::{Lab, OUTSIDE_ADDRESS, OUTSIDE_ADDRESS6};
use crate::LabError;
use crate::spec::DnsRecord;

/// A block the outside answers every address of, for names with many addresses
/// (`198.51.104.0/22`, TEST-NET-2's neighbour, routed to the outside by the router).
pub const NAMES_BLOCK: &str = "198.51.104.0/22";

/// The same for IPv6 (`2001:db8:104::/48`), in a lab whose outside has IPv6 (`ipv6:
/// true` on a shared underlay).
pub const NAMES_BLOCK6: &str = "2001:db8:104::/48";

/// The dnsmasq configuration of `records`: authoritative for them alone.
pub(crate) fn dnsmasq_config(records: &[DnsRecord], log: &str) -> String {
    let mut out = format!(
        "no-resolv\nno-hosts\nno-poll\nbind-interfaces\nlisten-address={OUTSIDE_ADDRESS}\nexcept-interface=lo\nno-negcache\nedns-packet-max=4096\nlog-queries\nlog-facility={log}\n"
    );
    for r in records {
        if let Some(target) = &r.cname {
            out.push_str(&format!("cname={},{target},{}\n", r.name, r.ttl));
        }
        for a in &r.addresses {
            // One host-record per address: dnsmasq answers every one of a name's.
            out.push_str(&format!("host-record={},{a},{}\n", r.name, r.ttl));
        }
    }
    out
}

impl Lab {
    fn dns_dir(&self) -> PathBuf {
        self.state_dir().join("dns")
    }

    fn dns_pid(&self) -> Option<i32> {
        let text = fs::read_to_string(self.dns_dir().join("dnsmasq.pid")).ok()?;
        let pid: i32 = text.trim().parse().ok()?;
        crate::process::proc_stat(pid as u32)
            .is_some_and(|(state, _)| state != 'Z' && state != 'X')
            .then_some(pid)
    }

    /// The addresses the lab's names stand for, which the outside holds.
    fn dns_addresses(&self) -> Vec<IpAddr> {
        let mut out: Vec<IpAddr> = self.spec.dns.iter().flat_map(|r| r.addresses.clone()).collect();
        out.sort();
        out.dedup();
        out
    }

    /// Starts the lab's DNS when it has records and it does not run yet: the
    /// addresses on the outside's loopback, dnsmasq, and every pod's resolv.conf.
    pub(super) fn start_dns(&self) -> Result<(), LabError> {
        if self.spec.dns.is_empty() || self.dns_pid().is_some() {
            return Ok(());
        }
        let outside = self.outside_ns();
        // The outside answers every address of the names' block (a local route), and
        // the router sends it there; other addresses go on its loopback one by one.
        let block: ipnet::Ipv4Net = NAMES_BLOCK.parse().expect("a block");
        ip(&["-n", &outside, "route", "replace", "local", NAMES_BLOCK, "dev", "lo"])?;
        ip(&[
            "-n",
            &self.router(),
            "route",
            "replace",
            NAMES_BLOCK,
            "via",
            OUTSIDE_ADDRESS,
        ])?;
        let block6: ipnet::Ipv6Net = NAMES_BLOCK6.parse().expect("a block");
        let v6 = self.node_address6(&self.spec.nodes[0]).is_some();
        if v6 {
            ip(&[
                "-n",
                &outside,
                "-6",
                "route",
                "replace",
                "local",
                NAMES_BLOCK6,
                "dev",
                "lo",
            ])?;
            ip(&[
                "-n",
                &self.router(),
                "-6",
                "route",
                "replace",
                NAMES_BLOCK6,
                "via",
                OUTSIDE_ADDRESS6,
            ])?;
        }
        let mut batch = String::new();
        for a in self.dns_addresses() {
            match a {
                IpAddr::V4(v4) if block.contains(&v4) => {}
                IpAddr::V6(a) if v6 && block6.contains(&a) => {}
                IpAddr::V4(v4) => batch.push_str(&format!("addr replace {v4}/32 dev lo\n")),
                IpAddr::V6(v6) => batch.push_str(&format!("addr replace {v6}/128 dev lo nodad\n")),
            }
        }
        if !batch.is_empty() {
            let path = self.dns_dir().join("addresses.batch");
            fs::create_dir_all(self.dns_dir()).map_err(|e| LabError::io("creating the DNS directory", e))?;
            fs::write(&path, batch).map_err(|e| LabError::io("writing the outside's addresses", e))?;
            ip(&["-n", &outside, "-batch", &path.display().to_string()])?;
        }
        let dir = self.dns_dir();
        fs::create_dir_all(&dir).map_err(|e| LabError::io("creating the DNS directory", e))?;
        let conf = dir.join("dnsmasq.conf");
        let log = dir.join("dnsmasq.log");
        fs::write(&conf, dnsmasq_config(&self.spec.dns, &log.display().to_string()))
            .map_err(|e| LabError::io("writing the dnsmasq configuration", e))?;
        // dnsmasq goes into the background once its socket is bound; the pid file says
        // which process to stop.
        let out = Command::new("ip")
            .args(["netns", "exec", &outside, "dnsmasq", "--user=root", "--group=root"])
            .arg(format!("--conf-file={}", conf.display()))
            .arg(format!("--pid-file={}", dir.join("dnsmasq.pid").display()))
            .output()
            .map_err(|e| LabError::io("starting dnsmasq (is dnsmasq-base installed?)", e))?;
        if !out.status.success() {
            return Err(LabError::Command {
                what: format!("starting dnsmasq in {outside}"),
                detail: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
        for p in &self.spec.pods {
            let etc = PathBuf::from("/etc/netns").join(self.netns_of(p));
            fs::create_dir_all(&etc).map_err(|e| LabError::io("creating a pod's /etc/netns directory", e))?;
            fs::write(etc.join("resolv.conf"), format!("nameserver {OUTSIDE_ADDRESS}\n"))
                .map_err(|e| LabError::io("writing a pod's resolv.conf", e))?;
        }
        Ok(())
    }

    /// Stops the lab's DNS and takes the pods' resolv.conf away.
    pub(super) fn stop_dns(&self) {
        if let Some(pid) = self.dns_pid() {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGTERM);
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
            while self.dns_pid().is_some() && std::time::Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
        }
        for p in &self.spec.pods {
            let _ = fs::remove_dir_all(PathBuf::from("/etc/netns").join(self.netns_of(p)));
        }
        // Made by `start_dns` when it was not there: gone when empty again.
        let _ = fs::remove_dir("/etc/netns");
    }

    /// Answers the lab's `dns` records as they are now in `self` (a record changed
    /// since `up`): dnsmasq is started again with them, its new addresses put on the
    /// outside. A name's answer changes at run time so.
    pub fn dns_restart(&self) -> Result<(), LabError> {
        if let Some(pid) = self.dns_pid() {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGTERM);
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
            while self.dns_pid().is_some() && std::time::Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
        }
        self.start_dns()
    }

    /// The lab's DNS server, when it has records.
    pub fn dns_server(&self) -> Option<IpAddr> {
        (!self.spec.dns.is_empty()).then(|| OUTSIDE_ADDRESS.parse().expect("an address"))
    }
}

/// What `lab names` measured: for each name of the lab's DNS and each pod, what the
/// pod got resolving it through the lab's DNS and connecting at once to every address.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct NameTable {
    /// The TCP port probed.
    pub port: u16,
    /// The pods, as columns (`namespace/name`).
    pub pods: Vec<String>,
    /// Each name with a cell per pod.
    pub rows: Vec<(String, Vec<NameCell>)>,
}

/// One pod's probe of one name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum NameCell {
    /// Every address reached.
    Reached,
    /// No address reached.
    Blocked,
    /// Some reached, some not.
    Partly,
    /// The name did not resolve (no answer, or no address).
    Unresolved,
}

impl NameCell {
    /// The table's character: `.`, `X`, `~`, `?`.
    pub fn symbol(self) -> char {
        match self {
            NameCell::Reached => '.',
            NameCell::Blocked => 'X',
            NameCell::Partly => '~',
            NameCell::Unresolved => '?',
        }
    }
}

impl std::fmt::Display for NameTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let width = self.rows.iter().map(|(n, _)| n.len()).max().unwrap_or(4).max(4);
        write!(f, "{:<width$}", format!("{}/tcp", self.port))?;
        for p in &self.pods {
            write!(f, " {p}")?;
        }
        writeln!(f)?;
        for (name, cells) in &self.rows {
            write!(f, "{name:<width$}")?;
            for (p, c) in self.pods.iter().zip(cells) {
                write!(f, " {:<w$}", c.symbol(), w = p.len())?;
            }
            writeln!(f)?;
        }
        Ok(())
    }
}

/// The addresses of `name` from the lab's DNS (UDP, EDNS), from the calling thread's
/// namespace.
fn resolve(name: &str, wait: std::time::Duration) -> Option<Vec<IpAddr>> {
    let s = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
    s.set_read_timeout(Some(wait)).ok()?;
    s.send_to(
        &weft_fqdn::answer::build::query(name, 0x1ab, false),
        (OUTSIDE_ADDRESS, 53),
    )
    .ok()?;
    let mut buf = [0u8; 4096];
    let n = s.recv(&mut buf).ok()?;
    let a = weft_fqdn::read_response(&buf[..n]).ok()??;
    Some(a.addresses.iter().map(|l| l.ip).collect())
}

impl Lab {
    /// Probes every name of the lab's DNS from every pod, as a pod's app would: resolve
    /// it through the lab's DNS and connect at once, on TCP `port`, to each address it
    /// gave (the outside listens there meanwhile), each connection waiting `timeout`.
    pub fn name_probes(&self, port: u16, timeout: std::time::Duration) -> Result<NameTable, LabError> {
        if self.spec.dns.is_empty() {
            return Err(LabError::Command {
                what: "lab names".into(),
                detail: "the lab has no dns: records".into(),
            });
        }
        let outside = weft_harness::NamedNetns::existing(&self.outside_ns());
        let listener = outside
            .bind_tcp(&format!("0.0.0.0:{port}"))
            .map_err(|e| LabError::Command {
                what: format!("listening on {port}/tcp in the outside"),
                detail: e.to_string(),
            })?;
        listener
            .set_nonblocking(true)
            .map_err(|e| LabError::io("listening in the outside", e))?;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let accepting = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    if listener.accept().is_err() {
                        std::thread::sleep(std::time::Duration::from_millis(5));
                    }
                }
            })
        };
        let names: Vec<String> = self.spec.dns.iter().map(|r| r.name.clone()).collect();
        let mut pods = Vec::new();
        let mut columns: Vec<Vec<NameCell>> = Vec::new();
        for p in &self.spec.pods {
            let ns = weft_harness::NamedNetns::existing(&self.netns_of(p));
            let cells = ns
                .within(|| {
                    names
                        .iter()
                        .map(|name| match resolve(name, std::time::Duration::from_secs(2)) {
                            Some(ips) if !ips.is_empty() => {
                                let reached = ips
                                    .iter()
                                    .filter(|ip| {
                                        std::net::TcpStream::connect_timeout(
                                            &std::net::SocketAddr::new(**ip, port),
                                            timeout,
                                        )
                                        .is_ok()
                                    })
                                    .count();
                                match reached {
                                    0 => NameCell::Blocked,
                                    n if n == ips.len() => NameCell::Reached,
                                    _ => NameCell::Partly,
                                }
                            }
                            _ => NameCell::Unresolved,
                        })
                        .collect::<Vec<_>>()
                })
                .map_err(|e| LabError::Command {
                    what: format!("probing from {}", p.name),
                    detail: e.to_string(),
                })?;
            pods.push(format!("{}/{}", p.namespace.as_deref().unwrap_or("default"), p.name));
            columns.push(cells);
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let _ = accepting.join();
        let rows = names
            .into_iter()
            .enumerate()
            .map(|(i, n)| (n, columns.iter().map(|c| c[i]).collect()))
            .collect();
        Ok(NameTable { port, pods, rows })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_become_host_records_and_cnames_with_their_ttls() {
        let records = vec![
            DnsRecord {
                name: "api.example.test".into(),
                addresses: vec!["198.51.100.10".parse().unwrap(), "198.51.100.11".parse().unwrap()],
                cname: None,
                ttl: 5,
            },
            DnsRecord {
                name: "www.example.test".into(),
                addresses: Vec::new(),
                cname: Some("api.example.test".into()),
                ttl: 300,
            },
        ];
        let c = dnsmasq_config(&records, "/tmp/x.log");
        assert!(c.contains("no-resolv\n") && c.contains(&format!("listen-address={OUTSIDE_ADDRESS}\n")));
        assert!(c.contains("host-record=api.example.test,198.51.100.10,5\n"), "{c}");
        assert!(c.contains("host-record=api.example.test,198.51.100.11,5\n"), "{c}");
        assert!(c.contains("cname=www.example.test,api.example.test,300\n"), "{c}");
    }
}
