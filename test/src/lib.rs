//! What weft's integration tests share: the harness (`weft-harness`: named network
//! namespaces that clean up after themselves, a real `weftd` inside a "node"
//! namespace, the real `weft` plugin executed as a container runtime executes it)
//! under the tests' short names, plus the tests' own helpers (Prometheus, dashboards,
//! containerd in `cri`, an OpenTelemetry collector in `otlp`).
//!
//! Every namespace a test makes is named `wt<pid>-<tag>-<n>`, so a test only ever
//! touches what it created, and a crashed run's leftovers are recognisable.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;
use weft_harness::{CallOptions, CniExec, CniVars, DaemonConfig, HarnessError, NamedNetns, NodeDaemon};

pub use weft_harness::{ChildGuard, wait_exit};
pub use weft_kernel::testutil::privileged;

pub mod conventions;
pub mod cri;
pub mod modgraph;
pub mod otlp;
pub mod webdriver;

/// Path of a workspace binary (`weft`, `weftd`, `weftctl`) built beside the tests.
pub fn bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    // target/<profile>/deps/<test> -> target/<profile>/<name>
    let dir = exe.parent().and_then(Path::parent).expect("target directory");
    let p = dir.join(name);
    assert!(
        p.exists(),
        "{} is missing: build the binaries first (cargo build --workspace --bins)",
        p.display()
    );
    p
}

/// Runs a command and returns its output; panics if it cannot be started.
pub fn run(cmd: &mut Command) -> Output {
    cmd.output().unwrap_or_else(|e| panic!("running {cmd:?}: {e}"))
}

/// Runs a command that must succeed and returns its stdout.
pub fn sh(cmd: &mut Command) -> String {
    let out = run(cmd);
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

static COUNTER: AtomicUsize = AtomicUsize::new(0);

/// `wt<pid>-<tag>-<n>`: a name no other test (or test run) uses.
fn unique(tag: &str) -> String {
    format!(
        "wt{}-{tag}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// A named network namespace (`/run/netns/<name>`), deleted on drop.
pub struct Netns(NamedNetns);

impl Netns {
    /// Creates `wt<pid>-<tag>-<n>`.
    pub fn new(tag: &str) -> Self {
        let name = unique(tag);
        Self(NamedNetns::create(&name).unwrap_or_else(|e| panic!("creating namespace {name}: {e}")))
    }

    /// The namespace's name.
    pub fn name(&self) -> &str {
        self.0.name()
    }

    /// `/run/netns/<name>`, what a runtime passes as `CNI_NETNS`.
    pub fn path(&self) -> String {
        self.0.path()
    }

    /// A command that runs `program` inside the namespace.
    pub fn cmd(&self, program: &str) -> Command {
        self.0.command([program])
    }

    /// `ip -j -n <ns> <args>` parsed as JSON.
    pub fn ip_json(&self, args: &[&str]) -> Value {
        let out = sh(Command::new("ip").args(["-j", "-n", self.name()]).args(args));
        if out.trim().is_empty() {
            Value::Array(vec![])
        } else {
            serde_json::from_str(&out).expect("ip -j output")
        }
    }

    /// Names of the links in the namespace.
    pub fn links(&self) -> Vec<String> {
        self.ip_json(&["link", "show"])
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l["ifname"].as_str().unwrap().to_string())
            .collect()
    }

    /// Names of the links in the namespace but the device a node holds its pods' IPv4
    /// gateways on ([`weft_kernel::GATEWAY_DEVICE`]: there while a pod is attached, or
    /// while weftd is away after the last went).
    pub fn links_but_gateway(&self) -> Vec<String> {
        self.links()
            .into_iter()
            .filter(|l| l != weft_kernel::GATEWAY_DEVICE)
            .collect()
    }

    /// Routes weft made (protocol 74) in the namespace, both families.
    pub fn weft_routes(&self) -> Vec<Value> {
        let mut v: Vec<Value> = self
            .ip_json(&["-4", "route", "show", "proto", "74"])
            .as_array()
            .unwrap()
            .clone();
        v.extend(
            self.ip_json(&["-6", "route", "show", "proto", "74"])
                .as_array()
                .unwrap()
                .iter()
                .cloned(),
        );
        v
    }

    /// Whether one ICMP echo to `addr` from this namespace is answered.
    pub fn ping(&self, addr: &str) -> bool {
        self.0.ping(addr, 2).is_some()
    }

    /// Runs `f` on a short-lived thread inside the namespace. Sockets it creates keep
    /// the namespace wherever they are used afterwards.
    pub fn within<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        self.0
            .within(f)
            .unwrap_or_else(|e| panic!("running inside {}: {e}", self.name()))
    }

    /// A TCP listener bound to `addr` inside the namespace.
    pub fn bind_tcp(&self, addr: &str) -> std::net::TcpListener {
        self.0
            .bind_tcp(addr)
            .unwrap_or_else(|e| panic!("bind inside the namespace: {e}"))
    }

    /// Starts `program args` inside the namespace; killed when the guard drops.
    pub fn spawn(&self, program: &str, args: &[&str], log: &Path) -> ChildGuard {
        let out = std::fs::File::create(log).expect("log file");
        let child = self
            .cmd(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::from(out.try_clone().unwrap()))
            .stderr(Stdio::from(out))
            .spawn()
            .unwrap_or_else(|e| panic!("starting {program}: {e}"));
        ChildGuard::new(child)
    }

    /// Deletes the namespace now (as a runtime does after DEL, or to make it vanish).
    pub fn delete(self) {
        let _ = self.0.delete();
    }
}

/// A temporary directory under /tmp, removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    /// Creates `/tmp/wt<pid>-<tag>-<n>`.
    pub fn new(tag: &str) -> Self {
        let p = PathBuf::from("/tmp").join(unique(tag));
        std::fs::create_dir_all(&p).unwrap();
        Self(p)
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A `weftd` running inside a node namespace with its own socket, state and log.
pub struct Daemon {
    // Declared first, so it is killed before its namespace and directory go.
    daemon: NodeDaemon,
    /// The node namespace the daemon runs in.
    pub node: Netns,
    dir: TempDir,
}

impl Daemon {
    /// Starts weftd in a fresh node namespace and waits until its socket answers.
    pub fn start(tag: &str) -> Self {
        Self::start_with_env(tag, &[])
    }

    /// Like [`Daemon::start`], with extra environment variables for weftd.
    pub fn start_with_env(tag: &str, env: &[(&str, &str)]) -> Self {
        Self::start_in(Netns::new(tag), tag, env)
    }

    /// Starts weftd in an existing node namespace.
    pub fn start_in(node: Netns, tag: &str, env: &[(&str, &str)]) -> Self {
        Self::start_configured(node, tag, |c| c.env = owned(env))
    }

    /// Starts weftd in an existing node namespace, its start-up changed by `configure`
    /// (a state directory on a small file system of its own, say).
    pub fn start_configured(node: Netns, tag: &str, configure: impl FnOnce(&mut DaemonConfig)) -> Self {
        let dir = TempDir::new(tag);
        let mut config = DaemonConfig::under(&bin("weftd"), dir.path(), &format!("node-{tag}"));
        configure(&mut config);
        // The socket is bound before start-up recovery, so a connection alone does not
        // mean the daemon serves: wait for an answer to a status call.
        config.status_probe = Some(bin("weftctl"));
        let daemon = NodeDaemon::start(&node.0, config).unwrap_or_else(|e| panic!("{e}:\n{}", log_of(dir.path())));
        Self { daemon, node, dir }
    }

    /// The node name weftd was given.
    pub fn node_name(&self) -> &str {
        &self.daemon.config().node_name
    }

    /// A scratch directory that lives as long as the daemon.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// `GET http://127.0.0.1:9384<path>` inside the node namespace, with `accept`.
    pub fn http_get(&self, path: &str, accept: &str) -> String {
        sh(self
            .node
            .cmd("curl")
            .args(["-sf", "--max-time", "10", "-H", &format!("Accept: {accept}")])
            .arg(format!("http://127.0.0.1:9384{path}")))
    }

    /// The log lines weftd wrote, parsed (lines that are not JSON are skipped).
    pub fn log_json(&self) -> Vec<Value> {
        self.log()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// Path of the daemon's socket.
    pub fn socket(&self) -> PathBuf {
        self.daemon.config().socket.clone()
    }

    /// The daemon's state directory.
    pub fn state_dir(&self) -> PathBuf {
        self.daemon.config().state_dir.clone()
    }

    /// The state directory as the daemon sees it, from this process: through its
    /// `/proc/<pid>/root` when it is on a file system only the daemon sees
    /// (`DaemonConfig::state_fs_size`).
    pub fn state_dir_seen(&self) -> PathBuf {
        self.daemon.state_dir_seen().expect("daemon running")
    }

    /// The daemon's log so far.
    pub fn log(&self) -> String {
        log_of(self.dir.path())
    }

    /// Starts a second weftd beside this one, sharing either the state directory (with
    /// its own socket) or the socket (with its own state); returns its exit status (it
    /// is expected to refuse). Its log goes to the same file.
    pub fn start_second(&self, share_state: bool) -> ExitStatus {
        let mut child = self.spawn_second(share_state, Duration::from_secs(1));
        wait_exit(&mut child, Duration::from_secs(10)).expect("a second weftd exits")
    }

    /// Spawns a second weftd beside this one (as [`Daemon::start_second`]) that waits up
    /// to `lock_wait` for this one to release the state directory; its socket is
    /// [`Daemon::second_socket`] when it shares the state. Killed with the returned guard.
    pub fn spawn_second(&self, share_state: bool, lock_wait: Duration) -> Child {
        let mut config = self.daemon.config().clone();
        if share_state {
            config.socket = self.second_socket();
        } else {
            config.state_dir = self.dir.path().join("second-state");
        }
        // Its own HTTP port: this one's is bound while it lives.
        config.metrics_addr = "127.0.0.1:9386".into();
        config
            .env
            .push(("WEFT_LOCK_WAIT".into(), lock_wait.as_secs().to_string()));
        config.command(&self.node.0).unwrap().spawn().unwrap()
    }

    /// The socket of a second weftd sharing this one's state.
    pub fn second_socket(&self) -> PathBuf {
        self.dir.path().join("second.sock")
    }

    /// The daemon's process id.
    pub fn pid(&self) -> i32 {
        self.daemon.pid().expect("daemon running") as i32
    }

    /// Sends `sig` to the daemon.
    pub fn signal(&self, sig: nix::sys::signal::Signal) {
        self.daemon.signal(sig).unwrap();
    }

    /// SIGKILLs the daemon (a crash) and reaps it.
    pub fn kill(&mut self) {
        self.daemon.kill();
    }

    /// Stops the daemon with SIGTERM and waits for it.
    pub fn stop(&mut self) -> Option<ExitStatus> {
        self.daemon.stop(Duration::from_secs(20))
    }

    /// Starts the daemon again on the same socket and state.
    pub fn restart(&mut self) {
        self.kill();
        self.start_again();
    }

    /// Replaces the extra environment weftd gets from its next start on (a crash test
    /// arms a failpoint for one run, then starts it again without).
    pub fn set_env(&mut self, env: &[(&str, &str)]) {
        self.daemon.config_mut().env = owned(env);
    }

    /// Waits up to `limit` for the daemon to exit on its own (a failpoint, a crash) and
    /// reaps it; `None` when it is still running then.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        self.daemon.wait_exit(limit)
    }

    /// Starts the daemon again after it was stopped or killed.
    pub fn start_again(&mut self) {
        assert!(self.daemon.pid().is_none(), "daemon still running");
        if let Err(e) = self.daemon.start_again() {
            panic!("{e}:\n{}", self.log());
        }
    }

    /// Starts the daemon again without waiting for it to serve (it is held at a pause
    /// point); [`Daemon::wait_serving`] waits after.
    pub fn spawn_again(&mut self) {
        assert!(self.daemon.pid().is_none(), "daemon still running");
        if let Err(e) = self.daemon.spawn_again() {
            panic!("{e}:\n{}", self.log());
        }
    }

    /// Waits until the daemon serves (after [`Daemon::spawn_again`]).
    pub fn wait_serving(&mut self) {
        if let Err(e) = self.daemon.wait_serving(Duration::from_secs(30)) {
            panic!("{e}:\n{}", self.log());
        }
    }

    /// `weftctl status --json` for this daemon.
    pub fn status(&self) -> Value {
        let out =
            sh(Command::new(bin("weftctl")).args(["--socket", self.socket().to_str().unwrap(), "--json", "status"]));
        serde_json::from_str(&out).expect("status JSON")
    }

    /// Addresses allocated across all ranges.
    pub fn allocated(&self) -> u64 {
        self.status()["ranges"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["allocated"].as_u64().unwrap())
            .sum()
    }

    /// Every attachment in the daemon's store, in any state, read straight from its
    /// database (the daemon may be running: SQLite's WAL lets a reader in beside it).
    pub fn store_attachments(&self) -> Vec<weft_store::Attachment> {
        self.store(|db| db.list(None, None))
    }

    /// Every address allocated in the daemon's store, read straight from its database.
    pub fn store_allocated(&self) -> Vec<std::net::IpAddr> {
        self.store(|db| db.allocated_addresses())
    }

    fn store<R>(&self, f: impl FnOnce(&mut weft_store::Db) -> Result<R, weft_store::StoreError>) -> R {
        let seen = self.state_dir_seen();
        // SQLite resolves the `/proc/<pid>/root` symlink of a state directory only the
        // daemon sees to `/`, which here leads to the empty directory under its mount:
        // read a copy of the database and its write-ahead log instead.
        let _copy;
        let path = if seen == self.state_dir() {
            seen.join("weft.db")
        } else {
            _copy = TempDir::new("state-copy");
            for name in ["weft.db-wal", "weft.db"] {
                let from = seen.join(name);
                if from.exists() {
                    std::fs::copy(&from, _copy.path().join(name))
                        .unwrap_or_else(|e| panic!("copying {}: {e}", from.display()));
                }
            }
            _copy.path().join("weft.db")
        };
        let mut db = weft_store::Db::open(&path).unwrap_or_else(|e| panic!("opening {}: {e}", path.display()));
        f(&mut db).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
    }

    /// Waits until no teardown is pending (DEL finishes removing veths after answering).
    pub fn settle(&self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if self.status()["pending_teardowns"].as_u64() == Some(0) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("teardowns did not finish");
    }

    /// Asserts the node holds nothing of weft's: no interface but `lo`, no weft route,
    /// no attachment, no allocated address.
    pub fn assert_clean(&self) {
        self.settle();
        let links = self.node.links();
        assert_eq!(links, vec!["lo".to_string()], "interfaces left on the node");
        assert!(
            self.node.weft_routes().is_empty(),
            "routes left: {:?}",
            self.node.weft_routes()
        );
        let st = self.status();
        assert_eq!(st["attachments"], 0, "attachments left: {st}");
        assert_eq!(self.allocated(), 0, "addresses left allocated: {st}");
    }

    /// A network config for this daemon.
    pub fn conf(&self, version: &str, ranges: &[&str]) -> String {
        serde_json::json!({
            "cniVersion": version,
            "name": "weft",
            "type": "weft",
            "socket": self.socket(),
            "ranges": ranges,
            "mtu": 1500,
        })
        .to_string()
    }
}

fn owned(env: &[(&str, &str)]) -> Vec<(String, String)> {
    env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

fn log_of(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("weftd.log")).unwrap_or_default()
}

/// What one plugin run produced.
#[derive(Debug)]
pub struct CniOutput {
    /// Exit code.
    pub code: i32,
    /// Stdout.
    pub stdout: String,
    /// Stderr.
    pub stderr: String,
}

impl CniOutput {
    /// Stdout parsed as JSON (`Null` when empty).
    pub fn json(&self) -> Value {
        if self.stdout.trim().is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&self.stdout).unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {}", self.stdout))
        }
    }

    /// The CNI error code, panicking when the call succeeded.
    pub fn err_code(&self) -> u64 {
        assert_eq!(self.code, 1, "expected a failure, got {self:?}");
        self.json()["code"]
            .as_u64()
            .unwrap_or_else(|| panic!("no code in {}", self.stdout))
    }

    /// Asserts success and returns the JSON.
    pub fn ok(&self) -> Value {
        assert_eq!(self.code, 0, "plugin failed: {self:?}");
        self.json()
    }
}

/// One invocation of the plugin as a runtime makes it.
#[derive(Debug, Clone, Default)]
pub struct Call {
    /// `CNI_*` variables (and others) to set; nothing else is inherited.
    pub env: Vec<(String, String)>,
    /// Config on stdin.
    pub stdin: String,
}

impl Call {
    /// A call for `command` on a container with the usual kubelet variables.
    pub fn new(command: &str, container_id: &str, netns: &str, conf: &str) -> Self {
        let args = format!(
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=pod-{container_id};K8S_POD_INFRA_CONTAINER_ID={container_id}"
        );
        let vars = CniVars {
            command,
            container_id,
            netns,
            ifname: "eth0",
            args: &args,
        };
        Self {
            env: vars.env("/opt/cni/bin"),
            stdin: conf.to_string(),
        }
    }

    /// Sets (or replaces) a variable.
    pub fn set(mut self, k: &str, v: &str) -> Self {
        self.env.retain(|(x, _)| x != k);
        self.env.push((k.to_string(), v.to_string()));
        self
    }

    /// Removes a variable.
    pub fn unset(mut self, k: &str) -> Self {
        self.env.retain(|(x, _)| x != k);
        self
    }

    /// Runs the plugin binary. A run longer than 30 s is killed and fails the test:
    /// the plugin must never hang.
    pub fn run(&self) -> CniOutput {
        self.run_as(None)
    }

    /// Like [`Call::run`], as user `uid` when given.
    pub fn run_as(&self, uid: Option<u32>) -> CniOutput {
        let opts = CallOptions {
            uid,
            capture_stderr: true,
            limit: Some(Duration::from_secs(30)),
            ..CallOptions::default()
        };
        let out = match CniExec::new(&bin("weft")).run(self.env.iter().cloned(), self.stdin.as_bytes(), opts) {
            Ok(out) => out,
            Err(HarnessError::TimedOut { .. }) => panic!("the plugin hung for 30 s: {self:?}"),
            Err(e) => panic!("running the plugin: {e}"),
        };
        CniOutput {
            code: out.code,
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }
}

/// Makes `path` world-accessible (tests use it to let a non-root client reach a socket).
pub fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// A real Prometheus (Debian's `prometheus`) running inside a network namespace,
/// scraping targets there every second; killed on drop.
pub struct Prometheus {
    netns: NamedNetns,
    port: u16,
    _proc: ChildGuard,
}

impl Prometheus {
    /// Starts Prometheus in namespace `netns` (a name under /run/netns) with its data in
    /// `dir`, listening on 127.0.0.1:`port`, scraping `targets` (`host:port`, each with a
    /// `node` label) and evaluating `rules` (a rules file, if any) every second.
    pub fn start(netns: &str, dir: &Path, port: u16, targets: &[(&str, &str)], rules: Option<&Path>) -> Self {
        std::fs::create_dir_all(dir).unwrap();
        let mut config = String::from("global: {scrape_interval: 1s, evaluation_interval: 1s}\n");
        if let Some(r) = rules {
            config += &format!("rule_files: ['{}']\n", r.display());
        }
        config += "scrape_configs:\n  - job_name: weft\n    static_configs:\n";
        for (target, node) in targets {
            config += &format!("      - targets: ['{target}']\n        labels: {{node: '{node}'}}\n");
        }
        std::fs::write(dir.join("prometheus.yml"), config).unwrap();
        let log = dir.join("prometheus.log");
        let out = std::fs::File::create(&log).expect("log file");
        let ns = NamedNetns::existing(netns);
        let child = ns
            .command(["prometheus"])
            .arg(format!("--config.file={}", dir.join("prometheus.yml").display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::from(out.try_clone().unwrap()))
            .stderr(Stdio::from(out))
            .spawn()
            .expect("starting prometheus");
        let p = Prometheus {
            netns: ns,
            port,
            _proc: ChildGuard::new(child),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !run(p.curl().arg(format!("http://127.0.0.1:{port}/-/ready")))
            .status
            .success()
        {
            assert!(
                Instant::now() < deadline,
                "prometheus not ready: {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        p
    }

    fn curl(&self) -> Command {
        self.netns.command(["curl", "-sf", "--max-time", "10"])
    }

    /// Evaluates a PromQL expression now; returns the result vector.
    pub fn query(&self, expr: &str) -> Vec<Value> {
        let out = sh(self
            .curl()
            .arg("-G")
            .arg(format!("http://127.0.0.1:{}/api/v1/query", self.port))
            .arg("--data-urlencode")
            .arg(format!("query={expr}")));
        let v: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["status"], "success", "{expr}: {v}");
        v["data"]["result"].as_array().cloned().unwrap_or_default()
    }

    /// Polls `expr` until it returns a series (or panics after `limit`).
    pub fn wait_for(&self, expr: &str, limit: Duration) -> Vec<Value> {
        let deadline = Instant::now() + limit;
        loop {
            let r = self.query(expr);
            if !r.is_empty() {
                return r;
            }
            assert!(Instant::now() < deadline, "nothing for {expr} within {limit:?}");
            std::thread::sleep(Duration::from_millis(250));
        }
    }
}

/// One query of a dashboard panel, ready for Prometheus (Grafana's variables replaced).
pub struct PanelQuery {
    /// The row the panel sits under.
    pub row: String,
    /// The panel's title.
    pub title: String,
    /// The expression, with `$node` matching every node and the interval variables set.
    pub expr: String,
}

/// Every panel query of the Grafana dashboard `dashboards/<name>`, in order.
pub fn dashboard_queries(name: &str) -> Vec<PanelQuery> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../dashboards").join(name);
    let dash: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut row = String::new();
    let mut out = Vec::new();
    for panel in dash["panels"].as_array().unwrap() {
        if panel["type"] == "row" {
            row = panel["title"].as_str().unwrap_or_default().to_string();
            continue;
        }
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"]
                .as_str()
                .unwrap()
                .replace("$node", ".*")
                .replace("$__rate_interval", "1m")
                .replace("$__range", "5m");
            out.push(PanelQuery {
                row: row.clone(),
                title: panel["title"].as_str().unwrap_or_default().to_string(),
                expr,
            });
        }
    }
    out
}

/// Whether a dashboard row charts wires (evaluated by the lab test, where wires exist).
pub fn is_wire_row(row: &str) -> bool {
    row.starts_with("Wires") || row.starts_with("Peer node streams")
}

/// Whether a dashboard row charts weft's link emulation (empty without impairments:
/// its queries are run by the lab test, their results not required).
pub fn is_emulation_row(row: &str) -> bool {
    row.starts_with("Link emulation")
}

/// Whether a dashboard row charts pod traffic between nodes (evaluated by the cluster
/// lab test, where there are several nodes).
pub fn is_node_network_row(row: &str) -> bool {
    row.starts_with("Pod network between nodes")
}

/// Whether a dashboard row charts network policy (evaluated by the policy test, whose
/// daemon enforces policies).
pub fn is_policy_row(row: &str) -> bool {
    row.starts_with("Network policy")
}

/// A lab taken down when dropped (the lab crate's guard, under the tests' name).
pub use weft_lab::DownOnDrop as LabDown;

/// A lab node daemon's metrics page, scraped inside the node's namespace.
pub fn node_metrics(lab: &weft_lab::Lab, node: &str) -> String {
    weft_harness::metrics::page_in(&lab.node_ns(node)).unwrap_or_else(|e| panic!("{e}"))
}

pub use weft_harness::metrics::series_value;

/// The value of `series` on lab node `node`'s metrics page (0 when absent).
pub fn lab_metric(lab: &weft_lab::Lab, node: &str, series: &str) -> f64 {
    series_value(&node_metrics(lab, node), series)
}

/// The checks of a lab that failed, as `from -> to (kind)`, for assertion messages.
pub fn failed_checks(checks: &[weft_lab::LinkCheck]) -> Vec<String> {
    checks
        .iter()
        .filter(|c| !c.ok)
        .map(|c| format!("{} -> {} ({})", c.from, c.to, c.kind))
        .collect()
}

/// The pod address of one family in a CNI result, without its prefix.
pub fn result_address(result: &Value, v6: bool) -> String {
    result["ips"]
        .as_array()
        .expect("a result lists ips")
        .iter()
        .map(|ip| ip["address"].as_str().expect("an address"))
        .find(|a| a.contains(':') == v6)
        .expect("an address of that family")
        .split('/')
        .next()
        .expect("an address")
        .to_string()
}

/// The lab file of the link-emulation tests: two nodes, pods a1 and b1 on n1 and c2 and
/// d2 on n2, in Topology namespace `namespace`, with one link of each kind: a1:e1 to
/// b1:e1 (veth, uid 1), a1:e2 to c2:e2 (VXLAN, uid 2) and b1:e3 to d2:e3 (gRPC, uid 3),
/// addressed `<subnet>.<uid>.1/30` on the first pod named and `.2` on the other.
/// `extra(pod, uid)` adds fields to that pod's entry of the link (`", delay: 20ms"`).
pub fn kinds_lab_file(name: &str, namespace: &str, subnet: &str, extra: &dyn Fn(&str, i64) -> String) -> String {
    // (uid, peer, interface, kind, whether the pod holds the link's .1 address)
    type Entry<'a> = (i64, &'a str, &'a str, &'a str, bool);
    let entries: [(&str, &[Entry]); 4] = [
        (
            "a1",
            &[(1, "b1", "e1", "", true), (2, "c2", "e2", ", kind: vxlan", true)],
        ),
        (
            "b1",
            &[(1, "a1", "e1", "", false), (3, "d2", "e3", ", kind: grpc", true)],
        ),
        ("c2", &[(2, "a1", "e2", ", kind: vxlan", false)]),
        ("d2", &[(3, "b1", "e3", ", kind: grpc", false)]),
    ];
    let mut topologies = String::new();
    for (pod, links) in entries {
        topologies += &format!(
            "  - apiVersion: networkop.co.uk/v1beta1\n    kind: Topology\n    metadata: {{name: {pod}, namespace: {namespace}}}\n    spec:\n      links:\n"
        );
        for &(uid, peer, intf, kind, first) in links {
            let (me, them) = if first { (1, 2) } else { (2, 1) };
            topologies += &format!(
                "      - {{uid: {uid}, peer_pod: {peer}, local_intf: {intf}, peer_intf: {intf}, local_ip: {subnet}.{uid}.{me}/30, peer_ip: {subnet}.{uid}.{them}/30{kind}{}}}\n",
                extra(pod, uid)
            );
        }
    }
    format!(
        "name: {name}\nnodes: [n1, n2]\npods:\n  - {{name: a1, node: n1}}\n  - {{name: b1, node: n1}}\n  - {{name: c2, node: n2}}\n  - {{name: d2, node: n2}}\ntopologies:\n{topologies}"
    )
}

/// Writes lab file `text` (for a lab named `name`) into `dir` and loads it with this
/// build's weftd and plugin, its state under `dir/labs/<name>` (not started yet): the
/// lab, the file's path, and the state directory's parent, where `weftctl --lab` looks.
pub fn load_lab(dir: &Path, name: &str, text: &str) -> (weft_lab::Lab, PathBuf, PathBuf) {
    let file = dir.join("lab.yaml");
    std::fs::write(&file, text).unwrap();
    let lab_dir = dir.join("labs");
    let lab = weft_lab::Lab::load(&file)
        .unwrap()
        .with_binaries(bin("weftd"), bin("weft"))
        .with_state_dir(lab_dir.join(name));
    (lab, file, lab_dir)
}

/// Runs `argv` inside lab pod `pod`'s network namespace and returns what it printed.
pub fn in_lab_pod(lab: &weft_lab::Lab, pod: &str, argv: &[&str]) -> Output {
    Command::new("ip")
        .args(["netns", "exec", &lab.pod_ns(pod)])
        .args(argv)
        .output()
        .unwrap()
}

/// Waits (up to 15 s) until lab pod `pod` gets an answer to a ping of `addr`.
pub fn wait_lab_reachable(lab: &weft_lab::Lab, pod: &str, addr: &str) {
    assert!(
        weft_harness::NamedNetns::existing(&lab.pod_ns(pod)).wait_reachable(addr, Duration::from_secs(15)),
        "{pod} never reached {addr}"
    );
}

/// Tests of one area (one module of a merged test binary, which was a binary of its
/// own before) may run beside each other, as they always did; tests of different areas
/// never overlap, as when each area was a binary that `cargo test` ran after the last.
/// Areas share names, ports and the machine's two cores, and were tuned for that.
///
/// This and [`alone`] are the one way integration tests keep out of each other's way:
/// every privileged test takes one of them first.
pub fn area(name: &'static str) -> AreaGuard {
    enter(name, false)
}

/// As [`area`], for a test that runs with no other test at all beside it, of its area
/// or another: one that brings up a whole lab, or whose timing is what it measures.
pub fn alone(name: &'static str) -> AreaGuard {
    enter(name, true)
}

fn enter(name: &'static str, alone: bool) -> AreaGuard {
    let mut gate = AREA.lock().unwrap_or_else(|e| e.into_inner());
    while !gate.admits(name, alone) {
        gate = AREA_FREE.wait(gate).unwrap_or_else(|e| e.into_inner());
    }
    gate.area = Some(name);
    gate.running += 1;
    gate.alone = alone;
    AreaGuard(())
}

/// Who runs now.
struct Gate {
    /// The area being run.
    area: Option<&'static str>,
    /// How many of its tests are running.
    running: usize,
    /// Whether the one running test runs alone.
    alone: bool,
}

impl Gate {
    /// Whether a test of `area` (`alone` or not) may start now.
    fn admits(&self, area: &'static str, alone: bool) -> bool {
        match self.area {
            None => true,
            Some(_) if alone || self.alone => false,
            Some(current) => current == area,
        }
    }
}

static AREA: std::sync::Mutex<Gate> = std::sync::Mutex::new(Gate {
    area: None,
    running: 0,
    alone: false,
});
static AREA_FREE: std::sync::Condvar = std::sync::Condvar::new();

/// Held for a test's whole run (see [`area`] and [`alone`]); its drop, on failure too,
/// lets the next test in once the last test of this area is done.
#[must_use = "the area is left when the guard drops"]
pub struct AreaGuard(());

impl Drop for AreaGuard {
    fn drop(&mut self) {
        let mut gate = AREA.lock().unwrap_or_else(|e| e.into_inner());
        gate.running -= 1;
        if gate.running == 0 {
            gate.area = None;
            gate.alone = false;
            AREA_FREE.notify_all();
        }
    }
}
