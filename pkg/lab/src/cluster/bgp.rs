//! A routed lab whose pod ranges travel over BGP (`bgp: true`): every weftd exports its
//! node's podCIDRs into table [`EXPORT_TABLE`] (`--export-table`), a BIRD 2 in the node
//! learns them there and announces them over eBGP to a BIRD in the router namespace,
//! which installs them in the router's kernel and passes each node the others'. The
//! nodes route pod traffic by what BGP taught them (`--pod-routing none`): no
//! encapsulation, no route of weft's to another node. The configurations a user needs
//! for a real fabric are in `docs/routed-cluster.md`; these are the same, per lab node.

use std::fs;
use std::path::PathBuf;
use std::process::Command;

use super::Lab;
use crate::LabError;
use crate::spec::NodeSpec;

/// The table weftd exports to in a BGP lab (Coil's choice, which operators know).
pub const EXPORT_TABLE: u32 = 119;

/// The router's AS; node `i` (from 0) is `NODE_AS_BASE + i`.
pub const ROUTER_AS: u32 = 65000;
const NODE_AS_BASE: u32 = 65001;

/// BIRD 2's configuration for a node at `address` (its router at `gateway`) with AS
/// `asn`: learn weft's exported routes from `table`, announce them and nothing else,
/// install what BGP teaches into the main table.
pub fn node_config(address: &str, gateway: &str, asn: u32, table: u32) -> String {
    format!(
        "# weft lab: BIRD on a node (see docs/routed-cluster.md)
router id {address};
ipv4 table weft;
protocol device {{ scan time 10; }}
# weft's exported pod ranges: blackhole routes in table {table}, learnt as they change.
protocol kernel weft_export {{
  ipv4 {{ table weft; import all; export none; }};
  kernel table {table};
  learn;
  scan time 1;
}}
protocol pipe {{ table weft; peer table master4; import none; export all; }}
# What BGP teaches is installed in the main table, which pods' traffic follows.
protocol kernel {{
  ipv4 {{ import none; export where source = RTS_BGP; }};
}}
protocol bgp fabric {{
  local {address} as {asn};
  neighbor {gateway} as {ROUTER_AS};
  ipv4 {{ import all; export where proto = \"weft_export\"; }};
}}
"
    )
}

/// BIRD 2's configuration for the router at `router_id`, peering with every node
/// (name, address, AS): take their ranges, pass each the others', install them all.
pub fn router_config(router_id: &str, nodes: &[(String, String, u32)]) -> String {
    let mut out = format!(
        "# weft lab: BIRD on the router
router id {router_id};
protocol device {{ scan time 10; }}
protocol kernel {{ ipv4 {{ import none; export all; }}; }}
template bgp node {{
  local as {ROUTER_AS};
  ipv4 {{ import all; export all; }};
}}
"
    );
    for (name, address, asn) in nodes {
        out.push_str(&format!(
            "protocol bgp node_{} from node {{ neighbor {address} as {asn}; }}\n",
            name.replace('-', "_")
        ));
    }
    out
}

impl Lab {
    fn bird_dir(&self) -> PathBuf {
        self.state_dir().join("bird")
    }

    /// The AS of node `n`.
    pub fn node_as(&self, n: &NodeSpec) -> u32 {
        NODE_AS_BASE + n.index as u32
    }

    /// The BIRD control socket of `who` (a node's name, or `router`), for `birdc -s`.
    pub fn bird_socket(&self, who: &str) -> PathBuf {
        self.bird_dir().join(format!("{who}.ctl"))
    }

    /// Starts BIRD in the router and every node, unless it runs there already.
    pub(super) fn start_birds(&self) -> Result<(), LabError> {
        fs::create_dir_all(self.bird_dir()).map_err(|e| LabError::io("creating the BIRD directory", e))?;
        let peers: Vec<(String, String, u32)> = self
            .spec
            .nodes
            .iter()
            .map(|n| {
                (
                    n.name.clone(),
                    self.address_of(&n.name).unwrap_or_default(),
                    self.node_as(n),
                )
            })
            .collect();
        let first_gateway = self.node_address(&self.spec.nodes[0]).0;
        let router_id = first_gateway.split('/').next().unwrap_or_default().to_string();
        self.start_bird("router", &self.router(), &router_config(&router_id, &peers))?;
        for n in &self.spec.nodes {
            let (gw, _) = self.node_address(n);
            let gw = gw.split('/').next().unwrap_or_default();
            let addr = self.address_of(&n.name).unwrap_or_default();
            let text = node_config(&addr, gw, self.node_as(n), EXPORT_TABLE);
            self.start_bird(&n.name, &self.node_ns(&n.name), &text)?;
        }
        Ok(())
    }

    fn bird_pid(&self, who: &str) -> Option<i32> {
        let text = fs::read_to_string(self.bird_dir().join(format!("{who}.pid"))).ok()?;
        let pid: i32 = text.trim().parse().ok()?;
        crate::process::proc_stat(pid as u32)
            .is_some_and(|(state, _)| state != 'Z' && state != 'X')
            .then_some(pid)
    }

    fn start_bird(&self, who: &str, netns: &str, config: &str) -> Result<(), LabError> {
        if self.bird_pid(who).is_some() {
            return Ok(());
        }
        let dir = self.bird_dir();
        let conf = dir.join(format!("{who}.conf"));
        fs::write(&conf, config).map_err(|e| LabError::io("writing a BIRD configuration", e))?;
        // BIRD forks into the background once its configuration is read and its
        // socket bound; the pid file says which process to stop.
        let out = Command::new("ip")
            .args(["netns", "exec", netns, "bird", "-c"])
            .arg(&conf)
            .arg("-s")
            .arg(self.bird_socket(who))
            .arg("-P")
            .arg(dir.join(format!("{who}.pid")))
            .output()
            .map_err(|e| LabError::io("starting BIRD (is bird2 installed?)", e))?;
        if !out.status.success() {
            return Err(LabError::Command {
                what: format!("starting BIRD in {netns}"),
                detail: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
        Ok(())
    }

    /// Stops every BIRD of the lab (their namespaces are about to go).
    pub(super) fn stop_birds(&self) {
        let who = std::iter::once("router".to_string()).chain(self.spec.nodes.iter().map(|n| n.name.clone()));
        for w in who {
            if let Some(pid) = self.bird_pid(&w) {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGTERM);
                let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
                while self.bird_pid(&w).is_some() && std::time::Instant::now() < deadline {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
            }
        }
    }
}
