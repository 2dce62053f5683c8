//! The node's certificates: the three files of a TLS Secret in one directory, turned
//! into server and client configurations, and read again when they change.

use std::fs::Metadata;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::{CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, ServerConfig, SignatureScheme};

use crate::{NodeNames, TlsObserver};

/// The CA that issued every node's certificate (`ca.crt` of a TLS Secret).
pub const CA_FILE: &str = "ca.crt";
/// This node's certificate chain (`tls.crt`).
pub const CERT_FILE: &str = "tls.crt";
/// This node's private key (`tls.key`).
pub const KEY_FILE: &str = "tls.key";

/// How often, at most, the files are looked at for a change: new connections within a
/// second of a rotation may still use the previous certificate.
const CHECK_EVERY: Duration = Duration::from_secs(1);

/// Why the certificates could not be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read.
    #[error("{path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// A file holds no usable PEM of the kind expected.
    #[error("{path}: {msg}")]
    Pem {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        msg: String,
    },
    /// The pieces do not make a TLS configuration (a key that is not the
    /// certificate's, a CA that is not a certificate authority, ...).
    #[error("TLS configuration from {dir}: {msg}")]
    Config {
        /// The directory.
        dir: PathBuf,
        /// rustls' reason.
        msg: String,
    },
    /// Making a certificate failed.
    #[error("issuing a certificate: {0}")]
    Issue(String),
}

/// What identifies one version of the files: a rotation (a Secret volume swaps a
/// symlink, cert-manager rewrites) changes at least one of them.
type Stamp = Vec<(u64, u64, Option<SystemTime>)>;

/// One readable version of the files, as configurations.
struct Loaded {
    server: Arc<ServerConfig>,
    client: Arc<ClientConfig>,
}

/// The state that changes under the lock.
struct Current {
    /// The configurations in use; none until the files first load.
    loaded: Option<Arc<Loaded>>,
    /// The version of the files last tried, usable or not (so broken files are not
    /// read again on every connection).
    tried: Option<Stamp>,
    checked: Instant,
}

/// A directory holding [`CA_FILE`], [`CERT_FILE`] and [`KEY_FILE`], and the
/// configurations made from them.
pub struct TlsDir {
    path: PathBuf,
    names: Arc<dyn NodeNames>,
    observer: Arc<dyn TlsObserver>,
    current: Mutex<Current>,
}

impl TlsDir {
    /// Reads the files of `path`, which must be usable (an error names the file and
    /// what is wrong with it). `names` says which node sits at an address (peers'
    /// certificates are checked against it); `observer` hears of reloads.
    pub fn open(
        path: impl Into<PathBuf>,
        names: Arc<dyn NodeNames>,
        observer: Arc<dyn TlsObserver>,
    ) -> Result<Arc<Self>, TlsError> {
        let (dir, problem) = Self::open_pending(path, names, observer);
        match problem {
            Some(e) => Err(e),
            None => Ok(dir),
        }
    }

    /// Like [`TlsDir::open`], but files that are missing or unusable now are no error:
    /// until they become usable (looked for on each new connection, at most once a
    /// second) every wire connection is refused, and the reason is returned here for
    /// the caller to report. A node's CNI service must not depend on its wire
    /// certificates having been provisioned yet.
    pub fn open_pending(
        path: impl Into<PathBuf>,
        names: Arc<dyn NodeNames>,
        observer: Arc<dyn TlsObserver>,
    ) -> (Arc<Self>, Option<TlsError>) {
        let path = path.into();
        let tried = stamp(&path).ok();
        let (loaded, problem) = match load(&path, &names) {
            Ok(l) => (Some(Arc::new(l)), None),
            Err(e) => (None, Some(e)),
        };
        let dir = Arc::new(Self {
            path,
            names,
            observer,
            current: Mutex::new(Current {
                loaded,
                tried,
                checked: Instant::now(),
            }),
        });
        (dir, problem)
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Who sits at an address, by the Node objects.
    pub fn names(&self) -> &Arc<dyn NodeNames> {
        &self.names
    }

    /// The server configuration for a new connection: the files as they are now (read
    /// again when they changed since the last look, at most once a second; files that
    /// do not load leave the previous version in use, logged and counted). `None` while
    /// the files have never been usable.
    pub fn server(&self) -> Option<Arc<ServerConfig>> {
        self.current().map(|l| l.server.clone())
    }

    /// The client configuration for a new connection (see [`TlsDir::server`]).
    pub fn client(&self) -> Option<Arc<ClientConfig>> {
        self.current().map(|l| l.client.clone())
    }

    /// Looks at the files now instead of within a second (tests, tools): whether a new
    /// version was taken into use.
    pub fn reload_now(&self) -> bool {
        let before = {
            let mut cur = self.current.lock().expect("tls lock");
            cur.checked = Instant::now() - CHECK_EVERY;
            cur.loaded.clone()
        };
        let after = self.current();
        match (before, after) {
            (Some(b), Some(a)) => !Arc::ptr_eq(&b, &a),
            (None, Some(_)) => true,
            _ => false,
        }
    }

    fn current(&self) -> Option<Arc<Loaded>> {
        let mut cur = self.current.lock().expect("tls lock");
        if cur.checked.elapsed() < CHECK_EVERY {
            return cur.loaded.clone();
        }
        cur.checked = Instant::now();
        // A file missing midway through a rotation: look again next time.
        let Ok(now) = stamp(&self.path) else {
            return cur.loaded.clone();
        };
        if cur.tried.as_ref() == Some(&now) {
            return cur.loaded.clone();
        }
        cur.tried = Some(now);
        match load(&self.path, &self.names) {
            Ok(l) => {
                tracing::info!(dir = %self.path.display(), "wire TLS certificates (re)loaded; new connections use them");
                cur.loaded = Some(Arc::new(l));
                self.observer.reloaded(true);
            }
            Err(e) => {
                tracing::warn!(error = %e, "wire TLS certificates changed but cannot be used; keeping the previous ones");
                self.observer.reloaded(false);
            }
        }
        cur.loaded.clone()
    }
}

fn stamp_of(m: &Metadata) -> (u64, u64, Option<SystemTime>) {
    use std::os::unix::fs::MetadataExt;
    (m.ino(), m.len(), m.modified().ok())
}

fn stamp(dir: &Path) -> std::io::Result<Stamp> {
    [CA_FILE, CERT_FILE, KEY_FILE]
        .iter()
        .map(|f| std::fs::metadata(dir.join(f)).map(|m| stamp_of(&m)))
        .collect()
}

/// The crypto the wire uses: TLS 1.3 only, AES-128-GCM first (the fastest of the
/// suites on CPUs with AES instructions; the frame stream is bulk data).
pub(crate) fn provider() -> Arc<CryptoProvider> {
    use rustls::crypto::ring::{cipher_suite, default_provider};
    Arc::new(CryptoProvider {
        cipher_suites: vec![
            cipher_suite::TLS13_AES_128_GCM_SHA256,
            cipher_suite::TLS13_AES_256_GCM_SHA384,
            cipher_suite::TLS13_CHACHA20_POLY1305_SHA256,
        ],
        ..default_provider()
    })
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_path_buf(),
        source,
    })
}

fn certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read(path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Pem {
            path: path.to_path_buf(),
            msg: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsError::Pem {
            path: path.to_path_buf(),
            msg: "no PEM certificate in the file".into(),
        });
    }
    Ok(certs)
}

fn load(dir: &Path, names: &Arc<dyn NodeNames>) -> Result<Loaded, TlsError> {
    let config = |e: rustls::Error| TlsError::Config {
        dir: dir.to_path_buf(),
        msg: e.to_string(),
    };
    let ca_path = dir.join(CA_FILE);
    let mut roots = RootCertStore::empty();
    for c in certs(&ca_path)? {
        roots.add(c).map_err(|e| TlsError::Pem {
            path: ca_path.clone(),
            msg: format!("not a usable CA certificate: {e}"),
        })?;
    }
    let roots = Arc::new(roots);
    let chain = certs(&dir.join(CERT_FILE))?;
    let key_path = dir.join(KEY_FILE);
    let key = PrivateKeyDer::from_pem_slice(&read(&key_path)?).map_err(|e| TlsError::Pem {
        path: key_path.clone(),
        msg: format!("no usable private key: {e}"),
    })?;
    let provider = provider();

    let clients = WebPkiClientVerifier::builder_with_provider(roots.clone(), provider.clone())
        .build()
        .map_err(|e| TlsError::Config {
            dir: dir.to_path_buf(),
            msg: e.to_string(),
        })?;
    let mut server = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(config)?
        .with_client_cert_verifier(clients)
        .with_single_cert(chain.clone(), key.clone_key())
        .map_err(config)?;
    server.alpn_protocols = vec![b"h2".to_vec()];

    let servers = WebPkiServerVerifier::builder_with_provider(roots, provider.clone())
        .build()
        .map_err(|e| TlsError::Config {
            dir: dir.to_path_buf(),
            msg: e.to_string(),
        })?;
    let mut client = ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(config)?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(NodeVerifier {
            inner: servers,
            names: names.clone(),
        }))
        .with_client_auth_cert(chain, key)
        .map_err(config)?;
    client.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Loaded {
        server: Arc::new(server),
        client: Arc::new(client),
    })
}

/// Checks a peer node's server certificate: the CA's, and naming the node dialled.
/// The dialler asks for the peer's address; a certificate that names the node by its
/// name (a DNS SAN) instead is accepted when the Node objects put that name at that
/// address. This is the client-side half of [`crate::names_node`], inside rustls'
/// verification so that a wrong peer never sees a byte of the stream.
#[derive(Debug)]
struct NodeVerifier {
    inner: Arc<WebPkiServerVerifier>,
    names: Arc<dyn NodeNames>,
}

impl std::fmt::Debug for dyn NodeNames {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NodeNames")
    }
}

fn wrong_name(e: &rustls::Error) -> bool {
    matches!(
        e,
        rustls::Error::InvalidCertificate(
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. }
        )
    )
}

impl ServerCertVerifier for NodeVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .inner
            .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
        {
            Err(e) if wrong_name(&e) => {
                let ServerName::IpAddress(ip) = server_name else {
                    return Err(e);
                };
                let ip = IpAddr::from(*ip);
                let Some(name) = self.names.node_at(ip) else {
                    return Err(e);
                };
                let dns = ServerName::try_from(name).map_err(|_| e.clone())?;
                self.inner
                    .verify_server_cert(end_entity, intermediates, &dns, ocsp, now)
            }
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}
