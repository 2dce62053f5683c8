//! Issue 16's acceptance test: the wire port (TCP 9385) of a lab with mutual TLS under
//! attack. Three nodes, gRPC links p1@n1 <-> p2@n2 and p1@n1 <-> p3@n3, so n1 holds
//! wires to two peers. From the lab's underlay (its "outside" namespace, an address
//! that is no node, and node n2's own namespace, so the source address is n2's) an
//! attacker written here speaks TLS and gRPC to n1: every attempt is refused and
//! counted under its reason, and no frame it sends reaches a pod (packet sockets on
//! every pod's link interfaces watch for its marker ethertype), while a CNI ADD/DEL
//! loop on n1 keeps succeeding and the real links keep passing. Then n1's certificate
//! is rotated on disk: a new connection gets the new one, the streams already open
//! keep running.

use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::{Buf, BufMut};
use prost::Message;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, RootCertStore};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::transport::{Channel, Endpoint};
use weft_harness::{CniExec, CniVars, NamedNetns};
use weft_lab::Lab;
use weft_rpc::wire::wire_client::WireClient;
use weft_rpc::wire::{Frame, FrameBatch};
use weft_tests::{LabDown, TempDir, bin, failed_checks, node_metrics, privileged, series_value};
use weft_wires::dataplane::{MAX_BATCH_MESSAGE, NODE_HEADER};
use weft_wiretls::{NoObserver, NodeNames, TlsDir, WireConnector, WireSecurity};

const WIRE_PORT: u16 = 9385;
/// The ethertype of the attacker's frames (IEEE local experimental): nothing in the lab
/// sends it, so one seen on a pod's interface can only be the attacker's.
const MARKER_TYPE: u16 = 0x88B5;
const MARKER: &[u8] = b"weft-wire-attack-marker";
/// An HTTP/2 client preface and an empty SETTINGS frame: an admitted caller gets the
/// server's SETTINGS back, a refused one an alert or the end of the connection.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";
/// The connection burst: how many, and how many at once.
const BURST: usize = 2000;
const BURST_PARALLEL: usize = 500;

fn link(uid: i64, peer: &str, local: &str, remote: &str, ip: (&str, &str)) -> String {
    format!(
        "      - {{uid: {uid}, peer_pod: {peer}, local_intf: {local}, peer_intf: {remote}, local_ip: {}, peer_ip: {}, kind: grpc}}\n",
        ip.0, ip.1
    )
}

fn topology(pod: &str, links: &[String]) -> String {
    format!(
        "  - apiVersion: networkop.co.uk/v1beta1\n    kind: Topology\n    metadata: {{name: {pod}, namespace: attack}}\n    spec:\n      links:\n{}",
        links.concat()
    )
}

fn rejected_series(reason: &str) -> String {
    format!("weft_peer_rejected_total{{reason=\"{reason}\"}}")
}

/// The sum of every series of a metric family on a metrics page.
fn family_sum(page: &str, name: &str) -> f64 {
    page.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .fold(0.0, |a, b| a + b)
}

fn reconnects(lab: &Lab) -> f64 {
    family_sum(&node_metrics(lab, "n1"), "weft_peer_stream_reconnects_total")
}

/// The connection-level refusals a burst of non-TLS connections can be counted under.
fn burst_refusals(lab: &Lab) -> f64 {
    let page = node_metrics(lab, "n1");
    ["tls_handshake", "handshake_overload", "handshake_timeout"]
        .iter()
        .map(|r| series_value(&page, &rejected_series(r)))
        .sum()
}

/// Connections the kernel of network namespace `ns` dropped before any socket was
/// accepted for them (`TcpExt: ListenDrops`): the client saw its handshake complete,
/// the listener never saw the connection, so weftd cannot count it.
fn listen_drops(ns: &str) -> f64 {
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", ns, "cat", "/proc/net/netstat"])
        .output()
        .expect("reading /proc/net/netstat");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut lines = text.lines().filter(|l| l.starts_with("TcpExt:"));
    let (Some(names), Some(values)) = (lines.next(), lines.next()) else {
        return 0.0;
    };
    names
        .split_whitespace()
        .zip(values.split_whitespace())
        .find(|(n, _)| *n == "ListenDrops")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0.0)
}

/// Polls `read` until it reaches `target` or `limit` passes; the last value.
fn wait_value(limit: Duration, target: f64, mut read: impl FnMut() -> f64) -> f64 {
    let deadline = Instant::now() + limit;
    loop {
        let v = read();
        if v >= target || Instant::now() >= deadline {
            return v;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Like [`wait_value`] for one series of n1, from inside an attacker's runtime: the
/// scrape runs on a blocking thread so that the attacker's connections keep being
/// driven meanwhile.
async fn wait_value_async(lab: &Arc<Lab>, series: &str, target: f64, limit: Duration) -> f64 {
    let deadline = Instant::now() + limit;
    loop {
        let (l, s) = (lab.clone(), series.to_string());
        let v = tokio::task::spawn_blocking(move || weft_tests::lab_metric(&l, "n1", &s))
            .await
            .expect("scrape");
        if v >= target || Instant::now() >= deadline {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The wire id of the end of `pod`'s interface `intf`, as its node mirrors it into the
/// lab's `.wires/` directory.
fn wire_id(lab: &Lab, pod: &str, intf: &str) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        for e in std::fs::read_dir(lab.topology_dir().join(".wires"))
            .into_iter()
            .flatten()
            .flatten()
        {
            let Ok(text) = std::fs::read_to_string(e.path()) else {
                continue;
            };
            let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
            for w in v["status"]["wires"].as_array().into_iter().flatten() {
                if w["local_pod"] == pod && w["local_intf"] == intf {
                    return w["local_id"].as_u64().expect("a wire id");
                }
            }
        }
        assert!(Instant::now() < deadline, "no wire id for {pod}:{intf}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// An Ethernet frame of the marker ethertype, with the virtio-net header (all zero:
/// no offloads) a wire frame carries in front, padded to `len` bytes.
fn marker_frame(len: usize) -> Vec<u8> {
    let mut f = vec![0u8; weft_kernel::packet::VNET_HDR_LEN];
    f.extend([0xff; 6]);
    f.extend([0x02, 0, 0, 0, 0, 0x66]);
    f.extend(MARKER_TYPE.to_be_bytes());
    f.extend(MARKER);
    f.resize(len.max(f.len() + 1), 0x5a);
    f
}

/// Watches one interface of a pod with a packet socket: counts frames of the marker
/// ethertype and IPv4 ICMP frames (the positive control: pings over the link).
struct Sniffer {
    what: String,
    markers: Arc<AtomicU64>,
    icmp: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Sniffer {
    fn start(lab: &Lab, pod: &str, intf: &str) -> Self {
        let fd = packet_socket(&lab.pod_ns(pod), intf);
        let (markers, icmp, stop) = (
            Arc::new(AtomicU64::new(0)),
            Arc::new(AtomicU64::new(0)),
            Arc::new(AtomicBool::new(false)),
        );
        let (m, i, s) = (markers.clone(), icmp.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let mut buf = vec![0u8; 65536];
            while !s.load(Ordering::Relaxed) {
                // SAFETY: reads into a buffer of the length given, on a descriptor owned
                // by this thread.
                let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
                if n < 14 {
                    continue; // the receive timeout, to look at `stop`
                }
                let f = &buf[..n as usize];
                match u16::from_be_bytes([f[12], f[13]]) {
                    MARKER_TYPE => {
                        m.fetch_add(1, Ordering::Relaxed);
                    }
                    0x0800 if f.len() > 23 && f[23] == 1 => {
                        i.fetch_add(1, Ordering::Relaxed);
                    }
                    _ => {}
                }
            }
        });
        Sniffer {
            what: format!("{pod}:{intf}"),
            markers,
            icmp,
            stop,
            thread: Some(thread),
        }
    }

    fn markers(&self) -> u64 {
        self.markers.load(Ordering::Relaxed)
    }

    fn icmp(&self) -> u64 {
        self.icmp.load(Ordering::Relaxed)
    }
}

impl Drop for Sniffer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// An AF_PACKET socket for every frame of interface `intf` of namespace `ns`, with a
/// 100 ms receive timeout. It is made with protocol 0 and bound with ETH_P_ALL, so it
/// receives nothing from other interfaces in between.
fn packet_socket(ns: &str, intf: &str) -> OwnedFd {
    let name = std::ffi::CString::new(intf).unwrap();
    let made = NamedNetns::existing(ns).within(move || -> std::io::Result<OwnedFd> {
        // SAFETY: plain socket calls with correctly sized arguments; the descriptor is
        // owned as soon as it exists.
        unsafe {
            let raw = libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0);
            if raw < 0 {
                return Err(std::io::Error::last_os_error());
            }
            let fd = OwnedFd::from_raw_fd(raw);
            let index = libc::if_nametoindex(name.as_ptr());
            if index == 0 {
                return Err(std::io::Error::last_os_error());
            }
            let mut sll: libc::sockaddr_ll = std::mem::zeroed();
            sll.sll_family = libc::AF_PACKET as u16;
            sll.sll_protocol = (libc::ETH_P_ALL as u16).to_be();
            sll.sll_ifindex = index as i32;
            if libc::bind(
                fd.as_raw_fd(),
                (&sll as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as u32,
            ) < 0
            {
                return Err(std::io::Error::last_os_error());
            }
            let tv = libc::timeval {
                tv_sec: 0,
                tv_usec: 100_000,
            };
            if libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&tv as *const libc::timeval).cast(),
                std::mem::size_of::<libc::timeval>() as u32,
            ) < 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(fd)
        }
    });
    made.unwrap_or_else(|e| panic!("entering {ns}: {e}"))
        .unwrap_or_else(|e| panic!("a packet socket on {ns}/{intf}: {e}"))
}

/// Runs the future `make` gives on a current-thread runtime on a thread inside
/// namespace `ns`: every socket the attacker opens comes from that namespace's address.
fn attack<R: Send, F: Future<Output = R>>(ns: &str, make: impl FnOnce() -> F + Send) -> R {
    NamedNetns::existing(ns)
        .within(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime")
                .block_on(make())
        })
        .unwrap_or_else(|e| panic!("attacking from {ns}: {e}"))
}

/// A node identity for the attacker: the three files of a TLS directory (a node's own,
/// or forged ones).
fn identity(dir: &Path) -> Arc<TlsDir> {
    let names: Arc<dyn NodeNames> = Arc::new(|_: IpAddr| -> Option<String> { None });
    TlsDir::open(dir, names, Arc::new(NoObserver)).unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
}

/// A TLS 1.3 client that trusts the lab's CA and has no certificate of its own.
fn anonymous(ca_pem: &str) -> Arc<ClientConfig> {
    let mut roots = RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(c.expect("the CA's PEM")).expect("a CA certificate");
    }
    let mut c = ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("TLS 1.3")
        .with_root_certificates(roots)
        .with_no_client_auth();
    c.alpn_protocols = vec![b"h2".to_vec()];
    Arc::new(c)
}

/// One TLS connection to the wire port at `to` with `config`, then an HTTP/2 preface:
/// the server's certificate when the server answers as HTTP/2 (admitted), else what
/// the attacker saw.
async fn tls_probe(config: Arc<ClientConfig>, to: SocketAddr) -> Result<Vec<u8>, String> {
    let limit = Duration::from_secs(5);
    let tcp = tokio::time::timeout(limit, TcpStream::connect(to))
        .await
        .map_err(|_| "connect timed out".to_string())?
        .map_err(|e| format!("connect: {e}"))?;
    let mut tls = tokio::time::timeout(
        limit,
        tokio_rustls::TlsConnector::from(config).connect(ServerName::IpAddress(to.ip().into()), tcp),
    )
    .await
    .map_err(|_| "handshake timed out".to_string())?
    .map_err(|e| format!("handshake: {e}"))?;
    let cert = tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .map(|c| c.to_vec())
        .unwrap_or_default();
    // TLS 1.3: the client finishes its side before the server has judged its
    // certificate, so a refusal shows on the first read.
    let _ = tls.write_all(H2_PREFACE).await;
    let _ = tls.flush().await;
    let mut buf = [0u8; 64];
    match tokio::time::timeout(limit, tls.read(&mut buf)).await {
        Err(_) => Err("no answer in 5 s".into()),
        Ok(Err(e)) => Err(format!("read: {e}")),
        Ok(Ok(0)) => Err("connection closed".into()),
        Ok(Ok(n)) if n >= 9 && buf[3] == 4 => Ok(cert),
        Ok(Ok(n)) => Err(format!("{n} unexpected bytes")),
    }
}

/// A gRPC channel to the wire port at `to`, as the node whose files `dir` holds.
async fn wire_channel(dir: Arc<TlsDir>, to: SocketAddr) -> Result<Channel, String> {
    Endpoint::from_shared(format!("http://{to}"))
        .map_err(|e| e.to_string())?
        .connect_timeout(Duration::from_secs(5))
        .connect_with_connector(WireConnector::new(WireSecurity::Mtls(dir)))
        .await
        .map_err(|e| format!("{e:?}"))
}

/// A `Frames` request claiming node `from`, whose messages are what `rx` gives.
fn frames_request<T>(
    from: IpAddr,
    rx: tokio::sync::mpsc::Receiver<T>,
) -> tonic::Request<tokio_stream::wrappers::ReceiverStream<T>> {
    let mut req = tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(rx));
    req.metadata_mut()
        .insert(NODE_HEADER, from.to_string().parse().expect("an address"));
    req
}

/// A codec that sends bytes as they are, for messages that are not a `FrameBatch`.
#[derive(Debug, Clone, Copy, Default)]
struct RawCodec;

impl Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawCodec;
    type Decoder = RawCodec;

    fn encoder(&mut self) -> RawCodec {
        RawCodec
    }

    fn decoder(&mut self) -> RawCodec {
        RawCodec
    }
}

impl Encoder for RawCodec {
    type Item = Vec<u8>;
    type Error = tonic::Status;

    fn encode(&mut self, item: Vec<u8>, buf: &mut EncodeBuf<'_>) -> Result<(), tonic::Status> {
        buf.put_slice(&item);
        Ok(())
    }
}

impl Decoder for RawCodec {
    type Item = Vec<u8>;
    type Error = tonic::Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, tonic::Status> {
        let n = buf.remaining();
        Ok(Some(buf.copy_to_bytes(n).to_vec()))
    }
}

/// What became of a frame stream the attacker opened: the response stream's end as the
/// attacker saw it within 10 s.
async fn stream_end<T>(resp: tonic::Response<tonic::Streaming<T>>) -> String {
    let mut s = resp.into_inner();
    match tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match s.message().await {
                Ok(Some(_)) => continue,
                other => return other.map(|_| ()),
            }
        }
    })
    .await
    {
        Err(_) => "stream still open after 10 s".into(),
        Ok(Ok(())) => "stream ended by the server".into(),
        Ok(Err(status)) => format!("stream ended: {:?} {}", status.code(), status.message()),
    }
}

/// One row of the attack table.
struct Row {
    attack: &'static str,
    seen: String,
    counter: String,
    before: f64,
    after: f64,
}

impl Row {
    /// The row of an attack that rejection counter `counter` must have counted: fails
    /// the test when the counter did not rise from `before` to `after`.
    fn counted(attack: &'static str, counter: &str, before: f64, after: f64, seen: String) -> Row {
        assert!(
            after > before,
            "{attack}: not counted as {counter} ({before} -> {after}; the attacker saw: {seen})"
        );
        Row {
            attack,
            seen,
            counter: counter.into(),
            before,
            after,
        }
    }
}

/// What one CNI call of the loop gave: success, time, and what the plugin printed.
type CniCall = (bool, Duration, String);

/// A CNI ADD/DEL loop of one pod on n1, as kubelet would run it, until finished; a
/// test that fails midway stops and joins it on drop, so its namespace goes too.
struct CniLoop {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Vec<CniCall>>>,
}

impl CniLoop {
    fn start(lab: &Lab, socket: &Path) -> Self {
        let node = lab.node_ns("n1");
        let config = serde_json::json!({
            "cniVersion": "1.1.0", "name": "weft", "type": "weft", "socket": socket,
        })
        .to_string();
        let stop = Arc::new(AtomicBool::new(false));
        let halt = stop.clone();
        let thread = std::thread::spawn(move || {
            let pod = weft_tests::Netns::new("attack-cni");
            let node = NamedNetns::existing(&node);
            let exec = CniExec::new(&bin("weft"));
            let mut calls = Vec::new();
            while !halt.load(Ordering::Relaxed) {
                for command in ["ADD", "DEL"] {
                    let vars = CniVars {
                        command,
                        container_id: pod.name(),
                        netns: &pod.path(),
                        ifname: "eth0",
                        args: "K8S_POD_NAMESPACE=attack;K8S_POD_NAME=cni-loop",
                    };
                    calls.push(match exec.call(&node, &vars, config.as_bytes()) {
                        Ok(out) => (
                            out.ok(),
                            out.elapsed,
                            format!("{command}: {}", String::from_utf8_lossy(&out.stdout).trim()),
                        ),
                        Err(e) => (false, Duration::ZERO, format!("{command}: {e}")),
                    });
                }
            }
            calls
        });
        CniLoop {
            stop,
            thread: Some(thread),
        }
    }

    /// Stops the loop; every call it made.
    fn finish(mut self) -> Vec<CniCall> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().expect("running").join().expect("the CNI loop")
    }
}

impl Drop for CniLoop {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Lets this process hold the burst's sockets at once.
fn raise_nofile() {
    // SAFETY: getrlimit/setrlimit on a properly initialised struct.
    unsafe {
        let mut r: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) == 0 && r.rlim_cur < r.rlim_max {
            r.rlim_cur = r.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &r);
        }
    }
}

#[test]
fn the_wire_port_refuses_and_counts_every_attack_and_rotates_certificates() {
    let _area = weft_tests::area("cluster::wire_attacks");
    if !privileged() {
        return;
    }
    let started = Instant::now();
    raise_nofile();
    let dir = TempDir::new("attack");
    let name = format!("wt{}att", std::process::id());
    let topologies = [
        topology(
            "p1",
            &[
                link(1, "p2", "e1", "e1", ("10.9.1.1/30", "10.9.1.2/30")),
                link(2, "p3", "e2", "e1", ("10.9.2.1/30", "10.9.2.2/30")),
            ],
        ),
        topology("p2", &[link(1, "p1", "e1", "e1", ("10.9.1.2/30", "10.9.1.1/30"))]),
        topology("p3", &[link(2, "p1", "e1", "e2", ("10.9.2.2/30", "10.9.2.1/30"))]),
    ];
    // wire_security is left to its default: mutual TLS.
    let spec = format!(
        "name: {name}\ninter_node_link: grpc\nnodes: [n1, n2, n3]\npods:\n  - {{name: p1, node: n1}}\n  - {{name: p2, node: n2}}\n  - {{name: p3, node: n3}}\ntopologies:\n{}",
        topologies.concat()
    );
    let file = dir.path().join("lab.yaml");
    std::fs::write(&file, spec).unwrap();
    let state = dir.path().join("state");
    let lab = Lab::load(&file)
        .unwrap()
        .with_binaries(bin("weftd"), bin("weft"))
        .with_state_dir(state.clone());
    assert_eq!(lab.spec.wire_security, weft_lab::WireSecurityMode::Mtls);
    let lab = LabDown(lab);
    lab.up().expect("lab up");

    // Every gRPC link passes over mutual TLS before anything else happens.
    let checks = lab.check(Duration::from_secs(20));
    assert_eq!(checks.len(), 4, "2 links, both ends");
    assert!(
        failed_checks(&checks).is_empty(),
        "links down: {:?}",
        failed_checks(&checks)
    );
    assert!(checks.iter().all(|c| c.kind == "grpc"), "{checks:?}");
    assert_eq!(weft_tests::lab_metric(&lab, "n1", "weft_wire_insecure"), 0.0);
    eprintln!(
        "[{:>5.1}s] lab up, 4 gRPC link ends pass over mTLS",
        started.elapsed().as_secs_f64()
    );

    let addr = |n: &str| -> IpAddr { lab.address_of(n).unwrap().parse().unwrap() };
    let (n1, n2) = (addr("n1"), addr("n2"));
    let target = SocketAddr::new(n1, WIRE_PORT);
    // n1's ends: toward p2 (peer n2) and toward p3 (peer n3).
    let (to_p2, to_p3) = (wire_id(&lab, "p1", "e1"), wire_id(&lab, "p1", "e2"));
    let nobodys = to_p3 ^ 0x5a5a_5a5a_5a5a_5a5a;
    assert!(nobodys != to_p2 && to_p2 != to_p3);
    let ca = lab.authority().expect("the lab's CA");
    let ca_pem = ca.cert_pem().to_string();
    let (outside, n2_ns) = (lab.outside_ns(), lab.node_ns("n2"));
    let shared = Arc::new(lab.0.clone());

    let sniffers = [
        Sniffer::start(&lab, "p1", "e1"),
        Sniffer::start(&lab, "p1", "e2"),
        Sniffer::start(&lab, "p2", "e1"),
        Sniffer::start(&lab, "p3", "e1"),
    ];
    // The same loop with nothing attacking first: what "the noise band" is here (the
    // two medians are reported, not asserted: timing belongs to benchmarks).
    let quiet = CniLoop::start(&lab, &state.join("nodes/n1/weftd.sock"));
    std::thread::sleep(Duration::from_millis(1500));
    let quiet = quiet.finish();
    assert!(quiet.iter().all(|c| c.0), "CNI calls failed with no attack: {quiet:?}");
    let cni = CniLoop::start(&lab, &state.join("nodes/n1/weftd.sock"));
    let reconnects_before = reconnects(&lab);
    let mut rows: Vec<Row> = Vec::new();

    // Connection-level attacks: one attempt each; the attacker must not get to speak
    // HTTP/2, and n1 counts the refusal under its reason.
    let rogue_dir = dir.path().join("rogue");
    let rogue = weft_wiretls::issue::Authority::generate("not the lab's CA").unwrap();
    let rogue_cert = rogue.issue("n2", &[n2]).unwrap();
    // The attacker trusts the lab's CA (to talk to n1) but holds a certificate of its own CA.
    weft_wiretls::issue::write_tls_dir(&rogue_dir, &ca_pem, &rogue_cert).unwrap();
    let connection_attacks: [(&'static str, &str, Arc<ClientConfig>, &str); 4] = [
        (
            "no client certificate (outside)",
            &outside,
            anonymous(&ca_pem),
            "no_certificate",
        ),
        (
            "certificate of another CA naming n2 (outside)",
            &outside,
            identity(&rogue_dir).client().unwrap(),
            "bad_certificate",
        ),
        (
            "n3's valid certificate from n2's address",
            &n2_ns,
            identity(&lab.wire_tls_dir("n3")).client().unwrap(),
            "identity_mismatch",
        ),
        (
            "n1's own valid certificate from n2's address",
            &n2_ns,
            identity(&lab.wire_tls_dir("n1")).client().unwrap(),
            "identity_mismatch",
        ),
    ];
    for (what, ns, config, reason) in connection_attacks {
        let before = weft_tests::lab_metric(&lab, "n1", &rejected_series(reason));
        let seen = attack(ns, move || tls_probe(config, target));
        assert!(seen.is_err(), "{what}: the attacker was admitted");
        let after = wait_value(Duration::from_secs(10), before + 1.0, || {
            weft_tests::lab_metric(&lab, "n1", &rejected_series(reason))
        });
        rows.push(Row::counted(what, reason, before, after, seen.unwrap_err()));
    }
    eprintln!("[{:>5.1}s] connection attacks refused", started.elapsed().as_secs_f64());

    // n2, with its own valid certificate from its own address, writes into the wire n1
    // holds for n3, and into a wire id nobody holds: both dropped and counted.
    let other_before = weft_tests::lab_metric(&lab, "n1", &rejected_series("other_peer_wire"));
    let unknown_before = weft_tests::lab_metric(&lab, "n1", &rejected_series("unknown_wire"));
    let (n2_dir, l) = (lab.wire_tls_dir("n2"), shared.clone());
    let (seen, other_after, unknown_after) = attack(&n2_ns, move || async move {
        let channel = wire_channel(identity(&n2_dir), target)
            .await
            .expect("n2's certificate admitted");
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let batch = FrameBatch {
            frames: vec![
                Frame {
                    wire_id: to_p3,
                    data: marker_frame(64).into(),
                },
                Frame {
                    wire_id: nobodys,
                    data: marker_frame(64).into(),
                },
            ],
        };
        tx.send(batch).await.unwrap();
        let seen = match WireClient::new(channel).frames(frames_request(n2, rx)).await {
            Ok(_resp) => {
                let other = wait_value_async(
                    &l,
                    &rejected_series("other_peer_wire"),
                    other_before + 1.0,
                    Duration::from_secs(10),
                )
                .await;
                let unknown = wait_value_async(
                    &l,
                    &rejected_series("unknown_wire"),
                    unknown_before + 1.0,
                    Duration::from_secs(10),
                )
                .await;
                drop(tx);
                return ("stream admitted (n2 is n2); frames dropped".to_string(), other, unknown);
            }
            Err(status) => format!("refused: {status}"),
        };
        (seen, other_before, unknown_before)
    });
    assert!(
        other_after > other_before,
        "frame for n1<->n3's wire not counted: {seen}"
    );
    assert!(
        unknown_after > unknown_before,
        "frame for an unknown wire not counted: {seen}"
    );
    rows.push(Row {
        attack: "n2 (valid) writes into n1's wire to n3",
        seen: seen.clone(),
        counter: "other_peer_wire".into(),
        before: other_before,
        after: other_after,
    });
    rows.push(Row {
        attack: "n2 (valid) writes to a wire id nobody holds",
        seen,
        counter: "unknown_wire".into(),
        before: unknown_before,
        after: unknown_after,
    });

    // A malformed batch: a marker frame for n2's own wire to p1, followed by bytes that
    // make the message no FrameBatch. Nothing of it may be delivered.
    let mut malformed = FrameBatch {
        frames: vec![Frame {
            wire_id: to_p2,
            data: marker_frame(64).into(),
        }],
    }
    .encode_to_vec();
    malformed.push(0x0f); // field 1, wire type 7: no such wire type
    let before = weft_tests::lab_metric(&lab, "n1", &rejected_series("malformed_batch"));
    let (n2_dir, l) = (lab.wire_tls_dir("n2"), shared.clone());
    let (seen, after) = attack(&n2_ns, move || async move {
        let channel = wire_channel(identity(&n2_dir), target)
            .await
            .expect("n2's certificate admitted");
        let mut grpc = tonic::client::Grpc::new(channel);
        grpc.ready().await.expect("channel ready");
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        tx.send(malformed).await.unwrap();
        let path = http::uri::PathAndQuery::from_static("/weft.wire.v1.Wire/Frames");
        let seen = match grpc.streaming(frames_request(n2, rx), path, RawCodec).await {
            Ok(resp) => stream_end(resp).await,
            Err(status) => format!("refused: {status}"),
        };
        let after = wait_value_async(
            &l,
            &rejected_series("malformed_batch"),
            before + 1.0,
            Duration::from_secs(10),
        )
        .await;
        drop(tx);
        (seen, after)
    });
    rows.push(Row::counted(
        "malformed batch (n2, valid)",
        "malformed_batch",
        before,
        after,
        seen,
    ));

    // An oversized message: one frame for n2's own wire to p1 making the batch larger
    // than the limit. Refused as a whole: the marker must not arrive.
    let before = weft_tests::lab_metric(&lab, "n1", &rejected_series("oversized_batch"));
    let (n2_dir, l) = (lab.wire_tls_dir("n2"), shared.clone());
    let (seen, after) = attack(&n2_ns, move || async move {
        let channel = wire_channel(identity(&n2_dir), target)
            .await
            .expect("n2's certificate admitted");
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        tx.send(FrameBatch {
            frames: vec![Frame {
                wire_id: to_p2,
                data: marker_frame(MAX_BATCH_MESSAGE + 1024).into(),
            }],
        })
        .await
        .unwrap();
        let seen = match WireClient::new(channel).frames(frames_request(n2, rx)).await {
            Ok(resp) => stream_end(resp).await,
            Err(status) => format!("refused: {status}"),
        };
        let after = wait_value_async(
            &l,
            &rejected_series("oversized_batch"),
            before + 1.0,
            Duration::from_secs(10),
        )
        .await;
        drop(tx);
        (seen, after)
    });
    rows.push(Row::counted(
        "oversized message, 4 MiB + 1 KiB (n2, valid)",
        "oversized_batch",
        before,
        after,
        seen,
    ));
    eprintln!("[{:>5.1}s] stream attacks refused", started.elapsed().as_secs_f64());

    // 2,000 connections in a burst from outside, each sending a few bytes that are not
    // TLS and closing: every one that connected is counted under a connection refusal.
    let before = burst_refusals(&lab);
    let drops_before = listen_drops(&lab.node_ns("n1"));
    let burst_start = Instant::now();
    let (connected, failures) = attack(&outside, move || async move {
        let slots = Arc::new(tokio::sync::Semaphore::new(BURST_PARALLEL));
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..BURST {
            let slot = slots.clone().acquire_owned().await.unwrap();
            tasks.spawn(async move {
                let _slot = slot;
                match tokio::time::timeout(Duration::from_secs(5), TcpStream::connect(target)).await {
                    Ok(Ok(mut s)) => {
                        let _ = s.write_all(b"\x16\x03\x01\x00\x04junk").await;
                        Ok(())
                    }
                    Ok(Err(e)) => Err(e.to_string()),
                    Err(_) => Err("connect timed out".to_string()),
                }
            });
        }
        let (mut ok, mut failed) = (0usize, Vec::new());
        while let Some(r) = tasks.join_next().await {
            match r.expect("burst task") {
                Ok(()) => ok += 1,
                Err(e) => failed.push(e),
            }
        }
        (ok, failed)
    });
    let burst_time = burst_start.elapsed();
    let after = wait_value(Duration::from_secs(20), before + connected as f64, || {
        burst_refusals(&lab) + listen_drops(&lab.node_ns("n1")) - drops_before
    });
    let dropped = listen_drops(&lab.node_ns("n1")) - drops_before;
    let page = node_metrics(&lab, "n1");
    let split: Vec<String> = ["tls_handshake", "handshake_overload", "handshake_timeout"]
        .iter()
        .map(|r| format!("{r}={}", series_value(&page, &rejected_series(r))))
        .collect();
    assert_eq!(
        connected,
        BURST,
        "connections of the burst failed: {:?}",
        &failures[..failures.len().min(5)]
    );
    // Every connection is counted by weftd, or was dropped by the kernel's full
    // accept queue before weftd could see it (on a busy machine).
    assert!(
        after - before >= connected as f64,
        "burst: {connected} connections, {} counted or dropped by the kernel ({}, ListenDrops={dropped})",
        after - before,
        split.join(", ")
    );
    rows.push(Row {
        attack: "2,000 non-TLS connections, 500 at once (outside)",
        seen: format!(
            "{connected} connected and were closed, {} failed, in {:.2} s",
            failures.len(),
            burst_time.as_secs_f64()
        ),
        counter: format!(
            "sum of tls_handshake+handshake_overload+handshake_timeout (now {})",
            split.join(", ")
        ),
        before,
        after,
    });
    eprintln!("[{:>5.1}s] burst refused", started.elapsed().as_secs_f64());

    // The CNI loop ran through all of it.
    let calls = cni.finish();
    let failed: Vec<&String> = calls.iter().filter(|c| !c.0).map(|c| &c.2).collect();
    assert!(calls.len() >= 2, "the CNI loop made no call");
    assert!(failed.is_empty(), "CNI calls failed under attack: {failed:?}");
    let times: Vec<Duration> = calls.iter().map(|c| c.1).collect();
    let (fastest, slowest) = (times.iter().min().unwrap(), times.iter().max().unwrap());

    // No frame of the attacker reached any pod. The sniffers get a moment for frames
    // still on their way.
    std::thread::sleep(Duration::from_millis(500));
    for s in &sniffers {
        assert_eq!(s.markers(), 0, "an attacker's frame reached {}", s.what);
    }

    // n1's daemon runs, every link passes, and the sniffers see each link's pings (so
    // they would have seen a marker).
    assert!(lab.daemon_pid("n1").is_some(), "weftd on n1 is gone");
    let checks = lab.check(Duration::from_secs(15));
    assert!(
        failed_checks(&checks).is_empty(),
        "links down after the attacks: {:?}",
        failed_checks(&checks)
    );
    // The sniffers read on threads of their own: give them a moment to catch up.
    for s in &sniffers {
        let until = std::time::Instant::now() + Duration::from_secs(3);
        while s.icmp() == 0 && std::time::Instant::now() < until {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(s.icmp() > 0, "the sniffer on {} saw no ping: it sees nothing", s.what);
    }
    let reconnects_after = reconnects(&lab);
    eprintln!(
        "[{:>5.1}s] links pass after the attacks",
        started.elapsed().as_secs_f64()
    );

    // Positive control for the frame path: the same marker, for n2's own wire to p1,
    // sent by n2 in a well-formed batch, does arrive on p1:e1 (and nowhere else).
    let (n2_dir, p1e1) = (lab.wire_tls_dir("n2"), sniffers[0].markers.clone());
    let delivered = attack(&n2_ns, move || async move {
        let channel = wire_channel(identity(&n2_dir), target)
            .await
            .expect("n2's certificate admitted");
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        tx.send(FrameBatch {
            frames: vec![Frame {
                wire_id: to_p2,
                data: marker_frame(64).into(),
            }],
        })
        .await
        .unwrap();
        let _resp = WireClient::new(channel).frames(frames_request(n2, rx)).await;
        let deadline = Instant::now() + Duration::from_secs(5);
        while p1e1.load(Ordering::Relaxed) == 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        drop(tx);
        p1e1.load(Ordering::Relaxed)
    });
    assert!(
        delivered >= 1,
        "a legitimate marker frame never reached p1:e1: the sniffer is blind"
    );
    std::thread::sleep(Duration::from_millis(300));
    for s in &sniffers[1..] {
        assert_eq!(s.markers(), 0, "the control frame leaked to {}", s.what);
    }

    // Rotation: a new certificate for n1 on disk. A new connection gets it; the streams
    // already open keep running (no reconnect, links pass).
    let checks = lab.check(Duration::from_secs(15));
    assert!(
        failed_checks(&checks).is_empty(),
        "links down: {:?}",
        failed_checks(&checks)
    );
    let peers_up = |lab: &Lab| {
        let page = node_metrics(lab, "n1");
        [addr("n2"), addr("n3")].map(|p| series_value(&page, &format!("weft_peer_stream_up{{peer_node=\"{p}\"}}")))
    };
    let up = peers_up(&lab);
    assert_eq!(
        up,
        [1.0, 1.0],
        "n1's streams to n2 and n3 are not both up before rotation"
    );
    let reconnects_rot = reconnects(&lab);
    let reloads_before = weft_tests::lab_metric(&lab, "n1", "weft_wire_tls_reloads_total{result=\"ok\"}");
    let n2_dir = lab.wire_tls_dir("n2");
    let old_der = attack(&n2_ns, {
        let dir = identity(&n2_dir);
        move || tls_probe(dir.client().unwrap(), target)
    })
    .expect("n2 admitted");
    let fresh = ca.issue("n1", &[n1]).unwrap();
    let new_der = CertificateDer::from_pem_slice(fresh.cert_pem.as_bytes())
        .unwrap()
        .to_vec();
    assert_ne!(old_der, new_der);
    weft_wiretls::issue::write_tls_dir(&lab.wire_tls_dir("n1"), &ca_pem, &fresh).unwrap();
    let rotated = Instant::now();
    std::thread::sleep(Duration::from_millis(1100));
    let mut seen_der = Vec::new();
    let mut probes = 0;
    while seen_der != new_der && rotated.elapsed() < Duration::from_secs(6) {
        let dir = identity(&n2_dir);
        seen_der =
            attack(&n2_ns, move || tls_probe(dir.client().unwrap(), target)).expect("n2 admitted after rotation");
        probes += 1;
        if seen_der != new_der {
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    assert_eq!(
        seen_der, new_der,
        "a new connection to n1 did not get the rotated certificate"
    );
    let took = rotated.elapsed();
    let checks = lab.check(Duration::from_secs(10));
    assert!(
        failed_checks(&checks).is_empty(),
        "links down after rotation: {:?}",
        failed_checks(&checks)
    );
    let reconnects_after_rot = reconnects(&lab);
    assert_eq!(reconnects_after_rot, reconnects_rot, "rotation re-opened a stream");
    assert_eq!(
        peers_up(&lab),
        [1.0, 1.0],
        "n1's streams are not both up after rotation"
    );
    let reloads_after = weft_tests::lab_metric(&lab, "n1", "weft_wire_tls_reloads_total{result=\"ok\"}");
    assert!(
        reloads_after >= reloads_before + 1.0,
        "no reload counted ({reloads_before} -> {reloads_after})"
    );

    eprintln!("\nattack | seen by the attacker | counter on n1 | before -> after");
    for r in &rows {
        eprintln!(
            "{} | {} | {} | {} -> {}",
            r.attack, r.seen, r.counter, r.before, r.after
        );
    }
    let median = |calls: &[CniCall]| {
        let mut t: Vec<Duration> = calls.iter().map(|c| c.1).collect();
        t.sort();
        t.get(t.len() / 2).copied().unwrap_or_default().as_secs_f64() * 1e3
    };
    eprintln!(
        "CNI call median on n1: {:.1} ms with no attack ({} calls), {:.1} ms under attack ({} calls)",
        median(&quiet),
        quiet.len(),
        median(&calls),
        calls.len()
    );
    eprintln!(
        "CNI loop on n1: {} calls ({} ADD+DEL pairs), all succeeded, {:.1} ms .. {:.1} ms",
        calls.len(),
        calls.len() / 2,
        fastest.as_secs_f64() * 1e3,
        slowest.as_secs_f64() * 1e3
    );
    eprintln!(
        "markers on pods: {:?}; pings seen: {:?}",
        sniffers
            .iter()
            .map(|s| (s.what.clone(), s.markers()))
            .collect::<Vec<_>>(),
        sniffers.iter().map(|s| (s.what.clone(), s.icmp())).collect::<Vec<_>>()
    );
    eprintln!(
        "weft_peer_stream_reconnects_total on n1: {reconnects_before} before the attacks, {reconnects_after} after, {reconnects_after_rot} after rotation"
    );
    eprintln!(
        "rotation: new certificate seen by a new connection {:.2} s after the write ({probes} probe(s) after 1.1 s); reloads ok {reloads_before} -> {reloads_after}; reconnects {reconnects_rot} -> {reconnects_after_rot}",
        took.as_secs_f64()
    );
    eprintln!("run time {:.1} s", started.elapsed().as_secs_f64());
    drop(sniffers);
    lab.down().unwrap();
}
