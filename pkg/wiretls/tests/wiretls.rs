//! The wire port's mutual TLS over loopback: who is let in, who is refused and why (as
//! the observer hears it), rotation of the files, and the files themselves. Certificates
//! come from the `issue` feature; nothing here needs root.

use std::future::Future;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{FutureExt, Stream, StreamExt};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, RootCertStore};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::runtime::Handle;
use weft_wiretls::issue::{self, Authority, NodeCert};
use weft_wiretls::{
    CA_FILE, CERT_FILE, KEY_FILE, MAX_HANDSHAKES, NodeNames, REFUSALS, TlsDir, TlsObserver, WireConn, WireConnector,
    WireSecurity, names_node,
};

/// How long any single wait may take before the test fails: generous, since a loaded CI
/// machine is slow, and only ever a bound (no test asserts how fast anything is).
const WAIT: Duration = Duration::from_secs(20);

const LOCAL: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

/// What the TLS layer reported, in order.
#[derive(Default)]
struct Seen {
    refused: Mutex<Vec<&'static str>>,
    reloaded: Mutex<Vec<bool>>,
}

impl TlsObserver for Seen {
    fn refused(&self, reason: &'static str) {
        // A reason outside the documented set would be a metric label nobody expects.
        assert!(REFUSALS.contains(&reason), "undocumented refusal reason {reason}");
        self.refused.lock().unwrap().push(reason);
    }

    fn reloaded(&self, ok: bool) {
        self.reloaded.lock().unwrap().push(ok);
    }
}

impl Seen {
    fn refusals(&self) -> Vec<&'static str> {
        self.refused.lock().unwrap().clone()
    }

    fn reloads(&self) -> Vec<bool> {
        self.reloaded.lock().unwrap().clone()
    }

    fn count(&self, reason: &str) -> usize {
        self.refusals().iter().filter(|r| **r == reason).count()
    }

    /// Waits (bounded) until `done` holds for the refusals so far; returns them.
    async fn until(&self, what: &str, done: impl Fn(&[&'static str]) -> bool) -> Vec<&'static str> {
        let polled = async {
            loop {
                let now = self.refusals();
                if done(&now) {
                    return now;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        };
        match tokio::time::timeout(WAIT, polled).await {
            Ok(r) => r,
            Err(_) => panic!("never saw {what}; refusals so far: {:?}", self.refusals()),
        }
    }

    /// Waits for exactly one refusal and returns its reason.
    async fn one_refusal(&self) -> &'static str {
        let r = self.until("a refusal", |r| !r.is_empty()).await;
        assert_eq!(r.len(), 1, "one connection, one refusal: {r:?}");
        r[0]
    }
}

async fn bounded<T>(what: &str, f: impl Future<Output = T>) -> T {
    tokio::time::timeout(WAIT, f)
        .await
        .unwrap_or_else(|_| panic!("{what} did not finish in {WAIT:?}"))
}

fn no_names() -> Arc<dyn NodeNames> {
    Arc::new(|_: IpAddr| None)
}

/// Node objects that put `name` at `at` and nothing anywhere else.
fn names(at: IpAddr, name: &'static str) -> Arc<dyn NodeNames> {
    Arc::new(move |a: IpAddr| (a == at).then(|| name.to_string()))
}

/// Writes `node`'s files under `root/<sub>` as a Secret volume would hold them.
fn write_dir(root: &Path, sub: &str, ca_pem: &str, node: &NodeCert) -> PathBuf {
    let dir = root.join(sub);
    issue::write_tls_dir(&dir, ca_pem, node).expect("write tls dir");
    dir
}

fn open(dir: &Path, names: Arc<dyn NodeNames>, seen: &Arc<Seen>) -> Arc<TlsDir> {
    TlsDir::open(dir, names, seen.clone()).expect("open tls dir")
}

fn der(pem: &str) -> CertificateDer<'static> {
    CertificateDer::from_pem_slice(pem.as_bytes()).expect("certificate PEM")
}

type Incoming = Pin<Box<dyn Stream<Item = io::Result<WireConn>> + Send>>;

/// A wire port on an ephemeral loopback port.
async fn serve(security: WireSecurity, seen: &Arc<Seen>) -> (SocketAddr, Incoming) {
    let listener = TcpListener::bind((LOCAL, 0)).await.expect("bind");
    let addr = listener.local_addr().unwrap();
    let stream = weft_wiretls::incoming(listener, security, seen.clone(), &Handle::current());
    (addr, Box::pin(stream))
}

async fn accepted(incoming: &mut Incoming) -> WireConn {
    bounded("accepting", incoming.next())
        .await
        .expect("incoming stream ended")
        .expect("incoming connection")
}

/// Nothing was handed to the server: what was refused never reaches tonic. Checked
/// without waiting: a refusal is reported by the very task that would have sent the
/// connection, so once it is reported there is nothing in flight.
fn nothing_accepted(incoming: &mut Incoming) {
    if let Some(item) = incoming.next().now_or_never() {
        panic!("a refused connection was handed over: {:?}", item.map(|r| r.is_ok()));
    }
}

/// Bytes go from the client to the server and back.
async fn round_trip(client: &mut WireConn, server: &mut WireConn, tag: &str) {
    bounded("round trip", async {
        let ask = format!("ping {tag}");
        client.write_all(ask.as_bytes()).await.expect("client write");
        client.flush().await.expect("client flush");
        let mut got = vec![0; ask.len()];
        server.read_exact(&mut got).await.expect("server read");
        assert_eq!(got, ask.as_bytes());

        let answer = format!("pong {tag}");
        server.write_all(answer.as_bytes()).await.expect("server write");
        server.flush().await.expect("server flush");
        let mut got = vec![0; answer.len()];
        client.read_exact(&mut got).await.expect("client read");
        assert_eq!(got, answer.as_bytes());
    })
    .await;
}

/// The client end of a connection the server refused gets no byte: the server closes
/// it (in TLS 1.3 the client may finish its side of the handshake first, so the dial
/// itself can succeed).
async fn shut_out<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(dialled: io::Result<S>) {
    let Ok(mut conn) = dialled else { return };
    bounded("the refused client seeing the close", async {
        // Writing may already fail; reading must end without data either way.
        let _ = conn.write_all(b"let me in").await;
        let _ = conn.flush().await;
        let mut buf = [0u8; 64];
        match conn.read(&mut buf).await {
            Ok(0) | Err(_) => {}
            Ok(n) => panic!("a refused client read {n} bytes"),
        }
    })
    .await;
}

/// The certificate a client connection was shown by the server.
fn server_cert_seen(conn: &WireConn) -> CertificateDer<'static> {
    let WireConn::Tls(tls) = conn else {
        panic!("not a TLS connection")
    };
    let tokio_rustls::TlsStream::Client(c) = tls.as_ref() else {
        panic!("not the client side")
    };
    c.get_ref().1.peer_certificates().expect("server certificates")[0]
        .clone()
        .into_owned()
}

/// A CA, and a node's files in a temporary directory.
struct Lab {
    tmp: tempfile::TempDir,
    ca: Authority,
}

impl Lab {
    fn new() -> Self {
        Self {
            tmp: tempfile::tempdir().expect("tempdir"),
            ca: Authority::generate("weft test CA").expect("CA"),
        }
    }

    fn cert(&self, name: &str, addresses: &[IpAddr]) -> NodeCert {
        self.ca.issue(name, addresses).expect("issue")
    }

    /// A node's directory holding a certificate of this CA.
    fn node(&self, sub: &str, name: &str, addresses: &[IpAddr]) -> PathBuf {
        write_dir(self.tmp.path(), sub, self.ca.cert_pem(), &self.cert(name, addresses))
    }

    fn mtls(&self, dir: &Path, names: Arc<dyn NodeNames>, seen: &Arc<Seen>) -> WireSecurity {
        WireSecurity::Mtls(open(dir, names, seen))
    }

    /// A server at 127.0.0.1 (node-s), as most tests want it.
    async fn server(&self, names: Arc<dyn NodeNames>) -> (SocketAddr, Incoming, Arc<Seen>) {
        let seen = Arc::new(Seen::default());
        let dir = self.node("server", "node-s", &[LOCAL]);
        let (addr, incoming) = serve(self.mtls(&dir, names, &seen), &seen).await;
        (addr, incoming, seen)
    }

    /// A dialler holding the certificate in `dir`.
    fn connector(&self, dir: &Path, names: Arc<dyn NodeNames>) -> WireConnector {
        WireConnector::new(self.mtls(dir, names, &Arc::new(Seen::default())))
    }

    /// A rustls client that trusts this CA and shows no certificate (not something the
    /// crate's connector can be made to do).
    fn anonymous_client(&self) -> ClientConfig {
        let mut roots = RootCertStore::empty();
        roots.add(der(self.ca.cert_pem())).unwrap();
        let mut c = ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        c.alpn_protocols = vec![b"h2".to_vec()];
        c
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mtls_round_trip() {
    let lab = Lab::new();
    let (addr, mut incoming, seen) = lab.server(no_names()).await;
    let client_dir = lab.node("client", "node-c", &[LOCAL]);
    let dialler = lab.connector(&client_dir, no_names());

    let mut client = bounded("dial", dialler.dial(addr)).await.expect("dial");
    let mut server = accepted(&mut incoming).await;
    assert!(matches!(server, WireConn::Tls(_)));
    round_trip(&mut client, &mut server, "1").await;
    round_trip(&mut client, &mut server, "2").await;
    // The server's certificate is the one in its directory.
    let shown = std::fs::read_to_string(lab.tmp.path().join("server").join(CERT_FILE)).unwrap();
    assert_eq!(server_cert_seen(&client), der(&shown));
    assert!(seen.refusals().is_empty(), "{:?}", seen.refusals());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_without_certificate_is_refused() {
    let lab = Lab::new();
    let (addr, mut incoming, seen) = lab.server(no_names()).await;

    let connector = tokio_rustls::TlsConnector::from(Arc::new(lab.anonymous_client()));
    let tcp = TcpStream::connect(addr).await.unwrap();
    let dialled = bounded(
        "anonymous handshake",
        connector.connect(ServerName::IpAddress(LOCAL.into()), tcp),
    )
    .await;
    shut_out(dialled).await;

    assert_eq!(seen.one_refusal().await, "no_certificate");
    nothing_accepted(&mut incoming);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_of_another_ca_is_refused() {
    let lab = Lab::new();
    let (addr, mut incoming, seen) = lab.server(no_names()).await;
    // The client trusts the right CA (so it accepts the server) but holds a certificate
    // for the right address from a CA of its own.
    let other = Authority::generate("someone else's CA").unwrap();
    let stray = other.issue("node-c", &[LOCAL]).unwrap();
    let dir = write_dir(lab.tmp.path(), "stray", lab.ca.cert_pem(), &stray);
    let dialler = lab.connector(&dir, no_names());

    shut_out(bounded("dial", dialler.dial(addr)).await).await;
    assert_eq!(seen.one_refusal().await, "bad_certificate");
    nothing_accepted(&mut incoming);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificate_of_another_node_is_refused() {
    let lab = Lab::new();
    // The Node objects even know 127.0.0.1 (as node-a): node-b's certificate still
    // cannot speak from there.
    let (addr, mut incoming, seen) = lab.server(names(LOCAL, "node-a")).await;
    let dir = lab.node("client", "node-b", &[IpAddr::V4(Ipv4Addr::new(10, 9, 9, 9))]);
    let dialler = lab.connector(&dir, no_names());

    shut_out(bounded("dial", dialler.dial(addr)).await).await;
    assert_eq!(seen.one_refusal().await, "identity_mismatch");
    nothing_accepted(&mut incoming);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_named_only_by_dns_is_checked_against_node_names() {
    let lab = Lab::new();
    let client_dir = lab.node("client", "node-a", &[]);
    let server_dir = lab.node("server", "node-s", &[LOCAL]);

    // 127.0.0.1 is node-a: its certificate, naming no address, is let in.
    let seen = Arc::new(Seen::default());
    let (addr, mut incoming) = serve(lab.mtls(&server_dir, names(LOCAL, "node-a"), &seen), &seen).await;
    let mut client = bounded("dial", lab.connector(&client_dir, no_names()).dial(addr))
        .await
        .expect("dial");
    let mut server = accepted(&mut incoming).await;
    round_trip(&mut client, &mut server, "node-a").await;
    assert!(seen.refusals().is_empty(), "{:?}", seen.refusals());

    // 127.0.0.1 is node-b, or no node at all: the same certificate is refused.
    for (label, node_names) in [("node-b", names(LOCAL, "node-b")), ("no node", no_names())] {
        let seen = Arc::new(Seen::default());
        let (addr, mut incoming) = serve(lab.mtls(&server_dir, node_names, &seen), &seen).await;
        shut_out(bounded("dial", lab.connector(&client_dir, no_names()).dial(addr)).await).await;
        assert_eq!(seen.one_refusal().await, "identity_mismatch", "127.0.0.1 is {label}");
        nothing_accepted(&mut incoming);
    }
}

/// The rustls error under a failed dial.
fn tls_error(e: &io::Error) -> Option<&rustls::Error> {
    e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dialler_refuses_a_server_naming_another_node() {
    let lab = Lab::new();
    let seen = Arc::new(Seen::default());
    let server_dir = lab.node("server", "node-b", &[IpAddr::V4(Ipv4Addr::new(10, 9, 9, 9))]);
    let (addr, mut incoming) = serve(lab.mtls(&server_dir, no_names(), &seen), &seen).await;
    let client_dir = lab.node("client", "node-c", &[LOCAL]);

    // Whether or not the Node objects know the address, node-b's certificate is not
    // the node at 127.0.0.1 (here they say node-a is).
    for (round, node_names) in [no_names(), names(LOCAL, "node-a")].into_iter().enumerate() {
        let err = match bounded("dial", lab.connector(&client_dir, node_names).dial(addr)).await {
            Ok(_) => panic!("dialled a server whose certificate names node-b"),
            Err(e) => e,
        };
        assert!(
            matches!(tls_error(&err), Some(rustls::Error::InvalidCertificate(_))),
            "dial failed for another reason: {err:?}"
        );
        // The server sees the dialler abort the handshake.
        let r = seen.until("the server's refusal", |r| r.len() > round).await;
        assert_eq!(r, vec!["tls_handshake"; round + 1]);
        nothing_accepted(&mut incoming);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dialler_accepts_a_server_named_only_by_dns_when_the_node_is_there() {
    let lab = Lab::new();
    let seen = Arc::new(Seen::default());
    let server_dir = lab.node("server", "node-s", &[]);
    let (addr, mut incoming) = serve(lab.mtls(&server_dir, no_names(), &seen), &seen).await;
    let client_dir = lab.node("client", "node-c", &[LOCAL]);

    let mut client = bounded("dial", lab.connector(&client_dir, names(LOCAL, "node-s")).dial(addr))
        .await
        .expect("the Node objects put node-s at 127.0.0.1");
    let mut server = accepted(&mut incoming).await;
    round_trip(&mut client, &mut server, "dns").await;

    // Without the Node objects saying so, the name proves nothing about the address.
    for node_names in [no_names(), names(LOCAL, "node-x")] {
        let err = match bounded("dial", lab.connector(&client_dir, node_names).dial(addr)).await {
            Ok(_) => panic!("dialled a server that is not the node at the address"),
            Err(e) => e,
        };
        assert!(
            matches!(tls_error(&err), Some(rustls::Error::InvalidCertificate(_))),
            "{err:?}"
        );
    }
    seen.until("two aborted handshakes", |r| r.len() == 2).await;
    assert_eq!(seen.count("tls_handshake"), 2, "{:?}", seen.refusals());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_tcp_is_refused() {
    let lab = Lab::new();
    let (addr, mut incoming, seen) = lab.server(no_names()).await;

    let mut tcp = TcpStream::connect(addr).await.unwrap();
    tcp.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
    tcp.shutdown().await.unwrap();
    // The server closes; what it sends first (an alert, maybe) is not HTTP.
    let mut answer = Vec::new();
    let _ = bounded("the server closing", tcp.read_to_end(&mut answer)).await;
    assert!(!answer.starts_with(b"HTTP"), "{answer:?}");

    assert_eq!(seen.one_refusal().await, "tls_handshake");
    nothing_accepted(&mut incoming);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_connection_times_out() {
    let lab = Lab::new();
    let (addr, mut incoming, seen) = lab.server(no_names()).await;

    let mut tcp = TcpStream::connect(addr).await.unwrap();
    // The server drops it after HANDSHAKE_TIMEOUT; WAIT bounds how long we look.
    let mut answer = Vec::new();
    let _ = bounded("the server dropping a silent peer", tcp.read_to_end(&mut answer)).await;
    assert_eq!(seen.one_refusal().await, "handshake_timeout");
    nothing_accepted(&mut incoming);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handshake_overload_is_refused_and_slots_come_back() {
    let lab = Lab::new();
    let (addr, mut incoming, seen) = lab.server(no_names()).await;

    let extra = 10;
    let mut silent = Vec::new();
    for _ in 0..MAX_HANDSHAKES + extra {
        silent.push(bounded("connect", TcpStream::connect(addr)).await.unwrap());
    }
    seen.until("the overload refusals", |r| {
        r.iter().filter(|r| **r == "handshake_overload").count() >= extra
    })
    .await;

    // Closing them ends their handshakes (the slots are released before each report).
    drop(silent);
    let total = MAX_HANDSHAKES + extra;
    let r = seen
        .until("every silent connection refused", |r| r.len() >= total)
        .await;
    assert_eq!(r.len(), total, "{r:?}");
    let overloaded = seen.count("handshake_overload");
    assert!(overloaded >= extra, "{r:?}");
    // What got a slot failed as a handshake (or, on a very slow machine, timed out).
    assert_eq!(
        seen.count("tls_handshake") + seen.count("handshake_timeout"),
        total - overloaded,
        "{r:?}"
    );

    let client_dir = lab.node("client", "node-c", &[LOCAL]);
    let mut client = bounded("dial", lab.connector(&client_dir, no_names()).dial(addr))
        .await
        .expect("dial after the burst");
    let mut server = accepted(&mut incoming).await;
    round_trip(&mut client, &mut server, "after").await;
    assert_eq!(seen.refusals().len(), total, "the proper client was refused");
}

/// Idle connections from hosts that are no node, from many addresses and beyond every
/// limit, never keep a node from connecting: node addresses have slots of their own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strangers_cannot_exhaust_the_slots_of_nodes() {
    let lab = Lab::new();
    let peer: IpAddr = "127.0.0.2".parse().unwrap();
    let (addr, mut incoming, seen) = lab.server(names(peer, "node-p")).await;

    // Strangers: one address more than MAX_HANDSHAKES needs at the per-address limit.
    let per = weft_wiretls::MAX_HANDSHAKES_PER_ADDRESS;
    let sources = MAX_HANDSHAKES / per + 2;
    let mut silent = Vec::new();
    for i in 0..sources {
        let from: IpAddr = format!("127.0.1.{}", i + 1).parse().unwrap();
        for _ in 0..per {
            let sock = tokio::net::TcpSocket::new_v4().unwrap();
            sock.bind(SocketAddr::new(from, 0)).unwrap();
            silent.push(bounded("connect", sock.connect(addr)).await.unwrap());
        }
    }
    let extra = sources * per - MAX_HANDSHAKES;
    seen.until("the strangers' overload", |r| {
        r.iter().filter(|r| **r == "handshake_overload").count() >= extra
    })
    .await;

    // The node at 127.0.0.2 gets in while the strangers still hold every slot of theirs.
    let dir = lab.node("peer", "node-p", &[peer]);
    let config = open(&dir, no_names(), &Arc::new(Seen::default()))
        .client()
        .expect("client config");
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.bind(SocketAddr::new(peer, 0)).unwrap();
    let tcp = bounded("connect", sock.connect(addr)).await.unwrap();
    let tls = bounded(
        "handshake",
        tokio_rustls::TlsConnector::from(config).connect(rustls::pki_types::ServerName::IpAddress(LOCAL.into()), tcp),
    )
    .await
    .expect("the node's handshake");
    let mut client = WireConn::Tls(Box::new(tokio_rustls::TlsStream::Client(tls)));
    let mut server = accepted(&mut incoming).await;
    round_trip(&mut client, &mut server, "node").await;
    assert_eq!(seen.count("handshake_overload"), extra, "{:?}", seen.refusals());
    drop(silent);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotation_reaches_new_connections_only() {
    let lab = Lab::new();
    let seen = Arc::new(Seen::default());
    let server_dir = lab.node("server", "node-s", &[LOCAL]);
    let dir = open(&server_dir, no_names(), &seen);
    let (addr, mut incoming) = serve(WireSecurity::Mtls(dir.clone()), &seen).await;
    let dialler = lab.connector(&lab.node("client", "node-c", &[LOCAL]), no_names());
    let old_cert = der(&std::fs::read_to_string(server_dir.join(CERT_FILE)).unwrap());

    let mut old_client = bounded("dial", dialler.dial(addr)).await.expect("dial");
    let mut old_server = accepted(&mut incoming).await;
    round_trip(&mut old_client, &mut old_server, "before").await;
    assert_eq!(server_cert_seen(&old_client), old_cert);

    let rotated = lab.cert("node-s", &[LOCAL]);
    issue::write_tls_dir(&server_dir, lab.ca.cert_pem(), &rotated).unwrap();
    assert!(dir.reload_now(), "the rotated files were not taken");
    assert_eq!(seen.reloads(), vec![true]);

    let mut new_client = bounded("dial", dialler.dial(addr)).await.expect("dial after rotation");
    let mut new_server = accepted(&mut incoming).await;
    let new_cert = der(&rotated.cert_pem);
    assert_ne!(new_cert, old_cert);
    assert_eq!(server_cert_seen(&new_client), new_cert);
    round_trip(&mut new_client, &mut new_server, "new").await;
    // The live stream keeps its session.
    round_trip(&mut old_client, &mut old_server, "old, after").await;

    // Broken files are not taken: the rotated certificate stays in use.
    std::fs::write(server_dir.join(CERT_FILE), "not a certificate").unwrap();
    assert!(!dir.reload_now(), "broken files were taken");
    assert_eq!(seen.reloads(), vec![true, false]);
    let mut client = bounded("dial", dialler.dial(addr))
        .await
        .expect("dial with broken files");
    let mut server = accepted(&mut incoming).await;
    assert_eq!(server_cert_seen(&client), new_cert);
    round_trip(&mut client, &mut server, "kept").await;
    // The same broken files are not read (and reported) again.
    assert!(!dir.reload_now());
    assert_eq!(seen.reloads(), vec![true, false]);
    assert!(seen.refusals().is_empty(), "{:?}", seen.refusals());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_certificates_refuse_until_they_arrive() {
    let lab = Lab::new();
    let seen = Arc::new(Seen::default());
    // The Secret is not mounted yet: the directory does not even exist.
    let server_dir = lab.tmp.path().join("server");
    let (dir, problem) = TlsDir::open_pending(&server_dir, no_names(), seen.clone());
    let problem = problem.expect("no files, yet no problem reported").to_string();
    assert!(problem.contains(&server_dir.display().to_string()), "{problem}");
    assert!(dir.server().is_none() && dir.client().is_none());
    assert!(TlsDir::open(&server_dir, no_names(), seen.clone()).is_err());

    let (addr, mut incoming) = serve(WireSecurity::Mtls(dir.clone()), &seen).await;
    let dialler = lab.connector(&lab.node("client", "node-c", &[LOCAL]), no_names());
    shut_out(bounded("dial", dialler.dial(addr)).await).await;
    assert_eq!(seen.one_refusal().await, "no_local_certificate");
    nothing_accepted(&mut incoming);

    // Without certificates this node does not dial in the clear either, nor open a
    // connection at all (it would count as a failed handshake on the peer): dialling a
    // port nobody listens on fails for want of a certificate, not for the refused TCP.
    let closed = TcpListener::bind((LOCAL, 0)).await.unwrap().local_addr().unwrap();
    let pending = WireConnector::new(WireSecurity::Mtls(dir.clone()));
    let err = match bounded("pending dial", pending.dial(closed)).await {
        Ok(_) => panic!("dialled without a certificate"),
        Err(e) => e,
    };
    assert_eq!(err.kind(), io::ErrorKind::NotFound, "{err}");
    assert!(err.to_string().contains(&server_dir.display().to_string()), "{err}");
    assert!(seen.reloads().is_empty(), "{:?}", seen.reloads());

    // The files arrive: taken for new connections.
    let cert = lab.cert("node-s", &[LOCAL]);
    issue::write_tls_dir(&server_dir, lab.ca.cert_pem(), &cert).unwrap();
    assert!(dir.reload_now(), "the new files were not taken");
    assert_eq!(seen.reloads(), vec![true]);
    let mut client = bounded("dial", dialler.dial(addr))
        .await
        .expect("dial once the files are there");
    let mut server = accepted(&mut incoming).await;
    assert_eq!(server_cert_seen(&client), der(&cert.cert_pem));
    round_trip(&mut client, &mut server, "arrived").await;
    assert_eq!(seen.refusals(), vec!["no_local_certificate"], "{:?}", seen.refusals());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn insecure_mode_is_plain_tcp() {
    let seen = Arc::new(Seen::default());
    let (addr, mut incoming) = serve(WireSecurity::Insecure, &seen).await;
    assert_eq!(WireSecurity::Insecure.mode(), "insecure");

    let mut client = bounded("dial", WireConnector::new(WireSecurity::Insecure).dial(addr))
        .await
        .expect("dial");
    let mut server = accepted(&mut incoming).await;
    assert!(matches!(client, WireConn::Plain(_)) && matches!(server, WireConn::Plain(_)));
    round_trip(&mut client, &mut server, "plain").await;
    assert!(seen.refusals().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connector_dials_wire_uris() {
    use tower::Service;

    let lab = Lab::new();
    let (addr, mut incoming, _) = lab.server(no_names()).await;
    let mut dialler = lab.connector(&lab.node("client", "node-c", &[LOCAL]), no_names());
    assert_eq!(
        WireSecurity::Mtls(open(
            &lab.tmp.path().join("client"),
            no_names(),
            &Arc::new(Seen::default())
        ))
        .mode(),
        "mtls"
    );

    let uri: http::Uri = format!("http://{addr}").parse().unwrap();
    let io = bounded("dial by URI", dialler.call(uri)).await.expect("dial by URI");
    let mut client = io.into_inner();
    let mut server = accepted(&mut incoming).await;
    round_trip(&mut client, &mut server, "uri").await;

    // Wire peers are addressed by IP; a host name or a missing port is not a wire address.
    for bad in ["http://node-s:4790", "http://127.0.0.1"] {
        let err = match bounded("bad URI", dialler.call(bad.parse().unwrap())).await {
            Ok(_) => panic!("dialled {bad}"),
            Err(e) => e,
        };
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{bad}: {err}");
    }
}

#[test]
fn open_names_the_file_that_is_wrong() {
    let lab = Lab::new();
    let open = |dir: &Path| TlsDir::open(dir, no_names(), Arc::new(Seen::default()));

    let dir = lab.node("no-key", "node-s", &[LOCAL]);
    std::fs::remove_file(dir.join(KEY_FILE)).unwrap();
    let msg = open(&dir).err().expect("opened without a key").to_string();
    assert!(msg.contains(&dir.join(KEY_FILE).display().to_string()), "{msg}");

    let dir = lab.node("garbage-ca", "node-s", &[LOCAL]);
    std::fs::write(dir.join(CA_FILE), "garbage").unwrap();
    let msg = open(&dir).err().expect("opened with a garbage CA").to_string();
    assert!(msg.contains(&dir.join(CA_FILE).display().to_string()), "{msg}");

    // PEM framing around something that is not a certificate.
    let dir = lab.node("bad-ca", "node-s", &[LOCAL]);
    std::fs::write(
        dir.join(CA_FILE),
        "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
    )
    .unwrap();
    let msg = open(&dir).err().expect("opened with a broken CA").to_string();
    assert!(msg.contains(&dir.join(CA_FILE).display().to_string()), "{msg}");

    // A key that is not the certificate's.
    let dir = lab.node("wrong-key", "node-s", &[LOCAL]);
    std::fs::write(dir.join(KEY_FILE), lab.cert("node-s", &[LOCAL]).key_pem).unwrap();
    assert!(open(&dir).is_err(), "opened with another certificate's key");

    // And the untouched directory opens.
    assert!(open(&lab.node("good", "node-s", &[LOCAL])).is_ok());
}

#[test]
fn names_node_cases() {
    let lab = Lab::new();
    let a = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));
    let b = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2));
    let v6 = IpAddr::V6(Ipv6Addr::LOCALHOST);
    let both = der(&lab.cert("node-a", &[a, v6]).cert_pem);

    // By address.
    assert!(names_node(&both, a, None));
    assert!(names_node(&both, v6, None));
    assert!(!names_node(&both, b, None));
    // By the name the Node objects give the address.
    assert!(names_node(&both, b, Some("node-a")));
    assert!(!names_node(&both, b, Some("node-b")));
    // A name that is not a DNS name falls back to the address.
    assert!(names_node(&both, a, Some("not a name!")));
    assert!(!names_node(&both, b, Some("not a name!")));

    let dns_only = der(&lab.cert("node-a", &[]).cert_pem);
    assert!(!names_node(&dns_only, LOCAL, None));
    assert!(names_node(&dns_only, LOCAL, Some("node-a")));
    assert!(!names_node(&dns_only, LOCAL, Some("node-b")));
    // The name must be the whole SAN, not a part of it.
    assert!(!names_node(&dns_only, LOCAL, Some("node")));

    // Not a certificate at all.
    assert!(!names_node(&CertificateDer::from(vec![0u8; 16]), a, Some("node-a")));
}

#[test]
fn secret_yaml_is_a_tls_secret_that_opens() {
    let lab = Lab::new();
    let node = lab.cert("node-a", &[LOCAL]);
    let yaml = issue::secret_yaml("weft-wire-node-a", "kube-system", lab.ca.cert_pem(), &node);
    let doc: serde_yaml_ng::Value = serde_yaml_ng::from_str(&yaml).expect("YAML");

    assert_eq!(doc["apiVersion"].as_str(), Some("v1"));
    assert_eq!(doc["kind"].as_str(), Some("Secret"));
    assert_eq!(doc["type"].as_str(), Some("kubernetes.io/tls"));
    assert_eq!(doc["metadata"]["name"].as_str(), Some("weft-wire-node-a"));
    assert_eq!(doc["metadata"]["namespace"].as_str(), Some("kube-system"));
    let data = doc["stringData"].as_mapping().expect("stringData");
    assert_eq!(data.len(), 3, "{yaml}");
    for (key, pem) in [
        (CA_FILE, lab.ca.cert_pem()),
        (CERT_FILE, &node.cert_pem),
        (KEY_FILE, &node.key_pem),
    ] {
        let got = data[key].as_str().unwrap_or_else(|| panic!("{key} missing:\n{yaml}"));
        assert_eq!(got.trim_end(), pem.trim_end(), "{key}");
    }

    // The files as the Secret volume would hold them are a usable directory.
    let dir = lab.tmp.path().join("from-secret");
    std::fs::create_dir(&dir).unwrap();
    for key in [CA_FILE, CERT_FILE, KEY_FILE] {
        std::fs::write(dir.join(key), data[key].as_str().unwrap()).unwrap();
    }
    TlsDir::open(&dir, no_names(), Arc::new(Seen::default())).expect("the Secret's files open");
}

#[test]
fn authority_saves_and_loads() {
    let lab = Lab::new();
    let dir = lab.tmp.path().join("ca");
    lab.ca.save(&dir).unwrap();
    let again = Authority::load(&dir).expect("load the saved CA");
    assert_eq!(again.cert_pem(), lab.ca.cert_pem());
    // What the loaded CA issues chains to the same CA certificate.
    let node = write_dir(
        lab.tmp.path(),
        "n",
        lab.ca.cert_pem(),
        &again.issue("node-a", &[LOCAL]).unwrap(),
    );
    TlsDir::open(&node, no_names(), Arc::new(Seen::default())).expect("issued by the loaded CA");

    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&dir.join(issue::CA_KEY_FILE)), 0o600);
    assert_eq!(mode(&node.join(KEY_FILE)), 0o600);
    assert_eq!(mode(&node), 0o700);
    // The private key is a key PEM rustls reads.
    PrivateKeyDer::from_pem_file(node.join(KEY_FILE)).expect("key PEM");
}
