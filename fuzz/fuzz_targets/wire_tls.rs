//! The wire port's TLS layer, as it meets a caller's first bytes: any bytes fed to a
//! server session configured exactly as weftd's (TLS 1.3 only, client certificates
//! required) end in a handshake error or a wait for more, never a panic; and the same
//! bytes taken as a peer's certificate never make `names_node` panic or accept.

#![no_main]

use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Arc, OnceLock};

use libfuzzer_sys::fuzz_target;
use rustls::ServerConfig;
use rustls::pki_types::CertificateDer;
use weft_wiretls::issue::{Authority, write_tls_dir};
use weft_wiretls::{NoObserver, TlsDir, names_node};

const NODE: IpAddr = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1));

/// weftd's server configuration, from certificates made once per fuzzing process.
fn server() -> Arc<ServerConfig> {
    static SERVER: OnceLock<Arc<ServerConfig>> = OnceLock::new();
    SERVER
        .get_or_init(|| {
            let dir = std::env::temp_dir().join(format!("weft-fuzz-wire-tls-{}", std::process::id()));
            let ca = Authority::generate("fuzz CA").expect("CA");
            let cert = ca.issue("node-a", &[NODE]).expect("node certificate");
            write_tls_dir(&dir, ca.cert_pem(), &cert).expect("writing the TLS files");
            let tls = TlsDir::open(&dir, Arc::new(|_: IpAddr| None), Arc::new(NoObserver)).expect("TLS files load");
            let config = tls.server().expect("a server configuration");
            let _ = std::fs::remove_dir_all(&dir);
            config
        })
        .clone()
}

fuzz_target!(|data: &[u8]| {
    let mut conn = rustls::ServerConnection::new(server()).expect("a server session");
    let mut rest = data;
    while !rest.is_empty() {
        match conn.read_tls(&mut rest) {
            Ok(0) | Err(_) => break,
            Ok(_) => {
                if conn.process_new_packets().is_err() {
                    break;
                }
            }
        }
    }
    // No handshake finishes from one side's bytes alone: a client must prove its key.
    assert!(conn.is_handshaking() || conn.peer_certificates().is_none());
    // Arbitrary bytes are no certificate naming the node.
    assert!(!names_node(&CertificateDer::from(data), NODE, Some("node-a")));
});
